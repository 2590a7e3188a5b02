"""Differential tests: the compiled core must agree with the reference on every input.

Agreement means the same plan (``to_dict()``), the same reasons and the same resident count, or
the same exception ``(type, message)``. Inputs come from ``stepplanner.testing``; invalid ledgers
are valid ones with one or two fields broken. Together these tests run well over 2,000 examples
per default run (each example plans several times).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplanner import StepPlannerError, StepPlannerLimits
from stepplanner.testing import (
    PlanningCase,
    as_resident_array,
    as_resident_states,
    planning_cases,
)

BASE = settings().max_examples  # the active profile's count; parity runs a multiple of it
PARITY = settings(max_examples=8 * BASE)
INVALID = settings(max_examples=4 * BASE)
OTHER_ERRORS = settings(max_examples=2 * BASE)
SEQUENCES = settings(max_examples=3 * BASE)
INPUT_KINDS = settings(max_examples=2 * BASE)


def outcome(planner: Any, residents: Any, count: Any = None) -> tuple[Any, ...]:
    reasons = np.full(max(len(residents), 1), 0xEE, dtype=np.uint8)
    try:
        plan = planner.plan(residents, count, reasons=reasons)
    except Exception as exc:  # noqa: BLE001 - the exception itself is the result compared
        return ("raised", type(exc), str(exc))
    return ("planned", plan.to_dict(), plan.num_residents, reasons.tolist())


def both_inputs(core: Any, rows: list[Any]) -> dict[str, Any]:
    return {"list": as_resident_states(rows, core.ResidentState), "array": as_resident_array(rows)}


def assert_same(
    case: PlanningCase, compiled: Any, reference: Any, rows: list[Any], count: Any = None
) -> tuple[Any, ...]:
    want = None
    for core in (reference, compiled):
        planner = core.StepPlanner(case.policy, case.limits)
        for kind, residents in both_inputs(core, rows).items():
            got = outcome(planner, residents, count)
            if want is None:
                want = got
            assert got == want, f"{core.IMPLEMENTATION} on {kind} input differs\n{case}"
    return want


@PARITY
@given(planning_cases())
def test_valid_ledgers(compiled, reference, case):
    result = assert_same(case, compiled, reference, case.rows)
    assert result[0] == "planned", result


# --- invalid ledgers ------------------------------------------------------------------------------


@st.composite
def broken_rows(draw: Any, case: PlanningCase) -> list[Any]:
    """The case's rows with one or two fields broken the ways §3's validation names."""
    rows = [list(r) for r in case.rows]
    s_in = case.limits.max_input_length
    for _ in range(draw(st.integers(1, 2))):
        r = rows[draw(st.integers(0, len(rows) - 1))]
        how = draw(
            st.sampled_from(("committed", "prompt_length", "paused", "exhausted", "too_long"))
        )
        if how == "committed":
            r[3] = draw(st.integers(-(2**31), -1))
        elif how == "prompt_length":
            r[2] = draw(st.integers(-(2**31), -1))
        elif how == "paused":
            r[5] = draw(st.integers(-(2**31), -1))
        elif how == "exhausted":
            r[4] = False
            r[3] = draw(st.integers(max(r[2], 0), 2**31 - 1))
        else:
            r[4] = False
            r[2] = draw(st.integers(s_in + 1, 2**31 - 1))
            r[3] = draw(st.integers(0, r[2] - 1))
    return [tuple(r) for r in rows]


@INVALID
@given(st.data())
def test_invalid_ledgers(compiled, reference, data):
    case = data.draw(planning_cases().filter(lambda c: c.rows))
    rows = data.draw(broken_rows(case))
    result = assert_same(case, compiled, reference, rows)
    assert result[0] == "raised" and issubclass(result[1], ValueError), result
    assert issubclass(result[1], StepPlannerError), result


@OTHER_ERRORS
@given(st.data())
def test_invalid_counts(compiled, reference, data):
    case = data.draw(planning_cases())
    b, n = case.limits.max_batch_size, len(case.rows)
    count = data.draw(
        st.one_of(
            st.integers(-3, b + 3),
            st.sampled_from([-(2**40), 2**40, n + 1]),
            st.sampled_from([1.0, "1", np.int32(1), True]),
        )
    )
    assert_same(case, compiled, reference, case.rows, count)


@OTHER_ERRORS
@given(st.data())
def test_wrong_element_types(compiled, reference, data):
    case = data.draw(planning_cases().filter(lambda c: c.rows))
    rows = case.rows
    at = data.draw(st.integers(0, len(rows) - 1))
    junk = data.draw(st.sampled_from([None, 0, (0, 0, 1, 0, False, 0), "r"]))
    results = []
    for core in (reference, compiled):
        residents = as_resident_states(rows, core.ResidentState)
        residents[at] = junk
        results.append(outcome(core.StepPlanner(case.policy, case.limits), residents))
    assert results[0] == results[1]
    assert results[0][0] == "raised"


# --- the compiled core against itself: input kinds and call history ------------------------------


@INPUT_KINDS
@given(planning_cases(), st.data())
def test_list_and_array_inputs_agree(compiled, case, data):
    planner = compiled.StepPlanner(case.policy, case.limits)
    count = data.draw(st.integers(0, len(case.rows)))
    inputs = both_inputs(compiled, case.rows)
    assert outcome(planner, inputs["list"], count) == outcome(planner, inputs["array"], count)


@st.composite
def ledger_histories(draw: Any) -> tuple[PlanningCase, list[tuple[list[Any], int | None]]]:
    """A case and a run of ledgers derived from it: shuffled, grown, shrunk, or cut by count."""
    case = draw(planning_cases())
    b = case.limits.max_batch_size
    pool = list(case.rows) + [(0, 1000 + i, 1, 0, False, 0) for i in range(b)]
    rows = list(case.rows)
    history = []
    for _ in range(draw(st.integers(2, 8))):
        step = draw(
            st.sampled_from(
                ("same", "shuffle", "grow", "shrink", "count", "swap_keys", "jump", "retire")
            )
        )
        if step == "shuffle":
            rows = list(draw(st.permutations(rows)))
        elif step == "grow" and len(rows) < b:
            rows = rows + draw(st.lists(st.sampled_from(pool), min_size=1, max_size=b - len(rows)))
        elif step == "shrink" and rows:
            rows = rows[: draw(st.integers(0, len(rows) - 1))]
        elif step == "swap_keys" and len(rows) > 1:
            # same slots, reversed arrivals: the previous order is now the worst guess
            arrivals = [r[1] for r in rows][::-1]
            rows = [r[:1] + (a,) + r[2:] for r, a in zip(rows, arrivals)]
        elif step == "jump" and rows:
            # a few rows re-ranked far up or down (a deadline level changing), the rest kept:
            # the sort's split pass takes them out of the run and merges them back
            rows = list(rows)  # the history keeps the previous list
            for i in draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=4)):
                priority = draw(st.sampled_from((-(2**31), -1, 0, 2**24, 2**31 - 1)))
                rows[i] = (priority,) + rows[i][1:]
        elif step == "retire" and rows:
            # the ledger's swap-remove: the last row moves into a retired row's slot
            i = draw(st.integers(0, len(rows) - 1))
            rows = rows[:-1] if i == len(rows) - 1 else rows[:i] + [rows[-1]] + rows[i + 1 : -1]
        count = draw(st.integers(0, len(rows))) if step == "count" else None
        history.append((rows, count))
    return case, history


@SEQUENCES
@given(ledger_histories())
def test_repeated_calls_never_depend_on_history(compiled, reference, case_history):
    case, history = case_history
    kept = compiled.StepPlanner(case.policy, case.limits)  # reuses the previous call's order
    for rows, count in history:
        for kind in ("list", "array"):
            got = outcome(kept, both_inputs(compiled, rows)[kind], count)
            fresh = outcome(
                reference.StepPlanner(case.policy, case.limits),
                both_inputs(reference, rows)[kind],
                count,
            )
            assert got == fresh, (kind, rows, count)


def test_large_ledger_far_from_previous_order(compiled, reference):
    """B=512 with a reversed order: nearly every row leaves the sort's run and is merge-sorted."""
    from stepplanner import SchedulingOptions, SchedulingPolicy, resolve_scheduling_policy

    limits = StepPlannerLimits(512, 64, 16)
    policy = resolve_scheduling_policy(
        SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY), limits
    )
    rng = np.random.default_rng(7)
    kept = compiled.StepPlanner(policy, limits)
    for trial in range(6):
        n = int(rng.integers(400, 513))
        rows = [
            (
                int(rng.integers(-3, 4)),
                int(rng.integers(0, 2**64, dtype=np.uint64)),
                8,
                8 if d else 3,
                bool(d),
                0,
            )
            for d in rng.integers(0, 2, n)
        ]
        if trial % 2:
            rows = rows[::-1]
        arr = as_resident_array(rows)
        ref = reference.StepPlanner(policy, limits)
        assert outcome(kept, arr) == outcome(ref, arr)


