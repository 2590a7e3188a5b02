"""``stepplanner``: see what a scheduling policy does to latency and throughput before deploying it.

Commands: ``simulate`` (one configuration on one workload), ``compare`` (several side by side),
``explain`` (one ledger -> its plan, every resident's reason, and which SPEC §2 rule set each
budget), ``record``/``replay`` (per-step ledger+plan traces, re-planned and diffed) and
``bench`` (forwarded to ``stepplanner.bench``). Needs the ``cli`` extra (click, rich).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import click
    from rich.console import Console
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise SystemExit(f"the stepplanner command needs click and rich ({exc}); "
                     "install them with: pip install 'stepplanner[cli]'") from None

from ._fields import enum_from_text
from ._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    chunk_cap,
    default_max_chunk_tokens,
    default_target,
    rd,
    resolve_scheduling_policy,
    ru,
)
from ._types import (
    IfbSchedulingMode,
    PreemptionMode,
    SchedulingPolicy,
    split_reason,
)
from .cli_tuning import extras as tuning_cli  # --slo, --latency-model, vLLM metrics
from .latency import LatencyModel
from .ledger import Ledger
from .simulator import (
    DEFAULT_LIMITS,
    SimulationResult,
    StepRecorder,
    policy_to_dict,
    read_record_header,
    replay,
    simulate,
)
from .traces import read_trace
from .workloads import DEFAULT_CLASSES, Workload, synthetic

__all__ = ["main", "parse_config"]

DEFAULT_REQUESTS = 6000
DEFAULT_RATE = 28.0
DEFAULT_COMPARE = ("name=fcfs,policy=fcfs", "name=priority,policy=priority",
                   "name=priority+pause,policy=priority,preemption=pause,max_pause_steps=64")

_ENUMS: dict[str, Any] = {"ifb_scheduling_mode": IfbSchedulingMode,
                          "scheduling_policy": SchedulingPolicy, "preemption": PreemptionMode}
_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulingOptions))
_LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(StepPlannerLimits))
_ALIASES = {"mode": "ifb_scheduling_mode", "policy": "scheduling_policy",
            "reserved": "priority_reserved_slots", "reserved_slots": "priority_reserved_slots"}


def _console() -> Console:
    # Off a terminal rich assumes 80 columns, which folds the comparison table.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


# --- configuration ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration to simulate: a name, the engine limits and the scheduling options."""

    name: str
    limits: StepPlannerLimits
    options: SchedulingOptions


def parse_config(items: dict[str, Any], base_limits: StepPlannerLimits,
                 base_options: SchedulingOptions, name: str | None = None) -> Config:
    """``{"policy": "priority", "max_num_tokens": 1024, ...}`` on top of the bases.

    Keys: the SchedulingOptions and StepPlannerLimits field names, the aliases mode, policy and
    reserved, and name. Enum values by name (any case) or number.
    """
    options = dataclasses.asdict(base_options)
    limits = dataclasses.asdict(base_limits)
    for raw_key, value in items.items():
        key = _ALIASES.get(raw_key.strip().lower(), raw_key.strip().lower())
        if key == "name":
            name = str(value)
            continue
        if key in _ENUMS and isinstance(value, str):
            value = enum_from_text(key, value, _ENUMS[key])
        elif key in _OPTION_FIELDS or key in _LIMIT_FIELDS:
            value = _int(key, value)
        else:
            allowed = sorted({*_OPTION_FIELDS, *_LIMIT_FIELDS, *_ALIASES, "name"})
            raise ValueError(f"config key {raw_key!r} is not known; allowed: {', '.join(allowed)}")
        (options if key in _OPTION_FIELDS else limits)[key] = value
    label = name or ", ".join(f"{k}={v}" for k, v in items.items()) or "default"
    return Config(label, StepPlannerLimits(**limits), SchedulingOptions(**options))


def parse_config_text(text: str) -> dict[str, Any]:
    """``"policy=priority, preemption=pause, max_num_tokens=1024"`` -> dict."""
    items: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"config item {part!r} is not KEY=VALUE")
        items[key.strip()] = value.strip()
    return items


