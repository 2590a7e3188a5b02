"""SPEC §2: limits, options, policy resolution, and the planner's check of hand-built policies."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepplanner import (
    IfbSchedulingMode,
    PreemptionMode,
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner.testing import limits as limits_strategy
from stepplanner.testing import policies, scheduling_options

AUTO, MIXED, PREFILL_FIRST = (
    IfbSchedulingMode.AUTO,
    IfbSchedulingMode.MIXED,
    IfbSchedulingMode.PREFILL_FIRST,
)


def resolve(b, s_in, p, **options):
    return resolve_scheduling_policy(SchedulingOptions(**options), StepPlannerLimits(b, s_in, p))


def raises_naming(exc_type, *fragments):
    """pytest.raises whose message must contain every fragment (field, value, allowed range)."""
    return pytest.raises(exc_type, match=".*".join(re.escape(f) for f in fragments))


# --- rule 1: ranges of limits and options ------------------------------------------------------


@pytest.mark.parametrize("field", ["max_batch_size", "max_input_length", "kv_page_size"])
@pytest.mark.parametrize("value", [0, -1])
def test_limits_below_one(field, value):
    args = {"max_batch_size": 4, "max_input_length": 64, "kv_page_size": 16, field: value}
    with raises_naming(ValueError, f"{field}={value}", "allowed: 1..2147483647"):
        StepPlannerLimits(**args)


def test_limits_t_max_must_fit_int32():
    with raises_naming(ValueError, "T_max", str(2**16 * 2**16), "2147483647"):
        StepPlannerLimits(2**16, 2**16, 16)


def test_limits_types():
    with raises_naming(TypeError, "max_batch_size", "float"):
        StepPlannerLimits(4.0, 64, 16)
    with raises_naming(OverflowError, "kv_page_size", str(2**31)):
        StepPlannerLimits(4, 64, 2**31)
    assert StepPlannerLimits(4, 64, 16).t_max == 256


# --- max_step_tokens (SPEC §1, §2; amended 2026-11-30) --------------------------------------------


def test_max_step_tokens_caps_t_max():
    assert StepPlannerLimits(4, 64, 16).t_max == 256
    assert StepPlannerLimits(4, 64, 16, 0).t_max == 256
    assert StepPlannerLimits(4, 64, 16, 80).t_max == 80
    assert StepPlannerLimits(4, 64, 16, 16).t_max == 16  # one page is enough
    assert StepPlannerLimits(4, 64, 16, 1000).t_max == 256  # larger than B*S_in: no effect


@pytest.mark.parametrize("value", [-1, 1, 15])
def test_max_step_tokens_below_a_page(value):
    with raises_naming(
        ValueError, f"max_step_tokens={value}", "max(kv_page_size, max_batch_size) = 16"
    ):
        StepPlannerLimits(4, 64, 16, value)


def test_max_step_tokens_below_one_decode_token_per_slot():
    # A prefill-first step with every resident decoding plans B tokens: they must fit.
    with raises_naming(ValueError, "max_step_tokens=31", "max(kv_page_size, max_batch_size) = 32"):
        StepPlannerLimits(32, 64, 16, 31)
    assert StepPlannerLimits(32, 64, 16, 32).t_max == 32


def test_max_step_tokens_types():
    with raises_naming(TypeError, "max_step_tokens", "float"):
        StepPlannerLimits(4, 64, 16, 80.0)
    with raises_naming(OverflowError, "max_step_tokens", str(2**31)):
        StepPlannerLimits(4, 64, 16, 2**31)


def test_max_step_tokens_lifts_the_int32_bound_on_b_times_s_in():
    # B*S_in = 2**32 does not fit int32, but no step can hold more than max_step_tokens.
    limits = StepPlannerLimits(2**10, 2**22, 16, 8192)
    assert limits.t_max == 8192
    with raises_naming(ValueError, "T_max", "max_step_tokens"):
        StepPlannerLimits(2**10, 2**22, 16)


def test_max_step_tokens_replaces_b_times_s_in_in_resolution():
    lim = StepPlannerLimits(4, 64, 16, 80)
    p = resolve_scheduling_policy(SchedulingOptions(), lim)  # rd(80) >= B + P: mixed
    assert (p.mode, p.max_num_tokens, p.max_chunk_tokens) == (MIXED, 80, 64)
    with raises_naming(ValueError, "max_num_tokens=100", "[20, 80]"):
        resolve_scheduling_policy(SchedulingOptions(max_num_tokens=100), lim)
    p = resolve_scheduling_policy(SchedulingOptions(ifb_scheduling_mode=PREFILL_FIRST), lim)
    assert (p.max_num_tokens, p.max_chunk_tokens) == (80, 64)
    # one page per step: mixed is infeasible (rd(16) < B + P), AUTO falls back to prefill-first
    p = resolve_scheduling_policy(SchedulingOptions(), StepPlannerLimits(4, 64, 16, 16))
    assert (p.mode, p.max_num_tokens, p.max_chunk_tokens) == (PREFILL_FIRST, 16, 64)


@pytest.mark.parametrize(
    "field", ["max_num_tokens", "max_chunk_tokens", "max_pause_steps", "priority_reserved_slots"]
)
def test_option_fields_negative(field):
    with raises_naming(ValueError, f"{field}=-1", "allowed: 0..2147483647"):
        SchedulingOptions(**{field: -1})


@pytest.mark.parametrize("value", [-1, 4, 5])
def test_priority_reserved_slots_below_batch(value):
    with raises_naming(ValueError, f"priority_reserved_slots={value}", "max_batch_size=4"):
        resolve_scheduling_policy(
            _options_unchecked(priority_reserved_slots=value), StepPlannerLimits(4, 64, 16)
        )


def _options_unchecked(**fields):
    """Options with a field the constructor would reject, to reach resolve's own check."""
    options = SchedulingOptions()
    for name, value in fields.items():
        object.__setattr__(options, name, value)
    return options


