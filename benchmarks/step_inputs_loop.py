"""StepInputs.prepare against plan() inside a running serving loop, step after step.

    python benchmarks/step_inputs_loop.py [--steps 4000] [--batch 256] [--rounds 3]

``benchmarks/test_step_inputs.py`` prepares one plan over and over; here every step is a new
one. A ledger that owns the page table (worst case reserved at admission) serves a saturated,
seeded stream (prompts 200..2000 tokens, outputs 100..800, S_in=8192, P=64, the default MIXED
policy): each step ``admit``, ``plan()``, ``prepare`` of that plan, then
``apply(plan, retire=True)``. Each layout has a run of its own (one ``StepInputs``, as in a
runtime), the layouts taking turns over the rounds on the same seeded stream; ``plan()`` and
``prepare`` are timed alone in the same step, so a noisy machine slows them alike. Medians over
the steady part (after the first B steps) and their ratios come from this one run.

Rows change position between steps here, which the repeated-plan benchmark never shows: decode
rows follow the chunk rows in arrival order, so a chunk row more or less in front, or a request
retired ahead, moves every row behind it (at B=256, a median of 203 of 210 rows per step).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Literal

import numpy as np

import stepplanner as sp
from stepplanner import _core
from stepplanner.bench import planner as bench
from stepplanner.kv import _kv
from stepplanner.kv._buffers import LAYOUTS


def run(
    layout: Literal["all", "flash_attn", "flashinfer"], steps: int, batch: int, seed: int = 0
) -> tuple[list[int], list[int]]:
    """Per steady step, the ns of ``plan()`` and of ``prepare`` with ``layout``."""
    planner = bench.make_planner(_core, "mixed", batch)
    limits = planner.limits
    max_pages = -(-limits.max_input_length // limits.kv_page_size)
    table = _kv.KVPageTable(batch, max_pages, batch * max_pages, limits.kv_page_size)
    ledger = sp.Ledger(limits, planner.policy, max_waiting=1 << 20, page_table=table)
    inputs = _kv.StepInputs(limits, table, layout)
    rng = random.Random(seed)
    for rid in range(steps * batch // 200):  # enough that the queue never runs dry
        ledger.submit(rid, rng.randint(200, 2000), max_new_tokens=rng.randint(100, 800))
    plans: list[int] = []
    prepares: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(steps):
        ledger.admit()
        start = clock()
        plan = planner.plan(ledger.residents)
        middle = clock()
        inputs.prepare(plan)
        end = clock()
        plans.append(middle - start)
        prepares.append(end - middle)
        ledger.apply(plan, np.zeros(plan.num_prefill + plan.num_decode, dtype=bool), retire=True)
    return plans[batch:], prepares[batch:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # One StepInputs per run, as in a runtime (several would share the caches); the layouts
    # take turns over the rounds, each round replaying the same seeded stream.
    plans: dict[str, list[int]] = {layout: [] for layout in LAYOUTS}
    prepares: dict[str, list[int]] = {layout: [] for layout in LAYOUTS}
    for _ in range(args.rounds):
        for layout in LAYOUTS:
            plan_ns, prepare_ns = run(layout, args.steps, args.batch)
            plans[layout] += plan_ns
            prepares[layout] += prepare_ns
    print(
        f"B={args.batch}, {args.rounds} x {args.steps - args.batch} steady steps per layout; "
        "medians:"
    )
    print(f"  {'layout':<11} {'plan()':>9} {'prepare':>9} {'ratio':>6}")
    for layout in LAYOUTS:
        plan = statistics.median(plans[layout])
        prepare = statistics.median(prepares[layout])
        print(
            f"  {layout:<11} {plan / 1000:6.2f} us {prepare / 1000:6.2f} us {prepare / plan:5.2f}x"
        )


if __name__ == "__main__":
    main()
