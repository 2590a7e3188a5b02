"""SPEC §3, one rule at a time, on both implementations and both input kinds."""

from __future__ import annotations

import numpy as np
import pytest

from stepplanner import (
    REASON_RELEASED_FROM_PAUSE,
    IfbSchedulingMode,
    PreemptionMode,
    Reason,
    SchedulingPolicy,
    SequenceWork,
    split_reason,
)
from stepplanner.planner.checks import check_plan
from stepplanner.testing import as_resident_array, as_resident_states

MIXED, PREFILL_FIRST = IfbSchedulingMode.MIXED, IfbSchedulingMode.PREFILL_FIRST
PRIORITY, PAUSE = SchedulingPolicy.PRIORITY, PreemptionMode.PAUSE
CONTEXT, DECODE = SequenceWork.CONTEXT, SequenceWork.DECODE


def row(priority=0, arrival=0, prompt=0, committed=0, decoding=False, paused_steps=0):
    return (priority, arrival, prompt, committed, decoding, paused_steps)


def dec(priority=0, arrival=0, committed=10, paused_steps=0):
    return row(priority, arrival, committed, committed, True, paused_steps)


@pytest.fixture(params=["list", "array"])
def kind(request):
    return request.param


@pytest.fixture
def run(core, kind):
    """run(planner, rows, count=None) -> (plan, [(Reason, released)] per planned-over row)."""

    def call(planner, rows, count=None):
        residents = (
            as_resident_array(rows)
            if kind == "array"
            else as_resident_states(rows, core.ResidentState)
        )
        reasons = np.full(max(len(rows), 1), 0xEE, dtype=np.uint8)
        plan = planner.plan(residents, count, reasons=reasons)
        check_plan(planner.policy, planner.limits, residents, plan)
        n = len(rows) if count is None else count
        return plan, [split_reason(c) for c in reasons[:n]]

    return call


def chunks(plan):
    return [
        (s.resident, s.query_length, s.select_last_token_logits)
        for s in plan.sequences
        if s.work == CONTEXT
    ]


def decodes(plan):
    return [s.resident for s in plan.sequences if s.work == DECODE]


# --- order ---------------------------------------------------------------------------------------


def test_fcfs_orders_by_arrival_and_ignores_priority(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=MIXED)
    rows = [row(-5, 3, 8), row(9, 1, 8), row(0, 2, 8), dec(-9, 7)]
    plan, _ = run(planner, rows)
    assert [s.resident for s in plan.sequences] == [1, 2, 0, 3]


def test_priority_orders_by_priority_then_arrival(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=MIXED, scheduling_policy=PRIORITY)
    rows = [row(1, 0, 8), row(-2, 9, 8), row(1, 2, 8), row(-2, 4, 8)]
    plan, _ = run(planner, rows)
    assert [r for r, _, _ in chunks(plan)] == [3, 1, 0, 2]


@pytest.mark.parametrize("policy", list(SchedulingPolicy))
def test_duplicate_arrivals_break_ties_by_index(make_planner, run, policy):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=MIXED, scheduling_policy=policy)
    rows = [dec(0, 5), dec(0, 5), row(0, 5, 8), dec(0, 5)]
    plan, _ = run(planner, rows)
    assert chunks(plan) == [(2, 8, True)] and decodes(plan) == [0, 1, 3]


def test_order_over_the_full_field_ranges(make_planner, run):
    planner = make_planner(5, 64, 16, ifb_scheduling_mode=MIXED, scheduling_policy=PRIORITY)
    rows = [
        dec(2**31 - 1, 0),
        dec(0, 2**64 - 1),
        dec(0, 2**32),
        dec(-(2**31), 2**63),
        dec(0, 2**32 - 1),
    ]
    plan, _ = run(planner, rows)
    assert decodes(plan) == [3, 4, 2, 1, 0]


def test_chunks_then_decodes_each_in_order(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=MIXED)
    rows = [dec(arrival=4), row(arrival=3, prompt=8), dec(arrival=1), row(arrival=2, prompt=8)]
    plan, _ = run(planner, rows)
    assert [(s.resident, s.work) for s in plan.sequences] == [
        (3, CONTEXT),
        (1, CONTEXT),
        (2, DECODE),
        (0, DECODE),
    ]