def test_large_ledger_rows_moving_between_levels(compiled, reference):
    """B=512 over 60 calls, each changing the ledger as a deadline ledger's step does: rows
    retired by swap-remove, new rows, and rows moving between priority levels (a few far, or
    a band of them at once). The compiled sort keeps the previous call's order and sorts only
    what moved, at several depths; every plan must equal a fresh reference's."""
    from stepplanner import (
        PreemptionMode,
        SchedulingOptions,
        SchedulingPolicy,
        resolve_scheduling_policy,
    )

    limits = StepPlannerLimits(512, 64, 16)
    policy = resolve_scheduling_policy(
        SchedulingOptions(
            scheduling_policy=SchedulingPolicy.PRIORITY, preemption=PreemptionMode.PAUSE
        ),
        limits,
    )
    rng = np.random.default_rng(11)
    levels = np.array([-1, 0, 2**24, 2 * 2**24, 3 * 2**24])
    stamp = iter(range(10**6))

    def new_row() -> list[int]:
        decoding = bool(rng.integers(0, 2))
        return [int(rng.choice(levels)), next(stamp), 8, 8 if decoding else 3, decoding, 0]

    rows = [new_row() for _ in range(500)]
    kept = compiled.StepPlanner(policy, limits)
    for call in range(60):
        for _ in range(int(rng.integers(0, 6))):  # swap-remove retirements
            i = int(rng.integers(0, len(rows)))
            rows[i] = rows[-1]
            rows.pop()
        while len(rows) < 512 and rng.random() < 0.8:
            rows.append(new_row())
        moving = rng.random(len(rows)) < (0.3 if call % 5 == 0 else 0.02)
        for i in np.flatnonzero(moving):
            rows[i][0] = int(rng.choice(levels))
        # and one of the first rows in order: the run's first keys are the merge's edge
        front = sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1], i))[:3]
        rows[front[int(rng.integers(0, 3))]][0] = int(rng.choice(levels))
        arr = as_resident_array([tuple(r) for r in rows])
        assert outcome(kept, arr) == outcome(reference.StepPlanner(policy, limits), arr), call
