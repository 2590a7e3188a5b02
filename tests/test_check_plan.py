"""``check_plan`` passes real plans and catches each broken guarantee in a hand-corrupted one."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given

from stepplanner import (
    IfbSchedulingMode,
    PlannedSequence,
    PreemptionMode,
    ResolvedSchedulingPolicy,
    SchedulingPolicy,
    SequenceWork,
    StepPlannerLimits,
)
from stepplanner.planner.checks import PlanInvariantError, check_plan
from stepplanner.testing import as_resident_array, as_resident_states, planning_cases

C, D = SequenceWork.CONTEXT, SequenceWork.DECODE
LIMITS = StepPlannerLimits(4, 64, 16)
MIXED_FCFS = ResolvedSchedulingPolicy(IfbSchedulingMode.MIXED, 52, 32)
PAUSING = ResolvedSchedulingPolicy(
    IfbSchedulingMode.MIXED, 52, 32, SchedulingPolicy.PRIORITY, PreemptionMode.PAUSE, 0, 2
)
PREFILL_FIRST = ResolvedSchedulingPolicy(
    IfbSchedulingMode.PREFILL_FIRST, 256, 64, SchedulingPolicy.PRIORITY
)
# SPEC §5's first ledger, and its plan
ROWS = [
    (0, 0, 40, 41, True, 0),
    (0, 1, 60, 0, False, 0),
    (0, 2, 20, 0, False, 0),
    (0, 3, 50, 16, False, 0),
]
PLAN = [(1, C, 0, 32, False), (2, C, 0, 16, False), (0, D, 41, 1, True)]
# SPEC §5's second ledger (with consecutive_paused_steps), and its plan
PAUSE_ROWS = [
    (1, 0, 40, 41, True, 1),
    (0, 5, 60, 0, False, 0),
    (2, 2, 20, 0, False, 0),
    (1, 3, 50, 50, True, 0),
]
PAUSE_PLAN = [(1, C, 0, 60, True)]


@dataclasses.dataclass
class FakePlan:
    """Only the attributes ``check_plan`` reads; totals are consistent unless overridden."""

    sequences: list
    paused: list
    num_residents: int
    num_prefill: int = 0
    num_decode: int = 0
    prefill_tokens: int = 0
    total_tokens: int = 0


def fake(seqs, paused=(), n=4, **totals):
    rows = [PlannedSequence(r, SequenceWork(w), past, q, sel) for r, w, past, q, sel in seqs]
    chunks = [s.query_length for s in rows if s.work == C]
    plan = FakePlan(
        rows,
        list(paused),
        n,
        len(chunks),
        len(rows) - len(chunks),
        sum(chunks),
        sum(s.query_length for s in rows),
    )
    return dataclasses.replace(plan, **totals)


def rejects(plan, *fragments, policy=MIXED_FCFS, rows=ROWS):
    with pytest.raises(PlanInvariantError) as info:
        check_plan(policy, LIMITS, rows, plan)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_is_an_assertion_error():
    assert issubclass(PlanInvariantError, AssertionError)


def test_accepts_the_worked_examples_in_every_input_form(core):
    for policy, rows, seqs, paused in [
        (MIXED_FCFS, ROWS, PLAN, []),
        (PAUSING, PAUSE_ROWS, PAUSE_PLAN, [0, 2, 3]),
    ]:
        check_plan(policy, LIMITS, rows, fake(seqs, paused))
        for residents in (as_resident_array(rows), as_resident_states(rows, core.ResidentState)):
            real = core.StepPlanner(policy, LIMITS).plan(residents)
            check_plan(policy, LIMITS, residents, real)
            assert real.to_dict()["paused"] == paused


@given(planning_cases())
def test_accepts_every_real_plan(core, case):
    residents = as_resident_states(case.rows, core.ResidentState)
    check_plan(
        case.policy,
        case.limits,
        residents,
        core.StepPlanner(case.policy, case.limits).plan(residents),
    )


# --- one corruption per guarantee -----------------------------------------------------------------


def test_empty_plan_with_residents():
    rejects(fake([]), "names no resident", "4 are resident")


def test_empty_plan_without_residents_is_fine():
    check_plan(MIXED_FCFS, LIMITS, [], fake([], n=0))


def test_resident_index_out_of_range():
    rejects(fake([(1, C, 0, 32, False), (4, D, 0, 1, True)]), "resident=4", "4 residents")


def test_resident_planned_twice():
    rejects(
        fake([(1, C, 0, 32, False), (1, C, 0, 32, False), (0, D, 41, 1, True)]),
        "resident 1",
        "more than once",
    )


def test_paused_and_planned():
    rejects(fake(PLAN, paused=[0]), "resident 0", "both paused and planned")


def test_paused_not_ascending():
    rejects(fake(PAUSE_PLAN, paused=[2, 0, 3]), "not ascending", policy=PAUSING, rows=PAUSE_ROWS)


def test_paused_repeated():
    rejects(
        fake(PAUSE_PLAN, paused=[0, 0, 2, 3]),
        "not ascending and unique",
        policy=PAUSING,
        rows=PAUSE_ROWS,
    )


def test_paused_out_of_range():
    rejects(fake(PAUSE_PLAN, paused=[0, 2, 3, 7]), "paused[3]=7", policy=PAUSING, rows=PAUSE_ROWS)


@pytest.mark.parametrize(
    ("field", "value", "right"),
    [
        ("num_prefill", 3, 2),
        ("num_decode", 0, 1),
        ("prefill_tokens", 47, 48),
        ("total_tokens", 48, 49),
    ],
)
def test_totals(field, value, right):
    rejects(fake(PLAN, **{field: value}), f"plan.{field}={value}", f"give {right}")


def test_budget_max_num_tokens():
    rows = ROWS[:2] + [(0, 2, 60, 0, False, 0)]
    rejects(
        fake([(1, C, 0, 32, False), (2, C, 0, 32, False), (0, D, 41, 1, True)], n=3),
        "total_tokens=65",
        "max_num_tokens=52",
        rows=rows,
    )


def test_chunk_after_decode():
    rejects(
        fake([(1, C, 0, 32, False), (0, D, 41, 1, True), (2, C, 0, 16, False)]),
        "a chunk follows a decode row",
    )


def test_chunks_out_of_order():
    rejects(
        fake([(2, C, 0, 16, False), (1, C, 0, 32, False), (0, D, 41, 1, True)]),
        "not in order",
        "[2, 1]",
    )


def test_decodes_out_of_order():
    rows = [(0, 5, 1, 1, True, 0), (0, 4, 1, 1, True, 0)]
    rejects(fake([(0, D, 1, 1, True), (1, D, 1, 1, True)], n=2), "not in order", rows=rows)


@pytest.mark.parametrize(
    ("chunk", "fragments"),
    [
        ((1, C, 0, 0, False), ("query_length=0", "1..60")),
        ((2, C, 0, 21, True), ("query_length=21", "1..20")),
        ((1, C, 0, 48, False), ("query_length=48", "over the cap 32")),
        ((2, C, 0, 20, False), ("select_last_token_logits=False", "final=True")),
        ((1, C, 0, 16, True), ("select_last_token_logits=True", "final=False")),
        ((1, C, 0, 24, False), ("non-final", "ends at 24", "kv_page_size=16")),
        ((1, C, 3, 32, False), ("past_length=3", "committed=0")),
        ((0, C, 41, 1, True), ("for a decoding resident",)),
    ],
)
def test_bad_chunk(chunk, fragments):
    rejects(fake([chunk, (0, D, 41, 1, True)] if chunk[0] else [chunk]), *fragments)


def test_chunk_over_input_length_without_decodes():
    rows = [(0, 0, 64, 0, False, 0)]
    check_plan(MIXED_FCFS, LIMITS, rows, fake([(0, C, 0, 64, True)], n=1))
    small = StepPlannerLimits(4, 48, 16)
    with pytest.raises(PlanInvariantError, match="query_length=64"):
        check_plan(MIXED_FCFS, small, rows, fake([(0, C, 0, 64, True)], n=1))


@pytest.mark.parametrize(
    ("decode", "fragments"),
    [
        ((0, D, 41, 2, True), ("query_length in 1..1 (1 + its drafts)", "got 2")),
        ((0, D, 41, 1, False), ("select_last_token_logits=True", "False")),
        ((0, D, 40, 1, True), ("past_length=40", "committed=41")),
    ],
)
def test_bad_decode_row(decode, fragments):
    rejects(fake(PLAN[:2] + [decode]), *fragments)


def test_decode_rows_with_drafts():
    """SPEC §8: a row holds at most 1 + its drafts (and S_in), and drafts go in order."""
    rows = [(0, 0, 40, 41, True, 0), (0, 1, 40, 50, True, 0), (0, 2, 40, 60, True, 0)]
    plan = [(0, D, 41, 3, True), (1, D, 50, 2, True), (2, D, 60, 1, True)]
    check_plan(MIXED_FCFS, LIMITS, rows, fake(plan, n=3), drafts=[2, 1, 0])
    with pytest.raises(PlanInvariantError, match=r"query_length in 1\.\.2 \(1 \+ its drafts\)"):
        check_plan(MIXED_FCFS, LIMITS, rows, fake(plan, n=3), drafts=[1, 1, 0])
    with pytest.raises(PlanInvariantError, match="verifies drafts although decode sequences"):
        check_plan(MIXED_FCFS, LIMITS, rows, fake(plan, n=3), drafts=[5, 1, 0])
    capped = [(0, D, 41, 64, True), (1, D, 50, 1, True), (2, D, 60, 1, True)]
    # 1 + min(99, S_in - 1) = 64 passes the row checks; only the budget then refuses it.
    with pytest.raises(PlanInvariantError, match="total_tokens=66 exceeds"):
        check_plan(MIXED_FCFS, LIMITS, rows, fake(capped, n=3), drafts=[99, 0, 0])


def test_decode_row_for_a_prompt():
    rejects(
        fake(PLAN[:1] + [(0, D, 41, 1, True), (2, D, 0, 1, True)]),
        "decode sequences[2] (resident 2)",
        "prompt-incomplete",
    )


def test_first_active_prompt_skipped():
    rejects(fake([(2, C, 0, 16, False), (0, D, 41, 1, True)]), "resident 1", "skipped")


def test_active_decoding_resident_left_out():
    rejects(fake(PLAN[:2]), "decoding resident 0 has no decode row")


def test_paused_outside_mixed_priority_pause():
    rows = PAUSE_ROWS
    rejects(fake(PAUSE_PLAN, paused=[0, 2, 3]), "only MIXED + PRIORITY + PAUSE", rows=rows)


def test_paused_past_max_pause_steps():
    rows = [PAUSE_ROWS[0][:5] + (2,)] + PAUSE_ROWS[1:]  # resident 0 has been paused 2 steps
    rejects(
        fake(PAUSE_PLAN, paused=[0, 2, 3]),
        "resident 0",
        "max_pause_steps=2",
        policy=PAUSING,
        rows=rows,
    )


def test_paused_though_not_worse():
    rows = PAUSE_ROWS[:3] + [(0, 3, 50, 50, True, 0)]  # resident 3 now has h's priority
    rejects(
        fake(PAUSE_PLAN, paused=[0, 2, 3]), "resident 3", "is paused", policy=PAUSING, rows=rows
    )


def test_worse_but_not_paused():
    rejects(
        fake(PAUSE_PLAN, paused=[0, 3]), "resident 2", "not paused", policy=PAUSING, rows=PAUSE_ROWS
    )


def test_prefill_first_decodes_while_prompt_pending():
    rows = [(0, 0, 8, 8, True, 0), (0, 1, 8, 0, False, 0)]
    rejects(
        fake([(1, C, 0, 8, True), (0, D, 8, 1, True)], n=2),
        "PREFILL_FIRST planned decode",
        policy=PREFILL_FIRST,
        rows=rows,
    )


def test_prefill_first_priority_plans_a_worse_prompt():
    rows = [(1, 0, 8, 0, False, 0), (0, 1, 8, 0, False, 0)]
    rejects(
        fake([(1, C, 0, 8, True), (0, C, 0, 8, True)], n=2),
        "resident 0",
        "priority 1",
        policy=PREFILL_FIRST,
        rows=rows,
    )


# --- a skip must be justified (SPEC §3 step 5) --------------------------------------------------


def first_prompt_only(plan):
    """A planted wrong planner: keeps the real plan's first chunk and skips every later prompt."""
    seqs = [s for s in plan.sequences]
    chunks = [s for s in seqs if s.work == C]
    kept = chunks[:1] + [s for s in seqs if s.work == D]
    return fake(
        [
            (s.resident, s.work, s.past_length, s.query_length, bool(s.select_last_token_logits))
            for s in kept
        ],
        paused=list(plan.paused),
        n=plan.num_residents,
    ), len(chunks)