def _int(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{key}={value!r} is not an integer") from None


# --- shared options --------------------------------------------------------------------------


def _compose(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def apply(f: Any) -> Any:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f
    return apply


workload_options = _compose(
    click.option("--trace", type=click.Path(exists=True, dir_okay=False),
                 help="CSV or JSONL trace: stepplanner, Azure, BurstGPT, Mooncake or Vidur "
                      "columns (recognised), or any with --columns; default: the embedded "
                      "synthetic workload."),
    click.option("--columns", default=None,
                 help="Which trace columns hold what: 'arrival=COL,prompt=COL,output=COL"
                      "[,priority=COL][,unit=s|ms|us|datetime]'."),
    click.option("--requests", "--num-prompts", "requests", type=click.IntRange(min=1),
                 default=DEFAULT_REQUESTS, show_default=True,
                 help="Synthetic workload: number of requests."),
    click.option("--rate", "--request-rate", "rate", type=click.FloatRange(min=0, min_open=True),
                 default=DEFAULT_RATE, show_default=True,
                 help="Synthetic workload: Poisson arrivals per second."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Synthetic workload: random seed."),
)

limit_options = _compose(
    click.option("--max-batch-size", "-B", "--max-num-seqs", "max_batch_size", type=int,
                 default=DEFAULT_LIMITS.max_batch_size,
                 show_default=True, help="B: resident slots."),
    click.option("--max-input-length", type=int, default=DEFAULT_LIMITS.max_input_length,
                 show_default=True, help="S_in: longest prompt; longer ones are refused."),
    click.option("--kv-page-size", "--block-size", "kv_page_size", type=int,
                 default=DEFAULT_LIMITS.kv_page_size,
                 show_default=True, help="P: non-final chunks end on a multiple of P."),
    click.option("--max-step-tokens", "--max-num-batched-tokens", "max_step_tokens", type=int,
                 default=DEFAULT_LIMITS.max_step_tokens,
                 show_default=True,
                 help="The runtime's tokens per step (its step buffer); caps T_max, the budget "
                      "of a step without decode rows (0 = B*S_in)."),
)


def _choice(enum: Any) -> click.Choice[str]:
    return click.Choice([m.name.lower() for m in enum], case_sensitive=False)


scheduling_options = _compose(
    click.option("--mode", type=_choice(IfbSchedulingMode), default="auto", show_default=True,
                 help="ifb_scheduling_mode."),
    click.option("--max-num-tokens", type=int, default=0, show_default=True,
                 help="Token budget per step (0 = SPEC §2 default)."),
    click.option("--max-chunk-tokens", type=int, default=0, show_default=True,
                 help="Largest prompt chunk (0 = SPEC §2 default)."),
    click.option("--policy", "scheduling_policy", type=_choice(SchedulingPolicy),
                 default="fcfs", show_default=True, help="scheduling_policy."),
    click.option("--preemption", type=_choice(PreemptionMode), default="none",
                 show_default=True, help="PAUSE withholds worse priorities (MIXED+PRIORITY)."),
    click.option("--priority-reserved-slots", type=int, default=0, show_default=True,
                 help="Slots only urgent (priority < 0) requests may take."),
    click.option("--max-pause-steps", type=int, default=0, show_default=True,
                 help="Release a resident paused this many steps in a row (0 = never)."),
)

run_options = _compose(
    click.option("--latency", "latency_text", default="",
                 help="Override the step-latency model: 'a=SECONDS,b=PER_TOKEN,c=PER_CONTEXT'."),
    click.option("--max-steps", type=click.IntRange(min=1), default=None,
                 help="Stop after this many steps."),
    click.option("--progress/--no-progress", default=True, show_default=True,
                 help="Progress bar on stderr for runs over a second."),
)


def _limits(kw: dict[str, Any]) -> StepPlannerLimits:
    return StepPlannerLimits(kw.pop("max_batch_size"), kw.pop("max_input_length"),
                             kw.pop("kv_page_size"), kw.pop("max_step_tokens"))


def _options(kw: dict[str, Any]) -> SchedulingOptions:
    return SchedulingOptions(
        ifb_scheduling_mode=IfbSchedulingMode[kw.pop("mode").upper()],
        max_num_tokens=kw.pop("max_num_tokens"), max_chunk_tokens=kw.pop("max_chunk_tokens"),
        scheduling_policy=SchedulingPolicy[kw.pop("scheduling_policy").upper()],
        preemption=PreemptionMode[kw.pop("preemption").upper()],
        priority_reserved_slots=kw.pop("priority_reserved_slots"),
        max_pause_steps=kw.pop("max_pause_steps"))


def _workload(kw: dict[str, Any]) -> Workload:
    trace, columns, requests, rate, seed = (kw.pop(k) for k in ("trace", "columns", "requests",
                                                                "rate", "seed"))
    if trace:
        return read_trace(trace, columns)
    if columns:
        raise ValueError("--columns describes a --trace file, and none was given")
    return synthetic(requests=requests, rate=rate, seed=seed)


def _library_errors(f: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input the library rejects becomes a one-line CLI error, not a traceback (a limit
    too large for this machine's memory too: the planner sizes its buffers for B up front)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except (ValueError, TypeError, OverflowError, RuntimeError, MemoryError) as exc:
            raise click.ClickException(str(exc)) from None
    wrapper.__name__, wrapper.__doc__ = f.__name__, f.__doc__
    return wrapper


class _ProgressBar:
    """A rich progress bar on stderr that appears only once a run has taken a second."""

    def __init__(self, total: int, enabled: bool, label: str) -> None:
        self.total, self.enabled, self.label = total, enabled, label
        self.start = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, steps: int, sim_time: float, completed: int) -> None:
        if not self.enabled or time.perf_counter() - self.start < 1.0:
            return
        if self.bar is None:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TextColumn("{task.fields[steps]} steps"),
                                TimeElapsedColumn(), console=Console(stderr=True),
                                transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total, steps=0)
        self.bar.update(self.task, completed=completed, steps=steps)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _run(workload: Workload, limits: StepPlannerLimits, options: Any,
         latency: LatencyModel, max_steps: int | None, progress: bool, label: str,
         on_step: Any = None) -> SimulationResult:
    bar = _ProgressBar(len(workload), progress, label)
    try:
        return simulate(workload, limits, options, latency, max_steps=max_steps,
                        on_step=on_step, progress=bar, progress_every=1024)
    finally:
        bar.close()


# --- commands --------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stepplanner")
def main() -> None:
    """Plan in-flight-batching steps and simulate what a scheduling policy does."""


@main.command("simulate")
@workload_options
@limit_options
@scheduling_options
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG: TTFT CDF per priority class and the batch timeline "
                   "(needs matplotlib).")
@tuning_cli.simulate_options
@_library_errors
def simulate_command(latency_text: str, max_steps: int | None, progress: bool, as_json: bool,
                     plot: str | None, slos: Any, latency_model: Any, metric_percentiles: Any,
                     save_result: str | None, **kw: Any) -> None:
    """Simulate one configuration (the embedded workload when no --trace is given)."""
    if plot:
        _require_matplotlib()
    tuning_cli.check_output_path("--save-result", save_result)
    limits, options, workload = _limits(kw), _options(kw), _workload(kw)
    gaps = tuning_cli.GapRecorder(len(workload))
    result = _run(workload, limits, options, tuning_cli.latency_of(latency_model, latency_text),
                  max_steps, progress and not as_json, "simulating", on_step=gaps)
    report = result.report()
    report.update(tuning_cli.section(result, gaps, slos, metric_percentiles))
    tuning_cli.save(save_result, report, report)
    if plot:
        _plot(result, plot)
    if as_json:
        click.echo(tuning_cli.write_json(None, report))
        return
    _print_report(_console(), report)
    tuning_cli.print_section(_console(), report, metric_percentiles)
    if plot:
        click.echo(f"plot written to {plot}")


@main.command("compare")
@workload_options
@limit_options
@run_options
@click.option("--config", "configs", multiple=True,
              help="One configuration as KEY=VALUE,... e.g. 'policy=priority,preemption=pause,"
                   "max_num_tokens=1024' (repeat for each; keys are SchedulingOptions and "
                   "limits fields, aliases mode/policy/reserved, and name).")
@click.option("--config-file", type=click.File("r"),
              help="A JSON list of configuration objects (same keys as --config).")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
@tuning_cli.compare_options
@_library_errors
def compare_command(latency_text: str, max_steps: int | None, progress: bool,
                    configs: Sequence[str], config_file: Any, as_json: bool, slos: Any,
                    latency_model: Any, **kw: Any) -> None:
    """Run several configurations on one workload and show them side by side."""
    limits, workload = _limits(kw), _workload(kw)
    items: list[dict[str, Any]] = [parse_config_text(text) for text in configs]
    if config_file is not None:
        items.extend(_config_file(config_file))
    if not items:
        items = [parse_config_text(text) for text in DEFAULT_COMPARE]
    runs = [parse_config(item, limits, SchedulingOptions()) for item in items]
    # Every configuration is resolved (and so checked) before the first one runs.
    policies = [resolve_scheduling_policy(run.options, run.limits) for run in runs]
    latency = tuning_cli.latency_of(latency_model, latency_text)
    reports = []
    for k, (run, policy) in enumerate(zip(runs, policies), start=1):
        gaps = tuning_cli.GapRecorder(len(workload))
        result = _run(workload, run.limits, policy, latency, max_steps,
                      progress and not as_json, f"{k}/{len(runs)} {run.name}", on_step=gaps)
        reports.append({"name": run.name, **result.report(),
                        **tuning_cli.section(result, gaps, slos)})
    if as_json:
        click.echo(tuning_cli.write_json(None, reports))
        return
    _print_comparison(_console(), reports)
    for r in reports:
        tuning_cli.print_slos(_console(), r, f" for {r['name']}")


def _config_file(handle: Any) -> list[dict[str, Any]]:
    try:
        data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config-file: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise ValueError("--config-file: expected a JSON list of objects")
    return data


@main.command("explain")
@click.argument("ledger_file", type=click.File("r"))
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
@_library_errors
def explain_command(ledger_file: Any, as_json: bool) -> None:
    """Plan one ledger (JSON: limits, options, residents) and explain every decision.

    LEDGER_FILE ('-' for stdin) holds {"limits": {max_batch_size, max_input_length,
    kv_page_size}, "options": {SchedulingOptions fields}, "residents": [{priority, arrival,
    prompt_length, committed, context_committed, consecutive_paused_steps[, request_id]}]}.
    """
    from . import StepPlanner

    try:
        data = json.load(ledger_file)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ledger_file.name}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("residents"), list):
        raise ValueError(f'{ledger_file.name}: expected an object with a "residents" list')
    unknown = set(data) - {"limits", "options", "residents"}
    if unknown:
        raise ValueError(f"{ledger_file.name}: unknown key(s) {sorted(unknown)}; allowed: "
                         "limits, options, residents")
    config = parse_config({**data.get("options", {}), **data.get("limits", {})},
                          DEFAULT_LIMITS, SchedulingOptions())
    policy = resolve_scheduling_policy(config.options, config.limits)
    ledger = Ledger(config.limits, policy)
    ledger.load(data["residents"])
    reasons = np.zeros(max(ledger.count, 1), dtype=np.uint8)
    plan = StepPlanner(policy, config.limits).plan(ledger.residents, reasons=reasons)
    explanation = {
        "policy": explain_policy(config.options, policy, config.limits),
        "plan": plan.to_dict(),
        "residents": _resident_reasons(ledger, plan, reasons),
    }
    if as_json:
        click.echo(json.dumps(explanation, indent=2))
        return
    _print_explanation(_console(), explanation)