# --- pause ---------------------------------------------------------------------------------------


def pause_planner(make_planner, max_pause_steps=0, mode=MIXED, policy=PRIORITY, preemption=PAUSE):
    return make_planner(
        4,
        64,
        16,
        ifb_scheduling_mode=mode,
        scheduling_policy=policy,
        preemption=preemption,
        max_pause_steps=max_pause_steps,
    )


def test_pause_withholds_everyone_worse_than_the_first_prompt(make_planner, run):
    rows = [dec(1, 0), row(0, 5, 30), dec(0, 1), row(1, 2, 20)]
    plan, why = run(pause_planner(make_planner), rows)
    assert list(plan.paused) == [0, 3]
    assert chunks(plan) == [(1, 30, True)] and decodes(plan) == [2]
    assert why == [
        (Reason.PAUSED, False),
        (Reason.CHUNK_FINAL, False),
        (Reason.DECODE, False),
        (Reason.PAUSED, False),
    ]


def test_pause_needs_a_pending_prompt(make_planner, run):
    plan, _ = run(pause_planner(make_planner), [dec(3, 0), dec(0, 1), dec(7, 2)])
    assert list(plan.paused) == [] and decodes(plan) == [1, 0, 2]


def test_pause_h_is_first_prompt_even_if_a_decode_is_better(make_planner, run):
    # h has priority 2; the decoding resident with priority 0 is better and stays active.
    plan, _ = run(pause_planner(make_planner), [dec(0, 0), row(2, 1, 8), dec(3, 2)])
    assert list(plan.paused) == [2] and decodes(plan) == [0]


@pytest.mark.parametrize(("paused_steps", "released"), [(2, False), (3, True), (4, True)])
def test_max_pause_steps_boundary(make_planner, run, paused_steps, released):
    rows = [
        row(0, 0, 20),
        dec(1, 1, paused_steps=paused_steps),
        row(1, 2, 8, paused_steps=paused_steps),
    ]
    plan, why = run(pause_planner(make_planner, max_pause_steps=3), rows)
    if released:
        assert list(plan.paused) == []
        assert why[1:] == [(Reason.DECODE, True), (Reason.CHUNK_FINAL, True)]
    else:
        assert list(plan.paused) == [1, 2]
        assert why[1:] == [(Reason.PAUSED, False), (Reason.PAUSED, False)]


def test_max_pause_steps_zero_pauses_forever(make_planner, run):
    plan, _ = run(pause_planner(make_planner), [row(0, 0, 20), dec(1, 1, paused_steps=2**31 - 1)])
    assert list(plan.paused) == [1]


@pytest.mark.parametrize(
    ("mode", "policy", "preemption"),
    [
        (MIXED, SchedulingPolicy.FCFS, PAUSE),
        (MIXED, PRIORITY, PreemptionMode.NONE),
        (PREFILL_FIRST, PRIORITY, PAUSE),
    ],
)
def test_only_mixed_priority_pause_pauses(make_planner, run, mode, policy, preemption):
    planner = pause_planner(make_planner, mode=mode, policy=policy, preemption=preemption)
    plan, why = run(planner, [dec(1, 0), row(0, 5, 30), row(2, 2, 20)])
    assert list(plan.paused) == []
    assert all(reason != Reason.PAUSED for reason, _ in why)


# --- MIXED budget and cap ------------------------------------------------------------------------


def budget_planner(make_planner, b=4):
    return make_planner(
        b, 64, 16, ifb_scheduling_mode=MIXED, max_num_tokens=52, max_chunk_tokens=32
    )


def test_decode_rows_set_budget_and_cap(make_planner, run):
    plan, _ = run(budget_planner(make_planner), [row(0, 0, 60), dec(0, 1)])
    assert chunks(plan) == [(0, 32, False)]  # cap 32, budget 51


def test_no_decode_rows_use_t_max_and_s_in(make_planner, run):
    plan, _ = run(budget_planner(make_planner), [row(0, 0, 60), row(0, 1, 64)])
    assert chunks(plan) == [(0, 60, True), (1, 64, True)]  # 124 > 52: the budget is T_max


