"""LoRA admission (docs/decisions.md, "LoRA adapters"): with ``max_loras=N`` the residents hold at
most N distinct adapters, and a waiting request whose adapter cannot join is passed over, keeps
its place, and holds back no request behind it whose adapter can.

Every scenario runs on the compiled ledger and on the pure-Python twin; ``test_ledger_stateful.py``
drives both against a model of the rule through random sequences.
"""

from __future__ import annotations

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import StepPlannerLimits
from stepplanner._errors import QueueFullError

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16)


@pytest.fixture
def make(ledger_impl):
    def build(max_loras=2, policy=None, limits=LIMITS, **kwargs):
        return ledger_impl.Ledger(limits, policy, max_loras=max_loras, **kwargs)

    return build


def submit_all(ledger, adapters, length=8, priority=0):
    """Requests 0, 1, ... with these adapters (0: the base model)."""
    for rid, lora in enumerate(adapters):
        ledger.submit(rid, length, priority, lora_id=lora)


def resident_adapters(ledger) -> set[int]:
    return {r.get("lora_id", 0) for r in ledger.to_records()} - {0}


def _state(ledger) -> tuple:
    return (ledger.to_records(), ledger.waiting_ids(), ledger.waiting, ledger.admitted_ids.tolist())


# --- the rule -----------------------------------------------------------------------------------


def test_a_request_whose_adapter_cannot_join_is_passed_over_and_keeps_its_place(make):
    ledger = make(max_loras=1)
    submit_all(ledger, [1, 2, 0, 1, 3, 2])
    # 0 takes the one adapter slot (1); 1 (adapter 2) cannot join, 2 (base) and 3 (adapter 1)
    # can; 4 (3) and 5 (2) cannot. Nothing behind a blocked request waits for it.
    assert ledger.admit() == [0, 2, 3]
    assert resident_adapters(ledger) == {1}
    assert ledger.waiting_ids() == [1, 4, 5]
    # Adapter 1's last request leaves: the first passed-over request takes the slot, in queue
    # order, and its adapter's later request joins it; 4's adapter (3) still cannot.
    ledger.retire([0, 3])
    assert ledger.admit() == [1, 5]
    assert resident_adapters(ledger) == {2}
    assert ledger.waiting_ids() == [4]


def test_the_base_model_takes_no_adapter_slot_and_requests_share_one(make):
    ledger = make(max_loras=2, limits=StepPlannerLimits(8, 64, 16))
    submit_all(ledger, [0, 5, 0, 5, 7, 7, 0, 5])
    assert ledger.admit() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert resident_adapters(ledger) == {5, 7}


def test_without_max_loras_any_number_of_adapters_is_admitted(make):
    ledger = make(max_loras=None)
    assert ledger.max_loras is None
    submit_all(ledger, [1, 2, 3, 4])
    assert ledger.admit() == [0, 1, 2, 3]
    assert resident_adapters(ledger) == {1, 2, 3, 4}


def test_a_slot_opens_only_when_an_adapters_last_resident_leaves(make):
    ledger = make(max_loras=1)
    submit_all(ledger, [1, 1, 2])
    assert ledger.admit() == [0, 1]
    ledger.retire([0])  # adapter 1 still has request 1
    ledger.submit(3, 8, lora_id=0)
    assert ledger.admit() == [3]
    assert ledger.waiting_ids() == [2]
    ledger.retire([1])
    assert ledger.admit() == [2]


def test_plans_hold_at_most_max_loras_adapters_over_a_long_run(ledger_impl):
    """A serving loop over 300 requests on six adapters and the base model, two slots: no step
    plans rows of more than two adapters, every request finishes, and requests were admitted
    past earlier ones whose adapters could not join."""
    limits = StepPlannerLimits(8, 64, 16)
    policy = sp.resolve_scheduling_policy(
        sp.SchedulingOptions(preemption=sp.PreemptionMode.PAUSE), limits
    )
    ledger = ledger_impl.Ledger(limits, policy, max_loras=2, max_waiting=400)
    planner = ledger_impl.StepPlanner(policy, limits)
    rng = np.random.default_rng(7)
    adapter = {}
    for rid in range(300):
        adapter[rid] = int(rng.integers(0, 7))
        ledger.submit(
            rid,
            int(rng.integers(1, 64)),
            max_new_tokens=int(rng.integers(1, 9)),
            lora_id=adapter[rid],
        )
    finished, overtaken, steps = [], 0, 0
    plan = ledger.step(planner)
    while ledger.count or ledger.waiting:
        ids = ledger.request_ids.tolist()
        planned = {adapter[ids[s.resident]] for s in plan.sequences} - {0}
        assert len(planned) <= 2
        assert len({adapter[i] for i in ids} - {0}) <= 2
        waiting = set(ledger.waiting_ids())
        plan = ledger.step(planner)
        finished += ledger.finished_ids.tolist()
        admitted = ledger.admitted_ids.tolist()
        overtaken += sum(1 for a in admitted for w in waiting if w < a and w not in admitted)
        steps += 1
        assert steps < 5000
    assert sorted(finished) == list(range(300))
    assert overtaken > 0


