"""The flags commands share (workload, engine limits, scheduling options, run control) and the
functions that turn their parsed values into library objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import click

from .._errors import StepPlannerValueError
from ..ledger._shared import AdmissionOrder
from ..planner._fields import as_enum
from ..planner._policy import SchedulingOptions, StepPlannerLimits, check_reserved_slots
from ..planner._types import IfbSchedulingMode, PreemptionMode, SchedulingPolicy
from ..sim.engine import PEER_ORDERS
from ..sim.load import at_load
from ..sim.prefix_workload import prefix_heavy_requests
from ..sim.prefixes import SharedPrefixes
from ..sim.simulator import DEFAULT_LIMITS, ServingQueue, Speculation
from ..sim.traces import read_trace
from ..sim.workloads import (
    DEFAULT_RATE,
    DEFAULT_REQUESTS,
    DEFAULT_SLO_CLASSES,
    MAX_RATE,
    Workload,
    check_rate,
    synthetic,
)
from ..tuning.slo import parse_slo_classes
from .counts import check_requests, check_slots
from .errors import InputError
from .render import FORMATS


def compose(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One decorator that applies ``decorators`` as if stacked in this order: flag groups that
    several commands share."""

    def apply(f: Any) -> Any:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


def trace_options(default: str) -> Callable[[Any], Any]:
    """``--trace`` and ``--columns``; ``default`` says what a command runs without a trace."""
    return compose(
        click.option(
            "--trace",
            type=click.Path(exists=True, dir_okay=False),
            help="CSV or JSONL trace: stepplanner, Azure, BurstGPT, Mooncake or Vidur "
            f"columns (recognised), or any with --columns; default: {default}.",
        ),
        click.option(
            "--columns",
            default=None,
            help="Which trace columns hold what: 'arrival=COL,prompt=COL,output=COL"
            "[,priority=COL][,unit=s|ms|us|datetime]'.",
        ),
    )


objective_options = compose(
    click.option(
        "--slo-class",
        "slo_classes",
        multiple=True,
        help="A priority class's objectives, PRIORITY=ttft:VALUE[,tpot:VALUE] with "
        "VALUE in ms, s or us (repeatable; e.g. 0=ttft:250ms,tpot:100ms): token i "
        "of its requests is due ttft + i * tpot after arrival. A trace's "
        "ttft_slo_ms/tpot_slo_ms columns override it per request. Default: the "
        "embedded workload's three classes (docs/simulator.md, 'SLOs and "
        "goodput'), a trace's none.",
    ),
    click.option(
        "--no-slo",
        is_flag=True,
        default=False,
        help="No objectives at all: neither the embedded workload's default classes "
        "nor a trace's columns.",
    ),
)

workload_options = compose(
    trace_options("the embedded synthetic workload"),
    # Second names: the flags users bring from vLLM (docs/tuning.md says what differs).
    click.option(
        "--requests",
        "--num-prompts",
        "requests",
        type=int,
        default=DEFAULT_REQUESTS,
        show_default=True,
        help="Synthetic workload: number of requests (at most what the available memory "
        "holds, about 2.5 KB a request).",
    ),
    click.option(
        "--rate",
        "--request-rate",
        "rate",
        type=float,
        default=DEFAULT_RATE,
        show_default=True,
        help=f"Synthetic workload: Poisson arrivals per second (0 < rate <= {MAX_RATE:,.0f}).",
    ),
    click.option(
        "--seed", type=int, default=0, show_default=True, help="Synthetic workload: random seed."
    ),
    click.option(
        "--burstiness",
        type=click.FloatRange(min=0, min_open=True),
        default=1.0,
        show_default=True,
        help="Synthetic workload: gaps between arrivals are gamma-distributed with "
        "this shape, as vLLM's --burstiness (1: Poisson; < 1 burstier; inf: "
        "constant gaps); the same requests at every value.",
    ),
    objective_options,
)