def test_no_decode_rows_use_max_step_tokens_when_smaller(make_planner, run):
    # SPEC §2: T_max = min(B*S_in, max_step_tokens) = 100: A 60 (final), then min(64, 40) -> 32.
    planner = make_planner(
        4,
        64,
        16,
        max_step_tokens=100,
        ifb_scheduling_mode=MIXED,
        max_num_tokens=52,
        max_chunk_tokens=32,
    )
    plan, why = run(planner, [row(0, 0, 60), row(0, 1, 64)])
    assert chunks(plan) == [(0, 60, True), (1, 32, False)]
    assert plan.total_tokens == 92 <= 100
    assert [r for r, _ in why] == [Reason.CHUNK_FINAL, Reason.CHUNK]


def test_prefill_first_budget_is_max_step_tokens(make_planner, run):
    planner = make_planner(4, 64, 16, max_step_tokens=80, ifb_scheduling_mode=PREFILL_FIRST)
    assert planner.policy.max_num_tokens == 80
    plan, _ = run(planner, [row(0, 0, 60), row(0, 1, 64), dec(0, 2)])
    assert chunks(plan) == [(0, 60, True), (1, 16, False)]  # 80 - 60 = 20 -> one page


def test_budget_shrinks_with_each_decode_row(make_planner, run):
    # 3 decode rows: budget 49; first prompt 32 (cap), second min(40, 17) = 17 -> page end 16.
    rows = [row(0, 0, 60), row(0, 1, 40), dec(0, 2), dec(0, 3)]
    planner = make_planner(
        5, 64, 16, ifb_scheduling_mode=MIXED, max_num_tokens=52, max_chunk_tokens=32
    )
    plan, _ = run(planner, rows + [dec(0, 4)])
    assert chunks(plan) == [(0, 32, False), (1, 16, False)]
    assert plan.total_tokens == 51 <= 52


def test_skip_and_continue(make_planner, run):
    # budget 51: A 32, B min(40, 19) -> 16, C min(20, 3) -> 0 (page trim: skipped), D 3 (final)
    rows = [row(0, 0, 60), row(0, 1, 40), row(0, 2, 20), row(0, 3, 3), dec(0, 4)]
    plan, why = run(budget_planner(make_planner, b=5), rows)
    assert chunks(plan) == [(0, 32, False), (1, 16, False), (3, 3, True)]
    assert [r for r, _ in why] == [
        Reason.CHUNK,
        Reason.CHUNK,
        Reason.SKIPPED_PAGE_TRIM,
        Reason.CHUNK_FINAL,
        Reason.DECODE,
    ]


def test_skip_when_budget_is_spent(make_planner, run):
    # budget 51: A 32, B its final 19 -> budget 0, C skipped for budget
    rows = [row(0, 0, 60), row(0, 1, 19), row(0, 2, 4), dec(0, 3)]
    plan, why = run(budget_planner(make_planner), rows)
    assert chunks(plan) == [(0, 32, False), (1, 19, True)]
    assert why[2] == (Reason.SKIPPED_BUDGET, False)


def test_page_trim_with_prefix_reused_committed(make_planner, run):
    # committed 5 (off a page end): min(55, 32) = 32 would end at 37 -> trimmed to end at 32
    plan, _ = run(budget_planner(make_planner), [row(0, 0, 60, committed=5), dec(0, 1)])
    [chunk] = [s for s in plan.sequences if s.work == CONTEXT]
    assert (chunk.past_length, chunk.query_length, chunk.select_last_token_logits) == (5, 27, False)


def test_final_chunk_need_not_end_on_a_page(make_planner, run):
    plan, _ = run(budget_planner(make_planner), [row(0, 0, 37, committed=5), dec(0, 1)])
    assert chunks(plan) == [(0, 32, True)]


def test_input_shorter_than_a_page(make_planner, run):
    # S_in=8 < P=16: every prompt fits one chunk, final, whatever the page size.
    planner = make_planner(4, 8, 16, ifb_scheduling_mode=MIXED)
    plan, _ = run(planner, [row(0, 0, 8, committed=3), row(0, 1, 8), dec(0, 2)])
    assert chunks(plan) == [(0, 5, True), (1, 8, True)]


