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

vLLM's scheduler interface is private and changes between releases, so this module runs only on
the releases it is tested with, vLLM 0.32.x and 0.33.x (``SUPPORTED_VLLM_VERSIONS``), and says so
otherwise; what differs between them is in ``_vllm_compat``, named for what differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import math
import re
import reprlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# First, before any of vLLM's modules: the version check, and what differs between versions.
from . import _vllm_compat as _compat

SUPPORTED_VLLM_VERSIONS = _compat.SUPPORTED_VLLM_VERSIONS

import numpy as np  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.interface import PauseState  # noqa: E402
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreEventType  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from .._errors import (  # noqa: E402
    StepPlannerOverflowError,
    StepPlannerTypeError,
    StepPlannerValueError,
)
from ..core import (  # noqa: E402
    SLO,
    IfbSchedulingMode,
    PreemptionMode,
    ResidentState,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlan,
    StepPlanner,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from ..ledger import Ranker  # noqa: E402
from ..ledger._shared import AdapterSlots, check_relegation_args  # noqa: E402
from ..planner._fields import as_enum  # noqa: E402
from ..planner._slo import check_slo_classes, due_of, slo_fields  # noqa: E402
from ..planner._types import RESIDENT_DTYPE, orders_by_priority  # noqa: E402

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

CONFIG_KEY = "stepplanner"
SLO_CLASSES_KEY = "slo_classes"  # in additional_config["stepplanner"]
# The ledger's relegation options (docs/scheduling.md, "Overload"), also in it.
RELEGATION_KEYS = ("relegated_wait", "never_relegate_below")
SLO_ARGS = ("ttft_slo", "tpot_slo")  # in SamplingParams.extra_args, seconds
_RANKED = (SchedulingPolicy.EDF, SchedulingPolicy.DEADLINE)
_ENUM_FIELDS = {
    "ifb_scheduling_mode": IfbSchedulingMode,
    "scheduling_policy": SchedulingPolicy,
    "preemption": PreemptionMode,
}
_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulingOptions))
_INT32_MAX = 2**31 - 1
_NS = 1_000_000_000


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
        if key == SLO_CLASSES_KEY or key in RELEGATION_KEYS:
            continue  # slo_classes_from_config, relegation_from_config
        if key not in _OPTION_FIELDS:
            raise StepPlannerValueError(
                f'additional_config["{CONFIG_KEY}"]: key {key!r} is not known; '
                f"allowed: {', '.join(_OPTION_FIELDS + (SLO_CLASSES_KEY, *RELEGATION_KEYS))}"
            )
        with _named_in_config():
            values[key] = (
                as_enum(key, value, _ENUM_FIELDS[key])
                if key in _ENUM_FIELDS
                else _strict_int(key, value)
            )
    vllm_policy = SchedulingPolicy[str(vllm_config.scheduler_config.policy).upper()]
    given = values.setdefault("scheduling_policy", vllm_policy)
    if given != vllm_policy and given not in _RANKED:
        raise StepPlannerValueError(
            f'additional_config["{CONFIG_KEY}"]: scheduling_policy={given.name.lower()!r} differs '
            f"from vLLM's --scheduling-policy {vllm_policy.name.lower()!r}; allowed: the same "
            "policy (vLLM orders its waiting queue by it, and admission follows that queue), "
            "'edf' or 'deadline' (they admit in first-token-deadline order)"
        )
    with _named_in_config():
        return SchedulingOptions(**values)


def _stepplanner_config(vllm_config: VllmConfig) -> Mapping[str, Any]:
    raw = (vllm_config.additional_config or {}).get(CONFIG_KEY, {})
    if not isinstance(raw, Mapping):
        raise StepPlannerTypeError(
            f'additional_config["{CONFIG_KEY}"] must be an object of SchedulingOptions '
            f"fields, got {type(raw).__name__} {raw!r}"
        )
    return raw


