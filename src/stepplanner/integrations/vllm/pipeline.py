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

    def _settled(self) -> list[Request]:
        """Running requests no step in flight holds. Only pipeline parallelism schedules with
        steps in flight and no placeholders (async scheduling plans ahead through them, and
        one step at a time leaves none in flight), so elsewhere that is every running request."""
        running: list[Request] = self.running
        return [r for r in running if not r.num_in_flight_tokens] if self._pipelined else running