def test_page_size_one_never_trims(make_planner, run):
    planner = make_planner(
        2, 64, 1, ifb_scheduling_mode=MIXED, max_num_tokens=20, max_chunk_tokens=7
    )
    plan, _ = run(planner, [row(0, 0, 60, committed=3), dec(0, 1)])
    assert chunks(plan) == [(0, 7, False)]


# --- PREFILL_FIRST -------------------------------------------------------------------------------


def test_prefill_first_holds_decodes_while_prompts_pend(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST)
    plan, why = run(planner, [dec(0, 0), row(0, 1, 64), row(0, 2, 50, committed=7)])
    assert chunks(plan) == [(1, 64, True), (2, 43, True)] and decodes(plan) == []
    assert why[0] == (Reason.HELD_PREFILL_FIRST, False)


def test_prefill_first_priority_only_lowest_priority_prompts(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST, scheduling_policy=PRIORITY)
    rows = [row(2, 0, 8), row(-1, 3, 8), dec(-5, 1), row(-1, 2, 8)]
    plan, why = run(planner, rows)
    assert chunks(plan) == [(3, 8, True), (1, 8, True)] and decodes(plan) == []
    assert why[0] == why[2] == (Reason.HELD_PREFILL_FIRST, False)


def test_prefill_first_fcfs_serves_every_prompt(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST)
    plan, _ = run(planner, [row(2, 0, 8), row(-1, 3, 8), row(-1, 2, 8)])
    assert [r for r, _, _ in chunks(plan)] == [0, 2, 1]


def test_prefill_first_decodes_everyone_without_prompts(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST, scheduling_policy=PRIORITY)
    plan, why = run(planner, [dec(3, 0), dec(-1, 1), dec(0, 2)])
    assert decodes(plan) == [1, 2, 0] and plan.total_tokens == 3
    assert {r for r, _ in why} == {Reason.DECODE}


# --- count ---------------------------------------------------------------------------------------


def test_count_takes_the_first_rows_only(make_planner, run):
    planner = make_planner(4, 64, 16, ifb_scheduling_mode=MIXED)
    rows = [dec(0, 1), row(0, 0, 8), row(0, 2, 10**6, committed=-1)]  # row 2 invalid: ignored
    plan, _ = run(planner, rows, count=2)
    assert plan.num_residents == 2
    assert chunks(plan) == [(1, 8, True)] and decodes(plan) == [0]


def test_count_zero_is_an_empty_plan(make_planner, run):
    plan, why = run(make_planner(4, 64, 16), [dec(0, 0)], count=0)
    assert len(plan.sequences) == 0 and plan.total_tokens == 0 and why == []


def test_empty_ledger(make_planner, core):
    plan = make_planner(4, 64, 16).plan([])
    assert plan.to_dict()["sequences"] == [] and plan.num_residents == 0
    empty = as_resident_array([])
    assert make_planner(4, 64, 16).plan(empty).num_residents == 0


def test_reasons_beyond_count_are_untouched(make_planner, core):
    reasons = np.full(4, 0xEE, dtype=np.uint8)
    make_planner(4, 64, 16).plan(as_resident_array([dec(0, 0), dec(0, 1)]), 1, reasons=reasons)
    assert list(reasons) == [Reason.DECODE, 0xEE, 0xEE, 0xEE]


def test_every_reason_code_occurs(make_planner, run):
    """Each Reason value and the RELEASED bit, from the cases above, in one table."""
    seen = set()
    cases = [
        (
            budget_planner(make_planner, b=5),
            [row(0, 0, 60), row(0, 1, 40), row(0, 2, 20), row(0, 3, 3), dec(0, 4)],
        ),
        (budget_planner(make_planner), [row(0, 0, 60), row(0, 1, 19), row(0, 2, 4), dec(0, 3)]),
        (
            pause_planner(make_planner, max_pause_steps=2),
            [row(0, 0, 20), dec(1, 1, paused_steps=2), dec(1, 2)],
        ),
        (make_planner(4, 64, 16, ifb_scheduling_mode=PREFILL_FIRST), [dec(0, 0), row(0, 1, 8)]),
    ]
    for planner, rows in cases:
        _, why = run(planner, rows)
        seen.update(why)
    assert {r for r, _ in seen} == set(Reason)
    assert (Reason.DECODE, True) in seen
    assert REASON_RELEASED_FROM_PAUSE == 0x10
