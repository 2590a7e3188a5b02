"""The step-time budget (``stepplanner.ledger.step_time.StepTimeBudget``, SPEC §9): on both
ledgers, every step with decode rows fits its time, the online fit finds a model the prior
got wrong despite outliers, and bad arguments are refused naming them, with nothing changed."""

from __future__ import annotations

import dataclasses
import math

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
from stepplanner.ledger.step_time import StepTimeBudget, plan_features

LIMITS = StepPlannerLimits(max_batch_size=16, max_input_length=8192, kv_page_size=32)
POLICY = resolve_scheduling_policy(
    SchedulingOptions(max_num_tokens=2048, max_chunk_tokens=1024), LIMITS
)
TRUE = {"a": 2e-3, "b": 2e-5, "c": 1e-7}


def step_time(plan, model) -> float:
    tokens, context, rows, attention = plan_features(plan)
    terms = {"a": 1, "b": tokens, "c": context, "d": tokens * context, "e": attention, "f": rows}
    return sum(model.get(k, 0.0) * x for k, x in terms.items())


def serve(ledger_impl, budget_of, steps=400, seed=0):
    """A deep-KV stream: long prompts, long outputs; yields (plan, budget) per step."""
    rng = np.random.default_rng(seed)
    ledger = ledger_impl.Ledger(LIMITS, POLICY, max_waiting=10_000)
    planner = ledger_impl.StepPlanner(POLICY, LIMITS)
    budget = budget_of(planner)
    for rid in range(200):
        ledger.submit(rid, int(rng.integers(2000, 8000)), max_new_tokens=int(rng.integers(50, 400)))
    plan = ledger.step(budget)
    for _ in range(steps):
        yield plan, budget
        if ledger.count == 0:
            return
        plan = ledger.step(budget, np.zeros(len(plan.sequences), dtype=bool))


def test_every_step_with_decodes_fits_its_time(ledger_impl):
    target = 0.03
    cut = 0
    for plan, budget in serve(ledger_impl, lambda p: StepTimeBudget(p, TRUE, target)):
        if plan.num_decode and budget.last_budget > LIMITS.max_batch_size + LIMITS.kv_page_size:
            assert step_time(plan, TRUE) <= target * (1 + 1e-9), plan
            assert plan.total_tokens <= budget.last_budget
        cut += budget.last_budget < POLICY.max_num_tokens
        budget.observe(step_time(plan, TRUE))
    assert cut > 50  # the stream is deep enough that the budget binds


def test_a_loose_target_plans_as_the_policy(ledger_impl):
    plain = serve(ledger_impl, lambda p: p, steps=120)
    budgeted = serve(ledger_impl, lambda p: StepTimeBudget(p, TRUE, 10.0), steps=120)
    steps = 0
    for (want, _), (got, budget) in zip(plain, budgeted, strict=True):
        assert got.to_dict() == want.to_dict()
        assert budget.last_budget == POLICY.max_num_tokens
        steps += 1
    assert steps == 120


def test_the_floor_is_b_plus_p_and_the_first_prompt_advances(ledger_impl):
    low = LIMITS.max_batch_size + LIMITS.kv_page_size
    for plan, budget in serve(ledger_impl, lambda p: StepTimeBudget(p, TRUE, 1e-4), steps=80):
        if plan.num_decode:
            assert plan.total_tokens <= low
            assert budget.last_budget == low
            assert plan.num_prefill >= 1 or plan.num_decode == plan.num_residents


def test_the_online_fit_learns_a_model_the_prior_got_wrong(ledger_impl):
    """A prior blind to KV depth (c = 0) overfills every deep step; fed the measured times,
    outliers included, the fit prices the steps within a few percent and the budget then
    keeps them within the target, where the prior alone overshoots."""
    rng = np.random.default_rng(1)
    prior = {"a": 2e-3, "b": 2e-5, "c": 0.0}
    target = 0.03
    errors, over, prior_over = [], [], []
    for k, (plan, budget) in enumerate(
        serve(ledger_impl, lambda p: StepTimeBudget(p, prior, target), steps=600)
    ):
        took = step_time(plan, TRUE)
        if k >= 400:
            errors.append(abs(budget.predict(plan) / took - 1))
            if plan.num_decode and plan.num_prefill:
                over.append(took / target)
        if k % 20 == 7:
            took *= 10  # an outlier: a slow step (a page fault, a GC)
        budget.observe(took * (1 + 0.01 * rng.standard_normal()))
    assert budget.refits >= 10
    never = 1 << 20  # the prior alone, never refitted
    for plan, _ in serve(
        ledger_impl, lambda p: StepTimeBudget(p, prior, target, refit_every=never)
    ):
        if plan.num_decode and plan.num_prefill:
            prior_over.append(step_time(plan, TRUE) / target)
    assert max(prior_over) > 1.2  # the prior's steps overshoot
    assert float(np.median(errors)) < 0.03
    assert over and max(over) < 1.05


