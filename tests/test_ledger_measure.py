"""``Ledger.measure``: the step-time measurement ``step`` makes from its ``now``, for a runtime that
plans with ``admit``/``rank``/``apply`` instead (the transformers adapter derives its rows between
admission and planning, so it cannot call ``step``)."""

from __future__ import annotations

import math

import pytest

import stepplanner as sp

LIMITS = sp.StepPlannerLimits(4, 64, 16)
DEADLINE = sp.resolve_scheduling_policy(
    sp.SchedulingOptions(
        scheduling_policy=sp.SchedulingPolicy.DEADLINE, preemption=sp.PreemptionMode.PAUSE
    ),
    LIMITS,
)


def test_measure_moves_the_estimate_as_step_does(ledger_impl) -> None:
    nows = [10.0, 10.5, 10.7, 11.5, 11.6]
    stepped = ledger_impl.Ledger(LIMITS, DEADLINE)
    measured = ledger_impl.Ledger(LIMITS, DEADLINE)
    planner = ledger_impl.StepPlanner(DEADLINE, LIMITS)
    stepped.submit(1, 64, arrival_time=9.0, slo=sp.SLO(100.0, 1.0))  # 4 chunks, 1 decode
    ran = False  # step(now) measures with whether its pending plan (the previous one) had rows
    for now in nows:
        plan = stepped.step(planner, now=now)
        measured.measure(now, ran)
        ran = plan.num_prefill + plan.num_decode > 0
    assert measured.step_time_estimate == stepped.step_time_estimate
    # The first sample, then each later one weighted by a quarter: an estimate, not the last.
    expected = 0.5
    for sample in (0.2, 0.8, 0.1):
        expected += 0.25 * (sample - expected)
    assert math.isclose(measured.step_time_estimate, expected)


def test_a_step_that_ran_nothing_is_not_a_sample(ledger_impl) -> None:
    ledger = ledger_impl.Ledger(LIMITS, DEADLINE)
    ledger.measure(1.0)
    ledger.measure(5.0, ran=False)  # idle: 4 s is no step time, but the next starts from here
    ledger.measure(5.25)
    assert ledger.step_time_estimate == 0.25


def test_a_given_step_time_is_not_measured(ledger_impl) -> None:
    ledger = ledger_impl.Ledger(LIMITS, DEADLINE, step_time=(0.01, 0.0))
    ledger.measure(1.0)
    ledger.measure(3.0)
    assert ledger.step_time_estimate == 0.01


@pytest.mark.parametrize(("now", "exc"), [(math.nan, ValueError), ("1.0", TypeError)])
def test_measure_refuses_a_time_that_is_not_one(ledger_impl, now, exc) -> None:
    ledger = ledger_impl.Ledger(LIMITS, DEADLINE)
    with pytest.raises(exc, match="now"):
        ledger.measure(now)
