"""``stepplanner sweep``: a grid of configurations against SLOs, ranked by goodput."""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import cli as base
from ..tuning.grid import expand_grid, parse_grid
from ..tuning.sweep import sweep
from . import render
from .options import (
    PLOT_SUFFIXES,
    check_output_path,
    latency_model_option,
    latency_of,
    output_options,
    percentiles_option,
    slo_option,
)
from .progress import ConfigProgress, report_interrupt


@click.command("sweep")
@base.workload_options
@base.limit_options
@base.scheduling_options
@click.option("--grid", "grid_texts", multiple=True,
              help="NAME=V1,V2,... (repeatable): a SchedulingOptions or limits field and the "
                   "values to try, e.g. --grid mode=mixed,prefill_first --grid "
                   "max_num_tokens=320,768. The options above are the base of every point.")
@slo_option
@latency_model_option
@percentiles_option
@output_options("one object per configuration")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write the TTFT p99 / TPOT p99 plane with the Pareto front (PNG, SVG, PDF; "
                   "needs matplotlib).")
@base._library_errors
def command(grid_texts: tuple[str, ...], slos: Any, latency_model: Any, latency_text: str,
            metric_percentiles: Any, backend: str, workers: int | None,
            ray_address: str | None, as_json: bool, save_result: str | None,
            csv_path: str | None, plot: str | None, progress: bool, **kw: Any) -> None:
    """Simulate every configuration of a grid on one workload; rank by goodput under --slo."""
    for option, path in (("--save-result", save_result), ("--csv", csv_path)):
        check_output_path(option, path)
    check_output_path("--plot", plot, PLOT_SUFFIXES)
    if plot:
        render.require_matplotlib()
    limits, options, workload = base._limits(kw), base._options(kw), base._workload(kw)
    latency = latency_of(latency_model, latency_text)
    grid = parse_grid(grid_texts)
    total = len(expand_grid(grid, limits, options))
    with ConfigProgress(total, progress and not as_json, "sweeping") as tick:
        records, outcome = sweep(workload, grid, limits, options, latency, slos,
                                 metric_percentiles, backend, workers, ray_address, tick)
    report_interrupt(outcome, total)
    text = render.save(render.document(workload.summary(), latency, slos, grid, outcome, records),
                       save_result, csv_path)
    if plot:
        render.plot_front(plot, records, slos, f"{workload.source}: {len(records)} "
                                                "configurations")
    if as_json:
        click.echo(text)
    else:
        out = render.console()
        out.print(f"[bold]workload[/] {workload.source}; [bold]latency model[/] {latency.name}; "
                  f"{len(records)} configurations on {outcome.backend} ({outcome.workers} "
                  "workers)")
        render.sweep_table(records, slos, out)
        for label, path in (("csv", csv_path), ("plot", plot), ("result", save_result)):
            if path:
                out.print(f"{label} written to {path}")
    if outcome.interrupted:
        sys.exit(130)
