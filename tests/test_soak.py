"""Soak: many simulated engine steps over random policies and workloads, nothing lost.

Each run draws limits, scheduling options and a workload, and drives ``simulate`` with an
``on_step`` hook that checks, on every step:

* ``check_plan`` passes on the plan and the ledger rows it was made from;
* the ledger rows are exactly what the previous step predicts (SPEC §6, computed here
  independently of ``apply_to``): committed tokens neither lost nor doubled, flags and pause
  counters right, a newly admitted row fresh from its request;
* with ``max_pause_steps > 0`` no resident has been paused more than that many steps in a row;
* a request that leaves the ledger leaves once, with ``prompt + output - 1`` tokens committed
  (its prompt and every decoded token but the last, which is never fed back).

After the run: every request not refused at submission (prompt > S_in, the only refusal)
finished with all its output tokens, each admitted once. Runs end on their own (finite
workloads); a run cut short by the step cap fails.

Size: ``STEPPLANNER_SOAK_STEPS`` (default 3000, in the normal test run);
``python tools/soak.py --steps 1000000`` runs the long soak and prints steps and time.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import stepplanner as sp
from stepplanner.planner.checks import check_plan
from stepplanner.sim.simulator import simulate
from stepplanner.sim.workloads import Workload

DEFAULT_STEPS = 3000
RUN_STEP_CAP = 500_000  # a finite workload ends long before this; reaching it is a failure


def random_config(rng: np.random.Generator):
    """Limits and a resolved policy; options the resolver refuses are drawn again."""
    while True:
        b = int(rng.choice([1, 2, 3, 4, 8, 16, 32]))
        s_in = int(rng.choice([8, 16, 64, 200, 512]))
        p = int(rng.choice([1, 4, 16, 32]))
        limits = sp.StepPlannerLimits(b, s_in, p)
        given = rng.random() < 0.3
        options = sp.SchedulingOptions(
            ifb_scheduling_mode=int(rng.integers(0, 3)),
            max_num_tokens=int(rng.integers(b + p, limits.t_max + 1))
            if given and b + p <= limits.t_max
            else 0,
            scheduling_policy=int(rng.integers(0, 2)),
            preemption=int(rng.integers(0, 2)),
            priority_reserved_slots=int(rng.integers(0, b)) if rng.random() < 0.3 else 0,
            max_pause_steps=int(rng.choice([0, 0, 1, 2, 5])),
        )
        try:
            return limits, sp.resolve_scheduling_policy(options, limits)
        except ValueError:
            continue


def random_workload(rng: np.random.Generator, limits: sp.StepPlannerLimits) -> Workload:
    n = int(rng.integers(1, 160))
    s_in = limits.max_input_length
    return Workload(
        arrival_time=np.cumsum(rng.exponential(0.02, n)),
        prompt_tokens=rng.integers(1, s_in + s_in // 8 + 2, n),  # a few are too long: refused
        output_tokens=rng.integers(1, 40, n),
        priority=rng.integers(-1, 4, n),
    )


class StepChecker:
    """The ``on_step`` hook: checks each step against the previous one's prediction."""

    def __init__(self, workload: Workload, limits, policy) -> None:
        self.w, self.limits, self.policy = workload, limits, policy
        self.admitted = np.zeros(len(workload), dtype=bool)
        self.left = np.zeros(len(workload), dtype=bool)
        self.prev_pos: dict[int, int] = {}  # request id -> row, as of the previous step
        self.predicted: np.ndarray | None = None
        self.steps = 0

    def __call__(self, step: int, start: float, ledger, plan) -> None:
        rows = ledger.residents.copy()
        ids = ledger.request_ids.copy()
        check_plan(self.policy, self.limits, rows, plan)
        self._check_continuity(ids, rows)
        self._check_pause_bound(rows, plan)
        self.prev_pos = {r: k for k, r in enumerate(ids.tolist())}
        self.predicted = self._predict(rows, plan)
        self.steps += 1

    def _check_continuity(self, ids: np.ndarray, rows: np.ndarray) -> None:
        # Python sets, not np.isin: the arrays hold at most B ids and this runs every step.
        current = ids.tolist()
        prev = self.prev_pos
        stayed = [k for k, r in enumerate(current) if r in prev]
        if self.predicted is not None:
            expect = self.predicted[[prev[current[k]] for k in stayed]]
            assert rows[stayed].tolist() == expect.tolist(), "ledger rows drifted from SPEC §6"
            still = set(current)
            self.retire(np.array([r for r in prev if r not in still], dtype=np.int64))
        new = np.array([r for r in current if r not in prev], dtype=np.int64)
        if not len(new):
            return
        assert not self.admitted[new].any(), f"requests {new} admitted twice"
        self.admitted[new] = True
        fresh = rows[[k for k, r in enumerate(current) if r not in prev]]
        assert fresh["committed"].tolist() == [0] * len(new)
        assert not fresh["context_committed"].any() and not fresh["consecutive_paused_steps"].any()
        assert fresh["prompt_length"].tolist() == self.w.prompt_tokens[new].tolist()
        assert fresh["priority"].tolist() == self.w.priority[new].tolist()

    def retire(self, gone: np.ndarray) -> None:
        """Requests that left since the last step: once, with every token committed."""
        if not len(gone):
            return
        assert not self.left[gone].any(), f"requests {gone} left twice"
        self.left[gone] = True
        final = self.predicted[[self.prev_pos[int(r)] for r in gone]]
        want = self.w.prompt_tokens[gone] + self.w.output_tokens[gone] - 1
        assert final["committed"].tolist() == want.tolist(), f"requests {gone} lost tokens"
        assert final["context_committed"].all()

    def _check_pause_bound(self, rows: np.ndarray, plan) -> None:
        mps = self.policy.max_pause_steps
        if mps > 0 and len(plan.paused):
            held = rows["consecutive_paused_steps"][plan.paused_array()]
            assert (held < mps).all(), f"a resident paused {held.max() + 1} > {mps} steps in a row"

    @staticmethod
    def _predict(rows: np.ndarray, plan) -> np.ndarray:
        """SPEC §6 over a copy, written independently of apply_to."""
        out = rows.copy()
        seq = plan.as_array()
        out["committed"][seq["resident"]] += seq["query_length"]
        final = (seq["work"] == sp.SequenceWork.CONTEXT) & seq["select_last_token_logits"]
        out["context_committed"][seq["resident"][final]] = True
        paused = plan.paused_array()
        out["consecutive_paused_steps"] = 0
        out["consecutive_paused_steps"][paused] = rows["consecutive_paused_steps"][paused] + 1
        return out


