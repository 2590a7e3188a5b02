"""The ledger against SPEC §6: apply, consecutive_paused_steps, admission, refusal, retire.

Every test runs on the compiled ledger (with the compiled planner) and on the pure-Python twin
(with the reference planner): ``_both`` rebinds this module's ``Ledger`` and ``StepPlanner``.
"""

from __future__ import annotations

import numpy as np
import pytest

import stepplanner
from stepplanner import (
    IfbSchedulingMode,
    PreemptionMode,
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlanner,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner.ledger import Ledger

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16)


@pytest.fixture(autouse=True)
def _both(ledger_impl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "Ledger", ledger_impl.Ledger)
    monkeypatch.setitem(globals(), "StepPlanner", ledger_impl.StepPlanner)


def _policy(**kw: object) -> ResolvedSchedulingPolicy:
    return ResolvedSchedulingPolicy(
        **{"mode": IfbSchedulingMode.MIXED, "max_num_tokens": 52, "max_chunk_tokens": 32, **kw}
    )


def _ledger(rows: list[tuple], policy: ResolvedSchedulingPolicy | None = None) -> Ledger:
    ledger = Ledger(LIMITS, policy or _policy())
    ledger.load(
        [
            dict(
                zip(("priority", "arrival", "prompt_length", "committed", "context_committed"), row)
            )
            for row in rows
        ]
    )
    return ledger


def _state(ledger: Ledger) -> tuple:
    return (
        ledger.residents.copy().tolist(),
        ledger.request_ids.tolist(),
        ledger.waiting,
        ledger.waiting_ids(),
    )


def _oracle_apply(before: np.ndarray, plan: dict) -> np.ndarray:
    """SPEC §6 written out in Python, row by row."""
    after = before.copy()
    for seq in plan["sequences"]:
        i = seq["resident"]
        after[i]["committed"] += seq["query_length"]
        if seq["work"] == "CONTEXT" and seq["select_last_token_logits"]:
            after[i]["context_committed"] = True
    for i in range(len(after)):
        paused = i in plan["paused"]
        after[i]["consecutive_paused_steps"] = (
            before[i]["consecutive_paused_steps"] + 1 if paused else 0
        )
    return after


# --- apply ---------------------------------------------------------------------------------


def test_apply_spec_example_one() -> None:
    ledger = _ledger(
        [(0, 0, 40, 41, True), (0, 1, 60, 0, False), (0, 2, 20, 0, False), (0, 3, 50, 16, False)]
    )
    plan = StepPlanner(_policy(), LIMITS).plan(ledger.residents)
    ledger.apply(plan)
    r = ledger.residents
    assert r["committed"].tolist() == [42, 32, 16, 16]
    assert r["context_committed"].tolist() == [True, False, False, False]
    assert r["consecutive_paused_steps"].tolist() == [0, 0, 0, 0]


def test_apply_spec_example_two_pauses_then_resets() -> None:
    policy = _policy(scheduling_policy=SchedulingPolicy.PRIORITY, preemption=PreemptionMode.PAUSE)
    ledger = _ledger(
        [(1, 0, 40, 41, True), (0, 5, 60, 0, False), (2, 2, 20, 0, False), (1, 3, 50, 50, True)],
        policy,
    )
    planner = StepPlanner(policy, LIMITS)
    ledger.apply(planner.plan(ledger.residents))
    r = ledger.residents
    assert r["consecutive_paused_steps"].tolist() == [1, 0, 1, 1]
    assert r["committed"][1] == 60 and r["context_committed"][1]
    # Resident 2 (priority 2) is now the first pending prompt: nobody is worse, all reset.
    ledger.apply(planner.plan(ledger.residents))
    assert ledger.residents["consecutive_paused_steps"].tolist() == [0, 0, 0, 0]


