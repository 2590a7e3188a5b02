"""``stepplanner calibrate``: fit the step-latency model to a runtime's measured step times."""

from __future__ import annotations

import click

from ..sim.latency_models import fit_latency, read_timings, save_latency_model
from .errors import library_errors
from .files import check_output_path


@click.command("calibrate")
@click.argument("timings", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="Where to write the model (JSON; use it with --latency-model FILE).")
@click.option("--name", default=None, help="The model's name (default: the timings file's).")
@library_errors
def calibrate_command(timings: str, out_path: str, name: str | None) -> None:
    """Least-squares a, b, c >= 0 of seconds = a + b*tokens + c*context from TIMINGS (CSV with
    columns tokens, context, seconds: one row per measured engine step)."""
    check_output_path("--out", out_path)
    tokens, context, seconds = read_timings(timings)
    fit = fit_latency(tokens, context, seconds, name or f"calibrated from {timings}")
    save_latency_model(fit.model, out_path, fit.to_dict())
    m = fit.model
    click.echo(f"fitted a={m.a:.6g} s + b={m.b:.6g} s/token + c={m.c:.6g} s/context position "
               f"over {fit.rows} steps")
    click.echo(f"R² {fit.r2:.5f}; worst relative error {fit.worst_relative_error:.2%} "
               f"(data row {fit.worst_row + 1})")
    click.echo(f"model written to {out_path}")