@pytest.mark.parametrize(
    ("kwargs", "kind", "text"),
    [
        ({"max_step_seconds": 0}, ValueError, "max_step_seconds=0"),
        ({"max_step_seconds": -1.0}, ValueError, "max_step_seconds=-1.0"),
        ({"max_step_seconds": math.nan}, ValueError, "max_step_seconds=nan"),
        ({"max_step_seconds": math.inf}, ValueError, "max_step_seconds=inf"),
        ({"max_step_seconds": True}, TypeError, "max_step_seconds"),
        ({"max_step_seconds": "0.1"}, TypeError, "max_step_seconds"),
        ({"coefficients": {"a": 1e-3, "z": 1.0}}, ValueError, "coefficients=z"),
        ({"coefficients": {"a": -1.0}}, ValueError, r"coefficients\['a'\]=-1.0"),
        ({"window": 4}, ValueError, "window=4.*8\\.\\."),
        ({"refit_every": 0}, ValueError, "refit_every=0"),
        ({"huber": 0.0}, ValueError, "huber=0.0"),
    ],
)
def test_bad_arguments_are_refused_naming_them(core, kwargs, kind, text):
    planner = core.StepPlanner(POLICY, LIMITS)
    args = {"coefficients": TRUE, "max_step_seconds": 0.03, **kwargs}
    with pytest.raises(kind, match=text):
        StepTimeBudget(planner, args.pop("coefficients"), args.pop("max_step_seconds"), **args)


def test_prefill_first_is_refused(core):
    limits = StepPlannerLimits(max_batch_size=2, max_input_length=16, kv_page_size=16)
    policy = resolve_scheduling_policy(
        SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.PREFILL_FIRST), limits
    )
    with pytest.raises(ValueError, match="policy.mode=PREFILL_FIRST.*MIXED"):
        StepTimeBudget(core.StepPlanner(policy, limits), TRUE, 0.03)


def test_a_bad_measurement_is_refused_and_changes_nothing(ledger_impl):
    stream = serve(ledger_impl, lambda p: StepTimeBudget(p, TRUE, 0.03, refit_every=1))
    plan, budget = next(stream)
    for bad in (math.nan, -1.0, 0.0, math.inf):
        with pytest.raises(ValueError, match="seconds="):
            budget.observe(bad)
    assert budget.refits == 0 and budget.coefficients["c"] == TRUE["c"]
    budget.observe(step_time(plan, TRUE))  # the plan is still the one to observe
    assert budget.refits == 1


# --- the pricing pass: compiled against its twin ---------------------------------------------


@settings(max_examples=6 * settings().max_examples)
@given(st.data())
def test_the_pricers_choose_alike_and_the_plan_keeps_its_guarantees(data):
    from stepplanner.ledger import _step_time, _step_time_py
    from stepplanner.planner.checks import check_plan
    from stepplanner.testing import as_resident_array, planning_cases

    case = data.draw(planning_cases().filter(lambda c: c.policy.mode == IfbSchedulingMode.MIXED))
    model = tuple(data.draw(st.sampled_from([0.0, 1e-9, 1e-6, 1e-4, 2e-3])) for _ in range(6))
    if not any(model):
        model = (1e-3, 0, 0, 0, 0, 0)
    target = data.draw(st.floats(1e-5, 1.0))
    residents = as_resident_array(case.rows)
    chosen = []
    for module in (_step_time, _step_time_py):
        planner = compiled_core().StepPlanner(case.policy, case.limits)
        pricer = module.StepPricer(planner, case.policy, case.limits, target, model)
        plan = pricer.plan(residents)
        chosen.append((pricer.last_budget, plan.to_dict()))
        budget = pricer.last_budget
        low = case.limits.max_batch_size + case.limits.kv_page_size
        assert low <= budget <= case.policy.max_num_tokens
        check_plan(
            dataclasses.replace(case.policy, max_num_tokens=budget), case.limits, case.rows, plan
        )
    assert chosen[0] == chosen[1]


def compiled_core():
    from stepplanner import _core

    return _core


@pytest.mark.parametrize("bad", [[1, 2, 3], np.zeros(3), np.zeros((2, 2))])
def test_the_pricers_refuse_what_is_not_a_resident_array(bad):
    from stepplanner.ledger import _step_time, _step_time_py

    for module in (_step_time, _step_time_py):
        planner = compiled_core().StepPlanner(POLICY, LIMITS)
        pricer = module.StepPricer(planner, POLICY, LIMITS, 0.03, (1e-3, 1e-5, 1e-8, 0, 0, 0))
        with pytest.raises(TypeError, match="residents must be a 1-D RESIDENT_DTYPE array"):
            pricer.budget(bad, 0)


def test_a_list_of_resident_states_is_priced_as_its_array(core):
    from stepplanner.testing import as_resident_array, as_resident_states

    rows = [(0, i, 4000, 3000 + i if i % 3 else 100 * i, bool(i % 3), 0) for i in range(12)]
    model = {"a": 2e-3, "b": 2e-5, "c": 1e-6}
    got = []
    for residents in (as_resident_array(rows), as_resident_states(rows, core.ResidentState)):
        budget = StepTimeBudget(core.StepPlanner(POLICY, LIMITS), model, 0.02)
        got.append((budget.plan(residents).to_dict(), budget.last_budget))
    assert got[0] == got[1]
    assert got[0][1] < POLICY.max_num_tokens  # it binds here
    with pytest.raises(ValueError, match="count"):
        StepTimeBudget(core.StepPlanner(POLICY, LIMITS), model, 0.02).plan(
            as_resident_array(rows), count=13
        )
