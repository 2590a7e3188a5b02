"""``stepplanner simulate``: one configuration on one workload."""

from __future__ import annotations

import json
from typing import Any

import click

from ..latency import LatencyModel
from .errors import library_errors
from .options import (limit_options, limits_from, options_from, run_options, scheduling_options,
                      workload_from, workload_options)
from .plot import plot_result, require_matplotlib
from .render import print_report, stdout_console
from .running import run


@click.command("simulate")
@workload_options
@limit_options
@scheduling_options
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG: TTFT CDF per priority class and the batch timeline "
                   "(needs matplotlib).")
@library_errors
def simulate_command(latency_text: str, max_steps: int | None, progress: bool, as_json: bool,
                     plot: str | None, **kw: Any) -> None:
    """Simulate one configuration (the embedded workload when no --trace is given)."""
    if plot:
        require_matplotlib()
    limits, options, workload = limits_from(kw), options_from(kw), workload_from(kw)
    result = run(workload, limits, options, LatencyModel.parse(latency_text), max_steps,
                 progress and not as_json, "simulating")
    report = result.report()
    if plot:
        plot_result(result, plot)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    print_report(stdout_console(), report)
    if plot:
        click.echo(f"plot written to {plot}")