def explain_policy(options: SchedulingOptions, policy: ResolvedSchedulingPolicy,
                   limits: StepPlannerLimits) -> list[dict[str, Any]]:
    """Each field of ``policy`` (resolved from ``options``) with the SPEC §2 rule behind it."""
    b, s_in, p, t_max = (limits.max_batch_size, limits.max_input_length, limits.kv_page_size,
                         limits.t_max)
    mixed = policy.mode == IfbSchedulingMode.MIXED
    if options.ifb_scheduling_mode != IfbSchedulingMode.AUTO:
        mode_rule = "given"
    elif options.max_num_tokens and mixed:
        mode_rule = "rule 2: AUTO -> MIXED because max_num_tokens was given"
    else:
        relation = ">=" if mixed else "<"
        mode_rule = (f"rule 2: AUTO -> {policy.mode.name} because rd(T_max)={rd(t_max, p)} "
                     f"{relation} B+P={b + p}")
    if not mixed:
        mnt_rule = f"rule 4: PREFILL_FIRST uses T_max = {_t_max_text(limits)}"
        mct_rule = f"rule 4: PREFILL_FIRST uses S_in = {s_in}"
    else:
        if options.max_num_tokens:
            mnt_rule = f"rule 3: given, within [B+P, T_max] = [{b + p}, {t_max}]"
        else:
            target = default_target(limits)
            mnt_rule = (f"rule 3: default min(ru({target}+B), rd(T_max)) = "
                        f"min({ru(target + b, p)}, {rd(t_max, p)})")
        mnt = policy.max_num_tokens
        if options.max_chunk_tokens:
            before = options.max_chunk_tokens
            mct_rule = f"rule 3: given {before}, a multiple of P in [P, max_num_tokens-B]"
        else:
            before = default_max_chunk_tokens(mnt, limits)
            mct_rule = f"rule 3: default max(P, rd(min(512, max_num_tokens-B))) = {before}"
        if before > chunk_cap(limits):
            mct_rule += f", capped at max(P, rd(S_in)) = {chunk_cap(limits)}"
    defaults = SchedulingOptions()
    rows = [("mode", policy.mode.name, mode_rule),
            ("max_num_tokens", policy.max_num_tokens, mnt_rule),
            ("max_chunk_tokens", policy.max_chunk_tokens, mct_rule)]
    for name in ("scheduling_policy", "preemption", "priority_reserved_slots",
                 "max_pause_steps"):
        value = getattr(policy, name)
        given = value != getattr(defaults, name)
        rows.append((name, getattr(value, "name", value),
                     "given (rule 1 range)" if given else "default"))
    return [{"field": f, "value": v, "rule": r} for f, v, r in rows]


