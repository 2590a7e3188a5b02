"""vLLM's ``SchedulerOutput`` for a step's decisions: the tail of vLLM's own ``schedule()``."""

from __future__ import annotations

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

from . import _compat
from .kv_connector import KVConnectors


class OutputBuilder(KVConnectors):
    """``StepPlannerScheduler``'s part that turns its decisions into vLLM's output."""

    def _make_output(
        self,
        num_scheduled: dict[str, int],
        new_blocks: dict[str, KVCacheBlocks],
        scheduled_running: list[Request],
        new_reqs: list[Request],
        resumed: list[Request],
        spec: dict[str, list[int]],
    ) -> SchedulerOutput:
        """vLLM's SchedulerOutput for these decisions (the tail of vLLM's own schedule())."""
        total = sum(num_scheduled.values())
        if total > 0:
            _compat.count_executed_step(self)
        new_reqs_data, cached = _compat.request_data(
            self, new_reqs, resumed, scheduled_running, num_scheduled, spec, new_blocks
        )
        boundary = self.kv_cache_manager.take_boundary_state_offloads()
        copies, cow_retained = self.kv_cache_manager.take_kv_cache_block_copies()
        if copies:
            self._free_cow_retained_blocks(cow_retained, self.sched_step_seq + 1)
        output = SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=total,
            scheduled_spec_decode_tokens=spec,
            scheduled_encoder_inputs={},
            preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=self.encoder_cache_manager.get_freed_mm_hashes(),
            new_block_ids_to_zero=self._get_new_block_ids_to_zero(),
            kv_cache_block_copies=copies or None,
            num_spec_tokens_to_schedule=self.num_spec_tokens,
            has_sync_kv_loads=self._sync_kv_loads,
            **_compat.output_fields(self, num_scheduled, new_reqs_data),
        )
        self._connector_output(output, boundary)
        self._update_after_schedule(output)
        return output
