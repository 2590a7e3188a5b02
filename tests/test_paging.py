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
    ledger.submit(11, 1, max_new_tokens=1)      # 2 tokens: 1 page
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
    for rid, length in ((1, 3), (2, 7), (3, 11), (4, 15)):
        ledger.submit(rid, length, max_new_tokens=1)
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
    ledger.submit(1, 3, max_new_tokens=1)
    ledger.admit()
    before = (table.rows.copy(), ledger.count, ledger.waiting)
    with pytest.raises(ValueError, match=r"needs 9 pages; allowed: at most 8"):
        ledger.submit(2, 30, max_new_tokens=6)
    with pytest.raises(ValueError, match="request_id=1 is already waiting or resident"):
        ledger.submit(1, 4, max_new_tokens=1)
    with pytest.raises(ValueError, match="prompt_length=33 exceeds max_input_length=32"):
        ledger.submit(5, 33, max_new_tokens=1)
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
    """A ledger whose ``submit`` fails once, after ``passes`` more calls (as a ledger out of
    memory would)."""

    def __init__(self, ledger):
        self.inner = ledger
        self.refuse = False
        self.passes = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, *args, **kwargs):
        if self.refuse:
            if self.passes:
                self.passes -= 1
            else:
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


def test_admit_after_a_refused_pass_keeps_what_passed_and_carries_on(kv):
    limits = StepPlannerLimits(4, 32, 4)
    table = kv.KVPageTable(4, 16, 64, 4)
    inner = RefusingOnce(sp.Ledger(limits))
    ledger = PagedLedger(inner, table)
    for rid in (1, 2, 3):
        ledger.submit(rid, 4, max_new_tokens=4)          # 2 pages each
    inner.refuse, inner.passes = True, 1                 # request 1 passes, request 2 fails
    with pytest.raises(MemoryError):
        ledger.admit()
    # Request 1 is in the ledger's queue with its pages promised; 2 and 3 are still held.
    assert ledger.ledger.waiting_ids() == [1] and ledger.held_back == 2
    assert ledger.reserved_pages == 2 and table.num_free_pages == 64 and ledger.count == 0
    assert ledger.admit() == [1, 2, 3]
    assert ledger.held_back == 0 and ledger.reserved_pages == 6
    assert table.page_counts[:3].tolist() == [2, 2, 2]
    table.check()


# --- submission checks everything the ledger checks ------------------------------------------


def test_submit_checks_every_field_as_the_ledger_does(kv):
    """An id the ledger would refuse is refused at submission, so admission never wedges."""
    limits, table, ledger = make(kv, 8)
    ledger.submit(1, 10, max_new_tokens=5)               # 4 pages
    before = paged_state(ledger, table)
    refusals = [
        (OverflowError, r"request_id=9223372036854775808 does not fit int64",
         dict(request_id=2**63, prompt_length=10, max_new_tokens=5)),
        (OverflowError, r"request_id=-9223372036854775809 does not fit int64",
         dict(request_id=-(2**63) - 1, prompt_length=10, max_new_tokens=5)),
        (TypeError, "request_id", dict(request_id=1.5, prompt_length=10, max_new_tokens=5)),
        (OverflowError, "priority=2147483648 does not fit int32",
         dict(request_id=2, prompt_length=10, priority=2**31, max_new_tokens=5)),
        (ValueError, r"max_new_tokens=0 is out of range; allowed: None or >= 1",
         dict(request_id=2, prompt_length=10, max_new_tokens=0)),
        (ValueError, r"max_new_tokens=None is refused: a PagedLedger reserves",
         dict(request_id=2, prompt_length=10, max_new_tokens=None)),
        (ValueError, r"prompt_length=0 is out of range; allowed: 1\.\.32",
         dict(request_id=2, prompt_length=0, max_new_tokens=5)),
        (OverflowError, r"max_new_tokens=2147483648 does not fit int32",
         dict(request_id=2, prompt_length=10, max_new_tokens=2**31)),
    ]
    for error, message, kwargs in refusals:
        with pytest.raises(error, match=message):
            ledger.submit(**kwargs)
        assert paged_state(ledger, table) == before, kwargs
    with pytest.raises(TypeError):
        ledger.submit(2, 10)                             # max_new_tokens is required
    ledger.submit(3, 10, max_new_tokens=5)
    # The review's case: ids 1, 2**63, 3 -- the bad one never got in, so both are admitted.
    assert ledger.admit() == [1, 3]
    assert ledger.held_back == 0 and ledger.reserved_pages == 8
    table.check()