def _long_pause_ledger(max_pause_steps: int) -> tuple[Ledger, StepPlanner]:
    # A priority-0 decode keeps decode rows in every step, so the 64-token priority-0 prompt
    # goes in 16-token chunks over four steps while the priority-1 decode waits.
    policy = _policy(
        scheduling_policy=SchedulingPolicy.PRIORITY,
        preemption=PreemptionMode.PAUSE,
        max_chunk_tokens=16,
        max_pause_steps=max_pause_steps,
    )
    ledger = _ledger([(0, 0, 8, 8, True), (1, 1, 8, 8, True), (0, 2, 64, 0, False)], policy)
    return ledger, StepPlanner(policy, LIMITS)


def test_consecutive_paused_steps_count_every_step_and_reset_when_planned() -> None:
    ledger, planner = _long_pause_ledger(max_pause_steps=0)
    seen = []
    for _ in range(5):
        ledger.apply(planner.plan(ledger.residents))
        seen.append(int(ledger.residents["consecutive_paused_steps"][1]))
    assert seen == [1, 2, 3, 4, 0]
    assert ledger.residents["context_committed"][2]


def test_max_pause_steps_releases_then_counting_restarts() -> None:
    ledger, planner = _long_pause_ledger(max_pause_steps=2)
    seen = []
    for _ in range(4):
        plan = planner.plan(ledger.residents)
        planned = {s.resident for s in plan.sequences}
        ledger.apply(plan)
        seen.append((int(ledger.residents["consecutive_paused_steps"][1]), 1 in planned))
    assert seen == [(1, False), (2, False), (0, True), (1, False)]


def test_apply_matches_the_spec_oracle_over_a_random_run() -> None:
    limits = StepPlannerLimits(max_batch_size=16, max_input_length=128, kv_page_size=16)
    policy = resolve_scheduling_policy(
        SchedulingOptions(
            scheduling_policy=SchedulingPolicy.PRIORITY,
            preemption=PreemptionMode.PAUSE,
            max_pause_steps=3,
            max_num_tokens=96,
            max_chunk_tokens=32,
        ),
        limits,
    )
    ledger, planner = Ledger(limits, policy), StepPlanner(policy, limits)
    rng = np.random.default_rng(1)
    next_id = 0
    for _ in range(300):
        for _ in range(rng.poisson(0.8)):
            ledger.submit(next_id, int(rng.integers(1, 129)), int(rng.integers(-1, 3)))
            next_id += 1
        ledger.admit()
        if not ledger.count:
            continue
        before = ledger.residents.copy()
        plan = planner.plan(ledger.residents)
        expected = _oracle_apply(before, plan.to_dict())
        ledger.apply(plan)
        assert ledger.residents.tolist() == expected.tolist()
        done = np.flatnonzero(ledger.residents["committed"] > ledger.residents["prompt_length"] + 5)
        ledger.retire_rows(done)
    assert next_id > 150


def test_residents_is_the_zero_copy_view_the_planner_reads() -> None:
    ledger = _ledger([(0, 0, 40, 0, False)])
    view = ledger.residents
    assert view.dtype == stepplanner.RESIDENT_DTYPE and view.flags.writeable
    view["committed"][0] = 8
    assert ledger.to_records()[0]["committed"] == 8
    assert StepPlanner(_policy(), LIMITS).plan(ledger.residents).sequences[0].past_length == 8


# --- admission -----------------------------------------------------------------------------


def test_arrival_stamps_are_monotonic_and_unique() -> None:
    ledger = Ledger(LIMITS)
    stamps = [ledger.submit(i, 10) for i in range(6)]
    assert stamps == sorted(set(stamps)) and stamps == list(range(6))
    ledger.admit()
    assert ledger.residents["arrival"].tolist() == [0, 1, 2, 3]


def test_priority_queue_admits_in_priority_then_arrival_order() -> None:
    ledger = Ledger(LIMITS, _policy(scheduling_policy=SchedulingPolicy.PRIORITY))
    for rid, prio in ((10, 2), (11, 0), (12, 1), (13, 0), (14, 0)):
        ledger.submit(rid, 10, prio)
    assert ledger.admit() == [11, 13, 14, 12]
    assert ledger.waiting_ids() == [10]


def test_fcfs_queue_admits_in_arrival_order_whatever_the_priority() -> None:
    ledger = Ledger(LIMITS)
    for rid, prio in ((10, 2), (11, 0), (12, 1)):
        ledger.submit(rid, 10, prio)
    assert ledger.admit() == [10, 11, 12]


