"""PagedLedger and the simulator with a finite page pool: slots and pages kept together, and
admission that reserves the worst case so that no step runs out of pages."""

from __future__ import annotations

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import PagedLedger, StepPlannerLimits
from stepplanner.paged_simulator import simulate_paged


def make(kv, num_pages, b=4, p=4):
    limits = StepPlannerLimits(b, 32, p)
    table = kv.KVPageTable(b, 16, num_pages, p)
    return limits, table, PagedLedger(sp.Ledger(limits), table)


def test_admission_reserves_the_worst_case(kv):
    limits, table, ledger = make(kv, 64)
    ledger.submit(10, 9, max_new_tokens=3)      # 12 tokens: 3 pages
    ledger.submit(11, 1, max_new_tokens=0)      # 1 page
    assert ledger.admit() == [10, 11]
    assert table.page_counts[:2].tolist() == [3, 1]
    assert ledger.reserved_pages == 4 and ledger.kv_pages_in_use() == 0
    assert ledger.residents is ledger.ledger.residents or np.shares_memory(
        ledger.residents, ledger.ledger.residents)


def test_requests_wait_in_order_until_their_worst_case_fits(kv):
    limits, table, ledger = make(kv, 8)
    ledger.submit(1, 20, max_new_tokens=4)      # 6 pages
    ledger.submit(2, 12, max_new_tokens=4)      # 4 pages: does not fit beside the first
    ledger.submit(3, 1, max_new_tokens=1)       # 1 page: fits, but waits behind request 2
    assert ledger.admit() == [1]
    assert ledger.waiting == 2 and ledger.held_back == 2 and table.num_free_pages == 2
    ledger.retire([1])
    assert table.num_free_pages == 8
    assert ledger.admit() == [2, 3]
    assert table.page_counts[:2].tolist() == [4, 1]
    table.check()


def test_retire_moves_pages_with_rows(kv):
    limits, table, ledger = make(kv, 64)
    for rid, length in ((1, 4), (2, 8), (3, 12), (4, 16)):
        ledger.submit(rid, length)
    ledger.admit()
    pages = {rid: table.rows[row].tolist() for row, rid in enumerate(ledger.request_ids.tolist())}
    ledger.retire_rows([0])
    ledger.retire([3])
    for row, rid in enumerate(ledger.request_ids.tolist()):
        assert table.rows[row].tolist() == pages[rid]
    assert table.num_free_pages == 64 - 2 - 4
    table.check()


def test_errors_change_nothing(kv):
    limits, table, ledger = make(kv, 8)
    ledger.submit(1, 4)
    ledger.admit()
    before = (table.rows.copy(), ledger.count, ledger.waiting)
    with pytest.raises(ValueError, match=r"needs 9 pages; allowed: at most 8"):
        ledger.submit(2, 30, max_new_tokens=6)
    with pytest.raises(ValueError, match="request_id=1 is already waiting or resident"):
        ledger.submit(1, 4)
    with pytest.raises(ValueError, match="prompt_length=33 is out of range"):
        ledger.submit(5, 33)
    with pytest.raises(ValueError, match="request_id=7 is not resident"):
        ledger.retire([7])
    with pytest.raises(ValueError, match="row 3 is out of range"):
        ledger.retire_rows([3])
    assert np.array_equal(before[0], table.rows) and before[1:] == (ledger.count, ledger.waiting)


def test_constructor_checks(kv):
    limits = StepPlannerLimits(4, 32, 4)
    with pytest.raises(ValueError, match="page_table.max_batch_size=2 is smaller"):
        PagedLedger(sp.Ledger(limits), kv.KVPageTable(2, 4, 8, 4))
    with pytest.raises(ValueError, match="page_table.kv_page_size=8 differs"):
        PagedLedger(sp.Ledger(limits), kv.KVPageTable(4, 4, 8, 8))
    full = sp.Ledger(limits)
    full.submit(1, 4)
    full.admit()
    with pytest.raises(ValueError, match="ledger holds count=1 residents"):
        PagedLedger(full, kv.KVPageTable(4, 4, 8, 4))


WORKLOAD = sp.synthetic(requests=120, rate=40.0, seed=3, max_prompt=512, max_output=64)
LIMITS = StepPlannerLimits(16, 512, 16)


