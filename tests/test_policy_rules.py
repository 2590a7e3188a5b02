"""resolve_with_rules: the resolution and the SPEC §2 rule behind each budget, from one place."""

from __future__ import annotations

import itertools

import pytest

import stepplanner as sp
from stepplanner.planner._policy import resolve_with_rules

MIXED, PREFILL_FIRST, AUTO = (
    sp.IfbSchedulingMode.MIXED,
    sp.IfbSchedulingMode.PREFILL_FIRST,
    sp.IfbSchedulingMode.AUTO,
)


def _rules(options: sp.SchedulingOptions, limits: sp.StepPlannerLimits) -> dict[str, str]:
    policy, rules = resolve_with_rules(options, limits)
    assert policy == sp.resolve_scheduling_policy(options, limits)
    return rules


def test_auto_with_a_budget_names_feasibility_when_mixed_was_feasible_anyway() -> None:
    """The old explanation said 'because max_num_tokens was given' whenever one was."""
    rules = _rules(sp.SchedulingOptions(max_num_tokens=256), sp.StepPlannerLimits(8, 300, 32))
    assert rules["mode"] == "rule 2: AUTO -> MIXED because rd(T_max)=2400 >= B+P=40"


def test_auto_with_a_budget_when_mixed_is_infeasible() -> None:
    limits = sp.StepPlannerLimits(4, 1, 4)  # rd(T_max)=4 < B+P=8: mixed is infeasible
    with pytest.raises(ValueError):  # a given budget must still lie in [B+P, T_max]
        resolve_with_rules(sp.SchedulingOptions(max_num_tokens=8), limits)
    rules = _rules(sp.SchedulingOptions(), limits)
    assert rules["mode"] == "rule 2: AUTO -> PREFILL_FIRST because rd(T_max)=4 < B+P=8"
    assert rules["max_num_tokens"] == "rule 4: PREFILL_FIRST uses T_max = B*S_in = 4"


def test_rules_name_defaults_givens_caps_and_the_step_buffer() -> None:
    limits = sp.StepPlannerLimits(8, 300, 32, max_step_tokens=1024)
    rules = _rules(sp.SchedulingOptions(), limits)
    assert rules["max_num_tokens"] == "rule 3: default min(ru(512+B), rd(T_max)) = min(544, 1024)"
    assert rules["max_chunk_tokens"] == (
        "rule 3: default max(P, rd(min(512, max_num_tokens-B)))"
        " = 512, capped at max(P, rd(S_in)) = 288"
    )
    rules = _rules(
        sp.SchedulingOptions(ifb_scheduling_mode=PREFILL_FIRST, max_num_tokens=100), limits
    )
    assert rules["max_num_tokens"] == (
        "rule 4: PREFILL_FIRST uses T_max = min(B*S_in, max_step_tokens) = min(2400, 1024) = 1024"
        " (the given value passed rule 3, then was replaced)"
    )
    rules = _rules(sp.SchedulingOptions(ifb_scheduling_mode=MIXED, max_chunk_tokens=64), limits)
    assert rules["mode"] == "given"
    assert rules["max_chunk_tokens"] == "rule 3: given 64, a multiple of P in [P, max_num_tokens-B]"


@pytest.mark.parametrize(
    ("mode", "budget", "chunk", "b", "s_in", "p", "step"),
    [
        *itertools.product(
            (AUTO, MIXED, PREFILL_FIRST), (0, 96, 544), (0, 32), (8,), (300, 40), (32,), (0, 256)
        ),
    ],
)
def test_every_resolution_has_a_rule_for_each_budget(mode, budget, chunk, b, s_in, p, step) -> None:
    limits = sp.StepPlannerLimits(b, s_in, p, step)
    options = sp.SchedulingOptions(
        ifb_scheduling_mode=mode, max_num_tokens=budget, max_chunk_tokens=chunk
    )
    try:
        policy, rules = resolve_with_rules(options, limits)
    except ValueError as exc:
        with pytest.raises(ValueError) as plain:
            sp.resolve_scheduling_policy(options, limits)
        assert str(plain.value) == str(exc)
        return
    assert policy == sp.resolve_scheduling_policy(options, limits)
    assert set(rules) == {"mode", "max_num_tokens", "max_chunk_tokens"}
    rule = "rule 4: PREFILL_FIRST" if policy.mode == PREFILL_FIRST else "rule 3: "
    assert rules["max_num_tokens"].startswith(rule)
    assert rules["max_chunk_tokens"].startswith(rule)
