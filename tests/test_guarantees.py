"""SPEC §3's guarantees as properties of both implementations, judged by ``check_plan``."""

from __future__ import annotations

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from stepplanner import IfbSchedulingMode, PreemptionMode, SchedulingPolicy
from stepplanner.planner.checks import check_plan
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
    residents = (
        as_resident_array(rows) if as_array else as_resident_states(rows, core.ResidentState)
    )
    planner = core.StepPlanner(case.policy, case.limits)
    for _ in range(steps):
        plan = planner.plan(residents)
        check_plan(case.policy, case.limits, residents, plan)
        plan.apply_to(residents)


# --- the strategies reach the corners their docs promise ------------------------------------------


def _pausing(case):
    return (
        case.policy.mode == IfbSchedulingMode.MIXED
        and case.policy.scheduling_policy == SchedulingPolicy.PRIORITY
        and case.policy.preemption == PreemptionMode.PAUSE
    )


CORNERS = {
    "empty ledger": lambda c: not c.rows,
    "B=1 with a resident": lambda c: c.limits.max_batch_size == 1 and len(c.rows) == 1,
    "P=1": lambda c: c.limits.kv_page_size == 1 and c.rows,
    "S_in < P": lambda c: c.limits.max_input_length < c.limits.kv_page_size and c.rows,
    "all decoding": lambda c: len(c.rows) > 1 and all(r[4] for r in c.rows),
    "all prompt": lambda c: len(c.rows) > 1 and not any(r[4] for r in c.rows),
    "negative priority": lambda c: any(r[0] < 0 for r in c.rows),
    "duplicate arrivals": lambda c: len({r[1] for r in c.rows}) < len(c.rows),
    "committed off a page end": lambda c: any(
        not r[4] and r[3] % c.limits.kv_page_size for r in c.rows
    ),
    "PREFILL_FIRST + PRIORITY": lambda c: (
        c.policy.mode == IfbSchedulingMode.PREFILL_FIRST
        and c.policy.scheduling_policy == SchedulingPolicy.PRIORITY
        and c.rows
    ),
    **{
        f"paused steps = max_pause_steps {d:+d}": (
            lambda c, d=d: (
                _pausing(c)
                and c.policy.max_pause_steps > 0
                and any(r[5] == c.policy.max_pause_steps + d for r in c.rows)
            )
        )
        for d in (-1, 0, 1)
    },
}


@pytest.mark.parametrize("corner", list(CORNERS))
def test_planning_cases_reach(corner):
    case = find(
        planning_cases(),
        CORNERS[corner],
        settings=settings(max_examples=3000, database=None, phases=[Phase.generate]),
    )
    assert CORNERS[corner](case)