def test_the_queue_bound_is_enforced_at_submission(kv):
    limits = StepPlannerLimits(4, 32, 4)
    table = kv.KVPageTable(4, 16, 4, 4)
    ledger = PagedLedger(sp.Ledger(limits, max_waiting=2), table)
    ledger.submit(1, 12, max_new_tokens=4)               # the whole pool
    assert ledger.admit() == [1]
    ledger.submit(2, 12, max_new_tokens=4)               # held for pages
    ledger.submit(3, 1, max_new_tokens=1)
    before = paged_state(ledger, table)
    with pytest.raises(sp.QueueFullError, match=r"max_waiting=2\): request 4"):
        ledger.submit(4, 1, max_new_tokens=1)
    assert paged_state(ledger, table) == before
    ledger.retire([1])
    assert ledger.admit() == [2]                         # 3 waits behind 2 for pages
    ledger.submit(4, 1, max_new_tokens=1)                # room again: 3 and 4 wait
    assert ledger.waiting_ids() == [3, 4]


# --- output accounting: a request finishes at its reservation --------------------------------


def planned(ledger_impl, kv, num_pages):
    """(page table, PagedLedger, planner) of one implementation: 4 slots, S_in 32, P = 4."""
    limits = StepPlannerLimits(4, 32, 4)
    policy = sp.ResolvedSchedulingPolicy(mode=sp.IfbSchedulingMode.MIXED, max_num_tokens=24,
                                         max_chunk_tokens=8)
    table = kv.KVPageTable(4, 16, num_pages, 4)
    return (table, PagedLedger(ledger_impl.Ledger(limits, policy), table),
            ledger_impl.StepPlanner(policy, limits))


def _paged_loop(ledger_impl, kv, *, retire, seed):
    """Requests with random prompts and output bounds through a real planner on a short pool;
    every step checks that each planned row's KV stays within the pages it holds."""
    p = 4
    table, ledger, planner = planned(ledger_impl, kv, 14)
    rng = np.random.default_rng(seed)
    want = {}
    for rid in range(24):
        prompt, new = int(rng.integers(1, 33)), int(rng.integers(1, 20))
        want[rid] = new
        ledger.submit(rid, prompt, max_new_tokens=new)
    emitted = {}
    for _ in range(2000):
        ledger.admit()
        if ledger.count == 0 and ledger.waiting == 0:
            break
        plan = planner.plan(ledger.residents)
        seq = plan.as_array()
        after = seq["past_length"].astype(np.int64) + seq["query_length"]
        held = table.page_counts[seq["resident"]].astype(np.int64)
        assert (held * p >= after).all()                 # no row outgrows its pages
        for row, tokens in zip(seq["resident"].tolist(), after.tolist()):
            assert table.ensure(row, tokens)             # already held: nothing to append
        assert ledger.reserved_pages <= table.num_pages
        ids = ledger.request_ids.copy()
        for rid in ids[seq["resident"][seq["select_last_token_logits"]]].tolist():
            emitted[rid] = emitted.get(rid, 0) + 1
        finished = ledger.apply(plan, retire=retire).tolist()
        if not retire:
            outputs = dict(zip(ledger.request_ids.tolist(), ledger.output_tokens.tolist()))
            assert all(outputs[rid] == want[rid] for rid in finished)
            ledger.retire_finished()
        assert all(emitted[rid] == want[rid] for rid in finished)
        assert all(emitted.get(rid, 0) < want[rid] for rid in ledger.request_ids.tolist())
        assert not set(finished) & set(ledger.request_ids.tolist())
        assert set(ids.tolist()) - set(finished) == set(ledger.request_ids.tolist())
        committed = ledger.residents["committed"].astype(np.int64)
        assert (table.page_counts[:ledger.count].astype(np.int64) * p >= committed).all()
        assert ledger.kv_pages_in_use() <= ledger.reserved_pages
        table.check()
    assert ledger.count == 0 and ledger.waiting == 0
    assert table.num_free_pages == table.num_pages and ledger.reserved_pages == 0
    assert emitted == want                               # each finished exactly at its bound


@pytest.mark.parametrize("retire", [True, False])
def test_requests_finish_at_their_reservation_and_never_outgrow_it(ledger_impl, kv, retire):
    _paged_loop(ledger_impl, kv, retire=retire, seed=7)