def relegation_from_config(vllm_config: VllmConfig) -> dict[str, Any]:
    """The ``Ranker``'s relegation options from ``additional_config["stepplanner"]``:
    ``relegated_wait`` (seconds; absent or null: each request's own TTFT objective) and
    ``never_relegate_below`` (a priority class; absent: 0, the urgent classes), checked as the
    ledger checks them."""
    config = _stepplanner_config(vllm_config)
    options = {key: config[key] for key in RELEGATION_KEYS if key in config}
    with _named_in_config():
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
def _named_in_config() -> Iterator[None]:
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


def _with_vllm_budget(options: SchedulingOptions, limits: StepPlannerLimits) -> SchedulingOptions:
    if options.max_num_tokens or options.ifb_scheduling_mode == IfbSchedulingMode.PREFILL_FIRST:
        return options
    p = limits.kv_page_size
    t_max = min(limits.max_batch_size * limits.max_input_length, limits.max_step_tokens)
    budget = t_max // p * p
    if budget < limits.max_batch_size + p:  # MIXED infeasible: leave it to SPEC §2 rule 2
        return options
    return dataclasses.replace(options, max_num_tokens=budget)


def _unsupported_features(vllm_config: VllmConfig) -> list[str]:
    """Features whose per-step work the planner does not model, by the name a user knows."""
    model, sched, par = (
        vllm_config.model_config,
        vllm_config.scheduler_config,
        vllm_config.parallel_config,
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
        (vllm_config.kv_transfer_config is not None, "KV connectors (kv_transfer_config)"),
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
        (model.is_hybrid, "hybrid Mamba/attention models (state-cache alignment)"),
    ]
    return [name for bad, name in checks if bad]


@dataclasses.dataclass
class StepPlannerStats:
    """Counters since start-up (read them from ``scheduler.stepplanner_stats``)."""

    steps: int = 0
    planned_rows: int = 0
    scheduled_rows: int = 0
    withheld_rows: int = 0  # a planned row whose KV blocks could not be allocated
    stale_prefix_rows: int = 0  # an admission whose cached prefix was evicted before allocation
    paused_rows: int = 0
    recompute_preemptions: int = 0  # nothing could be allocated: the last resident in order
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


class _Deadlines:
    """One request's objectives as the ranker reads them (``Ranker.rank``'s columns)."""

    __slots__ = ("first_due", "gap", "stamp", "relegated", "ttft", "shed_at", "handed_back")

    def __init__(self, first_due: float, gap: float, stamp: int, ttft: float) -> None:
        self.first_due = first_due  # arrival + ttft; inf: no objectives
        self.gap = gap  # tpot; 0: none
        self.stamp = stamp  # arrival order key, as the rows' arrival under FCFS/PRIORITY
        self.relegated = False  # DEADLINE: sticky
        self.ttft = ttft  # inf: no objectives
        self.shed_at = math.inf  # relegated while waiting: when it is handed back
        self.handed_back = False

    def due(self, token: int) -> float:
        """When the request's token ``token`` (0 = the first) is due (its SLO's definition)."""
        return due_of(self.first_due, self.gap, token)


def _lora_id(request: Request) -> int:
    """The request's LoRA adapter (vLLM's ``lora_int_id``), 0 for the base model."""
    lora = request.lora_request
    return lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else 0


