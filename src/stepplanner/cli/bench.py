"""``stepplanner bench``: ``stepplanner.bench``'s micro-benchmarks behind flags declared in click,
so ``bench --help`` and its errors read as every other command's; the values are handed on to
``stepplanner.bench.main`` (``python -m stepplanner.bench`` keeps its argparse). The module is
imported only when the command runs (it is the slowest part of the CLI to import), so the
choices and defaults are written here and a test holds them to ``stepplanner.bench``'s."""

from __future__ import annotations

import importlib
import sys

import click

from .counts import BYTES_PER_SLOT, check_count

BATCH_SIZES = "8,64,256,1024"  # stepplanner.bench.planner.BATCH_SIZES
SCENARIOS = ("mixed", "prefill_first", "priority_pause")  # stepplanner.bench.planner.SCENARIOS


def _batch_sizes(ctx: click.Context, param: click.Parameter, text: str) -> str:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not comma-separated integers") from None
    if not sizes:
        raise click.BadParameter(f"{text!r} names no batch size")
    for size in sizes:  # every size is a planner and a ledger of that many slots
        check_count("--batch-sizes", size, 1, BYTES_PER_SLOT)
    return ",".join(map(str, sizes))


@click.command("bench")
@click.option(
    "--batch-sizes",
    metavar="B[,B...]",
    default=BATCH_SIZES,
    show_default=True,
    callback=_batch_sizes,
    help="Batch sizes to time plan() at.",
)
@click.option(
    "--scenario",
    type=click.Choice(SCENARIOS),
    default="priority_pause",
    show_default=True,
    help="Scheduling scenario.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--loop",
    type=click.Choice(("on", "off", "only")),
    default="on",
    show_default=True,
    help="Also time the whole host step of a serving loop (ledger.step) against plan() at "
    "B=64,256,1024; only: that alone.",
)
@click.option(
    "--deadline-cost",
    is_flag=True,
    help="Only time the deadline-aware host step against the static-priority one on the "
    "simulator's workload past saturation (B=256 and 1024, the two runs in turns) and print "
    "the ratio.",
)
@click.option(
    "--reference-max-batch",
    metavar="B",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Time the pure-Python reference up to this B.",
)
def bench_command(
    batch_sizes: str,
    scenario: str,
    as_json: bool,
    loop: str,
    deadline_cost: bool,
    reference_max_batch: int,
) -> None:
    """Planner micro-benchmarks: plan() (array and list paths) against the kernel in a C loop
    and the pure-Python reference, checked against the performance targets."""
    try:
        bench = importlib.import_module("stepplanner.bench")
    except ModuleNotFoundError as exc:
        if exc.name != "stepplanner.bench":
            raise
        raise click.ClickException(
            "stepplanner bench is not available: the module stepplanner.bench is missing from "
            "this installation (reinstall stepplanner)"
        ) from None
    argv = [
        "--batch-sizes",
        batch_sizes,
        "--scenario",
        scenario,
        "--loop",
        loop,
        "--reference-max-batch",
        str(reference_max_batch),
        *(["--json"] if as_json else []),
        *(["--deadline-cost"] if deadline_cost else []),
    ]
    sys.exit(bench.main(argv, prog="stepplanner bench"))