def test_apply_refuses_a_plan_beyond_the_reserved_pages(ledger_impl, kv):
    """A finished request kept resident may take one more step (the last token's KV is in its
    worst case) but is refused before a second, with nothing changed."""
    table, ledger, planner = planned(ledger_impl, kv, 16)
    ledger.submit(1, 7, max_new_tokens=1)                # 8 tokens: 2 pages
    ledger.admit()
    assert ledger.apply(planner.plan(ledger.residents)).tolist() == [1]   # prompt: token 1
    assert ledger.output_tokens.tolist() == [1]
    ledger.apply(planner.plan(ledger.residents))          # flushing the last token: 8 tokens
    plan = planner.plan(ledger.residents)
    before = (ledger.to_records(), table.rows.tolist(), ledger.output_tokens.tolist())
    with pytest.raises(ValueError, match=r"plan row 0 \(resident 0, request 1\) would hold 9 "
                                         r"tokens of KV; allowed: at most the 8"):
        ledger.apply(plan, retire=True)
    assert (ledger.to_records(), table.rows.tolist(), ledger.output_tokens.tolist()) == before
    ledger.retire_finished()
    assert ledger.count == 0 and table.num_free_pages == 16


def test_apply_forwards_finished_and_errors_change_nothing(ledger_impl, kv):
    table, ledger, planner = planned(ledger_impl, kv, 16)
    for rid in (1, 2, 3):
        ledger.submit(rid, 4, max_new_tokens=8)          # 12 tokens: 3 pages each
    ledger.admit()
    plan = planner.plan(ledger.residents)
    before = paged_state(ledger, table)
    with pytest.raises(ValueError, match="finished"):
        ledger.apply(plan, np.zeros(2, dtype=bool), retire=True)
    with pytest.raises(TypeError, match="StepPlan"):
        ledger.apply(object(), retire=True)
    assert paged_state(ledger, table) == before
    pages = {rid: table.rows[row].tolist() for row, rid in enumerate([1, 2, 3])}
    done = ledger.apply(plan, np.array([False, True, False]), retire=True)   # the sampler's EOS
    assert done.tolist() == [2] and ledger.finished_ids.tolist() == [2]
    assert ledger.request_ids.tolist() == [1, 3]
    for row, rid in enumerate(ledger.request_ids.tolist()):
        assert table.rows[row].tolist() == pages[rid]
    assert table.num_free_pages == 16 - 6 and ledger.reserved_pages == 6
    table.check()


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_frees_pages_wherever_the_request_is(kv):
    limits, table, ledger = make(kv, 12)
    ledger.submit(1, 4, max_new_tokens=4)                # 2 pages
    ledger.submit(2, 8, max_new_tokens=4)                # 3 pages
    ledger.submit(3, 4, max_new_tokens=4)                # 2 pages
    ledger.submit(7, 1, max_new_tokens=1)                # 1 page: every slot taken
    assert ledger.admit() == [1, 2, 3, 7]
    pages7 = table.rows[3].tolist()
    ledger.submit(4, 4, max_new_tokens=4)                # 2 pages: promised, waits for a slot
    ledger.submit(5, 12, max_new_tokens=4)               # 4 pages: held back for pages
    ledger.submit(6, 1, max_new_tokens=1)                # held behind 5
    assert ledger.admit() == []
    assert ledger.ledger.waiting_ids() == [4] and ledger.held_back == 2
    assert ledger.reserved_pages == 10 and table.num_free_pages == 4
    before = paged_state(ledger, table)
    with pytest.raises(ValueError, match="request_id=9 is not waiting or resident"):
        ledger.cancel(9)
    with pytest.raises(OverflowError, match="does not fit int64"):
        ledger.cancel(2**63)
    assert paged_state(ledger, table) == before
    ledger.cancel(5)                                     # held: nothing promised yet
    assert ledger.waiting_ids() == [4, 6] and ledger.reserved_pages == 10
    ledger.cancel(4)                                     # in the ledger's queue: promise back
    assert ledger.ledger.waiting == 0 and ledger.reserved_pages == 8
    ledger.cancel(1)                                     # resident: row 0 freed, 7 moves in
    assert ledger.request_ids.tolist() == [7, 2, 3] and table.rows[0].tolist() == pages7
    assert ledger.reserved_pages == 6 and table.num_free_pages == 6
    table.check()
    assert ledger.admit() == [6]
    for rid in (2, 3, 6, 7):
        ledger.cancel(rid)
    assert ledger.count == 0 and ledger.waiting == 0 and table.num_free_pages == 12
    assert ledger.reserved_pages == 0
    table.check()


def test_step_is_refused_with_the_calls_that_replace_it(kv):
    limits, table, ledger = make(kv, 8)
    with pytest.raises(AttributeError, match=r"PagedLedger.step is refused: use apply\(plan"):
        ledger.step  # noqa: B018
