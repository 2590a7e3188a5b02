"""A Ledger with a page table, on both implementations, and the simulator with a finite page
pool: slots and pages kept together (slot i is ledger row i), and admission that reserves each
request's worst case so that no step runs out of pages."""

from __future__ import annotations

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import StepPlannerLimits
from stepplanner.kv import _kv_py as _kv_reference
from stepplanner.sim.paged import simulate_paged


@pytest.fixture(scope="session")
def impl(paged_impl):
    return paged_impl


MIXED = sp.ResolvedSchedulingPolicy(
    mode=sp.IfbSchedulingMode.MIXED, max_num_tokens=24, max_chunk_tokens=8
)


def make(impl, num_pages, b=4, p=4, policy=None, **kwargs):
    limits = StepPlannerLimits(b, 32, p)
    table = impl.KVPageTable(b, 16, num_pages, p)
    return limits, table, impl.Ledger(limits, policy, page_table=table, **kwargs)


def assert_pages_follow_rows(ledger, table, tokens):
    """Each resident's slot holds exactly its worst case (``tokens[id]`` tokens), every slot
    past the last row is empty, and the table's own invariants hold."""
    p = table.kv_page_size
    want = [-(-tokens[rid] // p) for rid in ledger.request_ids.tolist()]
    assert table.page_counts[: ledger.count].tolist() == want
    assert not table.page_counts[ledger.count :].any()
    assert ledger.reserved_pages == sum(want) == table.num_pages - table.num_free_pages
    table.check()


def state(ledger, table):
    return (
        table.rows.tolist(),
        table.num_free_pages,
        ledger.count,
        ledger.waiting,
        ledger.held_back,
        ledger.reserved_pages,
        ledger.waiting_ids(),
        ledger.request_ids.tolist(),
        ledger.to_records(),
        ledger.output_tokens.tolist(),
    )


def test_admission_reserves_the_worst_case(impl):
    limits, table, ledger = make(impl, 64)
    assert ledger.page_table is table
    ledger.submit(10, 9, max_new_tokens=3)  # 12 tokens: 3 pages
    ledger.submit(11, 1, max_new_tokens=1)  # 2 tokens: 1 page
    assert ledger.admit() == [10, 11]
    assert table.page_counts[:2].tolist() == [3, 1]
    assert ledger.reserved_pages == 4 and ledger.kv_pages_in_use() == 0
    assert_pages_follow_rows(ledger, table, {10: 12, 11: 2})


def test_requests_wait_in_order_until_their_worst_case_fits(impl):
    limits, table, ledger = make(impl, 8)
    ledger.submit(1, 20, max_new_tokens=4)  # 6 pages
    ledger.submit(2, 12, max_new_tokens=4)  # 4 pages: does not fit beside the first
    ledger.submit(3, 1, max_new_tokens=1)  # 1 page: would fit, but never overtakes 2
    assert ledger.admit() == [1]
    assert ledger.waiting == 2 and ledger.held_back == 2 and table.num_free_pages == 2
    ledger.retire([1])
    assert table.num_free_pages == 8 and ledger.held_back == 0
    assert ledger.admit() == [2, 3]
    assert table.page_counts[:2].tolist() == [4, 1]
    assert_pages_follow_rows(ledger, table, {2: 16, 3: 2})


def test_priority_order_decides_who_waits_for_pages(impl):
    """Under PRIORITY the queue's own order admits: the first request in that order holds back
    those behind it while its worst case does not fit, and the reserved slot still goes to
    urgent requests only."""
    policy = sp.resolve_scheduling_policy(
        sp.SchedulingOptions(
            scheduling_policy=sp.SchedulingPolicy.PRIORITY, priority_reserved_slots=1
        ),
        StepPlannerLimits(4, 32, 4),
    )
    limits, table, ledger = make(impl, 9, policy=policy)
    ledger.submit(1, 4, 5, max_new_tokens=4)  # 2 pages, priority 5
    ledger.submit(2, 28, 0, max_new_tokens=4)  # 8 pages, priority 0: first in queue order
    assert ledger.admit() == [2]
    assert ledger.held_back == 1 and table.num_free_pages == 1
    ledger.submit(3, 1, -1, max_new_tokens=1)  # urgent, 1 page: first now, and it fits
    assert ledger.admit() == [3]
    assert ledger.held_back == 1 and table.num_free_pages == 0
    ledger.retire([2])
    assert ledger.admit() == [1] and ledger.held_back == 0
    ledger.submit(4, 1, 0, max_new_tokens=1)
    assert ledger.admit() == [4]
    ledger.submit(5, 1, 0, max_new_tokens=1)  # the one slot left is reserved: not pages
    assert ledger.admit() == [] and ledger.held_back == 0
    assert_pages_follow_rows(ledger, table, {3: 2, 1: 8, 4: 2})


def test_retire_moves_pages_with_rows(impl):
    limits, table, ledger = make(impl, 64)
    tokens = {}
    for rid, length in ((1, 3), (2, 7), (3, 11), (4, 15)):
        ledger.submit(rid, length, max_new_tokens=1)
        tokens[rid] = length + 1
    ledger.admit()
    pages = {rid: table.rows[row].tolist() for row, rid in enumerate(ledger.request_ids.tolist())}
    ledger.retire_rows([0])
    ledger.retire([3])
    for row, rid in enumerate(ledger.request_ids.tolist()):
        assert table.rows[row].tolist() == pages[rid]
    assert table.num_free_pages == 64 - 2 - 4
    assert_pages_follow_rows(ledger, table, tokens)


def test_errors_change_nothing(impl):
    limits, table, ledger = make(impl, 8)
    ledger.submit(1, 3, max_new_tokens=1)
    ledger.admit()
    ledger.submit(2, 3, max_new_tokens=1)
    before = state(ledger, table)
    refusals = [
        (
            ValueError,
            r"request_id=5: prompt_length \+ max_new_tokens = 30 \+ 6 needs 9 pages; "
            r"allowed: at most 8 \(min of",
            dict(request_id=5, prompt_length=30, max_new_tokens=6),
        ),
        (
            ValueError,
            r"request_id=5: max_new_tokens=None is refused by a ledger with a page "
            r"table",
            dict(request_id=5, prompt_length=4),
        ),
        (
            OverflowError,
            r"max_new_tokens=2147483648 does not fit int32",
            dict(request_id=5, prompt_length=4, max_new_tokens=2**31),
        ),
        (
            ValueError,
            r"max_new_tokens=0 is out of range; allowed: None or >= 1",
            dict(request_id=5, prompt_length=4, max_new_tokens=0),
        ),
        (
            ValueError,
            "request_id=1 is already waiting or resident",
            dict(request_id=1, prompt_length=4, max_new_tokens=1),
        ),
        (
            ValueError,
            "prompt_length=33 exceeds max_input_length=32",
            dict(request_id=5, prompt_length=33, max_new_tokens=1),
        ),
    ]
    for error, message, kwargs in refusals:
        with pytest.raises(error, match=message):
            ledger.submit(**kwargs)
        assert state(ledger, table) == before, kwargs
    with pytest.raises(ValueError, match="request_id=7 is not resident"):
        ledger.retire([7])
    with pytest.raises(ValueError, match="row 3 is out of range"):
        ledger.retire_rows([3])
    with pytest.raises(ValueError, match="request_id=9 is not waiting or resident"):
        ledger.cancel(9)
    assert state(ledger, table) == before


def test_a_worst_case_at_the_limit_is_taken(impl):
    limits, table, ledger = make(impl, 16)  # rows of 16 pages of 4: 64 tokens
    ledger.submit(1, 32, max_new_tokens=32)
    assert ledger.admit() == [1] and table.page_counts[0] == 16 and table.num_free_pages == 0
    with pytest.raises(ValueError, match=r"32 \+ 33 needs 17 pages; allowed: at most 16"):
        ledger.submit(2, 32, max_new_tokens=33)


@pytest.mark.parametrize(
    ("slots", "pages", "page", "held", "message"),
    [
        (2, 8, 4, 0, r"page_table.max_batch_size=2 is smaller than limits.max_batch_size=4"),
        (4, 8, 8, 0, r"page_table.kv_page_size=8 differs from limits.kv_page_size=4"),
        (
            6,
            8,
            4,
            1,
            r"page_table holds 3 of its num_pages=8 pages; allowed: a table with every "
            r"page free",
        ),
    ],
)
def test_constructor_checks(impl, slots, pages, page, held, message):
    limits = StepPlannerLimits(4, 32, 4)
    table = impl.KVPageTable(slots, 4, pages, page)
    if held:
        assert table.ensure(5, 12)
    with pytest.raises(ValueError, match=message):
        impl.Ledger(limits, page_table=table)
    assert table.num_free_pages == pages - 3 * held  # the table is left as it was


def test_constructor_refuses_other_tables(impl):
    limits = StepPlannerLimits(4, 32, 4)
    with pytest.raises(TypeError, match=r"page_table must be a stepplanner.* or None, got dict"):
        impl.Ledger(limits, page_table={})
    if impl.name == "compiled":  # its C grows, releases and moves the compiled table's slots
        with pytest.raises(
            TypeError,
            match=r"page_table must be a stepplanner.kv._kv.KVPageTable "
            r"or None, got .*KVPageTable",
        ):
            impl.Ledger(limits, page_table=_kv_reference.KVPageTable(4, 4, 8, 4))
        return
    try:  # the twin drives either table through its Python API
        from stepplanner.kv._kv import KVPageTable as CompiledTable
    except ImportError:
        CompiledTable = impl.KVPageTable
    table = CompiledTable(4, 4, 8, 4)
    ledger = impl.Ledger(limits, page_table=table)
    ledger.submit(1, 4, max_new_tokens=4)
    assert ledger.admit() == [1] and table.page_counts[0] == 2


def test_page_table_is_read_only_and_absent_by_default(impl):
    limits, table, ledger = make(impl, 8)
    with pytest.raises(AttributeError):
        ledger.page_table = None
    assert ledger.page_table is table
    plain = impl.Ledger(limits)
    assert plain.page_table is None
    plain.submit(1, 30)  # no bound needed without a page table
    plain.admit()
    assert plain.reserved_pages == 0 and plain.held_back == 0 and plain.kv_pages_in_use() == 0


def test_load_is_refused_with_a_page_table(impl):
    limits, table, ledger = make(impl, 64)
    ledger.submit(1, 8, max_new_tokens=4)
    ledger.admit()
    before = state(ledger, table)
    records = ledger.to_records()
    with pytest.raises(ValueError, match=r"load\(\) is refused: this ledger has a page_table"):
        ledger.load(records)
    assert state(ledger, table) == before
    assert records == [
        dict(
            priority=0,
            arrival=0,
            prompt_length=8,
            committed=0,
            context_committed=False,
            consecutive_paused_steps=0,
            request_id=1,
        )
    ]


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
    assert (
        paged.report()["throughput"]["simulated_seconds"]
        >= plain.report()["throughput"]["simulated_seconds"]
    )


def test_a_request_larger_than_the_pool_is_refused_not_dropped():
    workload = sp.Workload(
        arrival_time=[0.0, 0.0], prompt_tokens=[100, 10], output_tokens=[50, 5], priority=[0, 0]
    )
    result, _ = simulate_paged(workload, LIMITS, num_pages=8)
    assert result.refused.tolist() == [True, False]
    assert result.report()["requests"]["completed"] == 1


def test_simulate_paged_checks_its_arguments_as_simulate_does():
    with pytest.raises(TypeError, match="workload must be a Workload"):
        simulate_paged([1, 2], LIMITS, num_pages=8)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="latency must be a LatencyModel"):
        simulate_paged(WORKLOAD, LIMITS, latency=None, num_pages=8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps=0"):
        simulate_paged(WORKLOAD, LIMITS, num_pages=8, max_steps=0)
    steps = []
    simulate_paged(
        WORKLOAD,
        LIMITS,
        num_pages=16 * 40,
        max_steps=3,
        progress_every=0,
        progress=lambda done, *_: steps.append(done),
    )
    assert steps == [1, 2, 3]  # progress_every < 1 reports every step, as in simulate


# --- the step: a request finishes at its reservation ----------------------------------------


def planned(impl, num_pages):
    """(page table, paged ledger, planner) of one implementation: 4 slots, S_in 32, P = 4."""
    limits = StepPlannerLimits(4, 32, 4)
    table = impl.KVPageTable(4, 16, num_pages, 4)
    return (table, impl.Ledger(limits, MIXED, page_table=table), impl.StepPlanner(MIXED, limits))


def check_plan_fits(table, plan):
    """Every planned row's KV fits the pages its row already holds: nothing to append."""
    seq = plan.as_array()
    after = seq["past_length"].astype(np.int64) + seq["query_length"]
    held = table.page_counts[seq["resident"]].astype(np.int64) * table.kv_page_size
    assert (held >= after).all()
    for row, tokens in zip(seq["resident"].tolist(), after.tolist()):
        before = table.num_free_pages
        assert table.ensure(row, tokens) and table.num_free_pages == before


def _paged_loop(impl, *, fused, retire, seed, requests=24, rate=1.0, steps=2000):
    """Requests with random prompts, priorities and output bounds, arriving over the run,
    through a real planner on a short pool: every step checks that each planned row's KV stays
    within the pages its row holds, and that the pages follow the rows."""
    table, ledger, planner = planned(impl, 14)
    rng = np.random.default_rng(seed)
    want, tokens, emitted = {}, {}, {}
    arriving = list(range(requests))
    plan, most_held = None, 0
    for _ in range(steps):
        for _ in range(int(rng.poisson(rate))):  # arrivals this step
            if arriving:
                rid = arriving.pop(0)
                prompt, new = int(rng.integers(1, 33)), int(rng.integers(1, 20))
                want[rid], tokens[rid] = new, prompt + new
                ledger.submit(rid, prompt, int(rng.integers(0, 2)), max_new_tokens=new)
        if fused:  # the sampler never ends a request early here: max_new_tokens does
            mask = None if plan is None else np.zeros(plan.num_prefill + plan.num_decode, bool)
            plan = ledger.step(planner, mask)
            done = ledger.finished_ids.tolist()
        else:
            ledger.admit()
            plan = planner.plan(ledger.residents)
        assert_pages_follow_rows(ledger, table, tokens)
        check_plan_fits(table, plan)
        seq = plan.as_array()
        for rid in ledger.request_ids[seq["resident"][seq["select_last_token_logits"]]].tolist():
            emitted[rid] = emitted.get(rid, 0) + 1  # the token this plan makes it emit
        if not fused:
            done = ledger.apply(plan, retire=retire).tolist()
            if not retire:
                outputs = dict(zip(ledger.request_ids.tolist(), ledger.output_tokens.tolist()))
                assert all(outputs[rid] == want[rid] for rid in done)
                ledger.retire_finished()
        assert all(emitted[rid] == want[rid] for rid in done)
        assert not set(done) & set(ledger.request_ids.tolist())
        assert all(emitted.get(rid, 0) <= want[rid] for rid in ledger.request_ids.tolist())
        assert ledger.kv_pages_in_use() <= ledger.reserved_pages <= table.num_pages
        most_held = max(most_held, ledger.held_back)
        if not arriving and ledger.count == 0 and ledger.waiting == 0:
            break
    else:
        raise AssertionError(f"requests still in the ledger after {steps} steps")
    assert table.num_free_pages == table.num_pages and ledger.reserved_pages == 0
    assert emitted == want  # each finished exactly at its bound
    return most_held


@pytest.mark.parametrize(("fused", "retire"), [(True, True), (False, True), (False, False)])
def test_requests_finish_at_their_reservation_and_never_outgrow_it(impl, fused, retire):
    _paged_loop(impl, fused=fused, retire=retire, seed=7)


def test_a_long_fused_run_never_runs_out_of_pages(impl):
    for seed in range(4):  # a pool short enough that requests wait for pages
        assert (
            _paged_loop(
                impl, fused=True, retire=True, seed=100 + seed, requests=120, rate=0.06, steps=20000
            )
            > 0
        )


def test_apply_refuses_a_plan_beyond_the_reserved_pages(impl):
    """A finished request kept resident may take one more step (the last token's KV is in its
    worst case) but is refused before a second, with nothing changed."""
    table, ledger, planner = planned(impl, 16)
    ledger.submit(1, 7, max_new_tokens=1)  # 8 tokens: 2 pages
    ledger.admit()
    assert ledger.apply(planner.plan(ledger.residents)).tolist() == [1]  # prompt: token 1
    assert ledger.output_tokens.tolist() == [1]
    ledger.apply(planner.plan(ledger.residents))  # flushing the last token: 8 tokens
    plan = planner.plan(ledger.residents)
    before = state(ledger, table)
    with pytest.raises(
        ValueError,
        match=r"plan row 0 \(resident 0, request 1\) would hold 9 "
        r"tokens of KV; allowed: at most the 8",
    ):
        ledger.apply(plan, retire=True)
    assert state(ledger, table) == before
    ledger.retire_finished()
    assert ledger.count == 0 and table.num_free_pages == 16


def test_step_refuses_a_pending_plan_beyond_the_pages(impl):
    """The fused step checks the plan it applies against the pages before anything changes;
    here the caller released the row's pages behind the ledger's back."""
    table, ledger, planner = planned(impl, 16)
    ledger.submit(1, 7, max_new_tokens=2)  # 9 tokens: 3 pages
    ledger.step(planner)  # admits it and plans its prompt
    table.release(0)
    before = state(ledger, table)
    with pytest.raises(
        ValueError,
        match=r"plan row 0 \(resident 0, request 1\) would hold 7 "
        r"tokens of KV; allowed: at most the 0",
    ):
        ledger.step(planner, np.zeros(1, dtype=bool))
    assert state(ledger, table) == before
    assert table.ensure(0, 9)
    ledger.step(planner, np.zeros(1, dtype=bool))  # the same pending plan, applied now
    assert ledger.output_tokens.tolist() == [1] and ledger.to_records()[0]["committed"] == 7


def test_apply_forwards_finished_and_errors_change_nothing(impl):
    table, ledger, planner = planned(impl, 16)
    for rid in (1, 2, 3):
        ledger.submit(rid, 4, max_new_tokens=8)  # 12 tokens: 3 pages each
    ledger.admit()
    plan = planner.plan(ledger.residents)
    before = state(ledger, table)
    with pytest.raises(ValueError, match="finished"):
        ledger.apply(plan, np.zeros(2, dtype=bool), retire=True)
    with pytest.raises(TypeError, match="StepPlan"):
        ledger.apply(object(), retire=True)
    assert state(ledger, table) == before
    pages = {rid: table.rows[row].tolist() for row, rid in enumerate([1, 2, 3])}
    done = ledger.apply(plan, np.array([False, True, False]), retire=True)  # the sampler's EOS
    assert done.tolist() == [2] and ledger.finished_ids.tolist() == [2]
    assert ledger.request_ids.tolist() == [1, 3]
    for row, rid in enumerate(ledger.request_ids.tolist()):
        assert table.rows[row].tolist() == pages[rid]
    assert table.num_free_pages == 16 - 6 and ledger.reserved_pages == 6
    assert_pages_follow_rows(ledger, table, {1: 12, 3: 12})


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_frees_pages_wherever_the_request_is(impl):
    limits, table, ledger = make(impl, 12)
    tokens = {1: 8, 2: 12, 3: 8, 7: 2, 4: 8, 5: 16, 6: 2}
    ledger.submit(1, 4, max_new_tokens=4)  # 2 pages
    ledger.submit(2, 8, max_new_tokens=4)  # 3 pages
    ledger.submit(3, 4, max_new_tokens=4)  # 2 pages
    ledger.submit(7, 1, max_new_tokens=1)  # 1 page: every slot taken
    assert ledger.admit() == [1, 2, 3, 7]
    pages7 = table.rows[3].tolist()
    ledger.submit(4, 4, max_new_tokens=4)  # 2 pages
    ledger.submit(5, 12, max_new_tokens=4)  # 4 pages
    ledger.submit(6, 1, max_new_tokens=1)  # 1 page
    assert ledger.admit() == [] and ledger.held_back == 0  # slots, not pages, hold them
    before = state(ledger, table)
    with pytest.raises(ValueError, match="request_id=9 is not waiting or resident"):
        ledger.cancel(9)
    with pytest.raises(OverflowError, match="does not fit int64"):
        ledger.cancel(2**63)
    assert state(ledger, table) == before
    ledger.cancel(4)  # waiting: it held no pages
    assert ledger.waiting_ids() == [5, 6] and ledger.reserved_pages == 8
    ledger.cancel(1)  # resident: row 0 freed, 7 moves in
    assert ledger.request_ids.tolist() == [7, 2, 3] and table.rows[0].tolist() == pages7
    assert ledger.reserved_pages == 6 and table.num_free_pages == 6
    assert_pages_follow_rows(ledger, table, tokens)
    assert ledger.admit() == [5]  # 4 of the 6 free pages
    assert ledger.admit() == [] and ledger.held_back == 0  # 6 fits, but no slot is free
    for rid in (2, 3, 5, 7):
        ledger.cancel(rid)
    assert ledger.admit() == [6]
    ledger.cancel(6)
    assert ledger.count == 0 and ledger.waiting == 0 and table.num_free_pages == 12
    assert ledger.reserved_pages == 0
    table.check()


class Meddling:
    """A planner that changes the ledger's page table and calls the ledger from inside
    ``plan()``: hostile, never a crash."""

    def __init__(self, planner, ledger, table):
        self.inner, self.ledger, self.table = planner, ledger, table
        self.limits = planner.limits
        self.refusals = []

    def plan(self, residents, *args, **kwargs):
        self.table.release(0)
        self.table.ensure(self.table.max_batch_size - 1, 9)  # a slot past the last row
        try:
            self.ledger.cancel(1)
        except RuntimeError as exc:
            self.refusals.append(str(exc))
        return self.inner.plan(residents, *args, **kwargs)


def test_a_planner_that_changes_the_table_mid_step_cannot_corrupt_the_ledger(impl):
    table, ledger, planner = planned(impl, 16)
    for rid in (1, 2):
        ledger.submit(rid, 4, max_new_tokens=4)  # 2 pages each
    meddling = Meddling(planner, ledger, table)
    ledger.step(meddling)
    assert meddling.refusals and "Ledger re-entered" in meddling.refusals[0]
    assert ledger.request_ids.tolist() == [1, 2]
    before = state(ledger, table)
    with pytest.raises(
        ValueError,
        match=r"plan row 0 \(resident 0, request 1\) would hold 4 "
        r"tokens of KV; allowed: at most the 0",
    ):
        ledger.step(planner, np.zeros(2, dtype=bool))
    assert state(ledger, table) == before
    assert table.ensure(0, 8)  # the caller puts the pages back
    ledger.step(planner, np.zeros(2, dtype=bool))
    ledger.retire([1, 2])
    assert table.page_counts.tolist() == [0, 0, 0, 3]  # what plan() grew past the rows stays
    ledger.submit(3, 4, max_new_tokens=8)  # 3 pages: the slot holds them already
    ledger.submit(4, 4, max_new_tokens=4)
    ledger.submit(5, 4, max_new_tokens=4)
    ledger.submit(6, 4, max_new_tokens=4)
    assert ledger.admit() == [3, 4, 5, 6]
    assert table.page_counts.tolist() == [3, 2, 2, 3]  # slot 3 kept its 3 pages, never shrunk
    table.check()
