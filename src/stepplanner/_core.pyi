"""Types of the compiled core (``_core.pyx``); ``stepplanner``'s public names come from here.

The pure-Python twin (``_core_py.py``) has the same surface. ``python -m mypy.stubtest
stepplanner`` checks this file against the built module in CI.
"""

from collections.abc import Sequence
from typing import Any, ClassVar, SupportsIndex, TypeAlias

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

from .planner._policy import ResolvedSchedulingPolicy, StepPlannerLimits
from .planner._types import PlannedSequence

# What plan() and apply_to() read: ResidentState rows, or a 1-D RESIDENT_DTYPE array (zero-copy).
_Residents: TypeAlias = list[ResidentState] | tuple[ResidentState, ...] | npt.NDArray[np.void]

IMPLEMENTATION: str

# Extension types: a class cannot derive from two of them (PEP 800).
@disjoint_base
class ResidentState:
    """One resident's ledger row: a C struct with attribute access (all fields writable)."""

    priority: int
    arrival: int
    prompt_length: int
    committed: int
    context_committed: bool
    consecutive_paused_steps: int
    __hash__: ClassVar[None]  # type: ignore[assignment]  # mutable
    def __init__(
        self,
        priority: SupportsIndex = 0,
        arrival: SupportsIndex = 0,
        prompt_length: SupportsIndex = 0,
        committed: SupportsIndex = 0,
        context_committed: bool = False,
        consecutive_paused_steps: SupportsIndex = 0,
    ) -> None: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __reduce__(self) -> tuple[type[ResidentState], tuple[int, int, int, int, bool, int]]: ...

@disjoint_base
class StepPlan:
    """A planned step. The planner's plan is overwritten by its next call: ``copy()`` to keep."""

    __hash__: ClassVar[None]  # type: ignore[assignment]
    @property
    def sequences(self) -> Sequence[PlannedSequence]: ...
    @property
    def paused(self) -> Sequence[int]: ...
    @property
    def num_prefill(self) -> int: ...
    @property
    def num_decode(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def total_tokens(self) -> int: ...
    @property
    def draft_tokens(self) -> int: ...
    @property
    def num_residents(self) -> int: ...
    @property
    def _version(self) -> int: ...
    def as_array(self) -> npt.NDArray[np.void]: ...
    def paused_array(self) -> npt.NDArray[np.int32]: ...
    def __init__(self) -> None: ...
    def copy(self) -> StepPlan: ...
    def __copy__(self) -> StepPlan: ...
    def __deepcopy__(self, memo: dict[int, Any]) -> StepPlan: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    def to_dict(self) -> dict[str, Any]: ...
    def apply_to(self, residents: _Residents) -> None: ...
    def __eq__(self, other: object, /) -> bool: ...

@disjoint_base
class StepPlanner:
    """Plans one in-flight-batching step per call (SPEC §3). One planner per thread."""

    def __init__(self, policy: ResolvedSchedulingPolicy, limits: StepPlannerLimits) -> None: ...
    @property
    def policy(self) -> ResolvedSchedulingPolicy: ...
    @property
    def limits(self) -> StepPlannerLimits: ...
    def plan(
        self,
        residents: _Residents,
        count: SupportsIndex | None = None,
        reasons: npt.NDArray[np.uint8] | None = None,
        drafts: Sequence[SupportsIndex] | npt.NDArray[np.int32] | None = None,
        max_num_tokens: SupportsIndex | None = None,
    ) -> StepPlan: ...

def time_kernel_loop(
    planner: StepPlanner,
    residents: _Residents,
    count: SupportsIndex | None = None,
    iterations: int = 10000,
) -> float: ...
