"""``stepplanner calibrate``: fit the step-latency model to a runtime's measured step times."""

from __future__ import annotations

import click

from ..sim.latency_models import fit_step_latency, read_step_timings, save_latency_model
from .errors import library_errors
from .files import check_files


@click.command("calibrate")
@click.argument("timings", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    required=True,
    help="Where to write the model (JSON; use it with --latency-model FILE).",
)
@click.option("--name", default=None, help="The model's name (default: the timings file's).")
@click.option(
    "--terms",
    default=None,
    help="The coefficients to fit, e.g. 'abc' for a + b*tokens + c*context only "
    "(default: every one the file's columns give).",
)
@library_errors
def calibrate_command(timings: str, out_path: str, name: str | None, terms: str | None) -> None:
    """Least-squares coefficients >= 0 of seconds = a + b*tokens + c*context + d*tokens*context
    + e*attention + f*rows from TIMINGS: CSV, one row per measured engine step, with columns
    seconds, tokens, context and, when the runtime writes them, rows, decode_rows,
    prefill_tokens, prefill_context and attention (other columns are ignored; e needs
    attention, f needs rows)."""
    check_files({"--out": out_path}, {"TIMINGS": timings})
    steps = read_step_timings(timings)
    fit = fit_step_latency(steps, name or f"calibrated from {timings}", terms)
    save_latency_model(fit.model, out_path, fit.to_dict())
    click.echo(f"fitted {fit.model.formula()} over {fit.rows} steps")
    click.echo(
        f"R² {fit.r2:.5f}; median relative error {fit.median_relative_error:.2%}; "
        f"worst relative error {fit.worst_relative_error:.2%} "
        f"(data row {fit.worst_row + 1})"
    )
    click.echo(f"model written to {out_path}")
