"""vLLM's requests as the planner's rows: the running requests with work, the waiting ones the
free slots admit (in vLLM's queue order, or the deadlines' order), their prefix-cache hits, the
``ResidentState`` rows ``plan()`` reads, and an admission's first allocation."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request, RequestStatus

from ...core import ResidentState
from ...ledger._shared import least_work_victim
from . import _compat
from .config import INT32_MAX
from .kv_connector import KVConnectors, Load
from .lora import lora_id, running_adapters

NS = 1_000_000_000  # vLLM's arrival_time (seconds) as the rows' arrival (nanoseconds)

# An admission candidate: the request, its local prefix blocks (None: the blocks a connector's
# landed load left it with, already its own), the tokens committed before its first chunk, and
# of those the connector's.
Candidate = tuple[Request, KVCacheBlocks | None, int, int]


def _arrival(request: Request) -> float:
    return float(request.arrival_time)


class RequestRows(KVConnectors):
    """``StepPlannerScheduler``'s translation of vLLM's requests into rows and back."""

    _rows: dict[str, ResidentState]  # by request id, kept between steps (pause counts)
    _cache_aware: bool  # vLLM 0.34's cache-aware admission window is in force
    _loads: list[Load]  # KV connectors: the step's asynchronous loads to start, in queue order
    _least_work: bool  # recompute preemption takes the least computed work, not the last
    _never_below: int  # never_relegate_below: the classes least-work spares while it can
    _uncached: bool  # "admission": "uncached-first" (uncached.py's order)
    _admitted_stamp: int  # uncached first: the latest admitted row's arrival
    _reserved: int  # priority_reserved_slots

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
    ) -> list[Candidate]:
        """Waiting requests the free slots admit (SPEC §6), with their prefix-cache hits
        (committed before planning, so a first chunk ends on a block; a KV connector's part
        included): in vLLM's queue order, or with ``now`` (EDF, DEADLINE) in first-token-deadline
        order. Requests whose KV a connector loads asynchronously go to ``_loads`` instead. Under
        PAUSED_NEW only the requests holding KV blocks (a connector's landed loads) are read, in
        their queue's order, as vLLM drains them."""
        self._loads = []
        state = self._pause_state
        paused_new = state == PauseState.PAUSED_NEW
        if state == PauseState.PAUSED_ALL or (paused_new and not self.kv_holding_waiting):
            return []
        free = self._slots - len(self.running) - self.num_waiting_for_streaming_input
        async_kv = self._kv_waiting_queues[1] if len(self._kv_waiting_queues) > 1 else None
        seen: set[Request] | None = set() if async_kv else None
        if free <= 0 or not (self.waiting or any(self._kv_waiting_queues)):
            if free <= 0 and seen is not None and not paused_new:
                self._loads_only(seen)
            return []
        budget = self.stepplanner_policy.max_num_tokens
        wanted = 0
        out: list[Candidate] = []
        if paused_new:
            order = self._queue_order(free, out, (self.kv_holding_waiting,))
        elif now is None or relegated is None:
            if self._cache_aware:
                # vLLM 0.34's cache-aware admission window, by vLLM's own code: within the first
                # N plain waiting requests, the deepest cached prefix first (once the KV cache
                # is as full as its threshold says); the plan then orders the rows it admits.
                _compat.reorder_waiting_by_cached_prefix(self)
            if self._uncached:  # the requests holding KV blocks first, as vLLM reads them
                holding = self._queue_order(free, out, self._kv_waiting_queues[:1])
                order = itertools.chain(holding, self._uncached_order(free, out))
            else:
                order = self._queue_order(free, out, self._waiting_queues())
        else:
            order = self._deadline_order(free, out, now, relegated)
        # LoRA: the ledgers' rule (docs/decisions.md), over the running requests (paused and in
        # flight included).
        adapters = running_adapters(self._max_loras, self.running)
        connector = self.connector
        load_room: int | None = None
        block_room = 0
        if connector is not None:
            load_room = _compat.inflight_kv_load_room(self)
            # Loads take no slot and no budget: what bounds them, as in vLLM, is blocks (and
            # 0.34's in-flight limit); past them the scan ends, with no more lookups.
            block_room = self.kv_cache_manager.block_pool.get_num_free_blocks() * self.block_size
        for request in order:  # lazily: the next one is taken only while there is room
            if seen is not None:
                seen.add(request)
            lora = lora_id(request)
            if connector is None:
                if not adapters.join(lora):
                    continue  # it waits; later requests whose adapters can join may
            elif not adapters.fits(lora):
                continue  # (a load holds no adapter, as in vLLM: joined below for a row only)
            found = self._lookup(request)
            if found is None:
                continue  # the connector cannot tell its hit yet: passed over this step
            blocks, hit, external, load = found
            if load:  # an asynchronous load: no row until its KV has landed
                if load_room is not None and len(self._loads) >= load_room:
                    continue  # past 0.34's --max-num-inflight-kv-loads: it waits
                self._loads.append(Load(request, blocks, hit - external, external))
                block_room -= hit
                if block_room < 0:
                    break
                continue
            if connector is not None:
                adapters.join(lora)
            out.append((request, blocks, hit, external))
            wanted += request.num_tokens - hit
            if len(out) == free or wanted >= budget:
                break
        if seen is not None and not paused_new:
            self._loads_only(seen)
        return out

    def _loads_only(self, seen: set[Request]) -> None:
        """vLLM 0.34 with ``--max-num-inflight-kv-loads``: once no slot or budget is left, loads
        still start from the requests that may load asynchronously (they take neither), in that
        queue's order, until one turns out to need a slot (it waits at the queue's head)."""
        room = _compat.inflight_kv_load_room(self)
        for request in self._kv_waiting_queues[1]:
            if room is not None and len(self._loads) >= room:
                return
            if request in seen or not self._admissible(request):
                continue
            found = self._lookup(request)
            if found is None:
                continue
            blocks, hit, external, load = found
            if not load:
                return
            self._loads.append(Load(request, blocks, hit - external, external))

    def _queue_order(
        self, free: int, out: list[Any], queues: Iterable[Iterable[Request]]
    ) -> Iterator[Request]:
        """vLLM's waiting queues in their order, one after the other, but requests with
        ``priority >= 0`` only while more than the reserved slots are free (``out``: the
        candidates so far)."""
        for queue in queues:
            for request in queue:
                if self._held_for_urgent(request, free, out):
                    if self._priority_order:
                        break  # urgent requests sort first: none follows in this queue
                    continue
                if self._admissible(request):
                    yield request

    def _held_for_urgent(self, request: Request, free: int, out: list[Any]) -> bool:
        """Whether ``priority_reserved_slots`` hold a waiting request back: a normal one
        (``priority >= 0``) while no more than the reserved slots are free (``out``: the
        candidates so far)."""
        return request.priority >= 0 and free - len(out) <= self._reserved

    def _waiting_queues(self) -> tuple[Iterable[Request], ...]:
        """vLLM's waiting queues in the order its schedule() reads them: the requests holding KV
        blocks (a connector's landed loads, requests added with tokens computed) first, then
        ``waiting`` (merged, on 0.34 with ``--max-num-inflight-kv-loads``, with the requests that
        may load asynchronously, as vLLM's ``_next_waiting_queue`` takes their heads)."""
        holding, *async_kv = self._kv_waiting_queues
        if not async_kv or not async_kv[0]:
            return (holding, self.waiting)
        key = None if self._priority_order else _arrival
        return (holding, heapq.merge(self.waiting, async_kv[0], key=key))

    def _waits(self, request: Request) -> bool:
        """Whether a request is (still) in one of vLLM's waiting queues. One whose grammar is
        still compiling, or whose KV a connector is loading, waits too: it keeps its place in
        the deadline or uncached order and is passed over until vLLM promotes it."""
        return self.requests.get(request.request_id) is request and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
            RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
            RequestStatus.WAITING_FOR_REMOTE_KVS,
        )

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

    def _lookup(self, request: Request) -> tuple[KVCacheBlocks | None, int, int, bool] | None:
        """A candidate's committed tokens before planning: ``(blocks, hit, external, load)``,
        its local prefix-cache hit plus a KV connector's ``external`` part (``load``: the
        connector loads it asynchronously); ``blocks`` None for a request whose load has landed
        (the KV is in its own blocks). None: the connector cannot tell yet."""
        if request.num_computed_tokens:
            return None, request.num_computed_tokens, 0, False
        blocks, local = self._probe_prefix(request)
        if self.connector is None:
            return blocks, local, 0, False
        found = self._connector_hit(request, blocks, local)
        if found is None:
            return None
        blocks, local, external, load = found
        return blocks, local + external, external, load

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
        candidates: list[Candidate],
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
        for request, _, hit, _ in candidates:
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
                if self._uncached:  # stamped in admission order, after every admitted row
                    stamp = self._admitted_stamp + 1
                row.arrival = last[key] = max(stamp, last.get(key, -1) + 1)
            row.committed = hit
            row.context_committed = False
            row.prompt_length = request.num_tokens
            out.append(row)
        return out

    def _admit(
        self,
        candidate: Candidate,
        n: int,
        new_blocks: dict[str, KVCacheBlocks],
        timestamp: float,
    ) -> int:
        """Allocate an admission's first chunk on top of its committed tokens: the tokens
        scheduled, or 0 to withhold it this step.

        The local prefix is looked up again: allocations earlier in this step may have evicted
        part of the one found before planning (the planned chunk assumed it, so the request waits
        a step), or added to it: vLLM caches a chunk's full blocks as it allocates them, so an
        identical prompt admitted earlier in this step computes them once, and this one only the
        rest of its planned chunk (which still ends where the plan ended it), as vLLM's own
        schedule() deduplicates prompts admitted together. With a KV connector, whose part of
        the hit continues the local one, that holds only while it has no part after the grown
        one (it is asked again, as vLLM asks it at the lookup that admits)."""
        request, blocks, hit, external = candidate
        manager = self.kv_cache_manager
        local = hit - external
        if blocks is None:  # a connector's load has landed in the request's own blocks
            allocated = manager.allocate_slots(
                request,
                n,
                num_lookahead_tokens=self.num_lookahead_tokens,
                full_sequence_must_fit=self.scheduler_reserve_full_isl,
                has_scheduled_reqs=bool(self.running),
            )
        else:
            if manager.enable_caching:  # (a local hit implies it)
                blocks, found = self._prefix_hit(request)
                if found != local:
                    end = hit + n  # a block boundary, or the prompt's end
                    # A connector's hit continues the local one it was asked with: a grown one
                    # is asked of it again, and admitted only if it adds nothing after it.
                    if (
                        found < local
                        or found >= end
                        or external
                        or not self._connector_adds_nothing(request, found)
                    ):
                        self.stepplanner_stats.stale_prefix_rows += 1
                        return 0
                    self.stepplanner_stats.shared_prefix_rows += 1
                    hit = local = found
                    n = end - found
            allocated = manager.allocate_slots(
                request,
                n,
                num_new_computed_tokens=local,
                new_computed_blocks=blocks,
                num_lookahead_tokens=self.num_lookahead_tokens,
                num_external_computed_tokens=external,
                full_sequence_must_fit=self.scheduler_reserve_full_isl,
                has_scheduled_reqs=bool(self.running),
            )
        if allocated is None:
            return 0
        if self.connector is not None:
            # Told of every admission's blocks, as vLLM does (a connector saving KV tracks them).
            self._after_alloc(
                request, external, 0 if blocks is None else request.num_tokens - local
            )
            self._sync_kv_loads = self._sync_kv_loads or external > 0
        if blocks is not None:
            self._record_hit(request, local, external)
        self.running.append(request)
        request.num_computed_tokens = hit
        if self.log_stats:
            request.record_event(EngineCoreEventType.SCHEDULED, timestamp)
        if hit + n < request.num_tokens:
            self._inflight_prefills.add(request)
        if self.connector is not None:
            self._admitted_with_connector(request)
        new_blocks[request.request_id] = manager.get_blocks(request.request_id)
        return n

    def _leave_waiting(self, admitted: list[Request]) -> None:
        """Take admitted requests out of vLLM's waiting queue. They are nearly always its head,
        in its order, and popping the head is cheap (what vLLM's own schedule() does), while
        removing from inside the PRIORITY queue's heap rebuilds it: a comparison per waiting
        request, a tenth of a step at B = 256 with a long queue."""
        waiting = self.waiting
        rest = set(admitted)
        for queue in self._kv_waiting_queues:  # read first: their heads
            while rest and queue and queue.peek_request() in rest:
                rest.discard(queue.pop_request())
        while rest and waiting and waiting.peek_request() in rest:
            rest.discard(waiting.pop_request())
        if rest:
            waiting.remove_requests(rest)
            for queue in self._kv_waiting_queues:
                queue.remove_requests(rest)
        self.deferred_waiting.difference_update(admitted)

    def _victim(self, victims: list[Request]) -> Request:
        """The running request a recompute preemption takes: vLLM's own rule, the last in the
        policy's order, or with ``kv_preemption: "least-work"`` the ledgers' rule
        (``least_work_victim``): the fewest computed tokens lost, never a class
        ``never_relegate_below`` protects while another will do."""
        if not self._least_work:
            return max(victims, key=self._order_key)
        pick, _ = least_work_victim(
            [r.num_computed_tokens for r in victims],
            [r.priority < self._never_below for r in victims],
            [self._order_key(r) for r in victims],
        )
        return victims[pick]

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
