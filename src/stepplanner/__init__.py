"""stepplanner: the work of one in-flight-batching step of an LLM serving engine.

Names map the C++ seed's camelCase to snake_case once, here: ``maxBatchSize`` →
``max_batch_size``, ``kvPageSize`` → ``kv_page_size``, ``contextCommitted`` →
``context_committed``, ``selectLastTokenLogits`` → ``select_last_token_logits``,
``kFcfs``/``kPriority`` → ``FCFS``/``PRIORITY`` and so on. See SPEC.md for the contract.

The planner comes from the compiled core by default. ``STEPPLANNER_IMPL=python`` selects the
pure-Python reference explicitly (slow; for platforms with no wheel). A missing compiled core is
an ``ImportError``, never a silent switch to the slow path.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ._errors import StepPlannerError
from ._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from ._types import (
    REASON_RELEASED_FROM_PAUSE,
    RESIDENT_DTYPE,
    SEQUENCE_DTYPE,
    IfbSchedulingMode,
    PlannedSequence,
    PreemptionMode,
    Reason,
    SchedulingPolicy,
    SequenceWork,
    split_reason,
)

__version__ = "0.1.0"

_IMPL = os.environ.get("STEPPLANNER_IMPL", "compiled").strip().lower() or "compiled"
if _IMPL == "python":
    from . import _reference as _impl
elif _IMPL == "compiled":
    try:
        from . import _core as _impl  # type: ignore[no-redef]  # same surface as _reference
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "stepplanner's compiled core (stepplanner._core) could not be imported: "
            f"{exc}. Install a wheel for this platform or build from source "
            "(pip install stepplanner needs a C compiler when no wheel matches), or select the "
            "pure-Python reference explicitly with STEPPLANNER_IMPL=python (about 100x slower)."
        ) from exc
else:
    raise ImportError(f"STEPPLANNER_IMPL={_IMPL!r} is not known; allowed: 'compiled' or 'python'")

# The KV page table and the step inputs come from the same side as the planner.
if _IMPL == "python":
    from . import _kv_reference as _kv_impl
else:
    try:
        from . import _kv as _kv_impl  # type: ignore[no-redef]  # same surface as _kv_reference
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"stepplanner's compiled KV module (stepplanner._kv) could not be imported: {exc}. "
            "Rebuild the package (pip install -e .) or select the pure-Python reference "
            "explicitly with STEPPLANNER_IMPL=python."
        ) from exc

if TYPE_CHECKING:
    # Type checkers see one surface, the compiled core's stub (_core.pyi); the reference has the
    # same names and signatures (tests/test_api_surface.py), so the choice above cannot change it.
    from ._core import IMPLEMENTATION, ResidentState, StepPlan, StepPlanner
    from ._kv import KVPageTable, StepInputs
else:
    StepPlanner = _impl.StepPlanner
    StepPlan = _impl.StepPlan
    ResidentState = _impl.ResidentState
    IMPLEMENTATION = _impl.IMPLEMENTATION
    KVPageTable = _kv_impl.KVPageTable
    StepInputs = _kv_impl.StepInputs

# The tools around the planner (pure Python; they use whichever planner was selected above).
from ._kv_checks import PageTableInvariantError  # noqa: E402
from .checks import PlanInvariantError, check_plan  # noqa: E402
from .latency import LatencyModel  # noqa: E402
from .ledger import Ledger, QueueFullError  # noqa: E402
from .paging import release_rows, worst_case_pages  # noqa: E402
from .simulator import SimulationResult, simulate  # noqa: E402
from .workloads import Workload, load_trace, synthetic  # noqa: E402

__all__ = [
    "IMPLEMENTATION",
    "REASON_RELEASED_FROM_PAUSE",
    "RESIDENT_DTYPE",
    "SEQUENCE_DTYPE",
    "IfbSchedulingMode",
    "KVPageTable",
    "LatencyModel",
    "Ledger",
    "PageTableInvariantError",
    "PlanInvariantError",
    "PlannedSequence",
    "PreemptionMode",
    "QueueFullError",
    "Reason",
    "ResidentState",
    "ResolvedSchedulingPolicy",
    "SchedulingOptions",
    "SchedulingPolicy",
    "SequenceWork",
    "SimulationResult",
    "StepInputs",
    "StepPlan",
    "StepPlanner",
    "StepPlannerError",
    "StepPlannerLimits",
    "Workload",
    "__version__",
    "check_plan",
    "load_trace",
    "release_rows",
    "resolve_scheduling_policy",
    "simulate",
    "split_reason",
    "synthetic",
    "worst_case_pages",
]