def _t_max_text(limits: StepPlannerLimits) -> str:
    full = limits.max_batch_size * limits.max_input_length
    if limits.max_step_tokens:
        return f"min(B*S_in, max_step_tokens) = min({full}, {limits.max_step_tokens}) = {limits.t_max}"
    return f"B*S_in = {full}"


def _resident_reasons(ledger: Ledger, plan: Any, reasons: Any) -> list[dict[str, Any]]:
    planned = {s.resident: s for s in plan.sequences}
    out = []
    for i, (record, code) in enumerate(zip(ledger.to_records(), reasons.tolist())):
        outcome, released = split_reason(code) if code else (None, False)
        row = planned.get(i)
        out.append({
            "index": i, **record,
            "reason": outcome.name if outcome else None,
            "released_from_pause": released,
            "planned": None if row is None else {"work": row.work.name,
                                                 "past_length": row.past_length,
                                                 "query_length": row.query_length},
        })
    return out


@main.command("record")
@click.argument("out", type=click.File("w"))
@workload_options
@limit_options
@scheduling_options
@run_options
@_library_errors
def record_command(out: Any, latency_text: str, max_steps: int | None, progress: bool,
                   **kw: Any) -> None:
    """Simulate and write every step's ledger and plan to OUT (JSON Lines)."""
    limits, options, workload = _limits(kw), _options(kw), _workload(kw)
    policy = resolve_scheduling_policy(options, limits)
    recorder = StepRecorder(out, limits, policy)
    result = _run(workload, limits, policy, LatencyModel.parse(latency_text),
                  max_steps if max_steps is not None else 2000, progress, "recording",
                  on_step=recorder)
    completed = int((~np.isnan(result.finish_time)).sum())
    click.echo(f"recorded {recorder.steps} steps ({completed} requests completed) to {out.name}",
               err=out.name == "<stdout>")