def test_a_plentiful_pool_changes_nothing():
    plain = sp.simulate(WORKLOAD, LIMITS)
    paged, occupancy = simulate_paged(WORKLOAD, LIMITS, num_pages=16 * 40)
    np.testing.assert_array_equal(plain.finish_time, paged.finish_time)
    assert occupancy.report()["steps_with_requests_held_for_pages"] == 0


def test_a_short_pool_holds_requests_back_and_never_runs_out():
    plain = sp.simulate(WORKLOAD, LIMITS)
    paged, occupancy = simulate_paged(WORKLOAD, LIMITS, num_pages=120)
    assert paged.report()["requests"]["completed"] == len(WORKLOAD)
    report = occupancy.report()
    assert report["steps_with_requests_held_for_pages"] > 0
    assert report["reserved_peak"] <= 1.0
    assert (occupancy.in_use <= occupancy.reserved).all()
    assert paged.report()["throughput"]["simulated_seconds"] >= plain.report()[
        "throughput"]["simulated_seconds"]


def test_a_request_larger_than_the_pool_is_refused_not_dropped():
    workload = sp.Workload(arrival_time=[0.0, 0.0], prompt_tokens=[100, 10],
                           output_tokens=[50, 5], priority=[0, 0])
    result, _ = simulate_paged(workload, LIMITS, num_pages=8)
    assert result.refused.tolist() == [True, False]
    assert result.report()["requests"]["completed"] == 1


def paged_state(ledger, table):
    return (table.rows.tolist(), table.num_free_pages, ledger.count, ledger.waiting,
            ledger.held_back, ledger.reserved_pages, ledger.waiting_ids(),
            ledger.request_ids.tolist())


def test_an_id_already_in_the_ledger_is_refused_and_nothing_changes(kv):
    limits, table, ledger = make(kv, 64)
    ledger.ledger.submit(5, 10)                  # behind the PagedLedger's back
    ledger.submit(6, 4, max_new_tokens=4)
    before = paged_state(ledger, table)
    with pytest.raises(ValueError, match="request_id=5 is already waiting or resident"):
        ledger.submit(5, 10, max_new_tokens=10)
    assert paged_state(ledger, table) == before
    # The foreign request has no promised pages: admission is refused, and nothing is lost.
    with pytest.raises(RuntimeError, match=r"differ by \+1 request\(s\)"):
        ledger.admit()
    assert paged_state(ledger, table) == before
    assert ledger.waiting_ids() == [5, 6]        # the ledger's queue, then the held request


class RefusingOnce:
    """A ledger whose next ``submit`` fails (as a ledger out of memory would)."""

    def __init__(self, ledger):
        self.inner = ledger
        self.refuse = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, *args, **kwargs):
        if self.refuse:
            self.refuse = False
            raise MemoryError("no room for the queue entry")
        return self.inner.submit(*args, **kwargs)


def test_admit_keeps_a_held_request_the_ledger_refuses(kv):
    limits = StepPlannerLimits(4, 32, 4)
    table = kv.KVPageTable(4, 16, 64, 4)
    inner = RefusingOnce(sp.Ledger(limits))
    ledger = PagedLedger(inner, table)
    ledger.submit(7, 4, max_new_tokens=4)
    before = paged_state(ledger, table)
    inner.refuse = True
    with pytest.raises(MemoryError):
        ledger.admit()
    assert paged_state(ledger, table) == before   # still held, with its worst case
    assert ledger.admit() == [7]
    assert table.page_counts[0] == 2 and ledger.held_back == 0
    table.check()


def test_state_changing_ledger_methods_are_not_forwarded(kv):
    limits, table, ledger = make(kv, 64)
    record = dict(priority=0, arrival=0, prompt_length=8, committed=0, context_committed=False,
                  consecutive_paused_steps=0)
    with pytest.raises(AttributeError, match="PagedLedger.load is refused"):
        ledger.load([record])
    assert ledger.count == 0 and table.num_free_pages == 64
    with pytest.raises(AttributeError, match="no attribute '_known'"):
        ledger._known  # noqa: B018 - private state stays the ledger's
    for name in ("capacity", "count", "free_slots", "limits", "reserved_slots", "by_priority"):
        assert getattr(ledger, name) == getattr(ledger.ledger, name), name
    ledger.submit(1, 8, max_new_tokens=4)
    ledger.admit()
    assert ledger.to_records() == ledger.ledger.to_records()
