"""``stepplanner fidelity``: a real run's per-request results beside the simulation of its trace."""

from __future__ import annotations

import dataclasses
import pathlib
import statistics
from typing import Any

import click

from ..fidelity.compare import fidelity_report
from ..fidelity.results import RunResults, read_results, served_workload
from ..planner._policy import SchedulingOptions, StepPlannerLimits, resolve_scheduling_policy
from ..sim.engine import Engine, RunSpec
from ..sim.latency_models import PACE_WINDOW, measured_pace, read_step_timings
from ..sim.traces import read_trace
from ..sim.workloads import Workload
from .errors import library_errors
from .files import check_files
from .notices import warn, warn_no_op_options, warn_refused
from .options import (
    format_option,
    given,
    limit_options,
    limits_from,
    num_pages_option,
    objective_options,
    options_from,
    run_options,
    scheduling_options,
    trace_from,
    trace_options,
    with_objectives_from,
)
from .plot import check_plot_path, plot_fidelity, require_matplotlib
from .render import emit, fidelity_blocks
from .replay import recorded_options
from .running import check_num_pages, run
from .tuning_options import latency_model_file, latency_model_option, latency_of
from .tuning_render import write_json

LIMIT_PARAMETERS = ("max_batch_size", "max_input_length", "kv_page_size", "max_step_tokens")
# Flag name -> SchedulingOptions field.
OPTION_PARAMETERS = {
    "mode": "ifb_scheduling_mode",
    "max_num_tokens": "max_num_tokens",
    "max_chunk_tokens": "max_chunk_tokens",
    "scheduling_policy": "scheduling_policy",
    "preemption": "preemption",
    "priority_reserved_slots": "priority_reserved_slots",
    "max_pause_steps": "max_pause_steps",
}


@click.command("fidelity")
@click.argument(
    "results_path", metavar="RESULTS.json", type=click.Path(exists=True, dir_okay=False)
)
@trace_options("the trace the results name, else the requests they hold")
@limit_options
@scheduling_options
@objective_options
@run_options
@latency_model_option
@num_pages_option
@format_option
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the full report as JSON to this file ('-': stdout, as --format json).",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Write an image (.png, .svg, .pdf, ...): real and simulated CDFs of TTFT, "
    "TPOT and E2E (needs matplotlib).",
)
@click.option(
    "--pace-from",
    "pace_from",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="TIMINGS.csv",
    help="Diagnostic: replay the real run's own speed over time. Each simulated step "
    "takes the model's seconds x the ratio of measured to modelled seconds of "
    "the real steps that started in the same window (needs the timings file's "
    "'start' column, as serve-trace writes it).",
)
@click.option(
    "--pace-window",
    type=click.FloatRange(min=0, min_open=True),
    default=PACE_WINDOW,
    show_default=True,
    help="--pace-from: the window, in seconds.",
)
@library_errors
def fidelity_command(
    results_path: str,
    latency_text: str,
    latency_model: Any,
    max_steps: int | None,
    progress: bool,
    num_pages: int,
    fmt: str,
    json_path: str | None,
    plot: str | None,
    pace_from: str | None,
    pace_window: float,
    **kw: Any,
) -> None:
    """Simulate the trace a real run served, with its limits and policy, and print real beside
    simulated: p50/p90/p99 of TTFT, TPOT, ITL and E2E and throughput, with relative errors.

    RESULTS.json is stepplanner's per-request results or vLLM's (vllm bench serve
    --save-result --save-detailed). The trace, limits and policy default to those the results
    record (a stepplanner results file); a flag given here replaces its field. --pace-from
    separates the error the engine's changing speed made from the rest (a diagnostic: the
    pace comes from the run being checked).
    """
    if plot:
        require_matplotlib()
        check_plot_path(plot)
    if json_path == "-":
        fmt, json_path = "json", None
    ctx = click.get_current_context()
    trace_option = "--trace" if kw["trace"] else "the trace the results name"
    results = read_results(results_path)
    trace, trace_name = _trace(kw, results, results_path)
    check_files(
        {"--json": json_path, "--plot": plot},
        {
            "RESULTS.json": results_path,
            trace_option: trace_name,
            "--latency-model": latency_model_file(),
            "--pace-from": pace_from,
        },
    )
    limits, options = _configuration(ctx, kw, results)
    policy = resolve_scheduling_policy(options, limits)
    warn_no_op_options(options, policy)
    _notices(results, latency_model, latency_text, policy)
    latency = latency_of(latency_model, latency_text)
    pace = (
        measured_pace(
            read_step_timings(pace_from), latency, pace_window, f"--pace-from {pace_from}"
        )
        if pace_from
        else None
    )
    workload, matched = served_workload(results, trace, trace_name)
    # The objectives the run was scheduled under (a deadline policy acts on them): a trace's
    # columns, or the classes given here.
    workload = with_objectives_from(kw, workload, embedded=False)
    check_num_pages(num_pages, workload, limits)
    show = progress and fmt == "table"
    engine = Engine(limits, policy, latency, num_pages, pace=pace)
    result, _ = run(RunSpec(workload, engine, max_steps), show, "simulating")
    warn_refused(result)
    fidelity = fidelity_report(matched, result)
    if pace is not None:
        fidelity.report["pace"] = {
            "from": pace_from,
            "window": pace.window,
            "windows": len(pace.factors),
            "min": min(pace.factors),
            "median": statistics.median(pace.factors),
            "max": max(pace.factors),
        }
    if json_path is not None:
        write_json(json_path, fidelity.report)
    if plot:
        series = {
            side: {m: getattr(samples["all"], m) for m in ("ttft", "tpot", "e2e")}
            for side, samples in (("real", fidelity.real), ("simulated", fidelity.simulated))
        }
        plot_fidelity(
            series["real"],
            series["simulated"],
            plot,
            f"{pathlib.Path(results_path).name}: real vs simulated ({latency.name})",
        )
    if fmt == "json":
        click.echo(write_json(None, fidelity.report))
    else:
        emit(fidelity_blocks(fidelity.report), fmt)
    for what, path in (("report", json_path), ("plot", plot)):
        if path:
            click.echo(f"{what} written to {path}", err=True)


