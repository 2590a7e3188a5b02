"""Pipeline parallelism without async scheduling: EngineCore keeps up to
``pipeline_parallel_size`` steps in flight, and a request is planned into one of them at a time
(vLLM counts each request's tokens in flight: ``num_in_flight_tokens``). With async scheduling it
is refused (``config.unsupported_features``)."""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request


def pipelined(vllm_config: VllmConfig, async_scheduling: bool) -> bool:
    """Whether steps run in flight with no placeholders: pipeline stages, async scheduling off."""
    return not async_scheduling and vllm_config.max_concurrent_batches > 1


class PipelineSteps(AsyncScheduler):
    """``StepPlannerScheduler``'s part that knows which requests a step in flight holds."""

    _pipelined: bool  # pipelined(): set by StepPlannerScheduler.__init__
    _async_scheduling: bool  # set by StepPlannerScheduler.__init__

    def _settled(self) -> list[Request]:
        """Running requests no step in flight holds. With async scheduling off, a step in
        flight holds its requests until its output is back: under pipeline parallelism
        EngineCore keeps several steps in flight, and any caller may call schedule() again
        before update_from_output (vLLM's own tests do; vLLM then schedules the other requests),
        so a request is planned into one step at a time. Async scheduling plans ahead through
        a step in flight with placeholders instead: there every running request is settled."""
        running: list[Request] = self.running
        if self._async_scheduling:
            return running
        return [r for r in running if not r.num_in_flight_tokens]