def test_priority_reserved_slots_top_of_range():
    assert resolve(4, 64, 16, priority_reserved_slots=3).priority_reserved_slots == 3


def test_option_enum_fields():
    with raises_naming(
        ValueError,
        "ifb_scheduling_mode=7",
        "allowed: auto, mixed, prefill_first (any case) or 0..2",
    ):
        SchedulingOptions(ifb_scheduling_mode=7)
    with raises_naming(TypeError, "max_num_tokens", "float"):
        SchedulingOptions(max_num_tokens=1.5)
    assert SchedulingOptions(scheduling_policy=1).scheduling_policy is SchedulingPolicy.PRIORITY


def test_option_defaults():
    o = SchedulingOptions()
    assert (
        o.ifb_scheduling_mode,
        o.max_num_tokens,
        o.max_chunk_tokens,
        o.scheduling_policy,
        o.preemption,
        o.priority_reserved_slots,
        o.max_pause_steps,
    ) == (AUTO, 0, 0, SchedulingPolicy.FCFS, PreemptionMode.NONE, 0, 0)


# --- rule 2: AUTO ------------------------------------------------------------------------------


def test_auto_feasible_is_mixed():
    # rd(T_max) = 256 >= B + P = 20
    assert resolve(4, 64, 16).mode == MIXED


def test_auto_infeasible_is_prefill_first():
    # B=4, S_in=4, P=16: rd(16) = 16 < B + P = 20
    policy = resolve(4, 4, 16)
    assert policy.mode == PREFILL_FIRST
    assert (policy.max_num_tokens, policy.max_chunk_tokens) == (16, 4)


def test_auto_with_given_budget_is_mixed_even_if_infeasible():
    # B=3, S_in=5, P=8: rd(T_max=15) = 8 < 11 = B + P <= T_max, so only a given budget works.
    assert resolve(3, 5, 8).mode == PREFILL_FIRST
    policy = resolve(3, 5, 8, max_num_tokens=12)
    assert policy.mode == MIXED
    # chunk default max(P, rd(min(512, 12 - 3))) = 8, capped at max(P, rd(S_in)=0) = 8
    assert (policy.max_num_tokens, policy.max_chunk_tokens) == (12, 8)


def test_auto_with_given_chunk_only_stays_by_feasibility():
    policy = resolve(4, 64, 16, max_chunk_tokens=32)
    assert (policy.mode, policy.max_chunk_tokens) == (MIXED, 32)


# --- rule 3: MIXED budgets -----------------------------------------------------------------------


