"""A Ledger with a page table, compiled and pure-Python side by side over random operation
sequences: every call must return the same value or raise the same error on both, and after
every call both must hold the same residents, queue, output counts and the same page table
(rows, counts, free pages). While nobody has touched the tables behind the ledgers' backs,
slot ``i`` must hold exactly the worst case of ledger row ``i`` and every slot past the last row
must be empty. A rule that does touch them (``release``/``ensure`` on a slot) checks that the
ledgers stay memory-safe and identical whatever the caller does to the table.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stepplanner import (
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner._errors import StepPlannerError

pytestmark = pytest.mark.skipif(
    os.environ.get("STEPPLANNER_IMPL", "").strip().lower() == "python",
    reason="STEPPLANNER_IMPL=python: reference-only run",
)


def _plain(value):
    """A value both implementations can be compared on."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


class PagedParity(RuleBasedStateMachine):
    @initialize(
        b=st.integers(1, 5),
        s_in=st.integers(1, 40),
        page=st.integers(1, 8),
        by_priority=st.booleans(),
        pause=st.booleans(),
        reserved=st.integers(0, 4),
        max_waiting=st.integers(1, 10),
        num_pages=st.integers(2, 40),
        row_pages=st.integers(2, 12),
        extra_slots=st.integers(0, 2),
    )
    def start(
        self,
        b,
        s_in,
        page,
        by_priority,
        pause,
        reserved,
        max_waiting,
        num_pages,
        row_pages,
        extra_slots,
    ):
        from stepplanner import _core
        from stepplanner import _core_py as _reference
        from stepplanner.kv import _kv
        from stepplanner.kv import _kv_py as _kv_reference
        from stepplanner.ledger import _ledger as _ledger_core
        from stepplanner.ledger import _ledger_py as _ledger_reference

        s_in = max(s_in, 2 * page + 1)
        self.limits = StepPlannerLimits(b, s_in, page)
        policy = resolve_scheduling_policy(
            SchedulingOptions(
                scheduling_policy=SchedulingPolicy.PRIORITY
                if by_priority
                else SchedulingPolicy.FCFS,
                preemption=PreemptionMode.PAUSE if pause else PreemptionMode.NONE,
                priority_reserved_slots=min(reserved, b - 1),
            ),
            self.limits,
        )
        shape = (b + extra_slots, row_pages, num_pages, page)
        self.tables = (_kv.KVPageTable(*shape), _kv_reference.KVPageTable(*shape))
        self.ledgers = tuple(
            ledger_type(self.limits, policy, max_waiting=max_waiting, page_table=table)
            for ledger_type, table in zip(
                (_ledger_core.Ledger, _ledger_reference.Ledger), self.tables
            )
        )
        self.planners = (
            _core.StepPlanner(policy, self.limits),
            _reference.StepPlanner(policy, self.limits),
        )
        self.most_tokens = min(row_pages, num_pages) * page
        self.tokens: dict[int, int] = {}  # request id -> its worst case, once submitted
        self.next_id = 0
        self.rows_pending: int | None = None  # plan rows of a step() not yet applied
        self.tampered = False

    def both(self, call):
        """``call(ledger, table, planner)`` on each implementation: the same value or the same
        error (type and message) on both."""
        outcomes = []
        for ledger, table, planner in zip(self.ledgers, self.tables, self.planners):
            try:
                outcomes.append(("ok", _plain(call(ledger, table, planner))))
            except (StepPlannerError, TypeError, ValueError, OverflowError) as exc:
                outcomes.append((type(exc).__name__, str(exc)))
        assert outcomes[0] == outcomes[1]
        event(
            outcomes[0][0]
            if outcomes[0][0] == "ok"
            else "".join(c for c in outcomes[0][1][:50] if not c.isdigit())
        )
        return outcomes[0]

    # --- rules ----------------------------------------------------------------------------------

    @rule(data=st.data(), burst=st.integers(1, 3))
    def submit(self, data, burst):
        for _ in range(burst):
            if data.draw(st.integers(0, 3)):  # mostly a request some row can hold
                rid = self.next_id
                length = data.draw(
                    st.integers(1, min(self.limits.max_input_length, self.most_tokens - 1) or 1)
                )
                new = data.draw(st.integers(1, max(self.most_tokens - length, 1)))
            else:
                rid = data.draw(st.integers(-1, self.next_id))
                length = data.draw(st.integers(0, self.limits.max_input_length + 1))
                new = data.draw(
                    st.one_of(st.none(), st.integers(1, self.most_tokens + 2), st.just(2**31))
                )
            priority = data.draw(st.integers(-2, 2))
            # both() calls it at once, for each ledger, before the loop moves on.
            outcome = self.both(lambda ledger, *_: ledger.submit(rid, length, priority, new))  # noqa: B023
            if outcome[0] == "ok":
                self.tokens[rid] = length + new
                self.next_id = max(self.next_id, rid + 1)

    @rule(data=st.data())
    def cancel(self, data):
        known = sorted(
            set(self.ledgers[0].request_ids.tolist()) | set(self.ledgers[0].waiting_ids())
        )
        if known and data.draw(st.integers(0, 3)):
            rid = data.draw(st.sampled_from(known))
        else:
            rid = data.draw(st.integers(-1, self.next_id + 1))
        # A resident cancelled while a step() plan is pending leaves with that plan, which
        # stays pending (rows do not move under it).
        self.both(lambda ledger, *_: ledger.cancel(rid))

    @rule()
    def admit(self):
        self.both(lambda ledger, *_: ledger.admit())
        self.rows_pending = None

    def _mask(self, data, rows):
        if rows is None or data.draw(st.booleans()):
            return None
        return np.array(
            data.draw(st.lists(st.booleans(), min_size=rows, max_size=rows)), dtype=bool
        )

    @rule(data=st.data(), retire=st.booleans())
    def plan_and_apply(self, data, retire):
        plans = [
            planner.plan(ledger.residents) for ledger, planner in zip(self.ledgers, self.planners)
        ]
        assert plans[0].to_dict() == plans[1].to_dict()
        mask = self._mask(data, plans[0].num_prefill + plans[0].num_decode)
        if mask is not None:  # only rows that emit may finish
            mask &= plans[0].as_array()["select_last_token_logits"].astype(bool)
        by_ledger = dict(zip(map(id, self.ledgers), plans))
        if (
            self.both(lambda ledger, *_: ledger.apply(by_ledger[id(ledger)], mask, retire=retire))[
                0
            ]
            == "ok"
        ):
            self.rows_pending = None

    @rule(data=st.data())
    def fused_step(self, data):
        mask = self._mask(data, self.rows_pending)
        outcome = self.both(lambda ledger, _, planner: ledger.step(planner, mask))
        if outcome[0] == "ok":
            plan = outcome[1]
            self.rows_pending = len(plan["sequences"])

    @rule()
    def retire_finished(self):
        self.both(lambda ledger, *_: ledger.retire_finished())
        self.rows_pending = None

    @precondition(lambda self: self.ledgers[0].count > 0)
    @rule(data=st.data())
    def retire(self, data):
        ids = data.draw(
            st.lists(st.sampled_from(self.ledgers[0].request_ids.tolist()), min_size=1, unique=True)
        )
        if self.both(lambda ledger, *_: ledger.retire(ids))[0] == "ok":
            self.rows_pending = None

    @rule(data=st.data())
    def retire_rows(self, data):
        count = self.ledgers[0].count
        if count and data.draw(st.integers(0, 3)):
            rows = data.draw(st.lists(st.integers(0, count - 1), min_size=1, unique=True))
        else:
            rows = data.draw(st.lists(st.integers(0, count), max_size=count + 1))
        if self.both(lambda ledger, *_: ledger.retire_rows(rows))[0] == "ok":
            self.rows_pending = None

    @rule()
    def load_is_refused(self):
        outcome = self.both(lambda ledger, *_: ledger.load(ledger.to_records()))
        assert outcome[0] == "StepPlannerValueError" and "page_table" in outcome[1]

    @rule(data=st.data(), grow=st.booleans())
    def touch_the_table(self, data, grow):
        """The caller changes a slot behind the ledgers' backs: never a crash, and both ledgers
        go on identically (a plan that then outgrows its row's pages is refused)."""
        slot = data.draw(st.integers(0, self.tables[0].max_batch_size - 1))
        tokens = data.draw(
            st.integers(0, self.tables[0].max_pages_per_sequence * self.tables[0].kv_page_size)
        )
        self.tampered = True
        if grow:
            self.both(lambda _, table, __: table.ensure(slot, tokens))
        else:
            self.both(lambda _, table, __: table.release(slot))

    # --- what must hold after every operation -----------------------------------------------------

    @invariant()
    def identical(self):
        states = []
        for ledger, table in zip(self.ledgers, self.tables):
            table.check()
            states.append(
                (
                    ledger.to_records(),
                    ledger.waiting_ids(),
                    ledger.waiting,
                    ledger.count,
                    ledger.output_tokens.tolist(),
                    ledger.finished_ids.tolist(),
                    ledger.admitted_ids.tolist(),
                    ledger.reserved_pages,
                    ledger.held_back,
                    ledger.kv_pages_in_use(),
                    table.rows.tolist(),
                    table.page_counts.tolist(),
                    table.num_free_pages,
                )
            )
        assert states[0] == states[1]
        event(f"residents={self.ledgers[0].count} held_back>0={self.ledgers[0].held_back > 0}")

    @invariant()
    def slot_i_is_row_i(self):
        if self.tampered:
            return
        ledger, table = self.ledgers[0], self.tables[0]
        p = table.kv_page_size
        want = [-(-self.tokens[rid] // p) for rid in ledger.request_ids.tolist()]
        assert table.page_counts[: ledger.count].tolist() == want
        assert not table.page_counts[ledger.count :].any()
        assert ledger.reserved_pages == sum(want)


TestPagedParity = PagedParity.TestCase
TestPagedParity.settings = settings(stateful_step_count=100)


def _state(ledger, table):
    table.check()
    return (
        ledger.to_records(),
        ledger.waiting_ids(),
        ledger.output_tokens.tolist(),
        ledger.finished_ids.tolist(),
        ledger.admitted_ids.tolist(),
        ledger.reserved_pages,
        ledger.held_back,
        table.rows.tolist(),
        table.num_free_pages,
    )


@pytest.mark.parametrize("seed", range(6))
def test_long_serving_runs_stay_identical(seed):
    """A serving loop of a few thousand fused steps with arrivals, the sampler's early stops
    and cancellations, on both implementations: the same plans, finishes and page tables at
    every step, and every planned row within its row's pages."""
    from stepplanner import _core
    from stepplanner import _core_py as _reference
    from stepplanner.kv import _kv
    from stepplanner.kv import _kv_py as _kv_reference
    from stepplanner.ledger import _ledger as _ledger_core
    from stepplanner.ledger import _ledger_py as _ledger_reference

    rng = np.random.default_rng(seed)
    b, page = int(rng.integers(2, 9)), int(rng.choice([1, 4, 16]))
    limits = StepPlannerLimits(b, 64, page)
    policy = resolve_scheduling_policy(
        SchedulingOptions(
            scheduling_policy=SchedulingPolicy(seed % 2),
            priority_reserved_slots=seed % 2,
            preemption=PreemptionMode.PAUSE,
        ),
        limits,
    )
    row_pages = -(-96 // page)
    shape = (b, row_pages, int(rng.integers(row_pages, row_pages * (b // 2 + 1) + 1)), page)
    tables = (_kv.KVPageTable(*shape), _kv_reference.KVPageTable(*shape))
    ledgers = (
        _ledger_core.Ledger(limits, policy, max_waiting=4000, page_table=tables[0]),
        _ledger_reference.Ledger(limits, policy, max_waiting=4000, page_table=tables[1]),
    )
    planners = (_core.StepPlanner(policy, limits), _reference.StepPlanner(policy, limits))
    plans = [None, None]
    next_id = finished = steps_held = 0
    for _ in range(3000):
        for _ in range(int(rng.poisson(0.4))):
            args = (
                next_id,
                int(rng.integers(1, 65)),
                int(rng.integers(-1, 3)),
                int(rng.integers(1, 33)),
            )
            for ledger in ledgers:
                ledger.submit(*args)
            next_id += 1
        if rng.random() < 0.02 and ledgers[0].count:
            rid = int(rng.choice(ledgers[0].request_ids))
            for ledger in ledgers:
                ledger.cancel(rid)
            plans = [None, None]
        mask = None
        if plans[0] is not None:
            mask = (rng.random(plans[0].num_prefill + plans[0].num_decode) < 0.05) & plans[
                0
            ].as_array()["select_last_token_logits"].astype(bool)
        plans = [
            ledger.step(planner, mask if plan is not None else None)
            for ledger, planner, plan in zip(ledgers, planners, plans)
        ]
        assert plans[0].to_dict() == plans[1].to_dict()
        assert _state(ledgers[0], tables[0]) == _state(ledgers[1], tables[1])
        seq = plans[0].as_array()
        pages = tables[0].page_counts[seq["resident"]].astype(np.int64)
        assert (seq["past_length"].astype(np.int64) + seq["query_length"] <= pages * page).all()
        finished += ledgers[0].finished_ids.size
        steps_held += ledgers[0].held_back > 0
    assert finished > 100 and next_id > 500 and steps_held > 0  # pages held requests back at times
