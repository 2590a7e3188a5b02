"""The StepPlan object: one per planner, overwritten per call, copies, array views, apply_to
(SPEC §6), and the compiled core's promise that plan() allocates nothing in steady state."""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepplanner import (
    SEQUENCE_DTYPE,
    IfbSchedulingMode,
    PreemptionMode,
    SchedulingPolicy,
    SequenceWork,
)
from stepplanner.testing import as_resident_array, as_resident_states, planning_cases

INT32_MAX = 2**31 - 1
FIRST = [
    (0, 0, 40, 41, True, 0),
    (0, 1, 60, 0, False, 0),
    (0, 2, 20, 0, False, 0),
    (0, 3, 50, 16, False, 0),
]
SECOND = [(0, 0, 8, 0, False, 0), (0, 1, 5, 5, True, 0)]
PAUSING = dict(
    ifb_scheduling_mode=IfbSchedulingMode.MIXED,
    scheduling_policy=SchedulingPolicy.PRIORITY,
    preemption=PreemptionMode.PAUSE,
)


@pytest.fixture
def planner(make_planner):
    return make_planner(
        4,
        64,
        16,
        ifb_scheduling_mode=IfbSchedulingMode.MIXED,
        max_num_tokens=52,
        max_chunk_tokens=32,
    )


def states(core, rows):
    return as_resident_states(rows, core.ResidentState)


def test_one_plan_object_per_planner(core, planner, make_planner):
    first = planner.plan(states(core, FIRST))
    assert planner.plan(as_resident_array(SECOND)) is first
    assert make_planner(4, 64, 16).plan([]) is not first
    assert isinstance(first, core.StepPlan)


def test_next_call_overwrites_the_plan_and_its_views(core, planner):
    plan = planner.plan(states(core, FIRST))
    sequences, paused = plan.sequences, plan.paused
    assert len(sequences) == 3
    planner.plan(states(core, SECOND))
    assert plan.num_residents == 2 and plan.total_tokens == 9
    assert (
        list(sequences)
        == list(plan.sequences)
        == [(0, SequenceWork.CONTEXT, 0, 8, True), (1, SequenceWork.DECODE, 5, 1, True)]
    )
    assert list(paused) == []


def test_copy_and_to_dict_are_independent(core, planner):
    plan = planner.plan(states(core, FIRST))
    kept, as_dict = plan.copy(), plan.to_dict()
    assert kept == plan and kept is not plan and kept.to_dict() == as_dict
    planner.plan(states(core, SECOND))
    assert kept.to_dict() == as_dict != plan.to_dict()
    assert kept.num_residents == 4 and kept != plan
    assert kept.copy() == kept


def test_sequence_views_behave_as_sequences(core, planner):
    plan = planner.plan(states(core, FIRST))
    seqs = plan.sequences
    assert seqs[-1] == seqs[2] and seqs[0:2] == list(seqs)[:2]
    assert seqs == list(seqs) and plan.paused == []
    with pytest.raises(IndexError):
        seqs[3]


def test_as_array_equals_the_sequences(core, planner):
    plan = planner.plan(states(core, FIRST))
    arr = plan.as_array()
    assert arr.dtype == SEQUENCE_DTYPE
    assert [tuple(r) for r in arr.tolist()] == [tuple(s) for s in plan.sequences]
    paused_plan = planner.plan(states(core, FIRST))  # nothing paused under FCFS
    assert paused_plan.paused_array().dtype == np.int32 and len(paused_plan.paused_array()) == 0


def test_array_views_are_read_only(core, planner):
    """Both implementations: a caller must not be able to write into a plan's rows. (The
    compiled core returns read-only views of its buffers; the reference must refuse too, or
    code written against it breaks on the core.)"""
    plan = planner.plan(states(core, FIRST))
    for arr in (plan.as_array(), plan.paused_array()):
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[...] = 0


def test_paused_array_equals_paused(core, make_planner):
    planner = make_planner(4, 64, 16, **PAUSING)
    rows = [
        (1, 0, 40, 41, True, 0),
        (0, 5, 60, 0, False, 0),
        (2, 2, 20, 0, False, 0),
        (1, 3, 50, 50, True, 0),
    ]
    plan = planner.plan(as_resident_array(rows))
    assert plan.paused_array().tolist() == list(plan.paused) == [0, 2, 3]


# --- apply_to (SPEC §6) ---------------------------------------------------------------------------


def expected_after(rows, plan):
    """SPEC §6 computed from the plan's rows, independently of apply_to."""
    out = [list(r) for r in rows]
    for s in plan.sequences:
        out[s.resident][3] += s.query_length
        if s.work == SequenceWork.CONTEXT and s.select_last_token_logits:
            out[s.resident][4] = True
    for i in range(plan.num_residents):
        out[i][5] = out[i][5] + 1 if i in list(plan.paused) else 0
    return [tuple(r) for r in out]


def as_rows(residents):
    if isinstance(residents, np.ndarray):
        return [tuple(r) for r in residents.tolist()]
    return [r._astuple() for r in residents]