def test_mixed_default_budgets():
    # min(ru(512 + 4), rd(256)) = 256; chunk max(16, rd(min(512, 252))) = 240, capped at rd(64)=64
    policy = resolve(4, 64, 16, ifb_scheduling_mode=MIXED)
    assert (policy.max_num_tokens, policy.max_chunk_tokens) == (256, 64)


def test_mixed_default_budget_rounds_up_to_a_page():
    # B=8, S_in=4096, P=100: ru(520) = 600 <= rd(T_max) = 32700; chunk rd(min(512, 592)) = 500
    policy = resolve(8, 4096, 100, ifb_scheduling_mode=MIXED)
    assert (policy.max_num_tokens, policy.max_chunk_tokens) == (600, 500)


def test_mixed_default_needs_feasibility():
    with raises_naming(ValueError, "max_num_tokens=0", "[7, 8]"):
        resolve(4, 2, 3, ifb_scheduling_mode=MIXED)  # rd(8) = 6 < 7


@pytest.mark.parametrize("value", [19, 257])
def test_mixed_given_budget_range(value):
    with raises_naming(ValueError, f"max_num_tokens={value}", "[20, 256]"):
        resolve(4, 64, 16, ifb_scheduling_mode=MIXED, max_num_tokens=value)


@pytest.mark.parametrize("value", [20, 256])
def test_mixed_given_budget_edges_accepted(value):
    assert (
        resolve(4, 64, 16, ifb_scheduling_mode=MIXED, max_num_tokens=value).max_num_tokens == value
    )


@pytest.mark.parametrize("value", [8, 24, 48 + 16])
def test_mixed_given_chunk_range(value):
    # [P, max_num_tokens - B] = [16, 48] and a multiple of 16
    with raises_naming(ValueError, f"max_chunk_tokens={value}", "kv_page_size=16", "[16, 48]"):
        resolve(4, 64, 16, max_num_tokens=52, max_chunk_tokens=value)


def test_mixed_chunk_capped_by_input_length():
    # a given 48 is allowed by [16, 48], then capped at max(P, rd(S_in=40)) = 32
    policy = resolve(4, 40, 16, max_num_tokens=52, max_chunk_tokens=48)
    assert policy.max_chunk_tokens == 32
    # S_in < P: the cap is P itself
    assert resolve(4, 8, 16, max_num_tokens=24).max_chunk_tokens == 16


# --- rule 3 under PREFILL_FIRST, and rule 4 -------------------------------------------------------


def test_prefill_first_budgets_are_t_max_and_s_in():
    policy = resolve(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST)
    assert (policy.mode, policy.max_num_tokens, policy.max_chunk_tokens) == (PREFILL_FIRST, 256, 64)


def test_prefill_first_checks_a_given_budget():
    with raises_naming(ValueError, "max_num_tokens=5", "[20, 256]"):
        resolve(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST, max_num_tokens=5)
    with raises_naming(ValueError, "max_chunk_tokens=20", "[16, "):
        resolve(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST, max_chunk_tokens=20)


def test_prefill_first_valid_given_budget_still_resolves_to_t_max():
    policy = resolve(
        4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST, max_num_tokens=52, max_chunk_tokens=32
    )
    assert (policy.max_num_tokens, policy.max_chunk_tokens) == (256, 64)


def test_resolution_carries_the_other_fields():
    policy = resolve(
        4,
        64,
        16,
        scheduling_policy=SchedulingPolicy.PRIORITY,
        preemption=PreemptionMode.PAUSE,
        priority_reserved_slots=2,
        max_pause_steps=3,
    )
    assert (
        policy.scheduling_policy,
        policy.preemption,
        policy.priority_reserved_slots,
        policy.max_pause_steps,
    ) == (SchedulingPolicy.PRIORITY, PreemptionMode.PAUSE, 2, 3)


def test_resolve_argument_types():
    with raises_naming(TypeError, "options", "dict"):
        resolve_scheduling_policy({}, StepPlannerLimits(4, 64, 16))
    with raises_naming(TypeError, "limits", "tuple"):
        resolve_scheduling_policy(SchedulingOptions(), (4, 64, 16))


