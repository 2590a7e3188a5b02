"""``stepplanner simulate``: one configuration on one workload."""

from __future__ import annotations

from typing import Any

import click

from ..cli import tuning_extras
from ..fidelity.simulated import results_document
from ..planner._policy import resolve_scheduling_policy
from ..sim.engine import Engine, RunSpec
from .engine_options import engine_options, engine_options_from, preemption_lines
from .errors import InputError, library_errors
from .files import check_files
from .notices import warn_no_op_options, warn_refused
from .options import (
    format_options,
    limit_options,
    limits_from,
    num_pages_option,
    offered_from,
    options_from,
    output_format,
    queue_from,
    queue_options,
    run_options,
    scheduling_options,
    speculation_from,
    speculation_options,
    workload_choice_option,
    workload_options,
)
from .plot import check_plot_path, plot_result, require_matplotlib
from .render import emit, page_blocks, report_blocks
from .running import check_num_pages, run
from .slo_render import attainment_blocks
from .tuning_options import latency_model_file, latency_of
from .tuning_render import write_json


@click.command("simulate")
@workload_choice_option
@workload_options
@limit_options
@scheduling_options
@run_options
@format_options
@num_pages_option
@engine_options
@queue_options
@speculation_options
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Write an image (.png, .svg, .pdf, ...): the TTFT CDF per priority class and "
    "the batch timeline (needs matplotlib).",
)
@tuning_extras.simulate_options
@library_errors
def simulate_command(
    latency_text: str,
    max_steps: int | None,
    progress: bool,
    fmt: str,
    as_json: bool,
    plot: str | None,
    slos: Any,
    latency_model: Any,
    metric_percentiles: Any,
    save_result: str | None,
    save_detailed: bool,
    num_pages: int,
    **kw: Any,
) -> None:
    """Simulate one configuration (the embedded workload when neither --workload nor --trace
    is given)."""
    if plot:
        require_matplotlib()
        check_plot_path(plot)
    if save_detailed and save_result is None:
        raise InputError(
            "--save-detailed adds the per-request results to --save-result FILE; "
            "give --save-result too"
        )
    check_files(
        {"--save-result": save_result, "--plot": plot},
        {"--trace": kw["trace"], "--latency-model": latency_model_file()},
    )
    fmt = output_format(fmt, as_json)
    limits = limits_from(kw)
    options, offered = options_from(kw, limits), offered_from(kw)
    workload = offered.workload
    queue, speculation = queue_from(kw), speculation_from(kw)
    policy = resolve_scheduling_policy(options, limits)
    warn_no_op_options(options, policy)
    latency = latency_of(latency_model, latency_text)
    show_progress = progress and fmt == "table"
    check_num_pages(num_pages, workload, limits)
    offered.check_pool(num_pages)
    extras = engine_options_from(kw, num_pages)
    engine = Engine(limits, policy, latency, num_pages, queue, speculation, **extras)
    result, occupancy = run(
        RunSpec(workload, engine, max_steps, save_detailed, offered.prefixes),
        show_progress,
        "simulating",
    )
    warn_refused(result)
    report = result.report()
    if occupancy is not None:
        report["pages"] = occupancy.report()
    report.update(tuning_extras.section(result, slos, metric_percentiles))
    tuning_extras.save(save_result, report, results_document(result) if save_detailed else None)
    if plot:
        plot_result(result, plot)
    if fmt == "json":
        click.echo(write_json(None, report))
    else:
        pages = (
            page_blocks(report["pages"], result.num_steps, "preemption" in report)
            if occupancy is not None
            else []
        )
        emit(
            [
                *report_blocks(report),
                *pages,
                *preemption_lines([report]),
                *attainment_blocks(report),
                *tuning_extras.vllm_blocks(report, metric_percentiles),
            ],
            fmt,
        )
    if plot:
        click.echo(f"plot written to {plot}", err=True)