class StepPlannerScheduler(AsyncScheduler):
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
        unsupported = _unsupported_features(vllm_config)
        if unsupported:
            raise StepPlannerValueError(
                "StepPlannerScheduler does not support "
                + "; ".join(unsupported)
                + ": the planner does not model their per-step work"
            )
        options = options_from_config(vllm_config)
        slo_classes = slo_classes_from_config(vllm_config)
        relegation = relegation_from_config(vllm_config)
        limits = limits_from_config(vllm_config, block_size)
        with _named_in_config():
            policy = resolve_scheduling_policy(_with_vllm_budget(options, limits), limits)
        super().__init__(
            vllm_config, kv_cache_config, structured_output_manager, block_size, *args, **kwargs
        )
        late = [
            name
            for bad, name in (
                (self.has_mamba_layers, "Mamba state caching (a hybrid KV cache config)"),
                (self.prefix_replay_tokens > 0, "prefix replay windows (sliding-window replay)"),
                # EAGLE-family drafters read 1 token ahead, which no chunk end can cut short.
                (self.num_prefill_lookahead > 1, "multi-module MTP prefill lookahead"),
            )
            if bad
        ]
        if late:
            raise StepPlannerValueError(
                "StepPlannerScheduler does not support "
                + "; ".join(late)
                + ": the planner does not model their per-step work"
            )
        self.stepplanner_limits = limits
        self.stepplanner_policy = policy
        self.planner = StepPlanner(policy, limits)
        self.stepplanner_stats = StepPlannerStats()
        self.last_step = StepRecord({}, [], [], [], [])
        # Called as on_plan(residents, plan, requests, drafts) after every plan() when set (tests
        # use it to hold each plan to stepplanner.check_plan); the plan is overwritten by the
        # next call. drafts: the proposed drafts plan() was given, or None.
        self.on_plan: (
            Callable[[list[ResidentState], StepPlan, list[Request], list[int] | None], None] | None
        ) = None
        self._rows: dict[str, ResidentState] = {}
        self._priority_order = orders_by_priority(policy.scheduling_policy)
        self._reserved = policy.priority_reserved_slots
        self._slots = min(self.max_num_running_reqs, self.max_num_active_reqs)
        self._async_scheduling = bool(self.scheduler_config.async_scheduling)
        # Pipeline parallelism without async scheduling: EngineCore keeps up to
        # pipeline_parallel_size steps in flight, and a request is planned into one of them at a
        # time (vLLM counts each request's tokens in flight: num_in_flight_tokens).
        self._pipelined = not self._async_scheduling and vllm_config.max_concurrent_batches > 1
        # LoRA: the running requests hold at most max_loras distinct adapters, so any step's rows
        # do (vLLM's worker has that many adapter slots per step); 0: LoRA is off.
        lora = vllm_config.lora_config
        self._max_loras = lora.max_loras if lora is not None else 0
        self._last_scheduled: set[str] = set()  # speculative decoding: the previous step's rows
        self.slo_classes = slo_classes
        self._ranked = policy.scheduling_policy in _RANKED
        if self._ranked:
            # The ledger's rank pass over this class's own rows (no Ledger here), with the
            # step time measured from each step's now.
            self._ranker = Ranker(limits, policy, **relegation)
            self._never_below = int(relegation.get("never_relegate_below", 0))
            # At most the earliest first-token deadline among waiting requests that may be
            # relegated: once now passes it, the queue is swept (the ledger's relegate_hopeless).
            self._earliest_due = math.inf
            b = limits.max_batch_size
            self._rank_rows = np.zeros(b, dtype=RESIDENT_DTYPE)
            self._rank_columns = (
                np.zeros(b),
                np.zeros(b),
                np.zeros(b, dtype=np.int64),
                np.zeros(b, dtype=np.uint64),
                np.zeros(b, dtype=np.uint8),
                np.zeros(b, dtype=np.int32),
            )
            self._by_class = policy.scheduling_policy == SchedulingPolicy.DEADLINE
            self._deadlines: dict[str, _Deadlines] = {}
            # Waiting requests in first-token-deadline order, as the ledger queues them: urgent
            # (priority < 0, which may take reserved slots), the rest, and the relegated (by
            # arrival, after every other). Entries ((class, due), stamp, seq, request), the class
            # 0 under EDF; one that left the waiting queue is dropped when it reaches the top.
            self._urgent: list[tuple[tuple[int, float], int, int, Request]] = []
            self._normal: list[tuple[tuple[int, float], int, int, Request]] = []
            self._losing: list[tuple[tuple[int, float], int, int, Request]] = []
            self._seq = 0
            self._examined: list[Request] = []  # waiting requests this step took off the heaps
            self._shed: list[str] = []  # the requests this step handed back
            # A request's step, the unit its deadlines are counted in, is one token of its own:
            # one engine step, or under pipeline parallelism as many as are in flight (it is in
            # one of them). The ranker measures it over that many schedule() calls, a sample only
            # when every one of them scheduled tokens.
            self._pace_steps = vllm_config.max_concurrent_batches if self._pipelined else 1
            self._stride = self._pace_steps - 1  # the first schedule() starts the clock
            self._ran = False

    # --- requests in and out ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        reason = self._unsupported_request(request)
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
            first_due, gap = slo_fields(slo, request.arrival_time)
            self._deadlines[request.request_id] = _Deadlines(
                first_due, gap, int(request.arrival_time * _NS), slo.ttft if slo else math.inf
            )
            self._enqueue(request)

    @staticmethod
    def _unsupported_request(request: Request) -> str | None:
        if request.use_structured_output:
            return "structured output"
        if request.resumable:
            return "streaming-input sessions"
        if not -(2**31) <= request.priority <= _INT32_MAX:
            return f"priority={request.priority} (allowed: an int32)"
        return None

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        self._rows.pop(request.request_id, None)
        if self._ranked:
            self._deadlines.pop(request.request_id, None)
        return super()._free_request(request, delay_free_blocks)

    def _preempt_request(
        self, request: Request, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        super()._preempt_request(request, timestamp, drop_stale_output)
        if self._ranked:  # back in the waiting queue: a re-prefill, due by its next token
            self._enqueue(request)

    # --- the step -----------------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        # throttle_prefills (data-parallel prefill balancing) is not applied: the plan decides.
        self.current_step += 1
        self.kv_cache_manager.new_step_starts()
        stats = self.stepplanner_stats
        stats.steps += 1
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
        if now is not None and self._by_class:
            self._give_up(now, relegated)
        running = self._running_with_work() if self._async_scheduling else self._settled()
        candidates = self._admission_candidates(now, relegated)
        residents = self._resident_rows(running, candidates)
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
            if not withheld_resident and self._pause_state == PauseState.UNPAUSED:
                for i, n in admission_rows:
                    request, hit = candidates[i - n_running][0], candidates[i - n_running][2]
                    if self._admit(request, hit, n, new_blocks, timestamp):
                        admitted.append(request)
                        num_scheduled[request.request_id] = n
            if num_scheduled or not (resident_rows or admission_rows) or not self.running:
                break
            # Nothing could be allocated: recompute-preempt the resident last in order (vLLM's
            # own preemption) and try the rest of the plan again. A request with a step in
            # flight is never the victim: that step's output must find it as it was scheduled.
            victims = self._settled()
            if not victims:
                break
            victim = max(victims, key=self._order_key)
            self.running.remove(victim)
            self._rows.pop(victim.request_id, None)
            self._preempt_request(victim, timestamp)
            preempted.append(victim)
            stats.recompute_preemptions += 1
            resident_rows = [r for r in resident_rows if requests[r[0]] is not victim]
            admission_rows = []  # like vLLM: no admission in a step that preempted

        if admitted:
            self._leave_waiting(admitted)
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
        )
        new_reqs = [r for r in admitted if r.status == RequestStatus.WAITING]
        resumed = [r for r in admitted if r.status == RequestStatus.PREEMPTED]
        for request in admitted:
            request.status = RequestStatus.RUNNING
        spec: dict[str, list[int]] = {}
        if drafts is not None:
            spec = self._scheduled_drafts(scheduled_running, num_scheduled)
            self._last_scheduled = set(num_scheduled)
        return self._make_output(
            num_scheduled, new_blocks, scheduled_running, new_reqs, resumed, spec
        )

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
        does, a scheduled request's proposals are then used up."""
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
        return spec

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

    def _settled(self) -> list[Request]:
        """Running requests no step in flight holds. Only pipeline parallelism schedules with
        steps in flight and no placeholders (async scheduling plans ahead through them, and
        one step at a time leaves none in flight), so elsewhere that is every running request."""
        running: list[Request] = self.running
        return [r for r in running if not r.num_in_flight_tokens] if self._pipelined else running

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
        if self._ranked:  # the order the ranker wrote into the rows this step
            row = self._rows.get(request.request_id)
            if row is not None:
                return row.priority, row.arrival
            return _INT32_MAX, int(request.arrival_time * _NS)
        return (request.priority if self._priority_order else 0, int(request.arrival_time * _NS))

    # --- deadlines (EDF, DEADLINE): translated into the ranker's columns ------------------------

    def _enqueue(self, request: Request) -> None:
        """Into the waiting order: relegated ones by arrival, the rest by the deadline of the
        token their next prefill ends with (the first, or after a recompute preemption the
        next one)."""
        record = self._deadlines[request.request_id]
        self._seq += 1
        if record.relegated:
            # By when it is handed back, as the ledger serves its relegated requests.
            heapq.heappush(self._losing, ((0, record.shed_at), record.stamp, self._seq, request))
        else:
            # The ledger's queue keys: DEADLINE by class, then deadline; EDF by deadline.
            due = record.due(request.num_output_tokens)
            if due < self._earliest_due and request.priority >= self._never_below:
                self._earliest_due = due
            key = (request.priority, due) if self._by_class else (0, due)
            heapq.heappush(
                self._urgent if request.priority < 0 else self._normal,
                (key, record.stamp, self._seq, request),
            )

    def _waits(self, request: Request) -> bool:
        return self.requests.get(request.request_id) is request and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        )

    def _waits_viable(self, entry: tuple[Any, int, int, Request]) -> bool:
        """An urgent/normal heap entry still stands: its request waits and was not relegated
        since (a relegated request has a newer entry in the relegated heap)."""
        request = entry[3]
        return self._waits(request) and not self._deadlines[request.request_id].relegated

    def _waits_relegated(self, entry: tuple[Any, int, int, Request]) -> bool:
        """A relegated-heap entry still stands: its request waits and was not handed back (it
        waits until update_from_output finishes it, and async scheduling may plan a step
        before that)."""
        request = entry[3]
        return self._waits(request) and not self._deadlines[request.request_id].handed_back

    def _relegate_waiting(self, request: Request, now: float, relegated: list[str]) -> None:
        record = self._deadlines[request.request_id]
        record.relegated = True
        record.shed_at = now + self._ranker.relegated_wait(record.ttft)
        relegated.append(request.request_id)
        self._enqueue(request)

    def _give_up(self, now: float, relegated: list[str]) -> None:
        """DEADLINE, before admission (the ledger's admission pass): relegate every waiting
        request that can no longer make its first token, wherever it stands in the queue, once
        now passes the earliest deadline that could be missed; then hand back every relegated
        request whose wait is over: it finishes with an error naming why, so a client or
        router can retry elsewhere (vLLM's queue is unbounded, so no request waits for a place)."""
        if now >= self._earliest_due:
            found: list[Request] = []
            earliest = math.inf
            for heap in (self._urgent, self._normal):
                for entry in heap:
                    request = entry[3]
                    if not self._waits_viable(entry) or request.priority < self._never_below:
                        continue
                    due = self._deadlines[request.request_id].due(request.num_output_tokens)
                    if not self._ranker.admits(request.num_tokens, due, now, request.priority):
                        found.append(request)
                    elif due < earliest:
                        earliest = due
            self._earliest_due = earliest
            for request in sorted(found, key=lambda r: self._deadlines[r.request_id].stamp):
                self._relegate_waiting(request, now, relegated)
        losing = self._losing
        while losing:
            entry = heapq.heappop(losing)
            if not self._waits_relegated(entry):
                continue
            request = entry[3]
            record = self._deadlines[request.request_id]
            if record.shed_at > now:
                heapq.heappush(losing, entry)
                break
            self._hand_back(request, record)

    def _hand_back(self, request: Request, record: _Deadlines) -> None:
        """A relegated waiting request whose wait is over finishes with an error naming why
        (update_from_output finishes it); it is never admitted after this."""
        record.handed_back = True
        _compat.fail_request(
            self,
            request.request_id,
            f"StepPlannerScheduler: request {request.request_id}: relegated by the DEADLINE "
            "policy (it could no longer meet its objectives) and handed back unserved after "
            f"waiting {self._ranker.relegated_wait(record.ttft):.3g} s more; retry elsewhere",
        )
        self._shed.append(request.request_id)

    def _next_waiting(self, room: int) -> tuple[tuple[int, float], int, int, Request] | None:
        """The next waiting request in the ledger's queue order, off its heap, with ``room``
        free slots left: urgent and normal ones by deadline, a normal one only while more than
        the reserved slots are free; relegated ones after every other."""
        urgent, normal, losing = self._urgent, self._normal, self._losing
        for heap in (urgent, normal):
            while heap and not self._waits_viable(heap[0]):
                heapq.heappop(heap)
        while losing and not self._waits_relegated(losing[0]):
            heapq.heappop(losing)
        head = urgent if urgent and (not normal or urgent[0] < normal[0]) else normal
        if not head:
            if losing and (room > self._reserved or losing[0][3].priority < 0):
                return heapq.heappop(losing)
            return None
        if head is normal and room <= self._reserved:
            return heapq.heappop(urgent) if urgent else None
        return heapq.heappop(head)

    def _deadline_order(
        self, free: int, out: list[Any], now: float, relegated: list[str]
    ) -> Iterator[Request]:
        """Waiting requests in first-token-deadline order, taken off the heaps one at a time
        (``out``: the candidates so far). Under DEADLINE a prompt the ranker says cannot make its
        first token even if served at once is relegated: it goes behind every request that
        still can, as the ledger's admission does."""
        while (entry := self._next_waiting(free - len(out))) is not None:
            request = entry[3]
            record = self._deadlines[request.request_id]
            due = record.due(request.num_output_tokens)
            if not record.relegated and not self._ranker.admits(
                request.num_tokens, due, now, request.priority
            ):
                self._relegate_waiting(request, now, relegated)
                if record.shed_at <= now:  # relegated_wait 0: handed back at once
                    self._hand_back(request, record)
                continue
            self._examined.append(request)  # back on a heap at the step's end unless admitted
            if not self._is_blocked_waiting_status(request.status):
                yield request

    def _requeue(self, admitted: list[Request]) -> None:
        """The waiting requests this step examined and did not admit go back in order."""
        taken = set(admitted)
        for request in self._examined:
            if request not in taken and self._waits(request):
                self._enqueue(request)
        self._examined = []
        if len(self._urgent) + len(self._normal) + len(self._losing) > 2 * len(self.requests) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the entries of requests that left while waiting (aborts), all at once."""
        for heap in (self._urgent, self._normal):
            heap[:] = [entry for entry in heap if self._waits_viable(entry)]
            heapq.heapify(heap)
        self._losing[:] = [entry for entry in self._losing if self._waits_relegated(entry)]
        heapq.heapify(self._losing)

    def _rank(
        self,
        residents: list[ResidentState],
        requests: list[Request],
        now: float,
        relegated: list[str],
    ) -> None:
        """Write the rows' priority and arrival from the requests' deadlines at ``now``,
        through the ranker (the ledger's own rank pass): the state translated, no policy here."""
        n = len(residents)
        if not n:
            return
        rows = self._rank_rows[:n]
        rows["prompt_length"] = [r.prompt_length for r in residents]
        rows["committed"] = [r.committed for r in residents]
        decoding = [r.context_committed for r in residents]
        rows["context_committed"] = decoding
        first_due, gap, generated, stamp, lost, classes = (a[:n] for a in self._rank_columns)
        records = [self._deadlines[r.request_id] for r in requests]
        # One token per step in flight (async: at most one), whatever drafts it verifies.
        emitted = [r.num_output_tokens + min(r.num_output_placeholders, 1) for r in requests]
        # A decode row's next token is due by first_due and the tokens emitted; a prefill's
        # (a recompute preemption's re-prefill included) by the token it ends with.
        first_due[:] = [
            d.first_due if decode else d.due(k) for d, decode, k in zip(records, decoding, emitted)
        ]
        gap[:] = [d.gap for d in records]
        generated[:] = emitted
        stamp[:] = [d.stamp for d in records]
        lost[:] = [d.relegated for d in records]
        classes[:] = [r.priority for r in requests]
        for i in self._ranker.rank(
            rows, first_due, gap, generated, stamp, lost, now, classes=classes
        ).tolist():
            records[i].relegated = True
            relegated.append(requests[i].request_id)
        for row, priority, arrival in zip(
            residents, rows["priority"].tolist(), rows["arrival"].tolist()
        ):
            row.priority = priority
            row.arrival = arrival

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
        order = (
            self._queue_order(free, out)
            if now is None or relegated is None
            else self._deadline_order(free, out, now, relegated)
        )
        # LoRA: the ledgers' rule (docs/decisions.md), over the running requests (paused and in
        # flight included).
        adapters = AdapterSlots(self._max_loras, map(_lora_id, self.running))
        for request in order:  # lazily: the next one is taken only while there is room
            if not adapters.join(_lora_id(request)):
                continue  # it waits; later requests whose adapters can join may
            blocks, hit = self._prefix_hit(request)
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
            if (
                self._is_blocked_waiting_status(request.status)
                or request.request_id in self.grammar_compile_error_reqs
            ):
                continue  # refused at add_request: update_from_output finishes it
            yield request

    def _prefix_hit(self, request: Request) -> tuple[KVCacheBlocks, int]:
        blocks, hit, _ = self.kv_cache_manager.get_computed_blocks(request)
        return blocks, hit

    def _resident_rows(
        self, running: list[Request], candidates: list[tuple[Request, KVCacheBlocks, int]]
    ) -> list[ResidentState]:
        rows = self._rows
        out: list[ResidentState] = []
        for request in running:
            row = rows.get(request.request_id)
            if row is None:
                row = rows[request.request_id] = ResidentState(
                    priority=request.priority, arrival=int(request.arrival_time * _NS)
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
        for request, _, hit in candidates:
            # A waiting request the plan pauses stays waiting but counts its paused steps like
            # a resident, so max_pause_steps releases it as SPEC §3 says.
            row = rows.get(request.request_id)
            if row is None:
                row = rows[request.request_id] = ResidentState(
                    priority=request.priority, arrival=int(request.arrival_time * _NS)
                )
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
    ) -> bool:
        """Allocate an admission's first chunk on top of its cached prefix; False withholds it."""
        blocks = self.kv_cache_manager.empty_kv_cache_blocks
        if hit:
            # Allocations earlier in this step may have evicted part of the prefix found before
            # planning; the planned chunk assumed that prefix, so then it waits a step.
            blocks, now = self._prefix_hit(request)
            if now != hit:
                self.stepplanner_stats.stale_prefix_rows += 1
                return False
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
            return False
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
        return True

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
        if self.use_v2_model_runner:
            new_reqs = new_reqs + resumed
            resumed = []
        new_reqs_data = [
            NewRequestData.from_request(
                r,
                new_blocks[r.request_id].get_block_ids(),
                *((r._all_token_ids,) if self.use_v2_model_runner else ()),
                uses_mrope=self.model_uses_mrope,
            )
            for r in new_reqs
        ]
        cached = self._make_cached_request_data(
            scheduled_running, resumed, num_scheduled, spec, new_blocks
        )
        if not self.use_v2_model_runner:
            self.prev_step_scheduled_req_ids.clear()
            self.prev_step_scheduled_req_ids.update(num_scheduled)
        self.kv_cache_manager.take_boundary_state_offloads()
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
            ec_manager_metadata=self.encoder_cache_manager.get_manager_metadata(),
            **_compat.output_fields(self, num_scheduled, new_reqs_data),
        )
        self._update_after_schedule(output)
        return output
