"""``StepPlannerScheduler``: vLLM's v1 scheduler with ``schedule()`` taken by the planner. This
module is the facade: start-up (configuration and refusals), requests in and out, and the step
itself, which applies the plan through vLLM's KV cache manager; each concern it calls on has a
module of its own (the package's docstring lists them)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from ...core import (
    ResidentState,
    StepPlan,
    StepPlanner,
    resolve_scheduling_policy,
)
from ...planner._types import orders_by_priority
from . import _compat
from .config import (
    RANKED,
    admission_from_config,
    late_unsupported_features,
    limits_from_config,
    named_in_config,
    options_from_config,
    refuse,
    relegation_from_config,
    request_slo,
    slo_classes_from_config,
    unsupported_features,
    unsupported_request,
    victim_rule_from_config,
    with_vllm_budget,
)
from .deadlines import DeadlineQueue
from .lora import max_loras
from .outputs import OutputBuilder
from .pipeline import PipelineSteps, pipelined
from .requests import RequestRows
from .spec_decode import SpecDecode
from .uncached import UncachedQueue


@dataclasses.dataclass
class StepPlannerStats:
    """Counters since start-up (read them from ``scheduler.stepplanner_stats``)."""

    steps: int = 0
    planned_rows: int = 0
    scheduled_rows: int = 0
    withheld_rows: int = 0  # a planned row whose KV blocks could not be allocated
    stale_prefix_rows: int = 0  # an admission whose cached prefix was evicted before allocation
    # an admission whose cached prefix grew in the step (an identical prompt admitted before it):
    # it computes only the rest of its planned chunk
    shared_prefix_rows: int = 0
    paused_rows: int = 0
    # nothing could be allocated: the last resident in order, or the least work lost
    recompute_preemptions: int = 0
    recomputed_tokens: int = 0  # the victims' computed tokens, computed again when they resume
    draft_tokens: int = 0  # speculative decoding: drafts the decode rows verified (SPEC §8)
    relegated: int = 0  # DEADLINE: requests that can no longer meet their objectives
    shed: int = 0  # DEADLINE: relegated waiting requests handed back (finished with an error)


@dataclasses.dataclass
class StepRecord:
    """What the last ``schedule()`` decided, by request id (for tests and debugging)."""

    planned: dict[str, int]
    paused: list[str]  # running requests the plan paused (they stay running, unscheduled)
    withheld: list[str]
    preempted: list[str]
    admitted: list[str]
    relegated: list[str] = dataclasses.field(default_factory=list)  # DEADLINE, this step
    shed: list[str] = dataclasses.field(default_factory=list)  # DEADLINE, this step
    # admissions that computed only part of their planned chunk: an identical prompt admitted
    # before them in this step had cached the rest of their prefix
    shared: list[str] = dataclasses.field(default_factory=list)


class StepPlannerScheduler(
    DeadlineQueue,
    UncachedQueue,
    RequestRows,
    SpecDecode,
    PipelineSteps,
    OutputBuilder,
    AsyncScheduler,
):
    """vLLM's v1 scheduler with every per-step decision taken by ``StepPlanner.plan()``.

    vLLM's ``get_scheduler_cls()`` returns a ``--scheduler-cls`` as it is, whatever
    ``async_scheduling`` says, so this one class serves both modes: it extends ``AsyncScheduler``
    (whose output placeholders let a request be planned for its next decode while the step that
    samples its previous token is still running) and, with async scheduling off, does what
    ``Scheduler`` does after a schedule instead.
    """

    # The clock of now under EDF/DEADLINE: vLLM stamps Request.arrival_time with time.time(),
    # and deadlines count from it.
    clock: Callable[[], float] = staticmethod(time.time)

    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: Any,
        structured_output_manager: Any,
        block_size: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        refuse(unsupported_features(vllm_config))
        options = options_from_config(vllm_config)
        slo_classes = slo_classes_from_config(vllm_config)
        relegation = relegation_from_config(vllm_config)
        victim_rule = victim_rule_from_config(vllm_config)
        admission = admission_from_config(vllm_config)
        limits = limits_from_config(vllm_config, block_size)
        with named_in_config():
            policy = resolve_scheduling_policy(with_vllm_budget(options, limits), limits)
        super().__init__(
            vllm_config, kv_cache_config, structured_output_manager, block_size, *args, **kwargs
        )
        refuse(late_unsupported_features(self))
        self.stepplanner_limits = limits
        self.stepplanner_policy = policy
        self.planner = StepPlanner(policy, limits)
        self.stepplanner_stats = StepPlannerStats()
        self._least_work = victim_rule == "least-work"
        # The classes never given up on: DEADLINE never relegates them, least-work spares them.
        self._never_below = int(relegation.get("never_relegate_below", 0))
        self.last_step = StepRecord({}, [], [], [], [])
        # Called as on_plan(residents, plan, requests, drafts) after every plan() when set (tests
        # use it to hold each plan to stepplanner.check_plan); the plan is overwritten by the
        # next call. drafts: the proposed drafts plan() was given, or None.
        self.on_plan: (
            Callable[[list[ResidentState], StepPlan, list[Request], list[int] | None], None] | None
        ) = None
        self._rows = {}
        self._loads = []
        self._kv_waiting_queues = _compat.kv_waiting_queues(self)
        self._sync_kv_loads = False
        self._priority_order = orders_by_priority(policy.scheduling_policy)
        self._reserved = policy.priority_reserved_slots
        self._slots = min(self.max_num_running_reqs, self.max_num_active_reqs)
        self._async_scheduling = bool(self.scheduler_config.async_scheduling)
        self._pipelined = pipelined(vllm_config, self._async_scheduling)
        self._max_loras = max_loras(vllm_config)
        self._last_scheduled = set()  # speculative decoding: the previous step's rows
        self.slo_classes = slo_classes
        self._ranked = policy.scheduling_policy in RANKED
        # vLLM 0.34's cache-aware admission window reorders vLLM's waiting queue, the order
        # FCFS and PRIORITY admit in; EDF and DEADLINE admit by deadline, which it cannot move.
        self._cache_aware = _compat.cache_aware_window(self) > 0
        if self._cache_aware and self._ranked:
            refuse(
                [
                    "cache_aware_admission_window with the stepplanner policy "
                    f"{policy.scheduling_policy.name} (it admits by deadline, not vLLM's queue "
                    "order; use fcfs or priority, or leave the window at 0)"
                ]
            )
        if self._ranked:
            self._init_deadlines(vllm_config, limits, policy, relegation)
        self._init_uncached(admission)
        if self._uncached:
            refuse(
                [
                    name
                    for bad, name in (
                        (
                            self._ranked,
                            f"admission uncached-first with the stepplanner policy "
                            f"{policy.scheduling_policy.name} (its slack-first order is the "
                            "ledgers' only; use fcfs or priority here)",
                        ),
                        (
                            self._cache_aware,
                            "admission uncached-first with cache_aware_admission_window (two "
                            "orders by cached prefix; leave the window at 0)",
                        ),
                        (
                            self.connector is not None,
                            "admission uncached-first with a KV connector (a connector's hit "
                            "is known only as the request is admitted)",
                        ),
                    )
                    if bad
                ]
            )

    # --- requests in and out ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        reason = unsupported_request(request)
        message = (
            None
            if reason is None
            else f"StepPlannerScheduler: request {request.request_id}: {reason} is not supported"
        )
        slo = None
        if message is None:
            try:
                slo = request_slo(request) or self.slo_classes.get(request.priority)
            except (TypeError, ValueError, OverflowError) as exc:
                message = (
                    f"StepPlannerScheduler: request {request.request_id}: {exc}; it is "
                    "refused, never served without its objectives"
                )
        super().add_request(request)
        if message is not None:
            # A per-request error (not an engine crash): update_from_output finishes it.
            _compat.fail_request(self, request.request_id, message)
        elif self._ranked and request.request_id not in self._deadlines:
            self._add_deadlines(request, slo)
        elif self._uncached and request.request_id not in self._work_keys:
            self._enqueue_uncached(request)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        self._rows.pop(request.request_id, None)
        if self._ranked:
            self._deadlines.pop(request.request_id, None)
        elif self._uncached:
            self._work_keys.pop(request.request_id, None)
        return super()._free_request(request, delay_free_blocks)

    def _preempt_request(
        self, request: Request, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        super()._preempt_request(request, timestamp, drop_stale_output)
        if self._ranked:  # back in the waiting queue: a re-prefill, due by its next token
            self._enqueue(request)
        elif self._uncached:
            self._to_arrival_order(request)  # at the head of vLLM's queue too

    # --- the step -----------------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        # throttle_prefills (data-parallel prefill balancing) is not applied: the plan decides.
        self.current_step += 1
        self.kv_cache_manager.new_step_starts()
        stats = self.stepplanner_stats
        stats.steps += 1
        self._sync_kv_loads = False
        if self._uncached:
            self._starve_uncached()
        now = None
        relegated: list[str] = []
        if self._ranked:
            # vLLM's clock as the previous step's tokens are (about to be) back; the ranker
            # measures the step time from these reads (a step that ran nothing is no sample).
            now = self.clock()
            self._stride += 1
            if self._stride == self._pace_steps:
                self._ranker.measure(now, self._ran)
                self._stride = 0
                self._ran = True  # until a step of the next stride runs nothing
        if self._pause_state == PauseState.PAUSED_ALL:
            self._ran = False
            self.last_step = StepRecord({}, [], [], [], [])
            return self._make_output({}, {}, [], [], [], {})

        shed: list[str] = []
        self._shed = shed
        shared: list[str] = []
        if now is not None and self._by_class:
            self._give_up(now, relegated)
        running = self._running_with_work() if self._async_scheduling else self._settled()
        candidates = self._admission_candidates(now, relegated)
        residents = self._resident_rows(running, candidates, queue_order=now is None)
        requests = running + [c[0] for c in candidates]
        if now is not None:
            self._rank(residents, requests, now, relegated)
        drafts = self._proposed_drafts(running, residents) if self.num_spec_tokens else None
        plan = self.planner.plan(residents, drafts=drafts)
        if self.on_plan is not None:
            self.on_plan(residents, plan, requests, drafts)

        rows = plan.as_array()
        row_req = rows["resident"].tolist()
        row_tokens = rows["query_length"].tolist()
        paused = plan.paused_array().tolist()
        # SPEC §6 through the core, as a runtime applies a plan: the pause counts are what it
        # keeps between steps (committed and the rest are derived afresh from vLLM next step).
        plan.apply_to(residents)
        stats.paused_rows += len(paused)
        stats.planned_rows += len(row_req)

        # Decode rows need at most one block and bring a request nearer its end, so they are
        # allocated first; then running chunks; admissions last (in plan order within each).
        n_running = len(running)
        first_decode = len(row_req) - plan.num_decode
        decode_rows = list(zip(row_req[first_decode:], row_tokens[first_decode:]))
        chunk_rows = list(zip(row_req[:first_decode], row_tokens[:first_decode]))
        resident_rows = decode_rows + [r for r in chunk_rows if r[0] < n_running]
        admission_rows = [r for r in chunk_rows if r[0] >= n_running]

        planned = {requests[i].request_id: n for i, n in zip(row_req, row_tokens)}
        timestamp = time.monotonic()
        scheduled_running: list[Request] = []
        admitted: list[Request] = []
        num_scheduled: dict[str, int] = {}
        new_blocks: dict[str, KVCacheBlocks] = {}
        preempted: list[Request] = []
        while True:
            withheld_resident = False
            for i, n in resident_rows:
                request = requests[i]
                if request.status != RequestStatus.RUNNING:
                    continue  # preempted earlier in this step
                blocks = self.kv_cache_manager.allocate_slots(
                    request, n, num_lookahead_tokens=self.num_lookahead_tokens
                )
                if blocks is None:
                    withheld_resident = True
                    continue
                scheduled_running.append(request)
                num_scheduled[request.request_id] = n
                new_blocks[request.request_id] = blocks
            if not withheld_resident:  # (candidates: none under PAUSED_ALL)
                for i, n in admission_rows:
                    request = candidates[i - n_running][0]
                    scheduled = self._admit(candidates[i - n_running], n, new_blocks, timestamp)
                    if scheduled:
                        admitted.append(request)
                        num_scheduled[request.request_id] = scheduled
                        if scheduled != n:
                            shared.append(request.request_id)
            if num_scheduled or not (resident_rows or admission_rows) or not self.running:
                break
            # Nothing could be allocated: recompute-preempt the resident last in order (vLLM's
            # own preemption) and try the rest of the plan again. A request with a step in
            # flight is never the victim: that step's output must find it as it was scheduled.
            victims = self._settled()
            if not victims:
                break
            victim = self._victim(victims)
            if not self._can_preempt(victim):
                break  # its blocks would not come back in this step
            self.running.remove(victim)
            self._rows.pop(victim.request_id, None)
            stats.recomputed_tokens += victim.num_computed_tokens  # (preempting resets it)
            # With a connector that must deliver the KV it computes, the victim's output in
            # flight is dropped (vLLM's requires_kv_delivery).
            self._preempt_request(victim, timestamp, drop_stale_output=self.requires_kv_delivery)
            preempted.append(victim)
            stats.recompute_preemptions += 1
            resident_rows = [r for r in resident_rows if requests[r[0]] is not victim]
            admission_rows = []  # like vLLM: no admission in a step that preempted

        if admitted:
            self._leave_waiting(admitted)
        if self._uncached:
            self._requeue_uncached(admitted)
        if self._loads and not preempted:  # (none were looked up under PAUSED_ALL)
            self._start_loads(self._loads)
        if now is not None:
            self._ran = self._ran and bool(num_scheduled)
            self._requeue(admitted)
            stats.relegated += len(relegated)
            stats.shed += len(shed)
        preempted_ids = [r.request_id for r in preempted]
        withheld = [rid for rid in planned if rid not in num_scheduled and rid not in preempted_ids]
        stats.scheduled_rows += len(num_scheduled)
        stats.withheld_rows += len(withheld)
        self.last_step = StepRecord(
            planned,
            # A paused resident can still be the recompute-preemption victim: then it is not
            # paused (running, unscheduled) but preempted.
            [
                requests[i].request_id
                for i in paused
                if i < n_running and requests[i].request_id not in preempted_ids
            ],
            withheld,
            preempted_ids,
            [r.request_id for r in admitted],
            relegated,
            shed,
            shared,
        )
        new_reqs = [r for r in admitted if r.status == RequestStatus.WAITING]
        resumed = [r for r in admitted if r.status == RequestStatus.PREEMPTED]
        for request in admitted:
            request.status = RequestStatus.RUNNING
        spec: dict[str, list[int]] = {}
        if drafts is not None:
            spec = self._scheduled_drafts(scheduled_running, num_scheduled)
        return self._make_output(
            num_scheduled, new_blocks, scheduled_running, new_reqs, resumed, spec
        )

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        if self._async_scheduling:
            super()._update_after_schedule(scheduler_output)  # AsyncScheduler: placeholders
        else:
            # What vLLM runs without overlap (Scheduler): every sampled token is back before the
            # next schedule, so there is nothing to hold a place for.
            Scheduler._update_after_schedule(self, scheduler_output)

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        # Without overlap no placeholder was added, so none is released: vLLM 0.32's
        # AsyncScheduler releases one per token whatever it holds (and asserts the count stays
        # >= 0), where its Scheduler, which vLLM runs without overlap, releases none.
        result: tuple[list[int], bool] = (
            super()._update_request_with_output(request, new_token_ids, is_stale)
            if self._async_scheduling
            else Scheduler._update_request_with_output(self, request, new_token_ids, is_stale)
        )
        return result