def test_reserved_slots_hold_back_priority_zero_and_up() -> None:
    ledger = Ledger(
        LIMITS, _policy(scheduling_policy=SchedulingPolicy.PRIORITY, priority_reserved_slots=2)
    )
    for rid in range(4):
        ledger.submit(rid, 10, 0)
    assert ledger.admit() == [0, 1]  # admitted only while more than 2 slots are free
    assert ledger.free_slots == 2 and ledger.waiting == 2
    ledger.submit(99, 10, -1)
    assert ledger.admit() == [99]  # an urgent request may use a reserved slot
    ledger.submit(100, 10, -5)
    assert ledger.admit() == [100]
    assert ledger.free_slots == 0 and ledger.waiting == 2


def test_fcfs_urgent_request_passes_a_head_held_by_the_reservation() -> None:
    ledger = Ledger(LIMITS, _policy(priority_reserved_slots=3))
    ledger.submit(1, 10, 0)
    ledger.submit(2, 10, 0)
    ledger.submit(3, 10, -1)
    assert ledger.admit() == [1, 3]
    assert ledger.waiting_ids() == [2]


def test_prompt_longer_than_s_in_is_refused_at_submission() -> None:
    ledger = Ledger(LIMITS)
    with pytest.raises(ValueError, match=r"prompt_length=65 exceeds max_input_length=64.*refused"):
        ledger.submit(1, 65)
    assert ledger.waiting == 0
    assert ledger.submit(1, 64) == 0  # the id was not consumed, nor was a stamp
    ledger.admit()
    assert ledger.residents["prompt_length"].tolist() == [64]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((1, 0), ValueError, "prompt_length=0"),
        ((1, "10"), TypeError, "prompt_length must be an integer"),
        (("a", 10), TypeError, "request_id must be an integer"),
        ((1, 10, 2**31), OverflowError, "priority"),
        ((7, 10), ValueError, "request_id=7 is already waiting"),
    ],
)
def test_bad_submissions_leave_the_queue_unchanged(args: tuple, error: type, match: str) -> None:
    ledger = Ledger(LIMITS)
    ledger.submit(7, 10)
    before = _state(ledger)
    with pytest.raises(error, match=match):
        ledger.submit(*args)
    assert _state(ledger) == before
    assert ledger.submit(8, 10) == 1  # no stamp was spent on the failure


# --- retire --------------------------------------------------------------------------------


def _full_ledger() -> Ledger:
    ledger = Ledger(LIMITS)
    for rid, length in ((100, 11), (101, 12), (102, 13), (103, 14)):
        ledger.submit(rid, length)
    ledger.admit()
    return ledger


def _by_id(ledger: Ledger) -> dict[int, int]:
    return dict(zip(ledger.request_ids.tolist(), ledger.residents["prompt_length"].tolist()))


@pytest.mark.parametrize("gone", [[101], [103], [100, 103], [101, 102], [100, 101, 102, 103]])
def test_retire_keeps_rows_dense_and_each_row_with_its_request(gone: list[int]) -> None:
    ledger = _full_ledger()
    ledger.retire(gone)
    assert ledger.count == 4 - len(gone)
    expected = {rid: 11 + rid - 100 for rid in range(100, 104) if rid not in gone}
    assert _by_id(ledger) == expected
    assert ledger.residents.shape == (ledger.count,)
    ledger.submit(gone[0], 20)  # a retired id may come back
    ledger.admit()
    assert ledger.count == 5 - len(gone)


def test_retire_is_a_swap_remove() -> None:
    ledger = _full_ledger()
    ledger.retire([100])
    assert ledger.request_ids.tolist() == [103, 101, 102]


