"""The planner (SPEC §2–§3) as the package uses it: the selected kernel and what callers share.

The kernel lives beside this module: ``_core.pxd`` declares the C structs and its signature,
``_core.pyx`` holds it (``plan_step``, top of the file) and the objects that own its buffers
(``StepPlanner``, ``StepPlan``, ``ResidentState``), and ``_core_py.py`` is its pure-Python twin,
which the tests hold it to. This module picks one of the two (``STEPPLANNER_IMPL``, see
``_select``) and re-exports, from ``planner/``, what both share: policy resolution, the enums and
dtypes, and the §3 guarantees as an independent check. RapidFuzz's ``fuzz.py`` beside
``fuzz_cpp.pyx`` and ``fuzz_py.py`` is the same arrangement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._select import implementation
from .planner._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from .planner._slo import SLO
from .planner._types import (
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
from .planner.checks import PlanInvariantError, check_plan

if TYPE_CHECKING:
    # One surface for type checkers, the compiled core's stub; the twin has the same names and
    # signatures (tests/test_api_surface.py), so the choice below cannot change it.
    from ._core import IMPLEMENTATION, ResidentState, StepPlan, StepPlanner
else:
    _impl = implementation("stepplanner._core", "stepplanner._core_py")
    StepPlanner = _impl.StepPlanner
    StepPlan = _impl.StepPlan
    ResidentState = _impl.ResidentState
    IMPLEMENTATION = _impl.IMPLEMENTATION

__all__ = [
    "IMPLEMENTATION",
    "REASON_RELEASED_FROM_PAUSE",
    "RESIDENT_DTYPE",
    "SEQUENCE_DTYPE",
    "IfbSchedulingMode",
    "PlanInvariantError",
    "PlannedSequence",
    "PreemptionMode",
    "Reason",
    "ResidentState",
    "ResolvedSchedulingPolicy",
    "SLO",
    "SchedulingOptions",
    "SchedulingPolicy",
    "SequenceWork",
    "StepPlan",
    "StepPlanner",
    "StepPlannerLimits",
    "check_plan",
    "resolve_scheduling_policy",
    "split_reason",
]
