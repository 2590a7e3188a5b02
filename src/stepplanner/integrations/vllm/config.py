"""The adapter's configuration: ``SchedulingOptions``, limits, SLO classes and relegation from
vLLM's ``VllmConfig`` (``--additional-config '{"stepplanner": {...}}'``), a request's own
objectives, and the refusals: the vLLM features and request options whose per-step work the
planner does not model (docs/integrations.md, "vLLM's features").
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import reprlib
from collections.abc import Iterator, Mapping
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from ..._errors import StepPlannerOverflowError, StepPlannerTypeError, StepPlannerValueError
from ...core import (
    SLO,
    IfbSchedulingMode,
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlannerLimits,
)
from ...ledger._shared import (
    AdmissionArgs,
    AdmissionOrder,
    check_admission_args,
    check_relegation_args,
)
from ...planner._fields import as_enum
from ...planner._slo import check_slo_classes
from . import _compat

CONFIG_KEY = "stepplanner"
SLO_CLASSES_KEY = "slo_classes"  # in additional_config["stepplanner"]
# The ledger's relegation options (docs/scheduling.md, "Overload"), also in it.
RELEGATION_KEYS = ("relegated_wait", "never_relegate_below")
KV_PREEMPTION_KEY = "kv_preemption"  # the recompute-preemption victim rule
# The ledgers' admission order and its starvation bound (docs/scheduling.md, "Uncached work
# first"): "admission": "arrival" | "uncached-first", with "starvation_steps" or
# "starvation_seconds".
ADMISSION_KEYS = ("admission", "starvation_steps", "starvation_seconds")
# vLLM's own (the last running request in the policy's order) or the least computed work lost,
# never a class never_relegate_below protects while another will do (ledger._shared's rule).
VICTIM_RULES = ("vllm", "least-work")
SLO_ARGS = ("ttft_slo", "tpot_slo")  # in SamplingParams.extra_args, seconds
RANKED = (SchedulingPolicy.EDF, SchedulingPolicy.DEADLINE)
_ENUM_FIELDS = {
    "ifb_scheduling_mode": IfbSchedulingMode,
    "scheduling_policy": SchedulingPolicy,
    "preemption": PreemptionMode,
}
_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulingOptions))
_OTHER_KEYS = (SLO_CLASSES_KEY, *RELEGATION_KEYS, KV_PREEMPTION_KEY, *ADMISSION_KEYS)
INT32_MAX = 2**31 - 1


def options_from_config(vllm_config: VllmConfig) -> SchedulingOptions:
    """``SchedulingOptions`` from ``additional_config["stepplanner"]`` and vLLM's own policy.

    ``scheduling_policy`` defaults to vLLM's ``--scheduling-policy`` (the waiting queue is
    vLLM's and is ordered by it); naming a different one is an error, but for ``"edf"`` and
    ``"deadline"``, which admit in first-token-deadline order under either. When
    ``max_num_tokens`` is not given, the step budget is vLLM's ``max_num_batched_tokens``
    rounded down to a block.
    """
    values: dict[str, Any] = {}
    for key, value in _stepplanner_config(vllm_config).items():
        if key in _OTHER_KEYS:
            continue  # slo_classes_, relegation_, victim_rule_ and admission_from_config
        if key not in _OPTION_FIELDS:
            raise StepPlannerValueError(
                f'additional_config["{CONFIG_KEY}"]: key {key!r} is not known; '
                "allowed: " + ", ".join(_OPTION_FIELDS + _OTHER_KEYS)
            )
        with named_in_config():
            values[key] = (
                as_enum(key, value, _ENUM_FIELDS[key])
                if key in _ENUM_FIELDS
                else _strict_int(key, value)
            )
    vllm_policy = SchedulingPolicy[str(vllm_config.scheduler_config.policy).upper()]
    given = values.setdefault("scheduling_policy", vllm_policy)
    if given != vllm_policy and given not in RANKED:
        raise StepPlannerValueError(
            f'additional_config["{CONFIG_KEY}"]: scheduling_policy={given.name.lower()!r} differs '
            f"from vLLM's --scheduling-policy {vllm_policy.name.lower()!r}; allowed: the same "
            "policy (vLLM orders its waiting queue by it, and admission follows that queue), "
            "'edf' or 'deadline' (they admit in first-token-deadline order)"
        )
    with named_in_config():
        return SchedulingOptions(**values)


def _stepplanner_config(vllm_config: VllmConfig) -> Mapping[str, Any]:
    raw = (vllm_config.additional_config or {}).get(CONFIG_KEY, {})
    if not isinstance(raw, Mapping):
        raise StepPlannerTypeError(
            f'additional_config["{CONFIG_KEY}"] must be an object of SchedulingOptions '
            f"fields, got {type(raw).__name__} {raw!r}"
        )
    return raw


def victim_rule_from_config(vllm_config: VllmConfig) -> str:
    """Which running request a recompute preemption takes when KV blocks run out:
    ``additional_config["stepplanner"]["kv_preemption"]``, ``"vllm"`` (absent: vLLM's own rule)
    or ``"least-work"``."""
    rule = _stepplanner_config(vllm_config).get(KV_PREEMPTION_KEY, "vllm")
    if rule not in VICTIM_RULES:
        raise StepPlannerValueError(
            f'additional_config["{CONFIG_KEY}"]: {KV_PREEMPTION_KEY}={rule!r} is not a victim '
            f"rule; allowed: {', '.join(repr(r) for r in VICTIM_RULES)}"
        )
    return str(rule)


def admission_from_config(vllm_config: VllmConfig) -> AdmissionArgs:
    """The admission order and its starvation bound, checked as the ledgers check them:
    ``additional_config["stepplanner"]["admission"]``, ``"arrival"`` (absent: vLLM's queue order)
    or ``"uncached-first"`` with exactly one of ``"starvation_steps"`` (schedule() calls) and
    ``"starvation_seconds"`` (on vLLM's clock, from each request's ``arrival_time``)."""
    config = _stepplanner_config(vllm_config)
    with named_in_config():
        order = as_enum("admission", config.get("admission", "arrival"), AdmissionOrder)
        return check_admission_args(
            order, config.get("starvation_steps"), config.get("starvation_seconds")
        )


def relegation_from_config(vllm_config: VllmConfig) -> dict[str, Any]:
    """The ``Ranker``'s relegation options from ``additional_config["stepplanner"]``:
    ``relegated_wait`` (seconds; absent or null: each request's own TTFT objective) and
    ``never_relegate_below`` (a priority class; absent: 0, the urgent classes), checked as the
    ledger checks them."""
    config = _stepplanner_config(vllm_config)
    options = {key: config[key] for key in RELEGATION_KEYS if key in config}
    with named_in_config():
        check_relegation_args(options.get("relegated_wait"), options.get("never_relegate_below", 0))
    return options


def slo_classes_from_config(vllm_config: VllmConfig) -> dict[int, SLO]:
    """The objectives per priority class: ``additional_config["stepplanner"]["slo_classes"]``,
    ``{"<priority>": {"ttft": seconds, "tpot": seconds}}`` (keys strings, as JSON has them, or
    ints; ``tpot`` optional). A request without objectives of its own gets its class's."""
    raw = _stepplanner_config(vllm_config).get(SLO_CLASSES_KEY)
    where = f'additional_config["{CONFIG_KEY}"]: {SLO_CLASSES_KEY}'
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise StepPlannerTypeError(
            f'{where} must be an object {{"<priority>": {{"ttft": seconds, '
            f'"tpot": seconds}}}}, got {type(raw).__name__} {raw!r}'
        )
    classes: dict[Any, SLO] = {}
    for key, value in raw.items():
        priority = int(key) if isinstance(key, str) and re.fullmatch(r"[+-]?[0-9]+", key) else key
        if priority in classes:
            raise StepPlannerValueError(f"{where}: priority {priority} is given twice")
        if not isinstance(value, Mapping):
            raise StepPlannerTypeError(
                f'{where}["{key}"] must be an object {{"ttft": seconds, '
                f'"tpot": seconds}}, got {type(value).__name__} {value!r}'
            )
        unknown = sorted(set(value) - {"ttft", "tpot"}, key=str)
        if unknown or "ttft" not in value:
            raise StepPlannerValueError(
                f'{where}["{key}"]: '
                + (f"key {unknown[0]!r} is not known" if unknown else '"ttft" is missing')
                + '; allowed: "ttft" (seconds to '
                'the first token, required) and "tpot" (seconds per token after it)'
            )
        try:
            classes[priority] = SLO(value["ttft"], value.get("tpot"))
        except (TypeError, ValueError, OverflowError) as exc:
            given = {field: value[field] for field in ("ttft", "tpot") if field in value}
            raise _too_large(f'{where}["{key}"]', given) or type(exc)(
                f'{where}["{key}"]: {exc}'
            ) from None
    try:  # the keys: int32 priorities
        return check_slo_classes(classes)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def request_slo(request: Request) -> SLO | None:
    """A request's own objectives, from its ``SamplingParams.extra_args``: ``ttft_slo`` and
    optionally ``tpot_slo``, in seconds; ``None`` when it gives neither."""
    params = request.sampling_params
    args = None if params is None else params.extra_args
    if not isinstance(args, Mapping) or not any(key in args for key in SLO_ARGS):
        return None
    given = {key: args[key] for key in SLO_ARGS if key in args}
    shown = reprlib.repr(given)  # a client's values, bounded: they go into the error message
    if "ttft_slo" not in args:
        raise StepPlannerValueError(
            f"SamplingParams.extra_args {shown}: tpot_slo needs ttft_slo (token i is due ttft_slo "
            "+ i * tpot_slo after arrival); allowed: ttft_slo > 0 seconds, optionally tpot_slo > 0"
        )
    try:
        return SLO(args["ttft_slo"], args.get("tpot_slo"))
    except (TypeError, ValueError, OverflowError) as exc:
        where = f"SamplingParams.extra_args {shown}"
        raise _too_large(where, given) or type(exc)(
            f"{where}: {exc} (ttft as ttft_slo, tpot as tpot_slo)"
        ) from None


def _too_large(where: str, given: Mapping[str, object]) -> OverflowError | None:
    """The error for a number no float holds (a JSON integer of 400 digits), naming the field
    that holds it, the first of ``given``, whatever ``SLO`` raised for it and however long its
    message; ``None`` when every number fits."""
    for field, value in given.items():
        if _overflows(value):
            return StepPlannerOverflowError(
                f"{where}: {field}={reprlib.repr(value)} is out of range (no float holds it); "
                "allowed: a finite number of seconds > 0"
            )
    return None


def _overflows(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        float(value)
    except OverflowError:
        return True
    return False


@contextlib.contextmanager
def named_in_config() -> Iterator[None]:
    """A TypeError, ValueError or OverflowError raised inside starts with where the value was
    given: additional_config["stepplanner"]."""
    try:
        yield
    except (TypeError, ValueError, OverflowError) as exc:
        raise type(exc)(f'additional_config["{CONFIG_KEY}"]: {exc}') from None


def _strict_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StepPlannerTypeError(
            f"{key} must be an integer, got {type(value).__name__} {value!r}"
        )
    return value


def limits_from_config(vllm_config: VllmConfig, block_size: int) -> StepPlannerLimits:
    """B = max_num_seqs, S_in = max_model_len, P = block_size, max_step_tokens = the step buffer."""
    sched = vllm_config.scheduler_config
    step_tokens = sched.max_num_batched_tokens
    if sched.max_num_scheduled_tokens is not None:
        step_tokens = min(step_tokens, sched.max_num_scheduled_tokens)
    try:
        return StepPlannerLimits(
            max_batch_size=sched.max_num_seqs,
            max_input_length=vllm_config.model_config.max_model_len,
            kv_page_size=block_size,
            max_step_tokens=step_tokens,
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise type(exc)(
            f"vLLM's max_num_seqs={sched.max_num_seqs}, max_model_len="
            f"{vllm_config.model_config.max_model_len}, block_size={block_size} and "
            f"max_num_batched_tokens={step_tokens} are stepplanner's max_batch_size, "
            f"max_input_length, kv_page_size and max_step_tokens: {exc}"
        ) from None


def with_vllm_budget(options: SchedulingOptions, limits: StepPlannerLimits) -> SchedulingOptions:
    if options.max_num_tokens or options.ifb_scheduling_mode == IfbSchedulingMode.PREFILL_FIRST:
        return options
    p = limits.kv_page_size
    t_max = min(limits.max_batch_size * limits.max_input_length, limits.max_step_tokens)
    budget = t_max // p * p
    if budget < limits.max_batch_size + p:  # MIXED infeasible: leave it to SPEC §2 rule 2
        return options
    return dataclasses.replace(options, max_num_tokens=budget)


def unsupported_features(vllm_config: VllmConfig) -> list[str]:
    """Features whose per-step work the planner does not model, by the name a user knows."""
    model, sched, par, mamba_cache = (
        vllm_config.model_config,
        vllm_config.scheduler_config,
        vllm_config.parallel_config,
        vllm_config.cache_config.mamba_cache_mode,
    )
    spec = vllm_config.speculative_config
    slots = 0 if spec is None else spec.max_num_new_slots_for_drafting
    checks = [
        (
            slots > 0,
            f"speculative decoding with method {getattr(spec, 'method', None)!r}, which drafts in "
            f"{slots} extra slot(s) per request (the plan counts 1 + drafts per decode row; "
            "ngram, EAGLE, EAGLE3 and MTP need none)",
        ),
        (
            spec is not None and spec.uses_dynamic_speculative_decoding(),
            "dynamic speculative decoding (num_speculative_tokens_per_batch_size)",
        ),
        (
            spec is not None and par.pipeline_parallel_size > 1,
            "speculative decoding with pipeline parallelism (not tested; vLLM's own sync path "
            "counts a row's drafts in flight as tokens to schedule again)",
        ),
        (
            model.is_hybrid and vllm_config.kv_transfer_config is not None,
            "KV connectors with a hybrid Mamba/attention model (the connector's hit and the "
            "Mamba state's checkpoints are not planned together)",
        ),
        (
            vllm_config.ec_transfer_config is not None,
            "encoder-cache connectors (ec_transfer_config)",
        ),
        (
            par.pipeline_parallel_size > 1 and bool(sched.async_scheduling),
            "pipeline parallel with async scheduling (the V2 model runner's decode cadence; "
            "with --no-async-scheduling, vLLM's default for the V1 model runner, it is planned)",
        ),
        (
            par.decode_context_parallel_size > 1 or par.prefill_context_parallel_size > 1,
            "context parallel (decode/prefill_context_parallel_size > 1)",
        ),
        (
            model.supports_multimodal_inputs or model.is_encoder_decoder,
            "multimodal encoder budgets (a multimodal or encoder-decoder model)",
        ),
        (
            model.runner_type == "pooling" or model.is_diffusion,
            "pooling and diffusion models (no sampled token per step)",
        ),
        (
            not sched.enable_chunked_prefill,
            "disabled chunked prefill (the planner chunks prompts; keep --enable-chunked-prefill)",
        ),
        (
            sched.long_prefill_token_threshold > 0,
            "long_prefill_token_threshold (use the stepplanner option max_chunk_tokens)",
        ),
        (sched.prefill_schedule_interval > 1, "prefill_schedule_interval > 1 (prefill cadence)"),
        # A hybrid model without prefix caching (mamba_cache_mode "none", vLLM's default then) is
        # planned: vLLM's schedule() has no Mamba rule for it, the state is updated in place.
        # With prefix caching ("align") vLLM ends a prompt's chunks where Mamba state is
        # checkpointed, the prompt's last whole block among them, which a final chunk does not.
        (
            model.is_hybrid and mamba_cache != "none",
            "hybrid Mamba/attention models with prefix caching (mamba_cache_mode "
            f"{mamba_cache!r}: vLLM ends prompt chunks at the "
            "Mamba state checkpoints; run them with --no-enable-prefix-caching)",
        ),
        (
            model.is_hybrid and spec is not None,
            "speculative decoding with a hybrid Mamba/attention model (the Mamba state's draft "
            "slots are not planned)",
        ),
        (
            vllm_config.aux_output_config.enabled,
            "routed-experts auxiliary outputs (--enable-return-routed-experts: vLLM caps each "
            "prefix hit at the outputs it retains and sends their connector metadata every "
            "step, neither of which the planner's admission does)",
        ),
    ]
    return [name for bad, name in checks if bad]


def late_unsupported_features(scheduler: Scheduler) -> list[str]:
    """The features only vLLM's scheduler state shows, once its ``__init__`` has run."""
    return [
        name
        for bad, name in (
            # Mamba layers outside a hybrid model: a hybrid one reaches here only without prefix
            # caching (unsupported_features refused the rest), and is planned.
            (
                scheduler.has_mamba_layers and not scheduler.vllm_config.model_config.is_hybrid,
                "Mamba state caching (a hybrid KV cache config)",
            ),
            (scheduler.prefix_replay_tokens > 0, "prefix replay windows (sliding-window replay)"),
            # HiSparse: a connector's load into a reused page waits for the steps in flight
            # (vLLM's deferred loads), which the adapter does not start.
            (
                _compat.defers_async_loads(scheduler),
                "HiSparse KV offloading with a KV-consumer connector (deferred loads)",
            ),
            # EAGLE-family drafters read 1 token ahead, which no chunk end can cut short.
            (scheduler.num_prefill_lookahead > 1, "multi-module MTP prefill lookahead"),
        )
        if bad
    ]


def refuse(unsupported: list[str]) -> None:
    """Stop vLLM at start-up naming the unsupported features, if any."""
    if unsupported:
        raise StepPlannerValueError(
            "StepPlannerScheduler does not support "
            + "; ".join(unsupported)
            + ": the planner does not model their per-step work"
        )


def unsupported_request(request: Request) -> str | None:
    """The request option the adapter refuses (that request alone finishes with an error)."""
    if request.resumable:
        return "streaming-input sessions"
    if request.mm_features:
        # Multimodal models are refused at start-up; a text model's engine never makes such a
        # request (vLLM's input processor refuses images for it), but the plan has no encoder
        # budget to schedule its inputs with, so one that gets here fails rather than run blind.
        return "multimodal inputs"
    if not -(2**31) <= request.priority <= INT32_MAX:
        return f"priority={request.priority} (allowed: an int32)"
    return None