# --- with the other admission rules ----------------------------------------------------------


def test_a_passed_over_urgent_request_leaves_the_reserved_slot_to_urgent_requests(make):
    limits = StepPlannerLimits(3, 64, 16)
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(priority_reserved_slots=1), limits)
    ledger = make(max_loras=1, policy=policy, limits=limits)
    ledger.submit(0, 8, 0, lora_id=1)
    ledger.submit(1, 8, -1, lora_id=2)  # urgent, but its adapter cannot join
    ledger.submit(2, 8, 0, lora_id=1)
    ledger.submit(3, 8, 0)
    ledger.submit(4, 8, -1)  # urgent, the base model
    # Rows: 0, then 2 (FCFS; the urgent 1 passed over); with one free slot left, the reserved
    # one, only an urgent request may take it: 4, not 3.
    assert ledger.admit() == [0, 2, 4]
    assert ledger.waiting_ids() == [1, 3]


def test_with_a_page_table_a_passed_over_request_holds_no_pages_and_no_one_back(paged_impl):
    limits = StepPlannerLimits(4, 32, 4)
    table = paged_impl.KVPageTable(4, 16, 12, 4)
    ledger = paged_impl.Ledger(limits, page_table=table, max_loras=1)
    ledger.submit(0, 8, max_new_tokens=8, lora_id=1)  # 4 pages
    ledger.submit(1, 32, max_new_tokens=16, lora_id=2)  # 12 pages: would not fit either
    ledger.submit(2, 8, max_new_tokens=8)  # 4 pages
    ledger.submit(3, 16, max_new_tokens=8)  # 6 pages: does not fit; nothing overtakes it
    ledger.submit(4, 4, max_new_tokens=4)  # 2 pages
    assert ledger.admit() == [0, 2]
    assert ledger.reserved_pages == 8
    assert ledger.waiting_ids() == [1, 3, 4]
    # held_back reads the request admission takes next, the first that can join: 3.
    assert ledger.held_back == 3
    ledger.cancel(3)
    assert ledger.held_back == 0  # 4 fits; 1 does not, but admission passes it over anyway
    assert ledger.waiting_ids() == [1, 4]  # a read moves nothing
    assert ledger.admit() == [4]


def test_held_back_counts_a_request_behind_a_passed_over_one_that_would_fit(paged_impl):
    limits = StepPlannerLimits(4, 32, 4)
    table = paged_impl.KVPageTable(4, 16, 12, 4)
    ledger = paged_impl.Ledger(limits, page_table=table, max_loras=1)
    ledger.submit(0, 8, max_new_tokens=8, lora_id=1)  # 4 pages
    ledger.submit(1, 8, max_new_tokens=8)  # 4 pages
    ledger.submit(2, 4, max_new_tokens=4, lora_id=2)  # 2 pages: fits, cannot join
    ledger.submit(3, 32, max_new_tokens=8)  # 10 pages: does not fit the 4 left
    assert ledger.admit() == [0, 1]
    assert ledger.held_back == 2
    assert ledger.waiting_ids() == [2, 3]
    ledger.retire([0])  # adapter 1 leaves: 2 can join, and fits the 8 pages now free
    assert ledger.held_back == 0
    assert ledger.admit() == [2]
    assert ledger.held_back == 1  # 3 needs 10 pages, 6 are free


def test_held_back_with_every_row_taken_and_more_slots_than_rows(paged_impl):
    # max_loras past B: the residents hold B adapters and an urgent request (which the next
    # free row would take first) brings one more; reading held_back must not write past them.
    limits = StepPlannerLimits(2, 32, 4)
    table = paged_impl.KVPageTable(2, 16, 12, 4)
    ledger = paged_impl.Ledger(limits, page_table=table, max_loras=3)
    ledger.submit(0, 8, max_new_tokens=8, lora_id=1)
    ledger.submit(1, 8, max_new_tokens=8, lora_id=2)
    assert ledger.admit() == [0, 1]
    ledger.submit(2, 8, -1, max_new_tokens=8, lora_id=3)  # 4 pages: fits the 4 free
    ledger.submit(3, 32, -1, max_new_tokens=8)  # 10 pages: would not
    assert ledger.held_back == 0
    ledger.cancel(2)
    assert ledger.held_back == 1


def test_under_deadline_a_passed_over_request_is_still_relegated_and_shed(ledger_impl):
    limits = StepPlannerLimits(2, 256, 16)
    policy = sp.resolve_scheduling_policy(
        sp.SchedulingOptions(
            scheduling_policy=sp.SchedulingPolicy.DEADLINE,
            preemption=sp.PreemptionMode.PAUSE,
            max_num_tokens=32,
        ),
        limits,
    )
    ledger = ledger_impl.Ledger(limits, policy, step_time=(0.01, 0.0), max_loras=1)
    planner = ledger_impl.StepPlanner(policy, limits)
    ledger.submit(0, 16, 0, lora_id=1)  # no objectives: holds the adapter slot
    plan = ledger.step(planner, now=0.0)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.05), lora_id=2)
    plan = ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=0.0)
    assert ledger.admitted_ids.tolist() == []
    assert ledger.waiting_ids() == [1]
    for k in range(1, 20):
        plan = ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=0.01 * k)
        if 1 in ledger.shed_ids.tolist():
            break
    assert 1 not in ledger.waiting_ids()
    assert 1 in ledger.shed_ids.tolist()


