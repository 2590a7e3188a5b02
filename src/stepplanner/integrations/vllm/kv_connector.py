"""KV connectors (disaggregated prefill/decode, KV offloading): external prefix hits committed
before planning, asynchronous loads started and waited for, and the connector's hooks called
where vLLM's own ``schedule()`` calls them. Finished loads and sends, failed loads, invalid
blocks and delayed block frees are vLLM's own ``update_from_output``'s and ``_free_request``'s.

What the plan sees: a request whose prompt a connector can supply is an admission whose
committed tokens are its local hit plus the connector's (``get_num_new_matched_tokens``), so its
first chunk ends on a page as after a local hit; one whose KV loads asynchronously is no row at
all until the load has landed (it takes no slot and no budget, as in vLLM), then an admission
whose committed tokens are the loaded ones. Loads start after the plan's allocations, in queue
order (docs/integrations.md, "KV connectors").
"""

from __future__ import annotations

from typing import Any, NamedTuple

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import KVConnectorBlockState, SchedulerOutput
from vllm.v1.metrics.stats import KV_FETCH_IN_PROGRESS, KV_FETCH_WAITING_TO_START
from vllm.v1.request import Request, RequestStatus

from . import _compat


class Load(NamedTuple):
    """An asynchronous load to start: the request, its local prefix hit (blocks and tokens) and
    the connector's part after it."""

    request: Request
    blocks: KVCacheBlocks
    local: int
    external: int


