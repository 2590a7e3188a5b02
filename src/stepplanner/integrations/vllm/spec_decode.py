"""Speculative decoding (SPEC §8): each decode row's proposed drafts into the plan, and the drafts
the plan grants into vLLM's ``scheduled_spec_decode_tokens``. The drafting methods that need
extra slots per request are refused (``config.unsupported_features``)."""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request

from ...core import ResidentState


class SpecDecode(AsyncScheduler):
    """``StepPlannerScheduler``'s drafts, proposed and scheduled."""

    _last_scheduled: set[str]  # the previous step's rows (its drafts are valid under async)

    def _proposed_drafts(self, running: list[Request], residents: list[ResidentState]) -> list[int]:
        """Each row's proposed drafts (SPEC §8): a decoding request's ``spec_token_ids``, at
        most as many as fit before max_model_len (vLLM's own cut); admissions propose none.

        Under async scheduling vLLM holds a request's drafts on the device and the scheduler
        sees placeholders, valid only for a request the previous step ran: one that step left
        out (paused, withheld) has none, or the worker would verify stale placeholders
        (vLLM's own scheduler leaks them, vllm#36906)."""
        out = [0] * len(residents)
        max_len = self.max_model_len
        for i, request in enumerate(running):
            proposed = request.spec_token_ids
            if not proposed:
                continue
            if self._async_scheduling and request.request_id not in self._last_scheduled:
                request.spec_token_ids = []
                continue
            if residents[i].context_committed:
                out[i] = min(len(proposed), max(max_len - request.num_computed_tokens - 2, 0))
        return out

    def _scheduled_drafts(
        self, scheduled_running: list[Request], num_scheduled: dict[str, int]
    ) -> dict[str, list[int]]:
        """vLLM's ``scheduled_spec_decode_tokens`` for the decode rows: the leading drafts a
        row verifies (its tokens beyond the one after ``committed``); as vLLM's ``schedule()``
        does, a scheduled request's proposals are then used up, and the step's rows are the
        ones whose drafts the next step may verify."""
        spec: dict[str, list[int]] = {}
        drafts = 0
        for request in scheduled_running:
            rid = request.request_id
            k = (
                num_scheduled[rid]
                + request.num_computed_tokens
                - request.num_tokens
                - request.num_output_placeholders
            )
            if k > 0 and request.spec_token_ids:
                spec[rid] = request.spec_token_ids[:k]
                drafts += len(spec[rid])
            request.spec_token_ids = []
        self.stepplanner_stats.draft_tokens += drafts
        self._last_scheduled = set(num_scheduled)
        return spec