@given(st.data())
def test_valid_options_resolve_to_a_plannable_policy(data):
    lim = data.draw(limits_strategy())
    policy = resolve_scheduling_policy(data.draw(scheduling_options(lim)), lim)
    assert policy.mode in (MIXED, PREFILL_FIRST)
    p, b = lim.kv_page_size, lim.max_batch_size
    if policy.mode == PREFILL_FIRST:
        assert (policy.max_num_tokens, policy.max_chunk_tokens) == (lim.t_max, lim.max_input_length)
    else:
        assert b + p <= policy.max_num_tokens <= lim.t_max
        assert policy.max_chunk_tokens % p == 0
        assert p <= policy.max_chunk_tokens <= max(p, lim.max_input_length // p * p)


# --- the planner's check of hand-built policies ---------------------------------------------------


LIMITS = StepPlannerLimits(4, 64, 16)


def hand_built(**fields):
    base = dict(mode=MIXED, max_num_tokens=52, max_chunk_tokens=32)
    base.update(fields)
    return ResolvedSchedulingPolicy(**base)


def test_planner_rejects_unresolved_auto(core):
    with raises_naming(RuntimeError, "policy.mode", "AUTO", "MIXED or PREFILL_FIRST"):
        core.StepPlanner(hand_built(mode=AUTO), LIMITS)


@pytest.mark.parametrize(
    ("fields", "fragments"),
    [
        ({"max_num_tokens": 19}, ("max_num_tokens=19", "[20, 256]")),
        ({"max_num_tokens": 257}, ("max_num_tokens=257", "[20, 256]")),
        ({"max_chunk_tokens": 24}, ("max_chunk_tokens=24", "multiple of kv_page_size=16")),
        ({"max_chunk_tokens": 48 + 16}, ("max_chunk_tokens=64", "[16, 48]")),
        ({"max_chunk_tokens": 0}, ("max_chunk_tokens=0", "[16, 48]")),
        ({"mode": PREFILL_FIRST}, ("max_num_tokens=52", "256 under PREFILL_FIRST")),
        ({"mode": PREFILL_FIRST, "max_num_tokens": 256}, ("max_chunk_tokens=32", "64 under")),
        ({"priority_reserved_slots": 4}, ("priority_reserved_slots=4", "max_batch_size=4")),
    ],
)
def test_planner_rejects_broken_budgets(core, fields, fragments):
    with raises_naming(ValueError, *fragments):
        core.StepPlanner(hand_built(**fields), LIMITS)


def test_planner_rejects_chunk_above_input_length(core):
    # Within [P, max_num_tokens - B] but above max(P, rd(S_in)): resolve would have capped it.
    limits = StepPlannerLimits(4, 40, 16)
    with raises_naming(ValueError, "max_chunk_tokens=48", "[16, 32]"):
        core.StepPlanner(hand_built(max_chunk_tokens=48), limits)


def test_planner_argument_types(core):
    with raises_naming(TypeError, "policy", "SchedulingOptions"):
        core.StepPlanner(SchedulingOptions(), LIMITS)
    with raises_naming(TypeError, "limits", "tuple"):
        core.StepPlanner(hand_built(), (4, 64, 16))


def test_planner_keeps_its_policy_and_limits(core):
    policy = hand_built()
    planner = core.StepPlanner(policy, LIMITS)
    assert planner.policy is policy and planner.limits is LIMITS
    with pytest.raises((AttributeError, dataclasses.FrozenInstanceError)):
        planner.policy = hand_built(max_num_tokens=20)


@given(st.data())
def test_every_resolved_policy_builds_a_planner(core, data):
    lim = data.draw(limits_strategy())
    policy = data.draw(policies(lim))
    assert core.StepPlanner(policy, lim).policy is policy


@pytest.mark.parametrize(("limits", "budget"), [((1, 2000, 1000), 2000), ((8, 4096, 1024), 2048)])
def test_default_options_with_large_pages_build_a_planner(core, limits, budget):
    """Regression: SPEC's letter, min(ru(512 + B), rd(T_max)), is below B + P when pages are
    larger than 512 tokens (B=1, P=1000 gave 1000 < 1001, which the planner then refused).
    The default never falls below B + P: min(ru(B + max(512, P)), rd(T_max))."""
    lim = StepPlannerLimits(*limits)
    policy = resolve_scheduling_policy(SchedulingOptions(), lim)
    assert policy.max_num_tokens == budget >= lim.max_batch_size + lim.kv_page_size
    assert core.StepPlanner(policy, lim).policy is policy


@given(st.data())
def test_large_page_defaults_build_a_planner(core, data):
    lim = data.draw(limits_strategy(max_batch_size=64, max_input_length=8192, max_page_size=4096))
    policy = data.draw(policies(lim))
    core.StepPlanner(policy, lim)


# --- enum options by the names a person types (issue 44) ---------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"scheduling_policy": "priority"}, {"scheduling_policy": SchedulingPolicy.PRIORITY}),
        ({"scheduling_policy": " EDF "}, {"scheduling_policy": SchedulingPolicy.EDF}),
        ({"scheduling_policy": "3"}, {"scheduling_policy": SchedulingPolicy.DEADLINE}),
        ({"ifb_scheduling_mode": "Prefill-First"}, {"ifb_scheduling_mode": PREFILL_FIRST}),
        ({"ifb_scheduling_mode": "mixed"}, {"ifb_scheduling_mode": MIXED}),
        ({"preemption": "Pause"}, {"preemption": PreemptionMode.PAUSE}),
    ],
)
def test_options_take_enum_names_in_any_case(core, fields, expected):
    options = SchedulingOptions(**fields)
    for name, member in expected.items():
        assert getattr(options, name) is member
    # The same options plan alike on both implementations, given as names or as members.
    lim = StepPlannerLimits(4, 64, 16)
    by_name = resolve_scheduling_policy(options, lim)
    assert by_name == resolve_scheduling_policy(SchedulingOptions(**expected), lim)
    assert core.StepPlanner(by_name, lim).policy == by_name