def soak_run(rng: np.random.Generator) -> int:
    """One random configuration and workload; returns the steps it took."""
    limits, policy = random_config(rng)
    workload = random_workload(rng, limits)
    checker = StepChecker(workload, limits, policy)
    result = simulate(workload, limits, policy, max_steps=RUN_STEP_CAP, on_step=checker)
    assert not result.truncated, f"run did not finish in {RUN_STEP_CAP} steps: {policy}"
    assert result.num_steps == checker.steps
    checker.retire(np.array(list(checker.prev_pos), dtype=np.int64))  # all left after the last step
    too_long = workload.prompt_tokens > limits.max_input_length
    assert result.refused.tolist() == too_long.tolist(), "refused other than prompt > S_in"
    served = ~too_long
    assert checker.admitted.tolist() == served.tolist(), "a request was never admitted"
    assert checker.left.tolist() == served.tolist(), "a request never left the ledger"
    assert (result.generated[served] == workload.output_tokens[served]).all()
    assert not np.isnan(result.finish_time[served]).any()
    if policy.max_pause_steps > 0:
        assert result.max_consecutive_paused <= policy.max_pause_steps
    return checker.steps


def soak(total_steps: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    steps = runs = 0
    t0 = time.perf_counter()
    while steps < total_steps:
        steps += soak_run(rng)
        runs += 1
    return {
        "steps": steps,
        "runs": runs,
        "seconds": time.perf_counter() - t0,
        "implementation": sp.IMPLEMENTATION,
    }


def test_soak():
    total = int(os.environ.get("STEPPLANNER_SOAK_STEPS", DEFAULT_STEPS))
    seed = int(os.environ.get("STEPPLANNER_SOAK_SEED", 20240601))
    summary = soak(total, seed)
    print(f"\nsoak: {summary}")
    assert summary["steps"] >= total


def test_the_checker_catches_a_lost_token():
    """The hook must fail when the ledger drops a committed token (so a pass means something)."""
    rng = np.random.default_rng(7)
    limits = sp.StepPlannerLimits(4, 64, 16)
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits)
    workload = random_workload(rng, limits)
    checker = StepChecker(workload, limits, policy)

    def lossy(step, start, ledger, plan):
        checker(step, start, ledger, plan)
        if step == 3 and ledger.count:
            ledger.residents["committed"][0] -= 1 if ledger.residents["committed"][0] else -1

    with pytest.raises(AssertionError, match="drifted"):
        simulate(workload, limits, policy, on_step=lossy)