# The synthetic workloads --workload draws (simulate, compare, sweep): the embedded one, and the
# prefix-heavy one with the shared prefixes its runs look their hits up in (sim.prefix_workload).
WORKLOADS = ("embedded", "prefix-heavy")

workload_choice_option = click.option(
    "--workload",
    "workload_name",
    type=click.Choice(WORKLOADS),
    default=None,
    help="The synthetic workload --requests, --rate and --seed draw: embedded (three priority "
    "classes, nothing shared; the default) or prefix-heavy (chat on six shared system prompts, "
    "multi-turn sessions, cold documents; prompts up to 8,192 tokens, each with its own "
    "objectives), run with a prefix cache its requests' hits are looked up in. Not with "
    "--trace.",
)

limit_options = compose(
    click.option(
        "--max-batch-size",
        "-B",
        "--max-num-seqs",
        "max_batch_size",
        type=int,
        default=DEFAULT_LIMITS.max_batch_size,
        show_default=True,
        help="B: resident slots.",
    ),
    click.option(
        "--max-input-length",
        type=int,
        default=DEFAULT_LIMITS.max_input_length,
        show_default=True,
        help="S_in: longest prompt; longer ones are refused.",
    ),
    click.option(
        "--kv-page-size",
        "--block-size",
        "kv_page_size",
        type=int,
        default=DEFAULT_LIMITS.kv_page_size,
        show_default=True,
        help="P: non-final chunks end on a multiple of P.",
    ),
    click.option(
        "--max-step-tokens",
        "--max-num-batched-tokens",
        "max_step_tokens",
        type=int,
        default=DEFAULT_LIMITS.max_step_tokens,
        show_default=True,
        help="The runtime's tokens per step (its step buffer); caps T_max, the budget "
        "of a step without decode rows (0 = B*S_in).",
    ),
)