def test_a_resolved_policy_takes_enum_names(core):
    policy = ResolvedSchedulingPolicy(
        mode="mixed", max_num_tokens=52, max_chunk_tokens=32, scheduling_policy="Priority"
    )
    assert policy == hand_built(scheduling_policy=SchedulingPolicy.PRIORITY)
    assert core.StepPlanner(policy, LIMITS).policy is policy


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "scheduling_policy",
            "prio",
            "scheduling_policy='prio' is not a SchedulingPolicy; allowed: fcfs, priority, edf, "
            "deadline (any case) or 0..3",
        ),
        (
            "scheduling_policy",
            9,
            "scheduling_policy=9 is not a SchedulingPolicy; allowed: fcfs, priority, edf, "
            "deadline (any case) or 0..3",
        ),
        (
            "ifb_scheduling_mode",
            "prefill first",
            "ifb_scheduling_mode='prefill first' is not a IfbSchedulingMode; allowed: auto, "
            "mixed, prefill_first (any case) or 0..2",
        ),
        (
            "preemption",
            "",
            "preemption='' is not a PreemptionMode; allowed: none, pause (any case) or 0..1",
        ),
    ],
)
def test_an_unknown_enum_name_lists_the_spellings(field, value, message):
    with pytest.raises(ValueError) as info:
        SchedulingOptions(**{field: value})
    assert str(info.value) == message


# --- one range per field, below it or past int32 (issue 44) -----------------------------------


@pytest.mark.parametrize(
    ("value", "exc"), [(0, ValueError), (-1, ValueError), (99_999_999_999_999, OverflowError)]
)
def test_a_limit_states_one_range_either_side(value, exc):
    with pytest.raises(exc) as info:
        StepPlannerLimits(value, 64, 16)
    verb = "does not fit int32" if exc is OverflowError else "is out of range"
    assert str(info.value) == f"max_batch_size={value} {verb}; allowed: 1..2147483647"


@pytest.mark.parametrize(("value", "exc"), [(8, ValueError), (2**31, OverflowError)])
def test_max_step_tokens_states_one_range_either_side(value, exc):
    with pytest.raises(exc) as info:
        StepPlannerLimits(16, 64, 4, value)
    assert str(info.value).endswith(
        "allowed: 0 (= max_batch_size * max_input_length) or max(kv_page_size, "
        "max_batch_size) = 16..2147483647"
    )


@pytest.mark.parametrize(("value", "exc"), [(-1, ValueError), (2**40, OverflowError)])
def test_an_option_states_one_range_either_side(value, exc):
    with pytest.raises(exc) as info:
        SchedulingOptions(max_pause_steps=value)
    assert str(info.value).endswith("; allowed: 0..2147483647")
