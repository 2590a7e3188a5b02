"""``stepplanner bench``: every argument forwarded to ``stepplanner.bench``."""

from __future__ import annotations

import importlib
import sys

import click


@click.command(
    "bench",
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],
    },
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_command(args: tuple[str, ...]) -> None:
    """Planner micro-benchmarks: every argument goes to stepplanner.bench (try: bench --help)."""
    try:
        bench = importlib.import_module("stepplanner.bench")
    except ModuleNotFoundError as exc:
        if exc.name != "stepplanner.bench":
            raise
        raise click.ClickException(
            "stepplanner bench is not available: the module stepplanner.bench is missing from "
            "this installation (reinstall stepplanner)"
        ) from None
    sys.exit(bench.main(list(args), prog="stepplanner bench"))