def enum_option(*names: str, field: str, enum: type[IntEnum], **kw: Any) -> Callable[[Any], Any]:
    """An enum flag as the API and ``--config`` take it (``as_enum``: a name in any case, or its
    number) and refused with the same message; ``--help`` shows ``[fcfs|priority|...]``."""

    def convert(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        try:
            return as_enum(field, value, enum)
        except StepPlannerValueError as exc:
            raise InputError(str(exc)) from None

    metavar = "[" + "|".join(m.name.lower() for m in enum) + "]"
    return click.option(*names, metavar=metavar, callback=convert, show_default=True, **kw)


scheduling_options = compose(
    enum_option(
        "--mode",
        field="ifb_scheduling_mode",
        enum=IfbSchedulingMode,
        default="auto",
        help="ifb_scheduling_mode.",
    ),
    click.option(
        "--max-num-tokens",
        type=int,
        default=0,
        show_default=True,
        help="Token budget of a MIXED step that has decode rows (0 = SPEC §2 "
        "default). A step without decode rows may take T_max = B*S_in, or "
        "--max-step-tokens when given: cap every step with that.",
    ),
    click.option(
        "--max-chunk-tokens",
        type=int,
        default=0,
        show_default=True,
        help="Largest prompt chunk (0 = SPEC §2 default).",
    ),
    enum_option(
        "--policy",
        "scheduling_policy",
        field="scheduling_policy",
        enum=SchedulingPolicy,
        default="fcfs",
        help="scheduling_policy.",
    ),
    enum_option(
        "--preemption",
        field="preemption",
        enum=PreemptionMode,
        default="none",
        help="PAUSE withholds worse priorities (MIXED+PRIORITY).",
    ),
    click.option(
        "--priority-reserved-slots",
        type=int,
        default=0,
        show_default=True,
        help="Slots only urgent (priority < 0) requests may take.",
    ),
    click.option(
        "--max-pause-steps",
        type=int,
        default=0,
        show_default=True,
        help="Release a resident paused this many steps in a row (0 = never).",
    ),
)


queue_options = compose(
    click.option(
        "--max-waiting",
        type=int,
        default=None,
        help="Bound the waiting queue: a request that finds it full is refused (a server's "
        "HTTP 429) and counted as a miss (default: every request may wait).",
    ),
    click.option(
        "--relegated-wait",
        type=click.FloatRange(min=0),
        default=None,
        help="DEADLINE: seconds a relegated request may still wait in the queue before it is "
        "handed back unserved (0: at once; default: its own TTFT objective).",
    ),
    click.option(
        "--never-relegate-below",
        type=int,
        default=0,
        show_default=True,
        help="DEADLINE: priority classes below this are never relegated (0: the urgent ones).",
    ),
    enum_option(
        "--admission",
        field="admission",
        enum=AdmissionOrder,
        default="arrival",
        help="The order waiting requests are admitted in: arrival (the policy's own), or "
        "uncached-first (least uncached prompt work first, with a starvation bound; under "
        "EDF/DEADLINE among the requests with slack to spare).",
    ),
    click.option(
        "--starvation-steps",
        type=int,
        default=None,
        help="uncached-first: a request passed over in this many admission passes goes first.",
    ),
    click.option(
        "--starvation-seconds",
        type=float,
        default=None,
        help="uncached-first: a request waiting this many seconds goes first.",
    ),
    click.option(
        "--peer-order",
        type=click.Choice(PEER_ORDERS),
        default=None,
        help="Admit in another engine's order instead (FCFS only), modelled in front of the "
        "ledger as its code has it: vLLM 0.34's cache-aware admission window, or SGLang's HRRN.",
    ),
    click.option(
        "--cache-window",
        type=int,
        default=64,
        show_default=True,
        help="--peer-order vllm-cache-window: how many waiting requests it reorders.",
    ),
)


def queue_from(kw: dict[str, Any]) -> ServingQueue:
    """Pop the ``queue_options`` values out of a command's keyword arguments."""
    return ServingQueue(
        kw.pop("max_waiting"),
        kw.pop("relegated_wait"),
        kw.pop("never_relegate_below"),
        kw.pop("admission"),
        kw.pop("starvation_steps"),
        kw.pop("starvation_seconds"),
        kw.pop("peer_order"),
        kw.pop("cache_window"),
    )


speculation_options = compose(
    click.option(
        "--num-spec-tokens",
        type=click.IntRange(min=0, max=64),
        default=0,
        show_default=True,
        help="Speculative decoding: drafts each decoding request proposes a step (SPEC §8; "
        "0 = off).",
    ),
    click.option(
        "--spec-acceptance",
        type=click.FloatRange(min=0, max=1),
        default=0.7,
        show_default=True,
        help="Speculative decoding: the chance each verified draft is accepted, in order up to "
        "the first rejection.",
    ),
)


def speculation_from(kw: dict[str, Any]) -> Speculation | None:
    """Pop the ``speculation_options`` values out of a command's keyword arguments."""
    k, acceptance = kw.pop("num_spec_tokens"), kw.pop("spec_acceptance")
    return Speculation(k, acceptance) if k else None


def run_options_stopping_at(max_steps: int | None) -> Callable[[Any], Any]:
    """The run flags, with ``max_steps`` as the default of ``--max-steps`` (None: no limit)."""
    return compose(
        click.option(
            "--latency",
            "latency_text",
            default="",
            help="Override the step-latency model: 'a=SECONDS,b=PER_TOKEN,c=PER_CONTEXT'.",
        ),
        click.option(
            "--max-steps",
            type=click.IntRange(min=1),
            default=max_steps,
            show_default=max_steps is not None,
            help="Stop after this many steps"
            + ("." if max_steps is None else " (a warning says when the default stopped the run)."),
        ),
        click.option(
            "--progress/--no-progress",
            default=True,
            show_default=True,
            help="Progress bar on stderr for runs over a second.",
        ),
    )


run_options = run_options_stopping_at(None)


num_pages_option = click.option(
    "--num-pages",
    type=int,
    default=0,
    show_default=True,
    help="A pool of this many KV pages (of --kv-page-size tokens): admission reserves each "
    "request's worst case (prompt + output tokens) and the report adds page occupancy "
    "(0 = unlimited pages).",
)

format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice([*FORMATS, "json"]),
    default="table",
    show_default=True,
    help="table: for a terminal (rows printed vertically when the table is wider than it); md: "
    "Markdown; csv: the main table only; json: the full report.",
)

