"""``stepplanner simulate``: one configuration on one workload."""

from __future__ import annotations

from typing import Any

import click

from ..cli import tuning_extras
from ..planner._policy import resolve_scheduling_policy
from .errors import library_errors
from .notices import warn_no_op_options, warn_refused
from .options import (
    format_options,
    limit_options,
    limits_from,
    num_pages_option,
    options_from,
    output_format,
    run_options,
    scheduling_options,
    workload_from,
    workload_options,
)
from .plot import check_plot_path, plot_result, require_matplotlib
from .render import emit, page_blocks, report_blocks
from .running import check_num_pages, run, run_paged
from .tuning_options import check_output_paths, latency_of
from .tuning_render import write_json


@click.command("simulate")
@workload_options
@limit_options
@scheduling_options
@run_options
@format_options
@num_pages_option
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write an image (.png, .svg, .pdf, ...): the TTFT CDF per priority class and "
                   "the batch timeline (needs matplotlib).")
@tuning_extras.simulate_options
@library_errors
def simulate_command(latency_text: str, max_steps: int | None, progress: bool, fmt: str,
                     as_json: bool, plot: str | None, slos: Any, latency_model: Any,
                     metric_percentiles: Any, save_result: str | None, num_pages: int,
                     **kw: Any) -> None:
    """Simulate one configuration (the embedded workload when no --trace is given)."""
    if plot:
        require_matplotlib()
        check_plot_path(plot)
    check_output_paths(save_result=save_result)
    fmt = output_format(fmt, as_json)
    limits, options, workload = limits_from(kw), options_from(kw), workload_from(kw)
    policy = resolve_scheduling_policy(options, limits)
    warn_no_op_options(options, policy)
    latency = latency_of(latency_model, latency_text)
    show_progress = progress and fmt == "table"
    check_num_pages(num_pages, workload, limits)
    if num_pages:
        result, occupancy = run_paged(workload, limits, policy, latency, max_steps,
                                      show_progress, "simulating", num_pages)
    else:
        result = run(workload, limits, policy, latency, max_steps, show_progress, "simulating")
    warn_refused(result)
    report = result.report()
    if num_pages:
        report["pages"] = occupancy.report()
    report.update(tuning_extras.section(result, slos, metric_percentiles))
    tuning_extras.save(save_result, report)
    if plot:
        plot_result(result, plot)
    if fmt == "json":
        click.echo(write_json(None, report))
    else:
        pages = page_blocks(report["pages"], result.num_steps) if num_pages else []
        emit([*report_blocks(report), *pages,
              *tuning_extras.vllm_blocks(report, metric_percentiles)], fmt)
    if plot:
        click.echo(f"plot written to {plot}", err=True)