def _trace(
    kw: dict[str, Any], results: RunResults, results_path: str
) -> tuple[Workload | None, str | None]:
    """``--trace``, else the trace the results name when it is found (as written, or beside the
    results file), else None: the results' own arrivals and lengths."""
    path = kw["trace"]
    trace = trace_from(kw)
    if trace is not None:
        return trace, path
    if results.trace is None:
        return None, None
    for candidate in (
        pathlib.Path(results.trace),
        pathlib.Path(results_path).parent / results.trace,
    ):
        if candidate.is_file():
            return read_trace(candidate), str(candidate)
    warn(
        f"the trace the results name ({results.trace}) was not found; the arrivals, lengths "
        "and priorities come from the results themselves (give --trace to use the trace)"
    )
    return None, None


def _configuration(
    ctx: click.Context, kw: dict[str, Any], results: RunResults
) -> tuple[StepPlannerLimits, SchedulingOptions]:
    """The limits and options to simulate: the flags given on the command line, and for every
    other field the run's own (a stepplanner results file), else the flag's default."""
    limits = limits_from(kw)
    options = options_from(kw, limits)
    if results.limits is not None:
        limits = dataclasses.replace(
            results.limits,
            **{
                name: getattr(limits, name)
                for name in LIMIT_PARAMETERS
                if given(ctx, name) is not None
            },
        )
    if results.policy is not None:
        named = {
            field: getattr(options, field)
            for flag, field in OPTION_PARAMETERS.items()
            if given(ctx, flag) is not None
        }
        options = dataclasses.replace(recorded_options(results.policy, set(named)), **named)
    return limits, options


def _notices(results: RunResults, latency_model: Any, latency_text: str, policy: Any) -> None:
    if results.num_failed:
        warn(
            f"{results.num_failed} of the real run's requests failed; they are left out of "
            "both sides' metrics"
        )
    if results.scheduler and results.policy is None:
        warn(
            f"the run was scheduled by {results.scheduler!r}, which is not a stepplanner "
            f"policy; the simulation runs {policy.mode.name} + "
            f"{policy.scheduling_policy.name} from the flags"
        )
    if latency_model is None and not latency_text.strip():
        warn(
            "no --latency-model or --latency given: the simulation times steps with the "
            "default preset, not this engine; fit one to the run's step timings with "
            "'stepplanner calibrate' and pass --latency-model FILE"
        )