format_options = compose(
    format_option,
    click.option("--json", "as_json", is_flag=True, help="Same as --format json."),
)


def output_format(fmt: str, as_json: bool) -> str:
    """The format ``format_options`` asked for."""
    return "json" if as_json else fmt


def limits_from(kw: dict[str, Any], runs: int = 1) -> StepPlannerLimits:
    """Pop the ``limit_options`` values out of a command's keyword arguments; ``-B`` checked
    against the memory ``runs`` simulations at once need for their slots."""
    check_slots(kw["max_batch_size"], runs)
    return StepPlannerLimits(
        kw.pop("max_batch_size"),
        kw.pop("max_input_length"),
        kw.pop("kv_page_size"),
        kw.pop("max_step_tokens"),
    )


def options_from(kw: dict[str, Any], limits: StepPlannerLimits | None = None) -> SchedulingOptions:
    """Pop the ``scheduling_options`` values out of a command's keyword arguments; with the
    ``limits`` they run under, ``--priority-reserved-slots`` is refused with its one range (below
    B) whether it is negative or too large."""
    if limits is not None:
        check_reserved_slots(kw["priority_reserved_slots"], limits)
    return SchedulingOptions(
        ifb_scheduling_mode=kw.pop("mode"),
        max_num_tokens=kw.pop("max_num_tokens"),
        max_chunk_tokens=kw.pop("max_chunk_tokens"),
        scheduling_policy=kw.pop("scheduling_policy"),
        preemption=kw.pop("preemption"),
        priority_reserved_slots=kw.pop("priority_reserved_slots"),
        max_pause_steps=kw.pop("max_pause_steps"),
    )


def workload_from(kw: dict[str, Any], runs: int = 1) -> Workload:
    """Pop the ``workload_options`` values and load or generate the workload (``--requests``
    checked against the memory ``runs`` simulations at once need), with the objectives
    ``objective_options`` ask for."""
    trace = trace_from(kw)
    requests, rate, seed, burstiness = (
        kw.pop(k) for k in ("requests", "rate", "seed", "burstiness")
    )
    if trace is None:
        check_requests(requests, runs)
    workload = (
        trace
        if trace is not None
        else synthetic(requests=requests, rate=rate, seed=seed, burstiness=burstiness)
    )
    return with_objectives_from(kw, workload, embedded=trace is None)


@dataclasses.dataclass(frozen=True)
class Offered:
    """The workload a command runs; with ``--workload prefix-heavy`` also its shared prefixes
    and ``draw``, the same requests offered at another rate (requests/s), objectives as
    given."""

    workload: Workload
    prefixes: SharedPrefixes | None = None
    draw: Callable[[float], tuple[Workload, SharedPrefixes]] | None = None

    def at_load(self, load: float, saturation: float) -> tuple[Workload, SharedPrefixes | None]:
        """Offered at ``load`` x ``saturation`` requests/s: the embedded workload or a trace
        scaled (``sim.load.at_load``), the prefix-heavy one drawn at that rate (its sessions'
        gaps stay seconds, as ``tools/prefix_experiments.py`` draws it)."""
        if self.draw is None:
            return at_load(self.workload, load, saturation), None
        workload, prefixes = self.draw(load * saturation)
        source = f"{workload.source} at {load:g}x saturation"
        return workload.with_arrivals(workload.arrival_time, source), prefixes

    def check_pool(self, num_pages: int, option: str = "--num-pages", where: str = "") -> None:
        """Refuse a KV page pool (``where``: the configuration's) beside the prefix-heavy
        workload's prefix cache."""
        if self.prefixes is not None and num_pages:
            raise InputError(
                f"{where}{option}={num_pages} with --workload prefix-heavy: a prefix cache beside "
                f"a KV page pool is not simulated; allowed: {option}=0 (unlimited pages)"
            )