def test_skipping_a_prompt_that_fits_is_caught():
    # SPEC §5's first ledger: resident 2 gets 16 of the 52 - 1 - 32 = 19 tokens left
    rejects(
        fake([PLAN[0], PLAN[2]]),
        "prompt resident 2",
        "was skipped",
        "19 of the prefill",
        "chunk of 16",
    )


def test_skipping_a_later_prompt_that_fits_is_caught():
    # after resident 2's 16 tokens, 3 remain: resident 3 (past 16, 34 left) trims to
    # rd(16 + 3) - 16 = 0, so skipping it is right; so is a 4-token remainder (non-final, trims
    # to 0); a 3-token remainder fits whole, as a final chunk
    check_plan(MIXED_FCFS, LIMITS, ROWS, fake(PLAN))
    rows = ROWS[:3] + [(0, 3, 20, 16, False, 0)]
    check_plan(MIXED_FCFS, LIMITS, rows, fake(PLAN))
    rows = ROWS[:3] + [(0, 3, 19, 16, False, 0)]
    rejects(fake(PLAN), "prompt resident 3", "chunk of 3", rows=rows)


def test_skip_by_page_trim_is_justified():
    # 3 tokens left for a prompt past 17: its chunk would end at rd(17 + 3) = 16 <= 17, nothing;
    # past 14 it ends at rd(14 + 3) = 16, a 2-token chunk that the plan owed it
    rows = [(0, 0, 40, 41, True, 0), (0, 1, 60, 0, False, 0), (0, 2, 60, 17, False, 0)]
    plan = fake([(1, C, 0, 48, False), (0, D, 41, 1, True)], n=3)  # 52 - 1 - 48 = 3 left
    policy = ResolvedSchedulingPolicy(IfbSchedulingMode.MIXED, 52, 48)
    check_plan(policy, LIMITS, rows, plan)
    rows[2] = (0, 2, 60, 14, False, 0)
    with pytest.raises(PlanInvariantError, match="chunk of 2"):
        check_plan(policy, LIMITS, rows, plan)


