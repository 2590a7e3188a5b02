"""stepplanner: the work of one in-flight-batching step of an LLM serving engine.

Names map the C++ seed's camelCase to snake_case once, here: ``maxBatchSize`` →
``max_batch_size``, ``kvPageSize`` → ``kv_page_size``, ``contextCommitted`` →
``context_committed``, ``selectLastTokenLogits`` → ``select_last_token_logits``,
``kFcfs``/``kPriority`` → ``FCFS``/``PRIORITY`` and so on. See SPEC.md for the contract.

The package has two halves. The serving path, imported here: ``core`` (the planner), ``kv``
(KV page table, step inputs) and ``ledger``, each a compiled module beside its pure-Python twin
(``STEPPLANNER_IMPL=python`` selects every twin; a missing compiled module is an ``ImportError``,
never a silent switch to the slow path). The offline tools, loaded on first use: ``sim``
(simulator, latency models, calibration, workloads, traces), ``tuning``, ``bench``, ``cli``.
Their names that this module exports (``simulate``, ``LatencyModel``, ...) are resolved lazily
(PEP 562), so a runtime that imports the planner pays for none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import StepPlannerError
from .core import (
    IMPLEMENTATION,
    REASON_RELEASED_FROM_PAUSE,
    RESIDENT_DTYPE,
    SEQUENCE_DTYPE,
    SLO,
    IfbSchedulingMode,
    PlanInvariantError,
    PlannedSequence,
    PreemptionMode,
    Reason,
    ResidentState,
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    SchedulingPolicy,
    SequenceWork,
    StepPlan,
    StepPlanner,
    StepPlannerLimits,
    check_plan,
    resolve_scheduling_policy,
    split_reason,
)
from .kv import KVPageTable, PageTableInvariantError, StepInputs, release_rows, worst_case_pages
from .ledger import AdmissionOrder, Ledger, QueueFullError

__version__ = "0.1.0"

# The offline names: where each lives. Loaded on first use (PEP 562), never by
# ``import stepplanner``.
_OFFLINE = {
    "LatencyModel": "stepplanner.sim.latency",
    "SimulationResult": "stepplanner.sim.simulator",
    "simulate": "stepplanner.sim.simulator",
    "Workload": "stepplanner.sim.workloads",
    "synthetic": "stepplanner.sim.workloads",
    "load_trace": "stepplanner.sim.traces",
}

if TYPE_CHECKING:
    from .sim.latency import LatencyModel
    from .sim.simulator import SimulationResult, simulate
    from .sim.traces import load_trace
    from .sim.workloads import Workload, synthetic


def __getattr__(name: str) -> Any:
    module = _OFFLINE.get(name)
    if module is None:
        raise AttributeError(f"module 'stepplanner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_OFFLINE))


__all__ = [
    "IMPLEMENTATION",
    "AdmissionOrder",
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
    "SLO",
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
