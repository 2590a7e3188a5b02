"""``stepplanner capacity``: per configuration, the highest arrival rate that meets the SLOs."""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import cli as base
from ..traces import read_trace
from ..tuning.capacity import ScaledTrace, SyntheticRates, capacity
from ..tuning.grid import expand_grid, parse_grid
from . import render
from .options import (
    check_output_path,
    latency_model_option,
    latency_of,
    output_options,
    slo_option,
)
from .progress import ConfigProgress, report_interrupt


@click.command("capacity")
@base.workload_options
@base.limit_options
@base.scheduling_options
@click.option("--grid", "grid_texts", multiple=True,
              help="NAME=V1,V2,... (repeatable), as for sweep: one capacity per point.")
@slo_option
@latency_model_option
@click.option("--tolerance", type=click.FloatRange(min=0, min_open=True), default=0.1,
              show_default=True, help="Stop bisecting when the bracket is this narrow (req/s).")
@click.option("--max-rate", type=click.FloatRange(min=0, min_open=True), default=10_000.0,
              show_default=True, help="Stop doubling here (req/s).")
@output_options("'options' and 'capacity' (req/s) per configuration")
@base._library_errors
def command(grid_texts: tuple[str, ...], slos: Any, latency_model: Any, latency_text: str,
            tolerance: float, max_rate: float, backend: str, workers: int | None,
            ray_address: str | None, as_json: bool, save_result: str | None,
            csv_path: str | None, progress: bool, **kw: Any) -> None:
    """Bisect the arrival rate per configuration (same requests, time axis scaled; fixed seed).

    The synthetic workload starts from --rate; a --trace from its own mean rate.
    """
    if not slos:
        raise click.UsageError("capacity needs at least one --slo (without one every rate is "
                               "sustainable)")
    for option, path in (("--save-result", save_result), ("--csv", csv_path)):
        check_output_path(option, path)
    limits, options = base._limits(kw), base._options(kw)
    if kw.get("trace"):
        source: Any = ScaledTrace(read_trace(kw["trace"], kw.get("columns")))
    else:
        source = SyntheticRates(kw["requests"], kw["seed"], kw["rate"])
    latency = latency_of(latency_model, latency_text)
    grid = parse_grid(grid_texts)
    total = len(expand_grid(grid, limits, options))
    with ConfigProgress(total, progress and not as_json, "capacity") as tick:
        records, outcome = capacity(source, grid, limits, options, latency, slos, tolerance,
                                    max_rate, backend, workers, ray_address, tick)
    report_interrupt(outcome, total)
    document = render.document(source.at(source.rate).summary(), latency, slos, grid, outcome,
                               records, tolerance=tolerance)
    text = render.save(document, save_result, csv_path)
    if as_json:
        click.echo(text)
    else:
        out = render.console()
        out.print(f"[bold]workload[/] {document['workload']['source']} (time axis scaled); "
                  f"[bold]SLOs[/] {', '.join(document['slos'])}; tolerance {tolerance:g} req/s; "
                  f"{latency.name}")
        render.capacity_table(records, out)
    if outcome.interrupted:
        sys.exit(130)
