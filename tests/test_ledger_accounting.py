"""Output accounting, the bounded queue, cancel and the fused step, on both ledgers; hostile input
to each (a clear error, the ledger unchanged); and the stamp bugs of arrival 2**64 - 1 and of
load() arrivals that collide with waiting requests' stamps.

The compiled ledger runs with the compiled planner, the pure-Python twin with the reference one.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from stepplanner import (
    IfbSchedulingMode,
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner._errors import QueueFullError

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16)
POLICY = resolve_scheduling_policy(SchedulingOptions(), LIMITS)


@pytest.fixture
def make(ledger_impl):
    """(ledger, planner) of one implementation."""

    def build(policy=POLICY, **kw):
        return (ledger_impl.Ledger(LIMITS, policy, **kw), ledger_impl.StepPlanner(policy, LIMITS))

    return build


def _state(ledger) -> tuple:
    return (
        ledger.to_records(),
        ledger.waiting_ids(),
        ledger.waiting,
        ledger.output_tokens.tolist(),
        ledger.finished_ids.tolist(),
    )


# --- output accounting -----------------------------------------------------------------------


def test_max_new_tokens_finishes_after_that_many_tokens(make) -> None:
    ledger, planner = make()
    ledger.submit(1, 20, max_new_tokens=3)  # first token from the final chunk, then 2 decodes
    ledger.submit(2, 20)  # no limit: never finishes by itself
    ledger.admit()
    seen = []
    for _ in range(3):
        plan = planner.plan(ledger.residents)
        seen.append(ledger.apply(plan).tolist())
    assert seen == [[], [], [1]]
    assert ledger.output_tokens.tolist() == [3, 3] and ledger.count == 2
    ledger.retire_finished()
    assert ledger.request_ids.tolist() == [2]
    assert ledger.finished_ids.tolist() == [1]  # still the last apply's answer


def test_sampler_mask_finishes_requests_and_retire_removes_them(make) -> None:
    ledger, planner = make()
    for rid in (10, 11, 12):
        ledger.submit(rid, 16)
    ledger.admit()
    plan = planner.plan(ledger.residents)
    rows = plan.as_array()["resident"].tolist()
    mask = np.array([ledger.request_ids[r] == 11 for r in rows])
    assert ledger.apply(plan, mask, retire=True).tolist() == [11]
    assert sorted(ledger.request_ids.tolist()) == [10, 12]


def test_non_final_chunk_emits_nothing_and_cannot_finish(make) -> None:
    # A decoding resident holds the step to max_num_tokens=52, chunks to 32: the 64-token
    # prompt gets a non-final chunk (row 0) and the decode row (row 1) emits.
    policy = ResolvedSchedulingPolicy(
        mode=IfbSchedulingMode.MIXED, max_num_tokens=52, max_chunk_tokens=32
    )
    ledger, planner = make(policy)
    ledger.load([{"prompt_length": 8, "committed": 9, "context_committed": True, "request_id": 2}])
    ledger.submit(1, 64, max_new_tokens=1)
    ledger.admit()
    plan = planner.plan(ledger.residents)
    assert plan.as_array()["select_last_token_logits"].tolist() == [False, True]
    before = _state(ledger)
    with pytest.raises(ValueError, match=r"finished\[0\] is True but plan row 0 .*emits no token"):
        ledger.apply(plan, np.array([True, False]))
    assert _state(ledger) == before
    assert ledger.apply(plan, np.array([False, True])).tolist() == [2]
    assert ledger.output_tokens.tolist() == [1, 0]


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        ([True], TypeError, "finished must be a 1-D numpy bool array"),
        (np.ones(1, dtype=np.uint8), TypeError, "got an array of dtype uint8"),
        (np.ones(2, dtype=bool), ValueError, r"finished has shape \(2,\); allowed: \(1,\)"),
        (np.ones((1, 1), dtype=bool), ValueError, r"shape \(1, 1\)"),
        ("yes", TypeError, "got str"),
    ],
)
def test_bad_finished_masks_change_nothing(make, mask, error, match) -> None:
    ledger, planner = make()
    ledger.submit(1, 8, max_new_tokens=5)
    ledger.admit()
    plan = planner.plan(ledger.residents)
    before = _state(ledger)
    with pytest.raises(error, match=match):
        ledger.apply(plan, mask)
    assert _state(ledger) == before


def test_nothing_finishes_by_itself(make) -> None:
    ledger, planner = make()
    ledger.submit(1, 8)
    ledger.step(planner)
    for _ in range(50):
        ledger.step(planner)
    assert ledger.finished_ids.size == 0 and ledger.output_tokens.tolist() == [50]


# --- the fused step --------------------------------------------------------------------------


def test_fused_step_applies_retires_admits_and_plans(make) -> None:
    ledger, planner = make()
    for rid in range(6):
        ledger.submit(100 + rid, 8, max_new_tokens=2)
    plan = ledger.step(planner)
    assert ledger.admitted_ids.tolist() == [100, 101, 102, 103] and plan.num_prefill == 4
    plan = ledger.step(planner)  # first tokens
    assert ledger.finished_ids.tolist() == [] and plan.num_decode == 4
    finished = np.zeros(4, dtype=bool)
    plan = ledger.step(planner, finished)  # second tokens: all four finish, two admitted
    assert sorted(ledger.finished_ids.tolist()) == [100, 101, 102, 103]
    assert ledger.admitted_ids.tolist() == [104, 105]
    assert ledger.request_ids.tolist() == [104, 105] and plan.num_prefill == 2


def test_fused_step_refuses_a_mask_with_no_plan_pending(make) -> None:
    ledger, planner = make()
    ledger.submit(1, 8)
    plan = ledger.step(planner)
    ledger.apply(plan)  # applied by hand: nothing is pending any more
    before = _state(ledger)
    with pytest.raises(ValueError, match="no plan of this ledger's step"):
        ledger.step(planner, np.zeros(1, dtype=bool))
    assert _state(ledger) == before


def test_fused_step_checks_its_planner_and_reasons(make, ledger_impl) -> None:
    ledger, planner = make()
    ledger.submit(1, 8)
    other = ledger_impl.StepPlanner(
        resolve_scheduling_policy(SchedulingOptions(), StepPlannerLimits(8, 64, 16)),
        StepPlannerLimits(8, 64, 16),
    )
    with pytest.raises(ValueError, match="planner has limits"):
        ledger.step(other)
    with pytest.raises(ValueError, match=r"reasons must hold a code per slot .*capacity=4"):
        ledger.step(planner, reasons=np.zeros(3, dtype=np.uint8))
    assert ledger.waiting == 1 and ledger.count == 0  # nothing admitted by the refusals
    reasons = np.zeros(4, dtype=np.uint8)
    ledger.step(planner, reasons=reasons)
    assert reasons[0] != 0


def test_compiled_fused_step_allocates_nothing_in_steady_state(compiled) -> None:
    from stepplanner.bench.loop import loop_allocated_bytes

    assert loop_allocated_bytes(64, steps=150) == 0


# --- the queue -------------------------------------------------------------------------------


def test_queue_full_is_refused_with_queue_full_error(make) -> None:
    ledger, _ = make(max_waiting=2)
    ledger.submit(1, 8)
    ledger.submit(2, 8)
    before = _state(ledger)
    with pytest.raises(QueueFullError, match=r"queue is full \(max_waiting=2\): request 3"):
        ledger.submit(3, 8)
    assert isinstance(QueueFullError("x"), RuntimeError)
    assert _state(ledger) == before
    ledger.admit()
    assert ledger.submit(3, 8) == 2  # room again; no stamp was spent on the refusal


def test_default_queue_bound_is_sixteen_per_slot(make) -> None:
    ledger, _ = make()
    assert ledger.max_waiting == 16 * LIMITS.max_batch_size


@pytest.mark.parametrize("bound", [-1, 2**31])
def test_bad_queue_bound_is_refused(ledger_impl, bound) -> None:
    with pytest.raises(ValueError, match=f"max_waiting={bound} is out of range"):
        ledger_impl.Ledger(LIMITS, POLICY, max_waiting=bound)


def test_cancel_a_waiting_request_keeps_the_queue_order(make) -> None:
    policy = resolve_scheduling_policy(
        SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY), LIMITS
    )
    ledger, _ = make(policy)
    for rid, prio in ((1, 2), (2, 0), (3, 1), (4, 0), (5, -1)):
        ledger.submit(rid, 8, prio)
    ledger.cancel(4)
    ledger.cancel(5)
    assert ledger.waiting_ids() == [2, 3, 1] and ledger.waiting == 3
    ledger.submit(4, 8)  # a cancelled id may come back, behind the rest of its class
    assert ledger.admit() == [2, 4, 3, 1]


def test_cancel_a_resident_retires_it(make) -> None:
    ledger, _ = make()
    for rid in (1, 2, 3):
        ledger.submit(rid, 8)
    ledger.admit()
    ledger.cancel(1)
    assert ledger.request_ids.tolist() == [3, 2]
    with pytest.raises(ValueError, match="request_id=1 is not waiting or resident"):
        ledger.cancel(1)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((2**63, 8), OverflowError, r"request_id=9223372036854775808 does not fit int64"),
        ((1.5, 8), TypeError, "request_id must be an integer"),
        ((None, 8), TypeError, "request_id must be an integer"),
        (("req-1", 8), TypeError, "request_id must be an integer"),
        ((7, 8), ValueError, "request_id=7 is already waiting or resident"),
        ((1, 8, 0, 0), ValueError, "max_new_tokens=0 is out of range"),
        ((1, 8, 0, 2**63), OverflowError, "max_new_tokens"),
        ((1, 8, 0, "3"), TypeError, "max_new_tokens must be an integer"),
    ],
)
def test_hostile_submissions_change_nothing(make, args, error, match) -> None:
    ledger, _ = make()
    ledger.submit(7, 8)
    before = _state(ledger)
    with pytest.raises(error, match=match):
        ledger.submit(*args)
    assert _state(ledger) == before


@pytest.mark.parametrize("bad", [2**63, "x", None, 8])
def test_hostile_cancel_changes_nothing(make, bad) -> None:
    ledger, _ = make()
    ledger.submit(7, 8)
    before = _state(ledger)
    with pytest.raises((TypeError, ValueError, OverflowError)):
        ledger.cancel(bad)
    assert _state(ledger) == before


# --- arrival stamps (review finding: raises -> unchanged) ---------------------------------------


def test_no_stamp_is_left_after_a_loaded_arrival_of_2_64_minus_1(make) -> None:
    ledger, _ = make()
    ledger.load([{"arrival": 2**64 - 1, "prompt_length": 8, "request_id": 5}])
    before = _state(ledger)
    with pytest.raises(OverflowError, match="the next arrival stamp would be 2\\*\\*64"):
        ledger.submit(6, 8)
    assert _state(ledger) == before
    assert ledger.admit() == []  # nothing half-submitted waits in the queue
    ledger.retire([5])
    ledger.load([])  # the stamps stay spent: they must never repeat
    with pytest.raises(OverflowError):
        ledger.submit(6, 8)


def test_the_last_stamp_is_handed_out_once(make) -> None:
    ledger, _ = make()
    ledger.load([{"arrival": 2**64 - 3, "prompt_length": 8}])
    assert ledger.submit(1, 8) == 2**64 - 2
    assert ledger.submit(2, 8) == 2**64 - 1
    with pytest.raises(OverflowError):
        ledger.submit(3, 8)
    assert ledger.admit() == [1, 2]
    assert ledger.residents["arrival"].tolist() == [2**64 - 3, 2**64 - 2, 2**64 - 1]


def test_load_refuses_arrivals_that_waiting_requests_hold(make) -> None:
    ledger, _ = make()
    ledger.submit(1, 8)  # stamp 0
    ledger.submit(2, 8)  # stamp 1
    before = _state(ledger)
    with pytest.raises(
        ValueError,
        match=r"residents\[0\]\.arrival=1 is the arrival stamp of "
        r"waiting request 2",
    ):
        ledger.load([{"arrival": 1, "prompt_length": 8, "request_id": 9}])
    assert _state(ledger) == before
    ledger.load([{"arrival": 5, "prompt_length": 8, "request_id": 9}])
    assert ledger.admit() == [1, 2]
    arrivals = ledger.residents["arrival"].tolist()
    assert len(set(arrivals)) == len(arrivals)


def test_compiled_and_twin_agree_over_a_long_random_stream(compiled, reference) -> None:
    from stepplanner.ledger import _ledger as _ledger_core
    from stepplanner.ledger import _ledger_py as _ledger_reference

    policy = resolve_scheduling_policy(
        SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY, priority_reserved_slots=1),
        LIMITS,
    )
    fast = _ledger_core.Ledger(LIMITS, policy, max_waiting=6)
    slow = _ledger_reference.Ledger(LIMITS, policy, max_waiting=6)
    planners = (compiled.StepPlanner(policy, LIMITS), reference.StepPlanner(policy, LIMITS))
    rng = np.random.default_rng(3)
    plans = [None, None]
    for step in range(300):
        for rid in range(step * 3, step * 3 + rng.poisson(1.0)):
            args = (
                rid,
                int(rng.integers(1, 65)),
                int(rng.integers(-1, 3)),
                None if rng.random() < 0.3 else int(rng.integers(1, 6)),
            )
            outcomes = []
            for ledger in (fast, slow):
                try:
                    outcomes.append(ledger.submit(*args))
                except QueueFullError as exc:
                    outcomes.append(str(exc))
            assert outcomes[0] == outcomes[1]
        if rng.random() < 0.1 and fast.waiting:
            victim = fast.waiting_ids()[int(rng.integers(0, fast.waiting))]
            fast.cancel(victim)
            slow.cancel(victim)
        mask = None
        if plans[0] is not None and rng.random() < 0.5:
            mask = (rng.random(len(plans[0].sequences)) < 0.2) & plans[0].as_array()[
                "select_last_token_logits"
            ]
        plans = [ledger.step(p, mask) for ledger, p in zip((fast, slow), planners)]
        assert plans[0].to_dict() == plans[1].to_dict()
        assert _state(fast) == _state(slow)
        assert fast.admitted_ids.tolist() == slow.admitted_ids.tolist()


def test_tracemalloc_is_off_after_the_allocation_probe() -> None:
    assert not tracemalloc.is_tracing()


def test_fused_step_checks_loaded_rows_before_it_admits(make) -> None:
    # Found by the fuzzer: a loaded row the planner refuses (prompt exhausted) must stop step()
    # before it admits anyone.
    ledger, planner = make()
    ledger.load([{"prompt_length": 1, "committed": 10, "request_id": 5}])
    ledger.submit(6, 8)
    before = _state(ledger)
    with pytest.raises(ValueError, match=r"residents\[0\] is prompt-incomplete"):
        ledger.step(planner)
    assert _state(ledger) == before and ledger.count == 1


def test_a_ledger_shared_between_threads_stays_consistent(make) -> None:
    import threading

    ledger, planner = make(max_waiting=4000)
    errors: list[BaseException] = []

    def worker(base: int) -> None:
        try:
            for k in range(300):
                rid = base + k
                ledger.submit(rid, 8, k % 3 - 1, max_new_tokens=2)
                if k % 3 == 0:
                    ledger.cancel(rid)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(10_000 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    waiting = ledger.waiting_ids()
    assert ledger.waiting == len(waiting) == len(set(waiting)) == 4 * 200
    served = 0
    plan = ledger.step(planner)
    while ledger.count or ledger.waiting:
        plan = ledger.step(planner)
        served += len(ledger.finished_ids)
    assert served == 800 and plan.num_residents == 0


def test_compiled_id_views_cannot_be_made_writable(compiled) -> None:
    # The C side owns ids and counts; a view turned writable could desynchronise the id map.
    from stepplanner.ledger._ledger import Ledger

    ledger = Ledger(LIMITS, POLICY)
    ledger.submit(1, 8, max_new_tokens=1)
    ledger.step(compiled.StepPlanner(POLICY, LIMITS))
    for view in (
        ledger.request_ids,
        ledger.output_tokens,
        ledger.finished_ids,
        ledger.admitted_ids,
    ):
        with pytest.raises(ValueError):
            view.flags.writeable = True
    assert ledger.residents.flags.writeable  # the rows are the runtime's to read and write
    ledger.load(ledger.to_records())
    assert ledger.request_ids.tolist() == [1] and not ledger.request_ids.flags.writeable


def test_compiled_ledger_takes_plans_of_the_reference_planner(compiled, reference) -> None:
    from stepplanner.ledger import _ledger as _ledger_core
    from stepplanner.ledger import _ledger_py as _ledger_reference

    ledgers = (_ledger_core.Ledger(LIMITS, POLICY), _ledger_reference.Ledger(LIMITS, POLICY))
    planners = [reference.StepPlanner(POLICY, LIMITS) for _ in ledgers]  # one per step loop
    for ledger in ledgers:
        for rid in range(6):
            ledger.submit(rid, 20 + rid, max_new_tokens=3)
    plans = [ledger.step(planner) for ledger, planner in zip(ledgers, planners)]
    for _ in range(8):
        masks = [np.zeros(len(p.sequences), dtype=bool) for p in plans]
        plans = []
        for ledger, planner, mask in zip(ledgers, planners, masks):
            plans.append(ledger.step(planner, mask))
            assert ledger.finished_ids.tolist() == ledgers[0].finished_ids.tolist()
        assert _state(ledgers[0]) == _state(ledgers[1])
    with pytest.raises(TypeError, match="plan must be a StepPlan, got object"):
        ledgers[0].apply(object())