class KVConnectors(AsyncScheduler):
    """``StepPlannerScheduler``'s part that meets vLLM's KV connector (``self.connector``)."""

    _sync_kv_loads: bool  # a request admitted this step loads its external hit in the step
    # vLLM's queues of waiting requests besides `waiting` (_compat.kv_waiting_queues): the
    # requests holding KV blocks, then (0.34) those that may load asynchronously.
    _kv_waiting_queues: list[Any]

    def _connector_hit(
        self, request: Request, blocks: KVCacheBlocks, local: int
    ) -> tuple[KVCacheBlocks, int, int, bool] | None:
        """The connector's part of a waiting request's prefix, as vLLM's ``schedule()`` asks for
        it: ``(blocks, local, external, load_async)``, or None when the connector cannot tell yet
        (the request is passed over this step)."""
        connector = self.connector
        partial = local % self.block_size
        aligned = local - partial
        external, load_async = connector.get_num_new_matched_tokens(request, aligned)
        if _compat.skips_external_kv(request):
            external, load_async = 0, False
        if external is None:
            return None
        if partial and external > partial:
            # A longer remote hit supersedes the local hit's part-block tail (vLLM's rule: no
            # copy-on-write of that block while the load writes it).
            blocks = self.kv_cache_manager.truncate_computed_blocks(blocks, aligned)
            local = aligned
        elif partial:
            external, load_async = 0, False
        load_async = load_async and external > 0
        self._set_kv_fetch_stage(request, KV_FETCH_WAITING_TO_START if load_async else None)
        return blocks, local, external, load_async

    def _connector_adds_nothing(self, request: Request, local: int) -> bool:
        """Whether the connector, asked again with a local hit that grew in the step, has no
        tokens after it (always, without a connector)."""
        if self.connector is None:
            return True
        found = self._connector_hit(request, self.kv_cache_manager.empty_kv_cache_blocks, local)
        return found is not None and found[2] == 0

    def _after_alloc(self, request: Request, external: int, queries: int) -> None:
        """The connector told of an admission's or a load's blocks, and the ``queries`` tokens
        it was asked for counted with its hit (none for a landed load's admission: no lookup)."""
        connector = self.connector
        connector.update_state_after_alloc(
            request, self.kv_cache_manager.get_blocks(request.request_id), external
        )
        stats = self.connector_prefix_cache_stats
        if stats is not None and queries:
            preempted = request.num_preemptions > 0
            stats.record(
                num_tokens=queries,
                num_hits=external,
                preempted=preempted,
                hits_by_source=(
                    connector.get_external_cache_hit_sources(request, external)
                    if external and not preempted
                    else None
                ),
            )

    def _record_hit(self, request: Request, local: int, external: int) -> None:
        """A looked-up request's prefix hit counted, once it is allocated (vLLM counts no
        lookup that did not lead to an allocation), and its first prefill's stats."""
        self.kv_cache_manager.record_prefix_cache_stats(request, local)
        if request.prefill_stats and request.num_preemptions <= 0:
            request.prefill_stats.set(
                num_prompt_tokens=request.num_prompt_tokens,
                num_local_cached_tokens=local,
                num_external_cached_tokens=external,
            )

    def _start_loads(self, loads: list[Load]) -> None:
        """Start the asynchronous loads the step's lookups asked for, in queue order: blocks for
        the whole hit, the connector told, the request in ``WAITING_FOR_REMOTE_KVS`` among the
        waiting requests that hold blocks until vLLM's ``update_from_output`` reports the load
        finished. A load that does not fit, or is past 0.34's ``max_num_inflight_kv_loads``, waits
        for a later step (as in vLLM, the loads behind it too); so does one whose local prefix
        the step's allocations changed (an evicted cached block may hold another request's KV by
        now: the lookup is made again, as vLLM looks up and allocates at once)."""
        manager = self.kv_cache_manager
        started: list[Request] = []
        for request, blocks, local, external in loads:
            if not _compat.admits_inflight_kv_load(self):
                break
            if manager.enable_caching:
                blocks, found, _ = manager.get_computed_blocks(request)
                if found != local:
                    break
            reserved = self._inflight_prefill_reserved_blocks() + self._spec_decode_step_blocks
            allocated = manager.allocate_slots(
                request,
                0,
                num_new_computed_tokens=local,
                new_computed_blocks=blocks,
                # Drafts' lookahead slots come once the KV has landed (vLLM's rule: the
                # remote and local block counts must match for the load).
                num_lookahead_tokens=0,
                num_external_computed_tokens=external,
                delay_cache_blocks=True,
                skip_zeroing_group_ids=self.connector.get_loaded_kv_cache_group_ids(request),
                full_sequence_must_fit=self.scheduler_reserve_full_isl,
                reserved_blocks=reserved,
                has_scheduled_reqs=bool(self.running),
            )
            if allocated is None:
                break
            self._after_alloc(request, external, request.num_tokens - local)
            self._record_hit(request, local, external)
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            # vLLM's count until the load reports back (update_from_output corrects it).
            request.num_computed_tokens = local + external
            _compat.park_load(self, request)
            self._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)
            # One from the requests holding blocks (its failed load gave them up) keeps its
            # place there, as in vLLM.
            if request not in self.kv_holding_waiting:
                started.append(request)
        if started:
            # Out of the queue they waited in, to the end of the requests holding KV blocks
            # (where vLLM's schedule() leaves them: it drains that queue before starting a load,
            # so whatever it passed over there stays ahead).
            taken = set(started)
            self.waiting.remove_requests(taken)
            for queue in self._kv_waiting_queues[1:]:
                queue.remove_requests(taken)
            for request in started:
                self.kv_holding_waiting.add_request(request)
            self.deferred_waiting.update(started)

    def _admitted_with_connector(self, request: Request) -> None:
        """An admission's bookkeeping that only a connector's requests have (0.34's parked load
        reservation, the fetch stage)."""
        _compat.unpark_load(self, request)
        self._set_kv_fetch_stage(request, None)

    def _can_preempt(self, victim: Request) -> bool:
        """Whether recompute-preempting ``victim`` can free blocks now: not while the connector
        still holds blocks it will free (a send in flight), nor while a step that may still write
        the victim's blocks runs (vLLM's deferred frees, with a KV-consumer connector and
        overlapping steps)."""
        if self.connector is not None and self.connector.has_pending_block_frees():
            return False
        return bool(self._request_blocks_can_be_freed(victim))

    def _connector_output(self, output: SchedulerOutput, boundary: dict[str, Any]) -> None:
        """The connector's part of the step's output: its metadata, built from the step's block
        state as vLLM's ``schedule()`` builds it; and the fence of deferred frees advanced."""
        if self.connector is not None:
            ids = set(output.num_scheduled_tokens)
            ids.update(rid for rid in boundary if rid in self.requests)
            output.kv_connector_block_state = KVConnectorBlockState(
                req_ids=ids,
                resolve_block_ids=self.kv_cache_manager.get_block_ids,
                boundary_state_offloads=boundary,
            )
            output.kv_connector_metadata = self._build_kv_connector_meta(self.connector, output)
            # Connector-only state: never dispatched to the workers.
            output.kv_connector_block_state = None
        if self.defer_block_free and output.total_num_scheduled_tokens > 0:
            self.sched_step_seq += 1
