"""stepplanner as vLLM's v1 scheduler.

``vllm serve ... --scheduler-cls stepplanner.integrations.vllm.StepPlannerScheduler``.

``StepPlannerScheduler`` subclasses vLLM's ``AsyncScheduler`` and replaces only ``schedule()``:
every per-step decision (who decodes, which prompt gets a chunk of how many tokens, who is paused,
who is admitted) comes from ``StepPlanner.plan()``. vLLM's KV cache manager, prefix caching,
request queues, ``SchedulerOutput`` construction, output placeholders, ``update_from_output`` and
``finish_requests`` are vLLM's own. It runs with async scheduling on (vLLM's default: step N+1 is
scheduled while step N runs) and off. The mapping, and where vLLM's contract forced a choice, is
in docs/integrations.md ("vLLM").

Options come from ``--additional-config '{"stepplanner": {...}}'``: keys are ``SchedulingOptions``
fields, enum values as the CLI spells them (``"priority"``, ``"deadline"``, ``"pause"``,
``"prefill-first"``), and ``"slo_classes"``: ``{"<priority>": {"ttft": s, "tpot": s}}``, the
objectives of each priority class in seconds. A request's own objectives come from its
``SamplingParams.extra_args`` (``{"ttft_slo": s, "tpot_slo": s}``; ``vllm_xargs`` in the OpenAI
API). Under ``"edf"``/``"deadline"`` each step ranks the rows with ``stepplanner.ledger.Ranker`` at
``now`` = ``time.time()``, the clock of vLLM's ``Request.arrival_time``, and admits waiting
requests in first-token-deadline order.
B = ``max_num_seqs``, P = ``block_size``, S_in = ``max_model_len``, ``max_step_tokens`` =
``max_num_batched_tokens``.

vLLM's scheduler interface is private and changes between releases, so this package runs only on
the releases it is tested with, vLLM 0.32.x to 0.34.x (``SUPPORTED_VLLM_VERSIONS``), and says so
otherwise; what differs between them is in ``_compat``, named for what differs.

One module per concern (docs/integrations.md, "vLLM's features", names the features):

- ``scheduler``: ``StepPlannerScheduler``, the facade: start-up, requests in and out, the step
- ``config``: options, limits, SLO classes and relegation from ``VllmConfig``; the refusals
- ``requests``: vLLM's requests as the planner's rows, admission candidates, prefix hits
- ``outputs``: vLLM's ``SchedulerOutput`` from the step's decisions
- ``deadlines``: EDF and DEADLINE: the ranker's columns, the deadline-ordered waiting queue,
  relegation and hand-back
- ``uncached``: uncached work first: the waiting requests by the prompt work their prefix hit
  leaves, with a starvation bound
- ``spec_decode``: speculative decoding, proposed and scheduled drafts
- ``lora``: LoRA adapter slots
- ``pipeline``: pipeline parallelism's steps in flight
- ``kv_connector``: KV connectors: external prefix hits, asynchronous loads, the connector's hooks
- ``_compat``: the supported vLLM releases and what differs between them
"""

from __future__ import annotations

# First, before any of vLLM's modules (``_compat`` sorts first): the version check.
from ._compat import SUPPORTED_VLLM_VERSIONS
from .config import (
    limits_from_config,
    options_from_config,
    request_slo,
    slo_classes_from_config,
)
from .scheduler import StepPlannerScheduler, StepPlannerStats, StepRecord

__all__ = [
    "SUPPORTED_VLLM_VERSIONS",
    "StepPlannerScheduler",
    "StepPlannerStats",
    "StepRecord",
    "limits_from_config",
    "options_from_config",
    "request_slo",
    "slo_classes_from_config",
]
