"""Speculative decoding in the simulator: drafts proposed per decoding request, granted by the
plan (SPEC §8), accepted at a rate; what it does to tokens, times, deadlines and the ITL sample,
under every policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from stepplanner import (
    SLO,
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    SequenceWork,
    StepPlannerLimits,
)
from stepplanner.cli import main
from stepplanner.sim.simulator import Speculation, simulate
from stepplanner.sim.workloads import synthetic

LIMITS = StepPlannerLimits(max_batch_size=16, max_input_length=512, kv_page_size=16)
POLICIES = {
    "fcfs": SchedulingOptions(),
    "priority_pause": SchedulingOptions(
        scheduling_policy=SchedulingPolicy.PRIORITY,
        preemption=PreemptionMode.PAUSE,
        max_pause_steps=4,
    ),
    "deadline_pause": SchedulingOptions(
        scheduling_policy=SchedulingPolicy.DEADLINE,
        preemption=PreemptionMode.PAUSE,
        max_pause_steps=8,
    ),
}
CLASSES = {-1: SLO(0.5, 0.05), 0: SLO(2.0, 0.1), 1: SLO(8.0)}


def _workload(seed: int = 3):
    w = synthetic(requests=200, rate=30.0, seed=seed, max_prompt=512, max_output=96)
    return w.with_objectives(CLASSES)


class _Rows:
    """on_step: each plan's decode rows' query lengths, and the ledger's output counts."""

    def __init__(self) -> None:
        self.verifying = 0
        self.longest = 0

    def __call__(self, step, start, ledger, plan) -> None:
        rows = plan.as_array()
        decode = rows[rows["work"] == SequenceWork.DECODE]
        self.verifying += int((decode["query_length"] > 1).sum())
        self.longest = max(self.longest, int(decode["query_length"].max(initial=0)))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_speculation_serves_every_token_once_and_cuts_tpot(name):
    w = _workload()
    plain = simulate(w, LIMITS, POLICIES[name])
    rows = _Rows()
    spec = simulate(w, LIMITS, POLICIES[name], speculation=Speculation(3, 0.7), on_step=rows)
    for r in (plain, spec):
        assert not r.truncated and not r.refused.any()
        assert r.generated.tolist() == w.output_tokens.tolist()  # never past max_new_tokens
    assert rows.verifying > 0 and rows.longest == 4  # rows verified drafts, 3 at most
    report = spec.report()["speculation"]
    assert report["draft_tokens"] == spec.draft_tokens > 0
    # Accepted in order up to the first rejection: 0.7 + 0.49 + 0.343 of 3 drafts on average.
    assert report["accepted_fraction"] == pytest.approx((0.7 + 0.49 + 0.343) / 3, abs=0.03)
    # Every token is once a prompt token or a verified position; the rejected were extra work.
    assert spec.steps["tokens"].sum() == (
        w.prompt_tokens.sum()
        + (w.output_tokens - 1).sum()
        - spec.accepted_drafts
        + spec.draft_tokens
    )
    tpot = lambda r: np.nanmedian(r.latencies()["tpot"])  # noqa: E731
    assert tpot(spec) < 0.7 * tpot(plain)
    assert spec.num_steps < plain.num_steps
    assert "speculation" not in plain.report()


def test_nothing_accepted_is_one_token_a_row_and_all_accepted_is_every_draft():
    w = _workload(seed=4)
    none = simulate(w, LIMITS, speculation=Speculation(4, 0.0))
    assert none.accepted_drafts == 0 and none.draft_tokens > 0
    assert none.generated.tolist() == w.output_tokens.tolist()
    every = simulate(w, LIMITS, speculation=Speculation(4, 1.0))
    assert every.accepted_drafts == every.draft_tokens > 0
    assert every.generated.tolist() == w.output_tokens.tolist()


def test_tokens_of_one_step_count_each_deadline_and_zero_gaps():
    w = _workload(seed=5)
    r = simulate(w, LIMITS, POLICIES["deadline_pause"], speculation=Speculation(3, 0.8))
    assert np.all(r.late_tokens <= r.generated)
    # The pooled ITL sample has one gap per consecutive pair of tokens: an accepted draft comes
    # with its row's token, 0 s after it.
    gaps, counts = zip(*r.itl)
    total = sum(int(c.sum()) for c in counts)
    assert total == int((w.output_tokens - 1).sum())
    zeros = sum(int(c[g == 0].sum()) for g, c in zip(gaps, counts))
    assert zeros >= r.accepted_drafts


def test_speculation_checks_its_settings():
    for bad in [(0, 0.5), (65, 0.5), (3, 1.5), (3, -0.1), (True, 0.5), (3, "0.5")]:
        with pytest.raises(ValueError, match="out of range"):
            Speculation(*bad)
    with pytest.raises(TypeError, match="speculation must be a Speculation"):
        simulate(_workload(), LIMITS, speculation=(3, 0.7))


def test_cli_simulate_and_compare_take_the_speculation_flags():
    runner = CliRunner()
    args = ["--requests", "120", "--num-spec-tokens", "3", "--spec-acceptance", "0.6", "--json"]
    out = runner.invoke(main, ["simulate", *args])
    assert out.exit_code == 0, out.output
    spec = json.loads(out.output)["speculation"]
    assert spec["num_spec_tokens"] == 3 and spec["acceptance"] == 0.6
    assert 0 < spec["accepted_drafts"] < spec["draft_tokens"]
    out = runner.invoke(main, ["compare", *args])
    assert out.exit_code == 0, out.output
    assert all("speculation" in run for run in json.loads(out.output))
    out = runner.invoke(main, ["simulate", "--requests", "50", "--num-spec-tokens", "99"])
    assert out.exit_code == 2 and "--num-spec-tokens" in out.output
