"""The ledger as a state machine against a plain model of SPEC §6 and its admission rules.

Hypothesis drives long mixed sequences of submit / cancel / admit / step / fused step / apply
with the sampler's mask / retire_finished / retire / retire_rows / load (the states a serving
loop reaches after many steps, which example tests and the fuzzer rarely reach), and after every
operation the ledger must hold exactly what the model holds: the same requests, each once, with
the same row values and output counts, and the same queue in the same order. It runs on the
compiled ledger and on the pure-Python twin.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
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
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner import _core_py as _reference
from stepplanner._errors import QueueFullError
from stepplanner.ledger import RESIDENT_FIELDS
from stepplanner.ledger import _ledger_py as _ledger_reference
from stepplanner.planner.checks import check_plan

REFUSALS = (TypeError, ValueError, OverflowError, QueueFullError)


@dataclass
class Waiting:
    rid: int
    prompt_length: int
    priority: int
    arrival: int
    max_new: int  # 0: no limit
    lora: int  # its adapter, 0: the base model


class LedgerMachine(RuleBasedStateMachine):
    """Model: ``resident`` maps request id -> row dict; ``waiting`` is a plain list; ``accounts``
    maps resident id -> [tokens emitted, max_new (0: none), done]."""

    impl = "python"

    @initialize(
        b=st.integers(1, 6),
        s_in=st.integers(1, 48),
        page=st.integers(1, 16),
        by_priority=st.booleans(),
        pause=st.booleans(),
        max_pause=st.integers(0, 3),
        reserved=st.integers(0, 5),
        max_waiting=st.integers(0, 12),
        max_loras=st.sampled_from([None, 1, 2]),
    )
    def start(self, b, s_in, page, by_priority, pause, max_pause, reserved, max_waiting, max_loras):
        # Limits with rd(T_max) < B + P admit no policy; those are the config layer's tests.
        s_in = max(s_in, 2 * page + 1)
        self.limits = StepPlannerLimits(b, s_in, page)
        self.policy = resolve_scheduling_policy(
            SchedulingOptions(
                scheduling_policy=SchedulingPolicy.PRIORITY
                if by_priority
                else SchedulingPolicy.FCFS,
                preemption=PreemptionMode.PAUSE if pause else PreemptionMode.NONE,
                max_pause_steps=max_pause,
                priority_reserved_slots=min(reserved, b - 1),
            ),
            self.limits,
        )
        if self.impl == "compiled":
            from stepplanner import _core
            from stepplanner.ledger import _ledger as _ledger_core

            ledger_type, planner_type = _ledger_core.Ledger, _core.StepPlanner
        else:
            ledger_type, planner_type = _ledger_reference.Ledger, _reference.StepPlanner
        self.ledger = ledger_type(
            self.limits, self.policy, max_waiting=max_waiting, max_loras=max_loras
        )
        self.planner = planner_type(self.policy, self.limits)
        # Plans for refused calls come from another planner: planning on the ledger's own
        # between two step() calls changes its pending plan, which step() then refuses.
        self.side_planner = planner_type(self.policy, self.limits)
        self.max_waiting = max_waiting
        self.max_loras = max_loras or 0
        self.lora_of: dict[int, int] = {}  # request id -> its adapter
        self.resident: dict[int, dict] = {}
        self.accounts: dict[int, list[int]] = {}
        self.waiting: list[Waiting] = []
        self.pending = None  # (plan rows as dicts, paused, ids) of a step() not yet applied
        self.cancelled: set[int] = set()  # residents cancelled while a plan was pending
        self.next_id = 0
        self.next_arrival = 0

    # --- the model's own rules ----------------------------------------------------------------

    def _key(self, w: Waiting) -> tuple:
        return (w.priority, w.arrival) if self.ledger.by_priority else (w.arrival,)

    def _admit_model(self) -> list[int]:
        admitted = []
        # LoRA: the residents hold at most max_loras distinct adapters; a request whose adapter
        # cannot join is passed over this pass (it keeps its place), and the queue read on.
        held = {self.lora_of[rid] for rid in self.resident} - {0}
        candidates = list(self.waiting)
        while len(self.resident) < self.limits.max_batch_size and candidates:
            free = self.limits.max_batch_size - len(self.resident)
            best = min(candidates, key=self._key)
            if best.priority >= 0 and free <= self.ledger.reserved_slots:
                urgent = [w for w in candidates if w.priority < 0]
                if not urgent:
                    break
                best = min(urgent, key=self._key)
            candidates.remove(best)
            if self.max_loras and best.lora and best.lora not in held:
                if len(held) == self.max_loras:
                    continue
                held.add(best.lora)
            self.waiting.remove(best)
            self.resident[best.rid] = {
                "priority": best.priority,
                "arrival": best.arrival,
                "prompt_length": best.prompt_length,
                "committed": 0,
                "context_committed": False,
                "consecutive_paused_steps": 0,
            }
            self.accounts[best.rid] = [0, best.max_new, 0]
            admitted.append(best.rid)
        return admitted

    def _apply_model(
        self,
        ids: list[int],
        sequences: list,
        paused: set,
        mask: np.ndarray | None,
        retire: bool,
        accepted: np.ndarray | None = None,
    ) -> list[int]:
        """SPEC §6 (§8: a decode row commits and emits 1 + its accepted drafts) and the output
        accounting, written out; returns the finished ids."""
        finished = []
        for k, seq in enumerate(sequences):
            rid = ids[seq["resident"]]
            row = self.resident[rid]
            decode = seq["work"] == "DECODE"
            taken = 1 + int(accepted[k]) if decode and accepted is not None else seq["query_length"]
            row["committed"] += taken
            if seq["select_last_token_logits"]:
                row["context_committed"] = True
                account = self.accounts[rid]
                account[0] += taken if decode else 1
                hit = (account[1] and account[0] >= account[1]) or (mask is not None and mask[k])
                if hit and not account[2]:
                    account[2] = 1
                    finished.append(rid)
        for i, rid in enumerate(ids):
            row = self.resident[rid]
            row["consecutive_paused_steps"] = (
                row["consecutive_paused_steps"] + 1 if i in paused else 0
            )
        if retire:
            self._retire_done()
        self._drop_cancelled()
        self.pending = None
        return finished

    def _retire_done(self) -> None:
        for rid in [r for r, a in self.accounts.items() if a[2]]:  # the cancelled are done too
            del self.resident[rid], self.accounts[rid]
        self.cancelled.clear()

    def _drop_cancelled(self) -> None:
        """A resident cancelled while a plan was pending leaves at the next call that ends that
        plan (never reported finished): at once if the call moves rows."""
        for rid in self.cancelled:
            del self.resident[rid], self.accounts[rid]
        self.cancelled.clear()

    def _mask(self, data, sequences: list) -> np.ndarray | None:
        if data.draw(st.booleans()):
            return None
        emits = [bool(s["select_last_token_logits"]) for s in sequences]
        return np.array([e and data.draw(st.booleans()) for e in emits], dtype=bool)

    def _plan_rows(self, plan) -> tuple[list, set]:
        d = plan.to_dict()
        return d["sequences"], set(d["paused"])

    # --- rules ------------------------------------------------------------------------------

    @rule(data=st.data(), burst=st.integers(1, 4))
    def submit(self, data, burst):
        for _ in range(burst):
            length = data.draw(st.integers(1, self.limits.max_input_length))
            priority = data.draw(st.integers(-2, 2))
            max_new = data.draw(st.one_of(st.none(), st.integers(1, 4)))
            lora = data.draw(st.integers(0, 3))
            if len(self.waiting) >= self.max_waiting:
                with pytest.raises(QueueFullError, match="max_waiting"):
                    self.ledger.submit(self.next_id, length, priority, max_new, lora_id=lora)
                return
            arrival = self.ledger.submit(self.next_id, length, priority, max_new, lora_id=lora)
            assert arrival == self.next_arrival
            self.lora_of[self.next_id] = lora
            self.waiting.append(
                Waiting(self.next_id, length, priority, arrival, max_new or 0, lora)
            )
            self.next_id += 1
            self.next_arrival += 1

    @precondition(lambda self: self.waiting or self.resident)
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(
            st.sampled_from(sorted([w.rid for w in self.waiting] + list(self.resident)))
        )
        if rid in self.cancelled:
            with pytest.raises(ValueError, match="is not waiting or resident"):
                self.ledger.cancel(rid)
            return
        self.ledger.cancel(rid)
        if rid in self.resident and self.pending is not None:
            self.cancelled.add(rid)  # rows stay as the pending plan has them
            self.accounts[rid][2] = 1  # done: never reported finished
        elif rid in self.resident:
            del self.resident[rid], self.accounts[rid]
        else:
            self.waiting = [w for w in self.waiting if w.rid != rid]

    @rule()
    def admit(self):
        self._drop_cancelled()
        assert self.ledger.admit() == self._admit_model()
        self.pending = None

    @precondition(lambda self: self.ledger.count > 0)
    @rule(data=st.data(), retire=st.booleans())
    def plan_and_apply(self, data, retire):
        ids = self.ledger.request_ids.tolist()
        drafts = self._drafts(data, ids)
        plan = self.planner.plan(self.ledger.residents, drafts=drafts)
        check_plan(self.policy, self.limits, self.ledger.residents, plan, drafts=drafts)
        sequences, paused = self._plan_rows(plan)
        mask = self._mask(data, sequences)
        accepted = None
        if drafts is not None and data.draw(st.booleans()):
            accepted = np.array(
                [
                    data.draw(st.integers(0, s["query_length"] - 1)) if s["work"] == "DECODE" else 0
                    for s in sequences
                ],
                dtype=np.int32,
            )
        got = self.ledger.apply(plan, mask, accepted=accepted, retire=retire).tolist()
        assert got == self._apply_model(ids, sequences, paused, mask, retire, accepted)

    def _drafts(self, data, ids: list[int]) -> list[int] | None:
        """None, or drafts for each decoding row that cannot take it past max_new_tokens."""
        if not data.draw(st.booleans()):
            return None
        rows = self.ledger.residents
        out = []
        for i, rid in enumerate(ids):
            emitted, max_new, done = self.accounts[rid]
            room = max_new - emitted - 1 if max_new else 6
            ok = rows[i]["context_committed"] and not done and room > 0
            out.append(data.draw(st.integers(0, min(room, 6))) if ok else 0)
        return out

    @rule()
    def retire_finished(self):
        self.ledger.retire_finished()
        self._retire_done()
        self.pending = None

    @rule(data=st.data())
    def fused_step(self, data):
        mask = None
        if self.pending is not None:
            ids, sequences, paused = self.pending
            mask = self._mask(data, sequences)
        plan = self.ledger.step(self.planner, mask)
        if self.pending is not None:
            finished = self._apply_model(ids, sequences, paused, mask, retire=True)
            assert self.ledger.finished_ids.tolist() == finished
        assert self.ledger.admitted_ids.tolist() == self._admit_model()
        check_plan(self.policy, self.limits, self.ledger.residents, plan)
        sequences, paused = self._plan_rows(plan)
        self.pending = (self.ledger.request_ids.tolist(), sequences, paused)

    @precondition(lambda self: self.ledger.count > 0)
    @rule(data=st.data())
    def retire(self, data):
        ids = data.draw(
            st.lists(
                st.sampled_from(sorted(self.resident)),
                min_size=1,
                max_size=len(self.resident),
                unique=True,
            )
        )
        self.ledger.retire(ids)
        for rid in ids:
            del self.resident[rid], self.accounts[rid]
        self.cancelled -= set(ids)
        self._drop_cancelled()
        self.pending = None

    @precondition(lambda self: self.ledger.count > 0)
    @rule(data=st.data())
    def retire_rows(self, data):
        rows = data.draw(
            st.lists(
                st.integers(0, self.ledger.count - 1),
                min_size=1,
                max_size=self.ledger.count,
                unique=True,
            )
        )
        ids = self.ledger.request_ids.tolist()
        self.ledger.retire_rows(rows)
        for row in rows:
            del self.resident[ids[row]], self.accounts[ids[row]]
        self.cancelled -= {ids[row] for row in rows}
        self._drop_cancelled()
        self.pending = None

    @rule()
    def snapshot_round_trip(self):
        self.ledger.load(self.ledger.to_records())  # rows unchanged; accounting starts afresh
        for account in self.accounts.values():
            account[:] = [0, 0, 0]
        self.cancelled.clear()  # load() takes the records as given: cancelled rows included
        self.pending = None

    @rule(data=st.data())
    def refused_operations_change_nothing(self, data):
        before = self._snapshot()
        waiting_stamp = min((w.arrival for w in self.waiting), default=None)
        n = self.ledger.count
        call = data.draw(
            st.sampled_from(
                [
                    lambda: self.ledger.submit(self.next_id, self.limits.max_input_length + 1),
                    lambda: self.ledger.submit(self.next_id, 0),
                    lambda: self.ledger.submit(self.next_id, 1, 0, 0),
                    lambda: self.ledger.submit(self.next_id, 1, lora_id=-1),
                    lambda: self.ledger.submit(
                        next(iter(self.resident), -1) if self.resident else "id", 1
                    ),
                    lambda: self.ledger.cancel(self.next_id),
                    lambda: self.ledger.retire([self.next_id]),
                    lambda: self.ledger.retire_rows([self.ledger.count]),
                    lambda: self.ledger.load(
                        [{"request_id": w.rid} for w in self.waiting[:1]]
                        or [{"arrival": 0}, {"arrival": 0}]
                    ),
                    lambda: self.ledger.load(
                        [{"arrival": waiting_stamp, "prompt_length": 1}]
                        if waiting_stamp is not None
                        else [{"bogus": 1}]
                    ),
                    lambda: self.ledger.apply(
                        self.side_planner.plan(self.ledger.residents), np.ones(n + 1, dtype=bool)
                    ),
                    lambda: self.ledger.apply(
                        self.side_planner.plan(self.ledger.residents), np.zeros(n, dtype=np.int8)
                    ),
                    lambda: self.ledger.step(self.planner, [True]),
                ]
            )
        )
        try:
            call()
        except REFUSALS:
            pass
        else:
            raise AssertionError("a bad ledger operation was accepted")
        assert self._snapshot() == before

    def _snapshot(self) -> tuple:
        return (
            self.ledger.to_records(),
            self.ledger.waiting_ids(),
            self.ledger.output_tokens.tolist(),
            self.ledger.waiting,
        )

    # --- what must hold after every operation ---------------------------------------------------

    @invariant()
    def holds_what_the_model_holds(self):
        records = self.ledger.to_records()
        got = {r["request_id"]: {f: r[f] for f in RESIDENT_FIELDS} for r in records}
        assert len(got) == len(records) == self.ledger.count  # each request once
        assert got == self.resident
        loras = {r["request_id"]: r.get("lora_id", 0) for r in records}
        assert loras == {rid: self.lora_of[rid] for rid in self.resident}
        if self.max_loras:
            assert len(set(loras.values()) - {0}) <= self.max_loras
        tokens = dict(zip(self.ledger.request_ids.tolist(), self.ledger.output_tokens.tolist()))
        assert tokens == {rid: a[0] for rid, a in self.accounts.items()}
        assert self.ledger.waiting_ids() == [w.rid for w in sorted(self.waiting, key=self._key)]
        assert self.ledger.waiting == len(self.waiting)


class CompiledLedgerMachine(LedgerMachine):
    impl = "compiled"


TestLedgerMachine = LedgerMachine.TestCase


@pytest.mark.skipif(
    os.environ.get("STEPPLANNER_IMPL", "").strip().lower() == "python",
    reason="STEPPLANNER_IMPL=python: reference-only run",
)
class TestCompiledLedgerMachine(CompiledLedgerMachine.TestCase):
    pass
