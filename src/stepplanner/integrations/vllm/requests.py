"""vLLM's requests as the planner's rows: the running requests with work, the waiting ones the
free slots admit (in vLLM's queue order, or the deadlines' order), their prefix-cache hits, the
``ResidentState`` rows ``plan()`` reads, and an admission's first allocation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request

from ...core import ResidentState
from . import _compat
from .config import INT32_MAX
from .lora import lora_id, running_adapters

NS = 1_000_000_000  # vLLM's arrival_time (seconds) as the rows' arrival (nanoseconds)


class RequestRows(AsyncScheduler):
    """``StepPlannerScheduler``'s translation of vLLM's requests into rows and back."""

    _rows: dict[str, ResidentState]  # by request id, kept between steps (pause counts)
    _cache_aware: bool  # vLLM 0.34's cache-aware admission window is in force

    def _running_with_work(self) -> list[Request]:
        """Running requests with a token left to schedule. Under async scheduling the step in
        flight may already sample a request's last token (max_tokens, or max_model_len); such a
        request keeps its slot until that step's output finishes it, but has no row to plan, as
        vLLM's own schedule() skips it."""
        max_len = self.max_model_len
        out = []
        for request in self.running:
            ahead = request.num_output_placeholders
            # The step in flight samples at least one token (its drafts may all be rejected):
            # vLLM's own test, num_computed_tokens + 2 - placeholders >= prompt + max_tokens.
            if ahead and (
                request.num_output_tokens + 1 >= request.max_tokens
                or request.num_tokens + ahead >= max_len
            ):
                continue
            out.append(request)
        return out

    def _admission_candidates(
        self, now: float | None = None, relegated: list[str] | None = None
    ) -> list[tuple[Request, KVCacheBlocks, int]]:
        """Waiting requests the free slots admit (SPEC §6), with their prefix-cache hits
        (committed before planning, so a first chunk ends on a block): in vLLM's queue order, or
        with ``now`` (EDF, DEADLINE) in first-token-deadline order."""
        free = self._slots - len(self.running) - self.num_waiting_for_streaming_input
        if free <= 0 or self._pause_state != PauseState.UNPAUSED or not self.waiting:
            return []
        budget = self.stepplanner_policy.max_num_tokens
        wanted = 0
        out: list[tuple[Request, KVCacheBlocks, int]] = []
        if now is None or relegated is None:
            if self._cache_aware:
                # vLLM 0.34's cache-aware admission window, by vLLM's own code: within the first
                # N plain waiting requests, the deepest cached prefix first (once the KV cache
                # is as full as its threshold says); the plan then orders the rows it admits.
                _compat.reorder_waiting_by_cached_prefix(self)
            order = self._queue_order(free, out)
        else:
            order = self._deadline_order(free, out, now, relegated)
        # LoRA: the ledgers' rule (docs/decisions.md), over the running requests (paused and in
        # flight included).
        adapters = running_adapters(self._max_loras, self.running)
        for request in order:  # lazily: the next one is taken only while there is room
            if not adapters.join(lora_id(request)):
                continue  # it waits; later requests whose adapters can join may
            blocks, hit = self._probe_prefix(request)
            out.append((request, blocks, hit))
            wanted += request.num_tokens - hit
            if len(out) == free or wanted >= budget:
                break
        return out

    def _queue_order(self, free: int, out: list[Any]) -> Iterator[Request]:
        """vLLM's waiting queue in its order, but requests with ``priority >= 0`` only while more
        than the reserved slots are free (``out``: the candidates so far)."""
        for request in self.waiting:
            if request.priority >= 0 and free - len(out) <= self._reserved:
                if self._priority_order:
                    return  # urgent requests sort first: none follows
                continue
            if self._admissible(request):
                yield request

    def _admissible(self, request: Request) -> bool:
        """Whether a waiting request may be admitted now, in either queue order. One whose
        grammar is still compiling is passed over, holding back no one, until vLLM's own
        ``_handle_blocked_waiting_request`` promotes it; one whose grammar failed to compile, or
        that was refused at add_request, never is: update_from_output finishes it alone. A
        request preempted with output still in flight (async scheduling) waits, as in vLLM, until
        that output has come back: resumed earlier, it would sample again a position that output
        then delivers."""
        blocked = self._is_blocked_waiting_status(request.status)
        if blocked and not self._handle_blocked_waiting_request(request):
            return False
        if request.num_stale_output_tokens and not request.drop_stale_output:
            return False
        return request.request_id not in self.grammar_compile_error_reqs

    def _prefix_hit(self, request: Request) -> tuple[KVCacheBlocks, int]:
        blocks, hit, _ = self.kv_cache_manager.get_computed_blocks(request)
        return blocks, hit

    def _probe_prefix(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """A candidate's prefix hit, for the plan. With KV events on, vLLM reports the cached
        blocks a request reuses at each lookup (``kv_cache_report_mode="full"``); the lookup that
        admits it (``_admit``) reports them, so this one, before planning, must not."""
        manager = self.kv_cache_manager
        if not manager.enable_kv_cache_events:
            return self._prefix_hit(request)
        manager.enable_kv_cache_events = False
        try:
            return self._prefix_hit(request)
        finally:
            manager.enable_kv_cache_events = True

    def _resident_rows(
        self,
        running: list[Request],
        candidates: list[tuple[Request, KVCacheBlocks, int]],
        queue_order: bool,
    ) -> list[ResidentState]:
        rows = self._rows
        out: list[ResidentState] = []
        for request in running:
            row = rows.get(request.request_id)
            if row is None:
                row = rows[request.request_id] = ResidentState(
                    priority=request.priority, arrival=int(request.arrival_time * NS)
                )
            # Under async scheduling num_computed_tokens already counts the tokens of the step in
            # flight, and a token that step samples is a placeholder: committed is the KV length
            # once the dispatched steps have run, and a decoding request's one token left may be
            # that placeholder (vLLM fills it on the GPU). Without overlap placeholders are 0.
            computed = request.num_computed_tokens
            total = request.num_tokens + request.num_output_placeholders
            decoding = total - computed == 1 and computed >= request.num_prompt_tokens
            row.committed = computed
            row.context_committed = decoding
            row.prompt_length = request.num_prompt_tokens if decoding else total
            out.append(row)
        # The planner orders rows by (priority,) arrival; vLLM admits in its queue's order, which
        # is arrival order but for what it moved: a recompute-preempted request at the head, 0.34's
        # cache-aware window promoting cached prefixes, and requests reaching the engine core in
        # another order than they were stamped. So, in queue order (not under EDF/DEADLINE, whose
        # rank writes both), a candidate arrives no earlier than the one before it in its class:
        # the plan gives budget and blocks in the order vLLM would, and the row keeps that
        # arrival once admitted, as vLLM's running list keeps admission order.
        last: dict[int | None, int] = {}
        for request, _, hit in candidates:
            # A waiting request the plan pauses stays waiting but counts its paused steps like
            # a resident, so max_pause_steps releases it as SPEC §3 says.
            stamp = int(request.arrival_time * NS)
            row = rows.get(request.request_id)
            if row is None:
                row = rows[request.request_id] = ResidentState(
                    priority=request.priority, arrival=stamp
                )
            if queue_order:
                key = request.priority if self._priority_order else None
                row.arrival = last[key] = max(stamp, last.get(key, -1) + 1)
            row.committed = hit
            row.context_committed = False
            row.prompt_length = request.num_tokens
            out.append(row)
        return out

    def _admit(
        self,
        request: Request,
        hit: int,
        n: int,
        new_blocks: dict[str, KVCacheBlocks],
        timestamp: float,
    ) -> int:
        """Allocate an admission's first chunk on top of its cached prefix: the tokens scheduled,
        or 0 to withhold it this step.

        The prefix is looked up again: allocations earlier in this step may have evicted part
        of the one found before planning (the planned chunk assumed it, so the request waits a
        step), or added to it: vLLM caches a chunk's full blocks as it allocates them, so an
        identical prompt admitted earlier in this step computes them once, and this one only the
        rest of its planned chunk (which still ends where the plan ended it), as vLLM's own
        schedule() deduplicates prompts admitted together."""
        blocks = self.kv_cache_manager.empty_kv_cache_blocks
        if self.kv_cache_manager.enable_caching:  # (a hit implies it)
            blocks, found = self._prefix_hit(request)
            if found != hit:
                end = hit + n  # a block boundary, or the prompt's end
                if found < hit or found >= end:
                    self.stepplanner_stats.stale_prefix_rows += 1
                    return 0
                self.stepplanner_stats.shared_prefix_rows += 1
                hit, n = found, end - found
        allocated = self.kv_cache_manager.allocate_slots(
            request,
            n,
            num_new_computed_tokens=hit,
            new_computed_blocks=blocks,
            num_lookahead_tokens=self.num_lookahead_tokens,
            full_sequence_must_fit=self.scheduler_reserve_full_isl,
            has_scheduled_reqs=bool(self.running),
        )
        if allocated is None:
            return 0
        self.kv_cache_manager.record_prefix_cache_stats(request, hit)
        if request.prefill_stats and request.num_preemptions <= 0:
            request.prefill_stats.set(
                num_prompt_tokens=request.num_prompt_tokens,
                num_local_cached_tokens=hit,
                num_external_cached_tokens=0,
            )
        self.running.append(request)
        request.num_computed_tokens = hit
        if self.log_stats:
            request.record_event(EngineCoreEventType.SCHEDULED, timestamp)
        if hit + n < request.num_tokens:
            self._inflight_prefills.add(request)
        new_blocks[request.request_id] = self.kv_cache_manager.get_blocks(request.request_id)
        return n

    def _leave_waiting(self, admitted: list[Request]) -> None:
        """Take admitted requests out of vLLM's waiting queue. They are nearly always its head,
        in its order, and popping the head is cheap (what vLLM's own schedule() does), while
        removing from inside the PRIORITY queue's heap rebuilds it: a comparison per waiting
        request, a tenth of a step at B = 256 with a long queue."""
        waiting = self.waiting
        rest = set(admitted)
        while rest and waiting and waiting.peek_request() in rest:
            rest.discard(waiting.pop_request())
        if rest:
            waiting.remove_requests(rest)
        self.deferred_waiting.difference_update(admitted)

    def _order_key(self, request: Request) -> tuple[int, int]:
        """The request's place in the planner's order: its row's, as this step wrote it (the
        ranker's order, or the arrival that keeps vLLM's queue order, _resident_rows)."""
        row = self._rows.get(request.request_id)
        if self._ranked:
            if row is not None:
                return row.priority, row.arrival
            return INT32_MAX, int(request.arrival_time * NS)
        arrival = row.arrival if row is not None else int(request.arrival_time * NS)
        return (request.priority if self._priority_order else 0, arrival)