def test_skip_under_prefill_first_budget_is_checked():
    rows = [(0, 0, 8, 0, False, 0), (0, 1, 8, 0, False, 0)]
    check_plan(PREFILL_FIRST, LIMITS, rows, fake([(0, C, 0, 8, True), (1, C, 0, 8, True)], n=2))
    rejects(
        fake([(0, C, 0, 8, True)], n=2),
        "prompt resident 1",
        "T_max=256",
        policy=PREFILL_FIRST,
        rows=rows,
    )
    # under PRIORITY a worse-priority prompt is not its turn at all: leaving it out is right
    rows = [(0, 0, 8, 0, False, 0), (1, 1, 8, 0, False, 0)]
    check_plan(PREFILL_FIRST, LIMITS, rows, fake([(0, C, 0, 8, True)], n=2))


@given(planning_cases())
def test_first_prompt_only_planner_is_caught(core, case):
    residents = as_resident_states(case.rows, core.ResidentState)
    real = core.StepPlanner(case.policy, case.limits).plan(residents)
    check_plan(case.policy, case.limits, residents, real)
    planted, chunks = first_prompt_only(real)
    if chunks <= 1:
        check_plan(case.policy, case.limits, residents, planted)  # the same plan
        return
    with pytest.raises(PlanInvariantError, match="was skipped"):
        check_plan(case.policy, case.limits, residents, planted)


def test_first_prompt_only_planner_is_caught_on_a_burst(core):
    """Deterministic twin of the property: eight short prompts, room for all of them."""
    limits = StepPlannerLimits(8, 64, 16)
    policy = ResolvedSchedulingPolicy(IfbSchedulingMode.MIXED, 128, 64)
    rows = [(0, k, 10, 0, False, 0) for k in range(8)]
    residents = as_resident_states(rows, core.ResidentState)
    real = core.StepPlanner(policy, limits).plan(residents)
    check_plan(policy, limits, residents, real)
    planted, chunks = first_prompt_only(real)
    assert chunks == 8
    with pytest.raises(PlanInvariantError, match="prompt resident 1 .* was skipped"):
        check_plan(policy, limits, residents, planted)
