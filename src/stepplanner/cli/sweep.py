"""``stepplanner sweep``: a grid of configurations against SLOs, ranked by goodput."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..sim.engine import ServingQueue
from ..tuning.grid import grid_size, parse_grid
from ..tuning.sweep import sweep
from .counts import runs_at_once
from .engine_options import engine_options, engine_options_from
from .errors import library_errors
from .files import check_files
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
    scheduling_options,
    workload_choice_option,
    workload_options,
)
from .plot import check_plot_path, require_matplotlib
from .render import emit
from .running import check_num_pages
from .tuning_options import (
    latency_model_file,
    latency_model_option,
    latency_of,
    output_options,
    percentiles_option,
    slo_option,
)
from .tuning_progress import ConfigProgress, report_interrupt
from .tuning_render import document, plot_front, save, sweep_blocks


@click.command("sweep")
@workload_choice_option
@workload_options
@limit_options
@scheduling_options
@queue_options
@click.option(
    "--grid",
    "grid_texts",
    multiple=True,
    help="NAME=V1,V2,... (repeatable): a SchedulingOptions or limits field and the "
    "values to try, e.g. --grid mode=mixed,prefill_first --grid "
    "max_num_tokens=320,768. The options above are the base of every point.",
)
@slo_option
@latency_model_option
@percentiles_option
@num_pages_option
@engine_options
@output_options("one object per configuration")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the TTFT p99 / TPOT p99 plane with the Pareto front (PNG, SVG, PDF; "
    "needs matplotlib).",
)
@format_options
@library_errors
def sweep_command(
    grid_texts: tuple[str, ...],
    slos: Any,
    latency_model: Any,
    latency_text: str,
    metric_percentiles: Any,
    backend: str,
    workers: int | None,
    ray_address: str | None,
    save_result: str | None,
    csv_path: str | None,
    progress: bool,
    plot: str | None,
    fmt: str,
    as_json: bool,
    num_pages: int,
    **kw: Any,
) -> None:
    """Simulate every configuration of a grid on one workload; rank by goodput under --slo."""
    fmt = output_format(fmt, as_json)
    if plot:
        require_matplotlib()
        check_plot_path(plot)
    check_files(
        {"--save-result": save_result, "--csv": csv_path, "--plot": plot},
        {"--trace": kw["trace"], "--latency-model": latency_model_file()},
    )
    grid = parse_grid(grid_texts)
    total = grid_size(grid)
    runs = runs_at_once(workers, total)
    limits = limits_from(kw, runs)
    options = options_from(kw, limits)
    offered = offered_from(kw, runs)
    workload = offered.workload
    check_num_pages(num_pages, workload, limits)
    offered.check_pool(num_pages)
    engine = {"num_pages": num_pages, **engine_options_from(kw, num_pages)}
    queue = queue_from(kw)
    if queue != ServingQueue():  # the serving queue (admission order, waiting cap) of every point
        engine["queue"] = queue
    latency = latency_of(latency_model, latency_text)
    with ConfigProgress(total, progress and fmt == "table", "sweeping") as tick:
        records, outcome = sweep(
            workload,
            grid,
            limits,
            options,
            latency,
            slos,
            metric_percentiles,
            backend,
            workers,
            ray_address,
            tick,
            {k: v for k, v in engine.items() if v},
            offered.prefixes,
        )
    report_interrupt(outcome, total)
    text = save(
        document(workload.summary(), latency, slos, grid, outcome, records), save_result, csv_path
    )
    if plot:
        plot_front(plot, records, slos, workload.source)
    if fmt == "json":
        click.echo(text)
    else:
        emit(
            sweep_blocks(
                records,
                slos,
                f"{workload.source}; {latency.name}; {total} "
                f"configurations on {outcome.backend} "
                f"({outcome.workers} workers)",
            ),
            fmt,
        )
    for label, path in (("csv", csv_path), ("plot", plot), ("result", save_result)):
        if path:
            click.echo(f"{label} written to {path}", err=True)
    if outcome.interrupted:
        sys.exit(130)