# --- snapshots --------------------------------------------------------------------------------


def test_records_carry_the_adapter_and_load_reads_it_back(make):
    ledger = make(max_loras=2)
    submit_all(ledger, [3, 0, 9])
    ledger.admit()
    records = ledger.to_records()
    assert [r.get("lora_id") for r in records] == [3, None, 9]
    other = make(max_loras=2)
    other.load(records)
    assert other.to_records() == records
    other.submit(10, 8, lora_id=4)  # both slots held (3 and 9): it waits
    other.submit(11, 8, lora_id=9)
    assert other.admit() == [11]


def test_load_refuses_more_adapters_than_max_loras_and_changes_nothing(make):
    ledger = make(max_loras=1)
    submit_all(ledger, [1])
    ledger.admit()
    before = _state(ledger)
    with pytest.raises(ValueError, match=r"2 distinct lora_id .*at most max_loras=1"):
        ledger.load([{"lora_id": 1}, {"lora_id": 2}, {"lora_id": 0}])
    assert _state(ledger) == before


# --- bad input: a clear error naming the field, nothing changed ------------------------------


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (0, ValueError, r"max_loras=0 is out of range; allowed: 1\.\.2147483647, or None"),
        (-3, ValueError, r"max_loras=-3 is out of range"),
        (2**31, ValueError, r"max_loras=2147483648 is out of range"),
        (1.5, TypeError, r"max_loras"),
        ("2", TypeError, r"max_loras"),
    ],
)
def test_bad_max_loras_is_refused_naming_it(ledger_impl, value, error, match):
    with pytest.raises(error, match=match):
        ledger_impl.Ledger(LIMITS, max_loras=value)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (-1, ValueError, r"lora_id=-1 is out of range; allowed: 0 \(the base model\)"),
        (2**63, OverflowError, r"lora_id=9223372036854775808 does not fit int64"),
        (1.0, TypeError, r"lora_id"),
        (None, TypeError, r"lora_id"),
    ],
)
def test_a_bad_lora_id_is_refused_naming_it_and_the_queue_is_unchanged(make, value, error, match):
    ledger = make()
    submit_all(ledger, [1, 2])
    before = _state(ledger)
    with pytest.raises(error, match=match):
        ledger.submit(7, 8, lora_id=value)
    assert _state(ledger) == before
    ledger.submit(7, 8, lora_id=np.int64(3))  # any integer type, as every other field
    assert ledger.waiting_ids() == [0, 1, 7]


def test_a_full_queue_refuses_before_the_adapter_matters(make):
    ledger = make(max_waiting=1)
    ledger.submit(0, 8, lora_id=1)
    with pytest.raises(QueueFullError):
        ledger.submit(1, 8, lora_id=2)
    assert ledger.waiting_ids() == [0]


def test_a_bad_resident_lora_id_in_load_names_the_record(make):
    ledger = make()
    with pytest.raises(ValueError, match=r"residents\[1\]\.lora_id=-2 is out of range"):
        ledger.load([{}, {"lora_id": -2}])
    assert ledger.count == 0


def test_a_passed_over_request_can_be_cancelled_and_the_rest_keep_their_places(make):
    ledger = make(max_loras=1)
    submit_all(ledger, [1, 2, 3, 2, 0])
    assert ledger.admit() == [0, 4]
    assert ledger.waiting_ids() == [1, 2, 3]
    ledger.cancel(2)  # passed over (adapter 3): it leaves the queue, the others stay as they were
    assert ledger.waiting_ids() == [1, 3]
    with pytest.raises(ValueError, match="is not waiting or resident"):
        ledger.cancel(2)
    ledger.submit(5, 8, lora_id=1)
    assert ledger.admit() == [5]
    ledger.retire([0, 5])
    assert ledger.admit() == [1, 3]
    assert ledger.waiting == 0


def test_passed_over_requests_join_once_a_loaded_table_frees_their_adapter(make):
    ledger = make(max_loras=1)
    submit_all(ledger, [1, 2])
    assert ledger.admit() == [0]
    records = ledger.to_records()
    ledger.load([])  # the adapter-1 resident is gone: adapter 2 may join
    assert ledger.admit() == [1]
    assert resident_adapters(ledger) == {2}
    ledger.submit(3, 8, lora_id=1)
    assert ledger.admit() == []
    ledger.load(records)  # back to adapter 1 resident: 3 (adapter 1) joins, nothing else waits
    assert ledger.admit() == [3]
