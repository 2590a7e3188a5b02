"""SPEC §3's guarantees as properties of both implementations, judged by ``check_plan``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stepplanner.checks import check_plan
from stepplanner.testing import (
    as_resident_array,
    as_resident_states,
    ledgers,
    limits,
    planning_cases,
    policies,
)


def inputs(core, rows):
    return [as_resident_states(rows, core.ResidentState), as_resident_array(rows)]


@given(planning_cases())
def test_every_plan_keeps_the_guarantees(core, case):
    planner = core.StepPlanner(case.policy, case.limits)
    for residents in inputs(core, case.rows):
        check_plan(case.policy, case.limits, residents, planner.plan(residents))


@given(planning_cases(), st.data())
def test_guarantees_hold_for_a_prefix(core, case, data):
    count = data.draw(st.integers(0, len(case.rows)))
    planner = core.StepPlanner(case.policy, case.limits)
    for residents in inputs(core, case.rows):
        plan = planner.plan(residents, count)
        assert plan.num_residents == count
        check_plan(case.policy, case.limits, residents, plan)


@given(st.data())
def test_ledgers_strategy_array_form(core, data):
    lim = data.draw(limits())
    policy = data.draw(policies(lim))
    arr = data.draw(ledgers(lim, as_array=True, max_pause_steps=policy.max_pause_steps))
    assert arr.dtype == as_resident_array([]).dtype and len(arr) <= lim.max_batch_size
    check_plan(policy, lim, arr, core.StepPlanner(policy, lim).plan(arr))


@given(planning_cases(), st.integers(2, 12), st.booleans())
def test_guarantees_hold_along_a_run(core, case, steps, as_array):
    """Plan, check, apply (SPEC §6), repeat: the ledger a plan leaves is always plannable."""
    rows = [r[:3] + (min(r[3], 2**30),) + r[4:5] + (min(r[5], 2**30),) for r in case.rows]
    residents = as_resident_array(rows) if as_array else as_resident_states(rows, core.ResidentState)
    planner = core.StepPlanner(case.policy, case.limits)
    for _ in range(steps):
        plan = planner.plan(residents)
        check_plan(case.policy, case.limits, residents, plan)
        plan.apply_to(residents)
