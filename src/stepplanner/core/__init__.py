"""The planner (SPEC §2–§3): the kernel, its buffers and the plan it returns.

``_planner.pxd`` declares the C structs and the kernel's signature; ``_planner.pyx`` holds the
kernel (``plan_step``, top of the file) and the objects that own its buffers; ``_reference.py``
is the pure-Python twin the tests hold it to. ``_policy`` resolves ``SchedulingOptions`` into
budgets (SPEC §2), ``_types`` holds the enums, dtypes and plan formatting both share, ``_fields``
the argument conversion both share, ``checks`` the §3 guarantees as an independent check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._select import implementation
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
from .checks import PlanInvariantError, check_plan

if TYPE_CHECKING:
    # One surface for type checkers, the compiled core's stub; the twin has the same names and
    # signatures (tests/test_api_surface.py), so the choice below cannot change it.
    from ._planner import IMPLEMENTATION, ResidentState, StepPlan, StepPlanner
else:
    _impl = implementation("stepplanner.core._planner", "stepplanner.core._reference")
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
