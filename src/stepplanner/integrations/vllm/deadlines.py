"""EDF and DEADLINE: each request's objectives as the ledger's ranker reads them, the waiting
queue in first-token-deadline order (urgent, the rest, the relegated), the rows ranked each step
at ``now``, and under DEADLINE the requests that can no longer meet their objectives relegated and
handed back (docs/scheduling.md, "Overload")."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from vllm.config import VllmConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request, RequestStatus

from ...core import (
    SLO,
    ResidentState,
    ResolvedSchedulingPolicy,
    SchedulingPolicy,
    StepPlannerLimits,
)
from ...ledger import Ranker
from ...planner._slo import due_of, slo_fields
from ...planner._types import RESIDENT_DTYPE
from . import _compat
from .requests import NS


class _Deadlines:
    """One request's objectives as the ranker reads them (``Ranker.rank``'s columns)."""

    __slots__ = ("first_due", "gap", "stamp", "relegated", "ttft", "shed_at", "handed_back")

    def __init__(self, first_due: float, gap: float, stamp: int, ttft: float) -> None:
        self.first_due = first_due  # arrival + ttft; inf: no objectives
        self.gap = gap  # tpot; 0: none
        self.stamp = stamp  # arrival order key, as the rows' arrival under FCFS/PRIORITY
        self.relegated = False  # DEADLINE: sticky
        self.ttft = ttft  # inf: no objectives
        self.shed_at = math.inf  # relegated while waiting: when it is handed back
        self.handed_back = False

    def due(self, token: int) -> float:
        """When the request's token ``token`` (0 = the first) is due (its SLO's definition)."""
        return due_of(self.first_due, self.gap, token)


class DeadlineQueue(AsyncScheduler):
    """``StepPlannerScheduler``'s deadlines (EDF, DEADLINE): translated into the ranker's
    columns; set up only under those policies."""

    def _init_deadlines(
        self,
        vllm_config: VllmConfig,
        limits: StepPlannerLimits,
        policy: ResolvedSchedulingPolicy,
        relegation: dict[str, Any],
    ) -> None:
        # The ledger's rank pass over this class's own rows (no Ledger here), with the
        # step time measured from each step's now.
        self._ranker = Ranker(limits, policy, **relegation)
        # At most the earliest first-token deadline among waiting requests that may be
        # relegated: once now passes it, the queue is swept (the ledger's relegate_hopeless).
        self._earliest_due = math.inf
        b = limits.max_batch_size
        self._rank_rows = np.zeros(b, dtype=RESIDENT_DTYPE)
        self._rank_columns = (
            np.zeros(b),
            np.zeros(b),
            np.zeros(b, dtype=np.int64),
            np.zeros(b, dtype=np.uint64),
            np.zeros(b, dtype=np.uint8),
            np.zeros(b, dtype=np.int32),
        )
        self._by_class = policy.scheduling_policy == SchedulingPolicy.DEADLINE
        self._deadlines: dict[str, _Deadlines] = {}
        # Waiting requests in first-token-deadline order, as the ledger queues them: urgent
        # (priority < 0, which may take reserved slots), the rest, and the relegated (by
        # arrival, after every other). Entries ((class, due), stamp, seq, request), the class
        # 0 under EDF; one that left the waiting queue is dropped when it reaches the top.
        self._urgent: list[tuple[tuple[int, float], int, int, Request]] = []
        self._normal: list[tuple[tuple[int, float], int, int, Request]] = []
        self._losing: list[tuple[tuple[int, float], int, int, Request]] = []
        self._seq = 0
        self._examined: list[Request] = []  # waiting requests this step took off the heaps
        self._shed: list[str] = []  # the requests this step handed back
        # A request's step, the unit its deadlines are counted in, is one token of its own:
        # one engine step, or under pipeline parallelism as many as are in flight (it is in
        # one of them). The ranker measures it over that many schedule() calls, a sample only
        # when every one of them scheduled tokens.
        self._pace_steps = vllm_config.max_concurrent_batches if self._pipelined else 1
        self._stride = self._pace_steps - 1  # the first schedule() starts the clock
        self._ran = False

    def _add_deadlines(self, request: Request, slo: SLO | None) -> None:
        """A new request's objectives (its own, its class's or none), and its place in the
        waiting order."""
        first_due, gap = slo_fields(slo, request.arrival_time)
        self._deadlines[request.request_id] = _Deadlines(
            first_due, gap, int(request.arrival_time * NS), slo.ttft if slo else math.inf
        )
        self._enqueue(request)

    def _enqueue(self, request: Request) -> None:
        """Into the waiting order: relegated ones by arrival, the rest by the deadline of the
        token their next prefill ends with (the first, or after a recompute preemption the
        next one)."""
        record = self._deadlines[request.request_id]
        self._seq += 1
        if record.relegated:
            # By when it is handed back, as the ledger serves its relegated requests.
            heapq.heappush(self._losing, ((0, record.shed_at), record.stamp, self._seq, request))
        else:
            # The ledger's queue keys: DEADLINE by class, then deadline; EDF by deadline.
            due = record.due(request.num_output_tokens)
            if due < self._earliest_due and request.priority >= self._never_below:
                self._earliest_due = due
            key = (request.priority, due) if self._by_class else (0, due)
            heapq.heappush(
                self._urgent if request.priority < 0 else self._normal,
                (key, record.stamp, self._seq, request),
            )

    def _too_late(self, request: Request, due: float, now: float) -> bool:
        """Whether a waiting request can no longer make its first token by ``due``, served at
        once (the ranker's test), on the tokens it still computes: its prompt, less what a KV
        connector's landed load computed. A request still loading is never too late: its work is
        known once the load lands."""
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            return False
        work = request.num_tokens - request.num_computed_tokens
        return not self._ranker.admits(work, due, now, request.priority)

    def _waits_viable(self, entry: tuple[Any, int, int, Request]) -> bool:
        """An urgent/normal heap entry still stands: its request waits and was not relegated
        since (a relegated request has a newer entry in the relegated heap)."""
        request = entry[3]
        return self._waits(request) and not self._deadlines[request.request_id].relegated

    def _waits_relegated(self, entry: tuple[Any, int, int, Request]) -> bool:
        """A relegated-heap entry still stands: its request waits and was not handed back (it
        waits until update_from_output finishes it, and async scheduling may plan a step
        before that)."""
        request = entry[3]
        return self._waits(request) and not self._deadlines[request.request_id].handed_back

    def _relegate_waiting(self, request: Request, now: float, relegated: list[str]) -> None:
        record = self._deadlines[request.request_id]
        record.relegated = True
        record.shed_at = now + self._ranker.relegated_wait(record.ttft)
        relegated.append(request.request_id)
        self._enqueue(request)

    def _give_up(self, now: float, relegated: list[str]) -> None:
        """DEADLINE, before admission (the ledger's admission pass): relegate every waiting
        request that can no longer make its first token, wherever it stands in the queue, once
        now passes the earliest deadline that could be missed; then hand back every relegated
        request whose wait is over: it finishes with an error naming why, so a client or
        router can retry elsewhere (vLLM's queue is unbounded, so no request waits for a place)."""
        if now >= self._earliest_due:
            found: list[Request] = []
            earliest = math.inf
            for heap in (self._urgent, self._normal):
                for entry in heap:
                    request = entry[3]
                    if not self._waits_viable(entry) or request.priority < self._never_below:
                        continue
                    due = self._deadlines[request.request_id].due(request.num_output_tokens)
                    if self._too_late(request, due, now):
                        found.append(request)
                    elif due < earliest:
                        earliest = due
            self._earliest_due = earliest
            for request in sorted(found, key=lambda r: self._deadlines[r.request_id].stamp):
                self._relegate_waiting(request, now, relegated)
        losing = self._losing
        while losing:
            entry = heapq.heappop(losing)
            if not self._waits_relegated(entry):
                continue
            request = entry[3]
            record = self._deadlines[request.request_id]
            if record.shed_at > now:
                heapq.heappush(losing, entry)
                break
            self._hand_back(request, record)

    def _hand_back(self, request: Request, record: _Deadlines) -> None:
        """A relegated waiting request whose wait is over finishes with an error naming why
        (update_from_output finishes it); it is never admitted after this."""
        record.handed_back = True
        _compat.fail_request(
            self,
            request.request_id,
            f"StepPlannerScheduler: request {request.request_id}: relegated by the DEADLINE "
            "policy (it could no longer meet its objectives) and handed back unserved after "
            f"waiting {self._ranker.relegated_wait(record.ttft):.3g} s more; retry elsewhere",
        )
        self._shed.append(request.request_id)

    def _next_waiting(self, room: int) -> tuple[tuple[int, float], int, int, Request] | None:
        """The next waiting request in the ledger's queue order, off its heap, with ``room``
        free slots left: urgent and normal ones by deadline, a normal one only while more than
        the reserved slots are free; relegated ones after every other."""
        urgent, normal, losing = self._urgent, self._normal, self._losing
        for heap in (urgent, normal):
            while heap and not self._waits_viable(heap[0]):
                heapq.heappop(heap)
        while losing and not self._waits_relegated(losing[0]):
            heapq.heappop(losing)
        head = urgent if urgent and (not normal or urgent[0] < normal[0]) else normal
        if not head:
            if losing and (room > self._reserved or losing[0][3].priority < 0):
                return heapq.heappop(losing)
            return None
        if head is normal and room <= self._reserved:
            return heapq.heappop(urgent) if urgent else None
        return heapq.heappop(head)

    def _deadline_order(
        self, free: int, out: list[Any], now: float, relegated: list[str]
    ) -> Iterator[Request]:
        """Waiting requests in first-token-deadline order, taken off the heaps one at a time
        (``out``: the candidates so far). Under DEADLINE a prompt the ranker says cannot make its
        first token even if served at once is relegated: it goes behind every request that
        still can, as the ledger's admission does."""
        while (entry := self._next_waiting(free - len(out))) is not None:
            request = entry[3]
            record = self._deadlines[request.request_id]
            due = record.due(request.num_output_tokens)
            if not record.relegated and self._too_late(request, due, now):
                self._relegate_waiting(request, now, relegated)
                if record.shed_at <= now:  # relegated_wait 0: handed back at once
                    self._hand_back(request, record)
                continue
            self._examined.append(request)  # back on a heap at the step's end unless admitted
            if self._admissible(request):  # RequestRows's rule, as in vLLM's queue order
                yield request

    def _requeue(self, admitted: list[Request]) -> None:
        """The waiting requests this step examined and did not admit go back in order."""
        taken = set(admitted)
        for request in self._examined:
            if request not in taken and self._waits(request):
                self._enqueue(request)
        self._examined = []
        if len(self._urgent) + len(self._normal) + len(self._losing) > 2 * len(self.requests) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the entries of requests that left while waiting (aborts), all at once."""
        for heap in (self._urgent, self._normal):
            heap[:] = [entry for entry in heap if self._waits_viable(entry)]
            heapq.heapify(heap)
        self._losing[:] = [entry for entry in self._losing if self._waits_relegated(entry)]
        heapq.heapify(self._losing)

    def _rank(
        self,
        residents: list[ResidentState],
        requests: list[Request],
        now: float,
        relegated: list[str],
    ) -> None:
        """Write the rows' priority and arrival from the requests' deadlines at ``now``,
        through the ranker (the ledger's own rank pass): the state translated, no policy here."""
        n = len(residents)
        if not n:
            return
        rows = self._rank_rows[:n]
        rows["prompt_length"] = [r.prompt_length for r in residents]
        rows["committed"] = [r.committed for r in residents]
        decoding = [r.context_committed for r in residents]
        rows["context_committed"] = decoding
        first_due, gap, generated, stamp, lost, classes = (a[:n] for a in self._rank_columns)
        records = [self._deadlines[r.request_id] for r in requests]
        # One token per step in flight (async: at most one), whatever drafts it verifies.
        emitted = [r.num_output_tokens + min(r.num_output_placeholders, 1) for r in requests]
        # A decode row's next token is due by first_due and the tokens emitted; a prefill's
        # (a recompute preemption's re-prefill included) by the token it ends with.
        first_due[:] = [
            d.first_due if decode else d.due(k) for d, decode, k in zip(records, decoding, emitted)
        ]
        gap[:] = [d.gap for d in records]
        generated[:] = emitted
        stamp[:] = [d.stamp for d in records]
        lost[:] = [d.relegated for d in records]
        classes[:] = [r.priority for r in requests]
        for i in self._ranker.rank(
            rows, first_due, gap, generated, stamp, lost, now, classes=classes
        ).tolist():
            records[i].relegated = True
            relegated.append(requests[i].request_id)
        for row, priority, arrival in zip(
            residents, rows["priority"].tolist(), rows["arrival"].tolist()
        ):
            row.priority = priority
            row.arrival = arrival
