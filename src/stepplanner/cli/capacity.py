"""``stepplanner capacity``: per configuration, the highest arrival rate that meets the SLOs."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click

from ..sim.workloads import MAX_RATE, check_rate
from ..tuning.capacity import ScaledTrace, SyntheticRates, capacity
from ..tuning.grid import grid_size, parse_grid
from .counts import check_requests, runs_at_once
from .errors import InputError, library_errors
from .files import check_files
from .options import (
    format_options,
    limit_options,
    limits_from,
    options_from,
    output_format,
    scheduling_options,
    trace_from,
    with_objectives_from,
    workload_options,
)
from .render import emit
from .tuning_options import (
    latency_model_file,
    latency_model_option,
    latency_of,
    output_options,
    slo_option,
    stability_of,
    stability_options,
)
from .tuning_progress import ConfigProgress, report_interrupt
from .tuning_render import capacity_blocks, conditions, document, save


@click.command("capacity")
@workload_options
@limit_options
@scheduling_options
@click.option(
    "--grid",
    "grid_texts",
    multiple=True,
    help="NAME=V1,V2,... (repeatable), as for sweep: one capacity per point.",
)
@slo_option
@stability_options
@latency_model_option
@click.option(
    "--tolerance",
    type=click.FloatRange(min=0, min_open=True),
    default=0.1,
    show_default=True,
    help="Stop bisecting when the bracket is this narrow (req/s).",
)
@click.option(
    "--max-rate",
    type=float,
    default=10_000.0,
    show_default=True,
    help=f"Stop doubling here (req/s; at most {MAX_RATE:,.0f}).",
)
@output_options("'options' and 'capacity' (req/s) per configuration")
@format_options
@library_errors
def capacity_command(
    grid_texts: tuple[str, ...],
    slos: Any,
    stability: Any,
    no_stability: bool,
    latency_model: Any,
    latency_text: str,
    tolerance: float,
    max_rate: float,
    backend: str,
    workers: int | None,
    ray_address: str | None,
    save_result: str | None,
    csv_path: str | None,
    progress: bool,
    fmt: str,
    as_json: bool,
    **kw: Any,
) -> None:
    """Bisect the arrival rate per configuration (same requests, time axis scaled; fixed seed).

    The synthetic workload starts from --rate; a --trace from its own mean rate. A rate must
    meet every --slo and the stability condition (--max-queue-delay, default median queueing
    delay <= 2 s); a configuration that meets them all at --max-rate is reported as
    '>= max-rate' (JSON: "unbounded": true, "capacity": null). When requests carry objectives
    (the embedded workload's default classes, --slo-class, a trace's columns), the capacities
    at 90% and 99% deadline attainment (under the stability condition) are reported beside it.
    """
    fmt = output_format(fmt, as_json)
    stability = stability_of(stability, no_stability)
    if not slos and stability is None:
        raise InputError(
            "capacity needs at least one --slo when --no-stability drops the "
            "stability condition (without either every rate is sustainable)"
        )
    check_rate("max_rate", max_rate)  # before the search: 1e308 doubles for minutes
    check_files(
        {"--save-result": save_result, "--csv": csv_path},
        {"--trace": kw["trace"], "--latency-model": latency_model_file()},
    )
    grid = parse_grid(grid_texts)
    total = grid_size(grid)
    runs = runs_at_once(workers, total)
    limits = limits_from(kw, runs)
    options = options_from(kw, limits)
    trace = trace_from(kw)
    source: Any
    if trace is not None:
        source = ScaledTrace(with_objectives_from(kw, trace, embedded=False))
    else:
        check_requests(kw["requests"], runs)
        rates = SyntheticRates(kw["requests"], kw["seed"], kw["rate"], kw["burstiness"])
        embedded = with_objectives_from(kw, rates.at(rates.rate), embedded=True)
        source = dataclasses.replace(rates, slo_classes=dict(embedded.slo_classes or {}))
    latency = latency_of(latency_model, latency_text)
    with ConfigProgress(total, progress and fmt == "table", "capacity") as tick:
        records, outcome = capacity(
            source,
            grid,
            limits,
            options,
            latency,
            slos,
            tolerance,
            max_rate,
            backend,
            workers,
            ray_address,
            tick,
            stability=stability,
        )
    report_interrupt(outcome, total)
    workload = source.at(source.rate).summary()
    text = save(
        document(
            workload,
            latency,
            slos,
            grid,
            outcome,
            records,
            tolerance=tolerance,
            max_rate=max_rate,
            stability=None if stability is None else str(stability),
        ),
        save_result,
        csv_path,
    )
    if fmt == "json":
        click.echo(text)
    else:
        emit(
            capacity_blocks(
                records,
                slos,
                stability,
                max_rate,
                f"{workload['source']}, time axis scaled; "
                f"{conditions(slos, stability)}; tolerance {tolerance:g} req/s; "
                f"{latency.name}",
            ),
            fmt,
        )
    if outcome.interrupted:
        sys.exit(130)