@main.command("replay")
@click.argument("record_file", type=click.File("r"))
@click.option("--config", "config_text", default="",
              help="Re-plan under other options than the recorded ones, e.g. "
                   "'policy=priority,preemption=pause'.")
@click.option("--show", type=click.IntRange(min=0), default=5, show_default=True,
              help="How many differing steps to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_library_errors
def replay_command(record_file: Any, config_text: str, show: int, as_json: bool) -> None:
    """Re-plan every recorded step; print a diff where a plan differs (exit status 1)."""
    lines = record_file.read().splitlines()
    policy = limits = None
    if config_text:
        limits, recorded = read_record_header(lines)
        base = SchedulingOptions(
            scheduling_policy=recorded.scheduling_policy, preemption=recorded.preemption,
            priority_reserved_slots=recorded.priority_reserved_slots,
            max_pause_steps=recorded.max_pause_steps)
        config = parse_config(parse_config_text(config_text), limits, base)
        limits = config.limits
        policy = resolve_scheduling_policy(config.options, limits)
    result = replay(lines, policy, limits)
    if as_json:
        click.echo(json.dumps({"steps": result.steps, "policy": policy_to_dict(result.policy),
                               "differing_steps": len(result.diffs), "diffs": result.diffs},
                              indent=2))
    else:
        _print_replay(_console(), result, show)
    if result.diffs:
        sys.exit(1)


@main.command("bench", context_settings={"ignore_unknown_options": True,
                                         "allow_extra_args": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_command(args: tuple[str, ...]) -> None:
    """Planner micro-benchmarks: every argument goes to stepplanner.bench (try: bench --help)."""
    try:
        bench = importlib.import_module("stepplanner.bench")
    except ModuleNotFoundError as exc:
        if exc.name != "stepplanner.bench":
            raise
        raise click.ClickException(
            "stepplanner bench is not available: the module stepplanner.bench is missing from "
            "this installation (reinstall stepplanner)") from None
    sys.exit(bench.main(list(args)))


# --- rendering -------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f}"


_CLASS_NAMES = {str(c.priority): f"{c.priority} {c.name}" for c in DEFAULT_CLASSES}


def _class_name(key: str) -> str:
    return _CLASS_NAMES.get(key, key)


def _print_report(console: Console, r: dict[str, Any]) -> None:
    w, t, s, p, pl = r["workload"], r["throughput"], r["steps"], r["pauses"], r["planner"]
    pol = r["policy"]
    console.print(f"[bold]workload[/] {w['source']}: {w['requests']} requests over "
                  f"{w['duration_s']:.1f} s, mean prompt {w['prompt_tokens_mean']:.0f} / output "
                  f"{w['output_tokens_mean']:.0f} tokens")
    console.print(f"[bold]engine[/] B={r['limits']['max_batch_size']} "
                  f"S_in={r['limits']['max_input_length']} P={r['limits']['kv_page_size']}; "
                  f"[bold]policy[/] {pol['mode']} max_num_tokens={pol['max_num_tokens']} "
                  f"max_chunk_tokens={pol['max_chunk_tokens']} {pol['scheduling_policy']} "
                  f"preemption={pol['preemption']} reserved={pol['priority_reserved_slots']} "
                  f"max_pause_steps={pol['max_pause_steps']}")
    console.print(f"[bold]latency model[/] {r['latency_model']['name']}: a={r['latency_model']['a']:g} s"
                  f" + b={r['latency_model']['b']:g} s/token + c={r['latency_model']['c']:g} s/context")
    req = r["requests"]
    console.print(f"[bold]requests[/] {req['completed']}/{req['submitted']} completed, "
                  f"{req['refused']} refused (prompt > S_in){', run cut by --max-steps' if s['truncated_by_max_steps'] else ''}")
    console.print(f"[bold]throughput[/] {t['requests_per_s']:.2f} req/s, "
                  f"{t['output_tokens_per_s']:,.0f} output tok/s, {t['tokens_per_s']:,.0f} tok/s "
                  f"over {t['simulated_seconds']:.1f} simulated s")
    console.print(f"[bold]steps[/] {s['count']:,}: mean {s['mean_tokens']:.0f} tokens, "
                  f"{s['mean_prefill_rows']:.2f} chunks + {s['mean_decode_rows']:.1f} decodes, "
                  f"{s['mean_residents']:.0f} residents, {s['mean_step_ms']:.2f} ms")
    console.print(f"[bold]pauses[/] {p['paused_resident_steps']:,} paused resident-steps, "
                  f"{p['requests_paused']} requests paused, longest {p['max_consecutive_paused_steps']}"
                  f" steps in a row, {p['released_by_max_pause_steps']:,} releases by max_pause_steps")
    table = Table(title="latency by priority class (ms)", title_justify="left")
    table.add_column("class")
    for col in ("queue p50", "queue p99", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50",
                "TPOT p99", "E2E p50", "E2E p99", "max ITL p99"):
        table.add_column(col, justify="right")
    for key, lat in r["latency_s"].items():
        table.add_row(_class_name(key), _ms(lat["queue"]["p50"]), _ms(lat["queue"]["p99"]),
                      _ms(lat["ttft"]["p50"]), _ms(lat["ttft"]["p90"]), _ms(lat["ttft"]["p99"]),
                      _ms(lat["tpot"]["p50"]), _ms(lat["tpot"]["p99"]), _ms(lat["e2e"]["p50"]),
                      _ms(lat["e2e"]["p99"]), _ms(lat["max_itl"]["p99"]))
    console.print(table)
    reasons = ", ".join(f"{k} {v:,}" for k, v in r["reasons"].items() if v)
    console.print(f"[bold]reasons[/] (resident-steps) {reasons}")
    console.print(f"[bold]planner[/] plan() {pl['mean_plan_us']:.2f} us/step mean, "
                  f"p50 {pl['p50_plan_us']:.2f}, p99 {pl['p99_plan_us']:.2f}; ledger apply "
                  f"{pl['mean_apply_us']:.2f} us/step; {s['count']:,} steps in "
                  f"{pl['wall_seconds']:.2f} s = {pl['steps_per_s'] or 0:,.0f} steps/s")


def _print_comparison(console: Console, reports: list[dict[str, Any]]) -> None:
    first = reports[0]
    w = first["workload"]
    console.print(f"[bold]workload[/] {w['source']}: {w['requests']} requests; engine "
                  f"B={first['limits']['max_batch_size']} S_in={first['limits']['max_input_length']}"
                  f" P={first['limits']['kv_page_size']}; {first['latency_model']['name']}")
    classes = [k for k in first["latency_s"] if k != "all"]
    table = Table(title_justify="left")
    table.add_column("configuration", max_width=26)
    for col in ("budget/\nchunk", "req/s", "out\ntok/s", "tok/\nstep", "TTFT\np50", "TTFT\np99",
                *(f"TTFT p99\n[{c}]" for c in classes), "TPOT\np99", "max ITL\np99",
                "E2E\np99", "paused\nsteps", "plan\nus"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in reports:
        lat, pol = r["latency_s"], r["policy"]
        table.add_row(
            r["name"], f"{pol['max_num_tokens']}/{pol['max_chunk_tokens']}",
            f"{r['throughput']['requests_per_s']:.2f}",
            f"{r['throughput']['output_tokens_per_s']:,.0f}", f"{r['steps']['mean_tokens']:.0f}",
            _ms(lat["all"]["ttft"]["p50"]), _ms(lat["all"]["ttft"]["p99"]),
            *(_ms(lat[c]["ttft"]["p99"]) if c in lat else "-" for c in classes),
            _ms(lat["all"]["tpot"]["p99"]), _ms(lat["all"]["max_itl"]["p99"]),
            _ms(lat["all"]["e2e"]["p99"]), f"{r['pauses']['paused_resident_steps']:,}",
            f"{r['planner']['mean_plan_us']:.2f}")
    console.print(table)
    console.print("latencies in ms of simulated time; plan us = measured planner microseconds "
                  "per step on this machine")


def _print_explanation(console: Console, e: dict[str, Any]) -> None:
    table = Table(title="resolved policy (SPEC §2)", title_justify="left")
    for col in ("field", "value", "rule"):
        table.add_column(col)
    for row in e["policy"]:
        table.add_row(row["field"], str(row["value"]), row["rule"])
    console.print(table)
    table = Table(title="residents", title_justify="left")
    for col in ("#", "request", "prio", "arrival", "prompt", "committed", "ctx done",
                "paused", "reason", "planned"):
        table.add_column(col, justify="right" if col not in ("reason", "planned") else "left")
    for r in e["residents"]:
        reason = (r["reason"] or "-") + (" (released from pause)" if r["released_from_pause"]
                                        else "")
        planned = r["planned"]
        what = "-" if planned is None else (f"{planned['work']} past={planned['past_length']} "
                                            f"q={planned['query_length']}")
        table.add_row(str(r["index"]), str(r["request_id"]), str(r["priority"]),
                      str(r["arrival"]), str(r["prompt_length"]), str(r["committed"]),
                      "yes" if r["context_committed"] else "no",
                      str(r["consecutive_paused_steps"]), reason, what)
    console.print(table)
    p = e["plan"]
    console.print(f"[bold]plan[/] {p['num_prefill']} chunks ({p['prefill_tokens']} tokens) + "
                  f"{p['num_decode']} decodes = {p['total_tokens']} tokens; paused {p['paused']}")


def _print_replay(console: Console, result: Any, show: int) -> None:
    if not result.diffs:
        console.print(f"replayed {result.steps} steps: every plan matches the recording")
        return
    console.print(f"[bold red]replayed {result.steps} steps: {len(result.diffs)} differ[/]")
    for diff in result.diffs[:show]:
        console.print(f"[bold]step {diff['step']}[/] (line {diff['line']}):")
        for text in diff["differences"][:12]:
            console.print(f"  {text}", markup=False)
        if len(diff["differences"]) > 12:
            console.print(f"  ... {len(diff['differences']) - 12} more")


# --- plotting --------------------------------------------------------------------------------


def _require_matplotlib() -> None:
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise click.ClickException(
            "--plot needs matplotlib, which is not installed; install it with: "
            "pip install 'stepplanner[plot]'") from None


def _plot(result: SimulationResult, path: str) -> None:
    # Imported by name: matplotlib is optional and has no stubs where it is not installed.
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    w = result.workload
    ttft = result.latencies()["ttft"]
    fig, (ax_cdf, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in w.classes:
        values = np.sort(ttft[(w.priority == p) & ~np.isnan(ttft)])
        if values.size:
            ax_cdf.plot(values * 1e3, np.arange(1, values.size + 1) / values.size,
                        label=_class_name(str(p)))
    ax_cdf.set(xscale="log", xlabel="TTFT (ms, simulated)", ylabel="fraction of requests",
               title="TTFT CDF by priority class")
    ax_cdf.legend()
    st = result.steps
    ax_time.plot(st["end_time"], st["residents"], label="residents", lw=0.8)
    ax_time.plot(st["end_time"], st["waiting"], label="waiting", lw=0.8)
    ax_time.plot(st["end_time"], st["num_paused"], label="paused", lw=0.8)
    ax_time.set(xlabel="simulated time (s)", ylabel="requests", title="batch timeline")
    ax_time.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# sweep, capacity, calibrate: one module each (they import the shared options above).
from .cli_tuning import register as _register_tuning  # noqa: E402

_register_tuning(main)


if __name__ == "__main__":  # pragma: no cover
    main()
