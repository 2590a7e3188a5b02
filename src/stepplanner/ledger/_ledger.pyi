"""Types of the compiled ledger (``_ledger.pyx``); ``stepplanner.Ledger`` comes from here or
from the pure-Python twin (``_ledger_py.py``), which has the same surface."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, SupportsIndex, final

import numpy as np
import numpy.typing as npt

from .._core import StepPlan, StepPlanner
from ..kv._kv import KVPageTable
from ..planner._policy import ResolvedSchedulingPolicy, StepPlannerLimits
from ..planner._slo import SLO
from ._shared import AdmissionOrder

IMPLEMENTATION: str

@final
class Ledger:
    """Dense resident table, waiting queue and output accounting for one engine, in C."""

    @property
    def limits(self) -> StepPlannerLimits: ...
    @property
    def by_priority(self) -> bool: ...
    @property
    def reserved_slots(self) -> int: ...
    @property
    def max_waiting(self) -> int: ...
    @property
    def page_table(self) -> KVPageTable | None: ...
    def __init__(
        self,
        limits: StepPlannerLimits,
        policy: ResolvedSchedulingPolicy | None = None,
        *,
        max_waiting: SupportsIndex | None = None,
        page_table: KVPageTable | None = None,
        slo_classes: Mapping[int, SLO] | None = None,
        step_time: tuple[float, float] | None = None,
        relegated_wait: float | None = None,
        never_relegate_below: SupportsIndex = 0,
        max_loras: SupportsIndex | None = None,
        admission: AdmissionOrder = ...,
        starvation_steps: SupportsIndex | None = None,
        starvation_seconds: float | None = None,
    ) -> None: ...
    @property
    def max_loras(self) -> int | None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def free_slots(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def relegated_waiting(self) -> int: ...
    @property
    def residents(self) -> npt.NDArray[np.void]: ...
    @property
    def request_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def output_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def finished_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def admitted_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def relegated_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def shed_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def step_time_estimate(self) -> float: ...
    @property
    def reserved_pages(self) -> int: ...
    @property
    def held_back(self) -> int: ...
    def kv_pages_in_use(self) -> int: ...
    def submit(
        self,
        request_id: SupportsIndex,
        prompt_length: SupportsIndex,
        priority: SupportsIndex = 0,
        max_new_tokens: SupportsIndex | None = None,
        *,
        arrival_time: float | None = None,
        slo: SLO | None = None,
        lora_id: SupportsIndex = 0,
        cached_tokens: SupportsIndex = 0,
    ) -> int: ...
    def cancel(self, request_id: SupportsIndex) -> None: ...
    def admit(self, *, now: float | None = None) -> list[int]: ...
    def waiting_ids(self) -> list[int]: ...
    def apply(
        self,
        plan: StepPlan,
        finished: npt.NDArray[np.bool_] | None = None,
        *,
        accepted: npt.NDArray[np.int32] | None = None,
        retire: bool = False,
        now: float | None = None,
    ) -> npt.NDArray[np.int64]: ...
    def retire_finished(self) -> None: ...
    def step(
        self,
        planner: StepPlanner,
        finished: npt.NDArray[np.bool_] | None = None,
        *,
        accepted: npt.NDArray[np.int32] | None = None,
        drafts: SupportsIndex | Mapping[SupportsIndex, SupportsIndex] | None = None,
        reasons: npt.NDArray[np.uint8] | None = None,
        now: float | None = None,
    ) -> StepPlan: ...
    def rank(self, now: float) -> None: ...
    def measure(self, now: float, ran: bool = True) -> None: ...
    def retire(self, request_ids: Iterable[SupportsIndex]) -> None: ...
    def retire_rows(self, rows: Sequence[int] | npt.NDArray[np.integer[Any]]) -> None: ...
    def load(self, residents: Sequence[Mapping[str, Any]]) -> None: ...
    def to_records(self) -> list[dict[str, Any]]: ...

@final
class Ranker:
    """The ledger's rank pass over rows a runtime keeps itself."""

    @property
    def limits(self) -> StepPlannerLimits: ...
    @property
    def policy(self) -> ResolvedSchedulingPolicy: ...
    def __init__(
        self,
        limits: StepPlannerLimits,
        policy: ResolvedSchedulingPolicy,
        *,
        step_time: tuple[float, float] | None = None,
        relegated_wait: float | None = None,
        never_relegate_below: SupportsIndex = 0,
    ) -> None: ...
    @property
    def step_time_estimate(self) -> float: ...
    def relegated_wait(self, ttft: float) -> float: ...
    def measure(self, now: float, ran: bool = True) -> None: ...
    def admits(
        self,
        prompt_tokens: SupportsIndex,
        first_due: float,
        now: float,
        priority: SupportsIndex = 0,
    ) -> bool: ...
    def rank(
        self,
        rows: npt.NDArray[np.void],
        first_due: npt.NDArray[np.float64],
        gap: npt.NDArray[np.float64],
        generated: npt.NDArray[np.int64],
        stamp: npt.NDArray[np.uint64],
        relegated: npt.NDArray[np.uint8],
        now: float,
        *,
        classes: npt.NDArray[np.int32] | None = None,
    ) -> npt.NDArray[np.int64]: ...