@pytest.mark.parametrize(
    ("call", "args", "match"),
    [
        ("retire", ([100, 555],), "request_id=555 is not resident"),
        ("retire", ([101, 101],), "repeat"),
        ("retire_rows", ([1, 4],), "row 4 is out of range"),
        ("retire_rows", ([-1],), "row -1 is out of range"),
        ("retire_rows", ([2, 2],), "repeat a row"),
        ("retire_rows", ([[0, 1], [2]],), r"rows=\[\[0, 1\], \[2\]\] is not a flat sequence"),
    ],
)
def test_bad_retire_leaves_the_ledger_unchanged(call: str, args: tuple, match: str) -> None:
    ledger = _full_ledger()
    before = _state(ledger)
    with pytest.raises(ValueError, match=match):
        getattr(ledger, call)(*args)
    assert _state(ledger) == before


def test_apply_rejects_a_plan_of_another_count_and_changes_nothing() -> None:
    ledger = _full_ledger()
    planner = StepPlanner(_policy(), LIMITS)
    plan = planner.plan(ledger.residents[:3])
    before = _state(ledger)
    with pytest.raises(ValueError, match="plan was made over 3 residents.*count=4"):
        ledger.apply(plan)
    with pytest.raises(TypeError, match="plan must be a StepPlan"):
        ledger.apply(object())
    assert _state(ledger) == before


def test_apply_overflow_changes_nothing() -> None:
    ledger = _ledger([(0, 0, 40, 2**31 - 1, True), (0, 1, 40, 0, False)])
    plan = StepPlanner(_policy(), LIMITS).plan(ledger.residents)
    before = _state(ledger)
    with pytest.raises(OverflowError, match="committed"):
        ledger.apply(plan)
    assert _state(ledger) == before


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (3, "committed"),
        (3, "consecutive_paused_steps"),  # a row the plan leaves out
        (0, "consecutive_paused_steps"),  # a planned (decode) row
    ],
)
def test_apply_refuses_a_negative_field_written_after_planning(row: int, field: str) -> None:
    # One decode row leaves a prefill budget of 51: chunks of 32 and 16, and row 3 is skipped.
    ledger = _ledger(
        [(0, 0, 40, 40, True), (0, 1, 40, 0, False), (0, 2, 40, 0, False), (0, 3, 40, 0, False)]
    )
    plan = StepPlanner(_policy(), LIMITS).plan(ledger.residents)
    assert 3 not in plan.as_array()["resident"].tolist()
    ledger.residents[field][row] = -1
    before = _state(ledger)
    with pytest.raises(ValueError, match=rf"residents\[{row}\]\.{field}=-1 is negative"):
        ledger.apply(plan)
    assert _state(ledger) == before


@pytest.mark.parametrize(
    ("records", "error", "match"),
    [
        (
            [{"priority": 0, "arrival": 1}, {"arrival": 1}],
            ValueError,
            "two residents have the same arrival",
        ),
        ([{"bogus": 1}], ValueError, r"unknown field\(s\) \['bogus'\]"),
        ([{"committed": "x"}], TypeError, r"residents\[0\]\.committed must be an integer"),
        ([{}] * 5, ValueError, "5 residents exceed max_batch_size=4"),
        (["row"], TypeError, r"residents\[0\] must be an object"),
        ([{"request_id": None}], TypeError, r"residents\[0\]\.request_id must be an integer"),
        (
            [{}, {"request_id": 2**63}],
            OverflowError,
            r"residents\[1\]\.request_id=\d+ does not fit",
        ),
        (
            [{"request_id": 7}, {"request_id": 7, "arrival": 9}],
            ValueError,
            "two residents have the same request_id",
        ),
    ],
)
def test_bad_load_leaves_the_ledger_unchanged(records: list, error: type, match: str) -> None:
    ledger = _full_ledger()
    before = _state(ledger)
    with pytest.raises(error, match=match):
        ledger.load(records)
    assert _state(ledger) == before


def test_load_continues_arrival_stamps_after_the_largest() -> None:
    ledger = Ledger(LIMITS)
    ledger.load([{"arrival": 41, "prompt_length": 5}])
    assert ledger.submit(9, 5) == 42
    assert ledger.to_records()[0]["request_id"] == 0


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="limits must be a StepPlannerLimits"):
        Ledger("B=4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="policy must be a ResolvedSchedulingPolicy"):
        Ledger(LIMITS, SchedulingOptions())  # type: ignore[arg-type]
