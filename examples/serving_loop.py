"""plan() inside a serving loop: plan a step, run it, advance the ledger (SPEC §6), retire.

The ledger is a RESIDENT_DTYPE array that plan() reads in place and apply_to() advances; a finished
request's slot is refilled with the last row, so the ledger stays dense (rows 0..count-1).
Run: python examples/serving_loop.py  (type-checked with mypy --strict in CI).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import stepplanner as sp

OUTPUT_TOKENS = 4  # each request decodes this many tokens after its prompt


def run_model(rows: npt.NDArray[np.void]) -> None:
    """Stand-in for the engine's forward pass over the planned rows (SEQUENCE_DTYPE)."""


def serve(prompt_lengths: list[int]) -> int:
    """Serve every prompt to completion; return the number of engine steps it took."""
    limits = sp.StepPlannerLimits(max_batch_size=8, max_input_length=512, kv_page_size=16)
    planner = sp.StepPlanner(sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits), limits)
    ledger = np.zeros(limits.max_batch_size, dtype=sp.RESIDENT_DTYPE)
    for arrival, prompt_length in enumerate(prompt_lengths):
        ledger[arrival] = (0, arrival, prompt_length, 0, False, 0)
    count, steps = len(prompt_lengths), 0
    while count:
        plan = planner.plan(ledger, count)  # the planner's one StepPlan, overwritten next call
        run_model(plan.as_array())
        plan.apply_to(ledger)  # committed += query_length; a final chunk sets context_committed
        steps += 1
        done = ledger["context_committed"][:count] & (
            ledger["committed"][:count] >= ledger["prompt_length"][:count] + OUTPUT_TOKENS)
        for i in sorted(np.flatnonzero(done), reverse=True):  # retire from the back: rows stay valid
            count -= 1
            ledger[i] = ledger[count]
    return steps


if __name__ == "__main__":
    print(f"served 5 requests in {serve([300, 40, 500, 120, 64])} steps")
