"""SPEC §9 (a per-step token budget): the worked examples, compiled against reference on drawn
ledgers, the guarantees under the step's budget, and bad budgets refused alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplanner import (
    IfbSchedulingMode,
    SchedulingOptions,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner.planner.checks import check_plan
from stepplanner.testing import as_resident_array, draft_counts, planning_cases

BASE = settings().max_examples

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16)
POLICY = resolve_scheduling_policy(
    SchedulingOptions(max_num_tokens=52, max_chunk_tokens=32), LIMITS
)
ROWS = [
    (0, 0, 40, 41, True, 0),
    (0, 1, 60, 0, False, 0),
    (0, 2, 20, 0, False, 0),
    (0, 3, 50, 16, False, 0),
]


def rows_of(plan: Any) -> list[tuple[int, int, int, int, bool]]:
    return [
        (s.resident, int(s.work), s.past_length, s.query_length, s.select_last_token_logits)
        for s in plan.sequences
    ]


@pytest.mark.parametrize(
    ("budget", "drafts", "want", "total"),
    [
        (36, None, [(1, 0, 0, 32, False), (0, 1, 41, 1, True)], 33),
        (20, None, [(1, 0, 0, 16, False), (0, 1, 41, 1, True)], 17),
        (36, [40, 0, 0, 0], [(1, 0, 0, 16, False), (0, 1, 41, 20, True)], 36),
    ],
)
def test_worked_examples(core, budget, drafts, want, total):
    planner = core.StepPlanner(POLICY, LIMITS)
    plan = planner.plan(as_resident_array(ROWS), drafts=drafts, max_num_tokens=budget)
    assert rows_of(plan) == want
    assert plan.total_tokens == total


def test_the_policys_own_budget_plans_as_none(core):
    planner = core.StepPlanner(POLICY, LIMITS)
    residents = as_resident_array(ROWS)
    without = planner.plan(residents).to_dict()
    assert planner.plan(residents, max_num_tokens=52).to_dict() == without
    assert rows_of(planner.plan(residents))[:2] == [(1, 0, 0, 32, False), (2, 0, 0, 16, False)]


@pytest.mark.parametrize(
    ("value", "kind", "text"),
    [
        (19, ValueError, "max_num_tokens=19"),
        (53, ValueError, "max_num_tokens=53"),
        (-1, ValueError, "max_num_tokens=-1"),
        (True, TypeError, "max_num_tokens"),
        (36.0, TypeError, "max_num_tokens"),
        ("36", TypeError, "max_num_tokens"),
    ],
)
def test_bad_budgets_are_refused_and_leave_the_plan(core, value, kind, text):
    planner = core.StepPlanner(POLICY, LIMITS)
    residents = as_resident_array(ROWS)
    plan = planner.plan(residents, max_num_tokens=20)
    before = plan.to_dict()
    with pytest.raises(kind, match=text) as info:
        planner.plan(residents, max_num_tokens=value)
    if kind is ValueError:
        assert "[20, 52]" in str(info.value)
    assert plan.to_dict() == before  # the one plan object, not overwritten by the refused call


def test_a_budget_left_unread_is_refused_under_prefill_first(core):
    limits = StepPlannerLimits(max_batch_size=2, max_input_length=16, kv_page_size=16)
    policy = resolve_scheduling_policy(
        SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.PREFILL_FIRST), limits
    )
    planner = core.StepPlanner(policy, limits)
    residents = as_resident_array([(0, 0, 10, 12, True, 0), (0, 1, 8, 0, False, 0)])
    with pytest.raises(ValueError, match="max_num_tokens=32.*PREFILL_FIRST"):
        planner.plan(residents, max_num_tokens=32)
    assert planner.plan(residents, max_num_tokens=None).total_tokens == 8


def _mixed(case: Any) -> bool:
    return case.policy.mode == IfbSchedulingMode.MIXED


def outcome(planner: Any, residents: Any, drafts: Any, budget: Any) -> tuple[Any, ...]:
    reasons = np.full(max(len(residents), 1), 0xEE, dtype=np.uint8)
    try:
        plan = planner.plan(residents, reasons=reasons, drafts=drafts, max_num_tokens=budget)
    except Exception as exc:  # noqa: BLE001 - the exception itself is the result compared
        return ("raised", type(exc), str(exc))
    return ("planned", plan.to_dict(), plan.draft_tokens, reasons.tolist())


@settings(max_examples=6 * BASE)
@given(st.data())
def test_a_step_budget_plans_alike_and_keeps_every_guarantee(compiled, reference, data):
    case = data.draw(planning_cases().filter(_mixed))
    lim, pol = case.limits, case.policy
    low = lim.max_batch_size + lim.kv_page_size
    budget = data.draw(st.integers(low, pol.max_num_tokens))
    drafts = data.draw(st.none() | draft_counts(lim, case.rows))
    residents = as_resident_array(case.rows)
    got = [
        outcome(core.StepPlanner(pol, lim), residents, drafts, budget)
        for core in (compiled, reference)
    ]
    assert got[0] == got[1]
    assert got[0][0] == "planned", got[0]
    plan = compiled.StepPlanner(pol, lim).plan(residents, drafts=drafts, max_num_tokens=budget)
    # Every guarantee of §3 and §8 holds with the step's budget in the policy's place.
    check_plan(dataclasses.replace(pol, max_num_tokens=budget), lim, case.rows, plan, drafts=drafts)
    if plan.num_decode:
        assert plan.total_tokens <= budget
    full = compiled.StepPlanner(pol, lim).plan(residents, drafts=drafts)
    assert plan.num_decode == full.num_decode  # the budget takes chunk tokens, never a decode row
    assert plan.prefill_tokens <= full.prefill_tokens
    if full.num_prefill:
        assert plan.num_prefill >= 1 and plan.sequences[0].resident == full.sequences[0].resident


@settings(max_examples=3 * BASE)
@given(st.data())
def test_a_step_budget_plans_as_a_policy_with_that_budget(compiled, reference, data):
    """Where a policy with the step's budget is itself valid (its chunk cap fits), the plan is
    that policy's: the budget replaces max_num_tokens and nothing else."""
    case = data.draw(
        planning_cases().filter(
            lambda c: (
                _mixed(c)
                and c.policy.max_chunk_tokens + c.limits.max_batch_size <= c.policy.max_num_tokens
            )
        )
    )
    lim, pol = case.limits, case.policy
    budget = data.draw(st.integers(pol.max_chunk_tokens + lim.max_batch_size, pol.max_num_tokens))
    budget = max(budget, lim.max_batch_size + lim.kv_page_size)
    residents = as_resident_array(case.rows)
    for core in (compiled, reference):
        narrowed = core.StepPlanner(dataclasses.replace(pol, max_num_tokens=budget), lim)
        want = narrowed.plan(residents).to_dict()
        got = core.StepPlanner(pol, lim).plan(residents, max_num_tokens=budget).to_dict()
        assert got == want


@settings(max_examples=2 * BASE)
@given(st.data())
def test_out_of_range_budgets_are_refused_alike(compiled, reference, data):
    case = data.draw(planning_cases())
    lim, pol = case.limits, case.policy
    low = lim.max_batch_size + lim.kv_page_size
    if pol.mode == IfbSchedulingMode.MIXED:
        value: Any = data.draw(
            st.integers(-(2**40), low - 1) | st.integers(pol.max_num_tokens + 1, 2**40)
        )
    else:
        value = data.draw(st.integers(-(2**40), 2**40))
    residents = as_resident_array(case.rows)
    got = [
        outcome(core.StepPlanner(pol, lim), residents, None, value)
        for core in (compiled, reference)
    ]
    assert got[0] == got[1]
    assert got[0][0] == "raised" and issubclass(got[0][1], ValueError), got[0]
    assert f"max_num_tokens={value}" in got[0][2]