def offered_from(kw: dict[str, Any], runs: int = 1) -> Offered:
    """Pop ``--workload`` and the ``workload_options`` values: the embedded workload or the
    trace (``workload_from``), or the prefix-heavy one with its prefixes. ``--workload`` with
    ``--trace``, and ``--burstiness`` with the prefix-heavy workload, are refused."""
    name = kw.pop("workload_name")
    if name is not None and kw["trace"]:
        raise InputError(
            f"--workload {name} draws a synthetic workload and --trace {kw['trace']} reads "
            "one from a file; give one of them"
        )
    if name != "prefix-heavy":
        return Offered(workload_from(kw, runs))
    if kw["burstiness"] != 1.0:
        raise InputError(
            f"--burstiness {kw['burstiness']:g} shapes the embedded workload's gaps; "
            "--workload prefix-heavy draws Poisson roots and sessions' turns seconds apart; "
            "allowed: --burstiness 1"
        )
    trace_from(kw)  # None here; --columns without a --trace is refused as ever
    requests, rate, seed, _ = (kw.pop(k) for k in ("requests", "rate", "seed", "burstiness"))
    check_requests(requests, runs)
    check_rate("rate", rate)
    objectives = {k: kw.pop(k) for k in ("slo_classes", "no_slo")}

    def draw(rate: float) -> tuple[Workload, SharedPrefixes]:
        workload, prefixes = prefix_heavy_requests(requests, rate, seed)
        return with_objectives_from(dict(objectives), workload, embedded=False), prefixes

    return Offered(*draw(rate), draw)


def with_objectives_from(kw: dict[str, Any], workload: Workload, embedded: bool) -> Workload:
    """Pop ``--slo-class``/``--no-slo`` and give ``workload`` those objectives: the given
    classes, else the default classes for the ``embedded`` workload; ``--no-slo`` drops every
    objective (the trace's columns too)."""
    # Parsed here, not in a click callback: a bad objective is a one-line error (exit 2).
    classes, none = parse_slo_classes(kw.pop("slo_classes")), kw.pop("no_slo")
    if none and classes:
        raise click.UsageError(
            "--no-slo drops every objective and --slo-class gives some; give one of them"
        )
    if none:
        return workload.with_objectives(None, own=False)
    if classes:
        return workload.with_objectives(classes)
    if not embedded:
        return workload
    # A small embedded workload may lack a class: the defaults of the classes it has.
    return workload.with_objectives(
        {p: slo for p, slo in DEFAULT_SLO_CLASSES.items() if p in workload.classes}
    )


def trace_from(kw: dict[str, Any]) -> Workload | None:
    """Pop ``--trace`` and ``--columns``: the trace's workload, or None for the synthetic one
    (whose flags stay in ``kw``)."""
    trace, columns = kw.pop("trace"), kw.pop("columns")
    if trace:
        if kw.get("burstiness", 1.0) != 1.0:
            raise StepPlannerValueError(
                "--burstiness shapes the synthetic workload's arrivals; a --trace has its own"
            )
        return read_trace(trace, columns)
    if columns:
        raise StepPlannerValueError("--columns describes a --trace file, and none was given")
    return None


def given(ctx: click.Context, name: str) -> Any:
    """The value of parameter ``name`` when the command line gave it, else ``None``."""
    source = ctx.get_parameter_source(name)
    return ctx.params.get(name) if source == click.core.ParameterSource.COMMANDLINE else None