@given(planning_cases(), st.booleans(), st.data())
def test_apply_to_follows_spec_6(core, case, as_array, data):
    rows = [r[:3] + (min(r[3], 2**30),) + r[4:5] + (min(r[5], 2**30),) for r in case.rows]
    count = data.draw(st.integers(0, len(rows)))
    residents = as_resident_array(rows) if as_array else states(core, rows)
    plan = core.StepPlanner(case.policy, case.limits).plan(residents, count)
    plan.apply_to(residents)
    assert as_rows(residents) == expected_after(rows, plan)  # rows >= count untouched too


def test_apply_to_example(core, planner):
    residents = states(core, FIRST)
    planner.plan(residents).apply_to(residents)
    assert as_rows(residents) == [
        (0, 0, 40, 42, True, 0),
        (0, 1, 60, 32, False, 0),
        (0, 2, 20, 16, False, 0),
        (0, 3, 50, 16, False, 0),
    ]


def test_apply_to_counts_pauses(core, make_planner):
    planner = make_planner(4, 64, 16, **PAUSING)
    rows = [(1, 0, 4, 4, True, 7), (0, 1, 60, 0, False, 3), (2, 2, 20, 0, False, 0)]
    arr = as_resident_array(rows)
    planner.plan(arr).apply_to(arr)
    assert arr["consecutive_paused_steps"].tolist() == [8, 0, 1]
    assert arr["context_committed"].tolist() == [True, True, False]


@pytest.mark.parametrize("kind", ["list", "array"])
@pytest.mark.parametrize("overflow", ["committed", "consecutive_paused_steps"])
def test_apply_to_is_all_or_nothing(core, make_planner, kind, overflow):
    planner = make_planner(4, 64, 16, **PAUSING)
    rows = [(0, 0, 8, 0, False, 5), (0, 1, 3, 3, True, 4), (1, 2, 3, 3, True, 0)]
    if overflow == "committed":
        rows[1] = (0, 1, 3, INT32_MAX, True, 4)
        fragments = ("residents[1].committed=2147483647 + 1", "int32")
    else:
        rows[2] = (1, 2, 3, 3, True, INT32_MAX)
        fragments = ("residents[2].consecutive_paused_steps=2147483647 + 1", "int32")
    residents = as_resident_array(rows) if kind == "array" else states(core, rows)
    plan = planner.plan(residents)
    with pytest.raises(OverflowError) as info:
        plan.apply_to(residents)
    assert all(f in str(info.value) for f in fragments), str(info.value)
    assert as_rows(residents) == rows


def test_apply_to_rejects_bad_targets(core, planner):
    rows = FIRST
    plan = planner.plan(as_resident_array(rows))
    frozen = as_resident_array(rows)
    frozen.flags.writeable = False
    cases = [
        (frozen, ValueError, "read-only"),
        (as_resident_array(rows[:3]), ValueError, "len(residents)=3"),
        (states(core, rows)[:2], ValueError, "len(residents)=2"),
        (np.zeros(4, dtype=np.float64), TypeError, "dtype"),
        ("rows", TypeError, "residents must be"),
        ([None] * 4, TypeError, "residents[0] must be a ResidentState"),
    ]
    for target, exc, fragment in cases:
        with pytest.raises(
            exc, match=fragment.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
        ):
            plan.apply_to(target)


# --- allocation ---------------------------------------------------------------------------------


def _net_allocation(core, make_planner, kind, calls=1000):
    planner = make_planner(8, 64, 16, **PAUSING)
    rows = [(i % 3, i, 40, 5 if i % 2 else 41, i % 2 == 0, i % 2) for i in range(8)]
    residents = as_resident_array(rows) if kind == "array" else states(core, rows)
    reasons = np.zeros(8, dtype=np.uint8)
    drafts = [3 if r[4] else 0 for r in rows]
    draft_array = np.array(drafts, dtype=np.int32)
    plan = planner.plan

    def run(n):
        for _ in itertools.repeat(None, n):
            plan(residents)
            plan(residents, 8)
            plan(residents, None, reasons)
            plan(residents, drafts=drafts)
            plan(residents, None, reasons, draft_array)

    tracemalloc.start()
    try:
        run(200)  # warm up inside the trace: first-call caches are not per-call cost
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        run(calls // 3 + 1)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return current - before, peak - before


@pytest.mark.parametrize("kind", ["list", "array"])
def test_compiled_plan_allocates_nothing(compiled, reference, kind):
    from stepplanner import SchedulingOptions, StepPlannerLimits, resolve_scheduling_policy

    def make(core):
        def build(b, s_in, p, **options):
            lim = StepPlannerLimits(b, s_in, p)
            return core.StepPlanner(
                resolve_scheduling_policy(SchedulingOptions(**options), lim), lim
            )

        return build

    net, peak = _net_allocation(compiled, make(compiled), kind)
    ref_net, ref_peak = _net_allocation(reference, make(reference), kind)
    print(
        f"{kind}: compiled net {net} B (peak {peak} B); reference net {ref_net} B "
        f"(peak {ref_peak} B) over 1,000 calls"
    )
    assert net == 0
    # The measurement can see allocations: the reference makes lists and tuples per call.
    assert ref_peak > 1000 and ref_peak > 10 * max(peak, 1)
