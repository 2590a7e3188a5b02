"""The planner's micro-benchmarks: ``python -m stepplanner.bench`` and ``stepplanner bench``.

``planner`` times ``plan()`` against the project's targets; ``loop`` times the whole host step of
a serving loop (``ledger.step``) against ``plan()`` alone. ``main`` runs both and prints them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from . import deadline as deadline_cost
from . import loop as host_loop
from .planner import (
    BATCH_SIZES,
    KV_PAGE_SIZE,
    MAX_INPUT_LENGTH,
    SCENARIOS,
    checks,
    machine,
    measure_all,
    render,
)

__all__ = ["main"]


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--batch-sizes must be comma-separated integers, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batch-sizes must be integers >= 1, got {text!r}")
    return sizes


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Time plan() (array and list paths) against the kernel in a C loop and the "
        "pure-Python reference, and check the performance targets.",
    )
    parser.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        default=list(BATCH_SIZES),
        metavar="B[,B...]",
        help="batch sizes (default: 8,64,256,1024)",
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="priority_pause",
        help="scheduling scenario (default: priority_pause)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--loop",
        choices=("on", "off", "only"),
        default="on",
        help="also time the whole host step of a serving loop (ledger.step) "
        "against plan() at B=64,256,1024 (default: on)",
    )
    parser.add_argument(
        "--deadline-cost",
        action="store_true",
        help="only time the deadline-aware host step against the static-priority "
        "one on the simulator's workload past saturation (B=256 and 1024, the two runs "
        "in turns) and print the ratio",
    )
    parser.add_argument(
        "--reference-max-batch",
        type=int,
        default=max(BATCH_SIZES),
        metavar="B",
        help="time the pure-Python reference up to this B",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m stepplanner.bench") -> int:
    """Entry point of ``python -m stepplanner.bench`` and ``stepplanner bench`` (which passes
    its own name as ``prog``, for usage lines and errors); returns 0."""
    args = _parser(prog).parse_args(argv)
    if args.deadline_cost:
        costs = deadline_cost.measure_deadline_cost()
        allocated = {
            b: host_loop.loop_allocated_bytes(b, policy="deadline", masks=False)
            for b in host_loop.DEADLINE_BATCH_SIZES
        }
        if args.json:
            print(
                json.dumps(
                    {
                        "costs": [asdict(c) for c in costs],
                        "deadline_step_allocated_bytes": allocated,
                    },
                    indent=2,
                )
            )
        else:
            print(deadline_cost.render_deadline_cost(costs))
            print(
                "bytes allocated over 200 steady DEADLINE steps (loop.Stream): "
                + ", ".join(f"B={b}: {n}" for b, n in allocated.items())
            )
        return 0
    loop = host_loop.measure_loop() if args.loop != "off" else []
    if args.loop == "only":
        print(
            json.dumps([asdict(t) for t in loop], indent=2)
            if args.json
            else host_loop.render_loop(loop)
        )
        return 0
    timings = measure_all(args.scenario, args.batch_sizes, args.reference_max_batch)
    results = checks(timings)
    if args.json:
        print(
            json.dumps(
                {
                    "scenario": args.scenario,
                    "max_input_length": MAX_INPUT_LENGTH,
                    "kv_page_size": KV_PAGE_SIZE,
                    "machine": machine(),
                    "timings": [asdict(t) for t in timings],
                    "targets": [asdict(c) for c in results],
                    "loop": [asdict(t) for t in loop],
                },
                indent=2,
            )
        )
    else:
        print(render(args.scenario, timings, results))
        if loop:
            print()
            print(host_loop.render_loop(loop))
    return 0
