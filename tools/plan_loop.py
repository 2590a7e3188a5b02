"""A long, deterministic plan()/apply_to() loop for memory checkers (valgrind, ASan) and leak hunts.

Four lanes run side by side for ``--iterations`` steps: {array, list} × {MIXED+PRIORITY+PAUSE,
PREFILL_FIRST}, each over its own ledger of B residents that finish and are replaced as a
serving loop would (so the order cache, pause counters and every kernel branch keep moving).
Every step also fills a reasons array and, every 64 steps, takes ``copy()``/``to_dict()`` and a
``pickle`` round trip of the plan (checked equal), so the checkers see those paths too.

It prints one line of JSON: iterations, steps planned, and the traced Python heap (tracemalloc)
after a warm-up and at the end, so a caller can compare N with 10·N iterations: a loop that
allocates nothing per step ends with the same heap whatever N is.

    python tools/plan_loop.py --iterations 2000
    PYTHONMALLOC=malloc valgrind --tool=memcheck python tools/plan_loop.py --iterations 200
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import tracemalloc

import numpy as np

import stepplanner as sp

B, S_IN, P = 64, 512, 16
LIMITS = sp.StepPlannerLimits(B, S_IN, P)
OPTIONS = {
    "pause": sp.SchedulingOptions(
        ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED,
        scheduling_policy=sp.SchedulingPolicy.PRIORITY,
        preemption=sp.PreemptionMode.PAUSE,
        max_pause_steps=4,
    ),
    "prefill_first": sp.SchedulingOptions(
        ifb_scheduling_mode=sp.IfbSchedulingMode.PREFILL_FIRST,
        scheduling_policy=sp.SchedulingPolicy.PRIORITY,
    ),
}


class Lane:
    """One planner over one ledger, held as an array or as a list of ResidentState."""

    def __init__(self, options: sp.SchedulingOptions, as_list: bool, seed: int) -> None:
        self.planner = sp.StepPlanner(sp.resolve_scheduling_policy(options, LIMITS), LIMITS)
        self.rng = np.random.default_rng(seed)
        self.rows = np.zeros(B, dtype=sp.RESIDENT_DTYPE)
        self.output = np.zeros(B, dtype=np.int32)  # tokens each resident will decode
        self.arrival = 0
        for i in range(B):
            self._admit(i)
        self.objects = [sp.ResidentState(*r) for r in self.rows.tolist()] if as_list else None
        self.reasons = np.zeros(B, dtype=np.uint8)
        self.steps = 0

    def _admit(self, i: int) -> None:
        prompt = int(self.rng.integers(1, S_IN + 1))
        self.rows[i] = (int(self.rng.integers(0, 3)), self.arrival, prompt, 0, False, 0)
        self.output[i] = int(self.rng.integers(1, 64))
        self.arrival += 1

    def step(self) -> None:
        residents = self.rows if self.objects is None else self.objects
        count = B - int(self.steps % 7 == 0)  # now and then a shorter count
        plan = self.planner.plan(residents, count, self.reasons)
        plan.apply_to(residents)
        if self.steps % 64 == 0:
            kept = plan.copy()
            if pickle.loads(pickle.dumps(kept)).to_dict() != kept.to_dict():
                raise AssertionError(f"step {self.steps}: a pickled plan differs from its copy")
        self.steps += 1
        self._retire_finished()

    def _retire_finished(self) -> None:
        if self.objects is not None:
            for i, obj in enumerate(self.objects):
                if obj.context_committed and obj.committed >= obj.prompt_length + self.output[i]:
                    self._admit(i)
                    obj.__init__(*self.rows[i].tolist())
            return
        done = self.rows["context_committed"] & (
            self.rows["committed"] >= self.rows["prompt_length"] + self.output
        )
        for i in np.flatnonzero(done):
            self._admit(int(i))


def run(iterations: int, warmup: int, trace: bool = True) -> dict:
    lanes = [
        Lane(options, as_list, seed)
        for seed, (options, as_list) in enumerate(
            (o, a) for o in OPTIONS.values() for a in (False, True)
        )
    ]
    for _ in range(warmup):
        for lane in lanes:
            lane.step()
    gc.collect()  # every StepPlan is a cycle with its views: a copy is freed by the collector
    if trace:
        tracemalloc.start()
    after_warmup = tracemalloc.get_traced_memory()[0]
    for _ in range(iterations):
        for lane in lanes:
            lane.step()
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "iterations": iterations,
        "steps": sum(lane.steps for lane in lanes),
        "implementation": sp.IMPLEMENTATION,
        "traced_bytes_after_warmup": after_warmup,
        "traced_bytes_at_end": current,
        "traced_peak": peak,
        "growth_bytes": current - after_warmup,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--no-trace",
        dest="trace",
        action="store_false",
        help="leave tracemalloc off (under valgrind its own tables show as leaks)",
    )
    args = parser.parse_args()
    print(json.dumps(run(args.iterations, args.warmup, args.trace)))


if __name__ == "__main__":
    main()
