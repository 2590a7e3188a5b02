"""The ledger as a state machine against a plain model of SPEC §6 and its admission rules.

Hypothesis drives long mixed sequences of submit / admit / step / retire / retire_rows / load
(the states a serving loop reaches after many steps, which example tests and the fuzzer rarely
reach), and after every operation the ledger must hold exactly what the model holds: the same
requests, each once, with the same row values, and the same queue in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from stepplanner import (
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlanner,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner.checks import check_plan
from stepplanner.ledger import RESIDENT_FIELDS, Ledger


@dataclass
class Waiting:
    rid: int
    prompt_length: int
    priority: int
    arrival: int


class LedgerMachine(RuleBasedStateMachine):
    """Model: ``resident`` maps request id -> row dict; ``waiting`` is a plain list."""

    @initialize(b=st.integers(1, 6), s_in=st.integers(1, 48), page=st.integers(1, 16),
                by_priority=st.booleans(), pause=st.booleans(), max_pause=st.integers(0, 3),
                reserved=st.integers(0, 5))
    def start(self, b, s_in, page, by_priority, pause, max_pause, reserved):
        # Limits with rd(T_max) < B + P admit no policy; those are the config layer's tests.
        s_in = max(s_in, 2 * page + 1)
        self.limits = StepPlannerLimits(b, s_in, page)
        self.policy = resolve_scheduling_policy(SchedulingOptions(
            scheduling_policy=SchedulingPolicy.PRIORITY if by_priority else SchedulingPolicy.FCFS,
            preemption=PreemptionMode.PAUSE if pause else PreemptionMode.NONE,
            max_pause_steps=max_pause, priority_reserved_slots=min(reserved, b - 1)),
            self.limits)
        self.ledger = Ledger(self.limits, self.policy)
        self.planner = StepPlanner(self.policy, self.limits)
        self.resident: dict[int, dict] = {}
        self.waiting: list[Waiting] = []
        self.next_id = 0
        self.next_arrival = 0

    # --- the model's own admission rule -------------------------------------------------------

    def _key(self, w: Waiting) -> tuple:
        return (w.priority, w.arrival) if self.ledger.by_priority else (w.arrival,)

    def _admit_model(self) -> list[int]:
        admitted = []
        while len(self.resident) < self.limits.max_batch_size and self.waiting:
            free = self.limits.max_batch_size - len(self.resident)
            best = min(self.waiting, key=self._key)
            if best.priority >= 0 and free <= self.ledger.reserved_slots:
                urgent = [w for w in self.waiting if w.priority < 0]
                if not urgent:
                    break
                best = min(urgent, key=self._key)
            self.waiting.remove(best)
            self.resident[best.rid] = {
                "priority": best.priority, "arrival": best.arrival,
                "prompt_length": best.prompt_length, "committed": 0,
                "context_committed": False, "consecutive_paused_steps": 0}
            admitted.append(best.rid)
        return admitted

    # --- rules ------------------------------------------------------------------------------

    @rule(data=st.data(), burst=st.integers(1, 4))
    def submit(self, data, burst):
        for _ in range(burst):
            length = data.draw(st.integers(1, self.limits.max_input_length))
            priority = data.draw(st.integers(-2, 2))
            arrival = self.ledger.submit(self.next_id, length, priority)
            assert arrival == self.next_arrival
            self.waiting.append(Waiting(self.next_id, length, priority, arrival))
            self.next_id += 1
            self.next_arrival += 1

    @rule()
    def admit(self):
        assert self.ledger.admit() == self._admit_model()

    @precondition(lambda self: self.ledger.count > 0)
    @rule(steps=st.integers(1, 3))
    def step(self, steps):
        for _ in range(steps):
            ids = self.ledger.request_ids.tolist()
            plan = self.planner.plan(self.ledger.residents)
            check_plan(self.policy, self.limits, self.ledger.residents, plan)
            expected = {rid: dict(self.resident[rid]) for rid in ids}
            for seq in plan.sequences:  # SPEC §6, written out
                row = expected[ids[seq.resident]]
                row["committed"] += seq.query_length
                if seq.select_last_token_logits:
                    row["context_committed"] = True
            paused = set(plan.paused)
            for i, rid in enumerate(ids):
                row = expected[rid]
                row["consecutive_paused_steps"] = (row["consecutive_paused_steps"] + 1
                                                   if i in paused else 0)
            self.ledger.apply(plan)
            self.resident.update(expected)

    @precondition(lambda self: self.ledger.count > 0)
    @rule(data=st.data())
    def retire(self, data):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.resident)), min_size=1,
                                 max_size=len(self.resident), unique=True))
        self.ledger.retire(ids)
        for rid in ids:
            del self.resident[rid]

    @precondition(lambda self: self.ledger.count > 0)
    @rule(data=st.data())
    def retire_rows(self, data):
        rows = data.draw(st.lists(st.integers(0, self.ledger.count - 1), min_size=1,
                                  max_size=self.ledger.count, unique=True))
        ids = self.ledger.request_ids.tolist()
        self.ledger.retire_rows(rows)
        for row in rows:
            del self.resident[ids[row]]

    @rule()
    def snapshot_round_trip(self):
        self.ledger.load(self.ledger.to_records())  # the model does not change

    @rule(data=st.data())
    def refused_operations_change_nothing(self, data):
        before = (self.ledger.to_records(), self.ledger.waiting_ids())
        call = data.draw(st.sampled_from([
            lambda: self.ledger.submit(self.next_id, self.limits.max_input_length + 1),
            lambda: self.ledger.submit(self.next_id, 0),
            lambda: self.ledger.retire([self.next_id]),
            lambda: self.ledger.retire_rows([self.ledger.count]),
            lambda: self.ledger.load([{"request_id": w.rid} for w in self.waiting[:1]]
                                     or [{"arrival": 0}, {"arrival": 0}]),
        ]))
        try:
            call()
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            raise AssertionError("a bad ledger operation was accepted")
        assert (self.ledger.to_records(), self.ledger.waiting_ids()) == before

    # --- what must hold after every operation ---------------------------------------------------

    @invariant()
    def holds_what_the_model_holds(self):
        records = self.ledger.to_records()
        got = {r["request_id"]: {f: r[f] for f in RESIDENT_FIELDS} for r in records}
        assert len(got) == len(records) == self.ledger.count  # each request once
        assert got == self.resident
        assert self.ledger.waiting_ids() == [w.rid for w in sorted(self.waiting, key=self._key)]


TestLedgerMachine = LedgerMachine.TestCase
