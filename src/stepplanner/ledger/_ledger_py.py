"""The pure-Python twin of the compiled ledger (``stepplanner.ledger._ledger``): same surface, same
behaviour, same messages; the tests hold the two to each other. See ``stepplanner.ledger`` for
what a ledger is and the decisions behind it; the checks both share are in ``_shared``.
"""

from __future__ import annotations

import collections
import functools
import heapq
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, SupportsIndex, TypeVar

import numpy as np

from .. import _errors
from ..planner._fields import as_int32
from ..planner._policy import ResolvedSchedulingPolicy, StepPlannerLimits
from ..planner._slo import due_of
from ..planner._types import RESIDENT_DTYPE, RESIDENT_FIELDS, SEQUENCE_DTYPE, SequenceWork
from ._shared import (
    CLASS_SPAN,
    EDF_SPAN,
    KEY_NONE,
    KEY_SPAN,
    KEY_ZERO,
    LEVEL_AT_RISK,
    LEVEL_DUE,
    LEVEL_RELEGATED,
    LEVEL_SLACK,
    LEVEL_STRIDE,
    NEVER_RELEGATE_BELOW,
    RANK_DEADLINE,
    RANK_EDF,
    RANK_NONE,
    STEP_TIME_WEIGHT,
    UINT64_MAX,
    AdapterSlots,
    AdmissionOrder,
    DeadlineArgs,
    accepted_counts,
    admission_now,
    as_cached_tokens,
    as_lora_id,
    as_request_id,
    as_time,
    check_admits_args,
    check_constructor,
    check_deadline_args,
    check_ledger_args,
    check_page_table,
    check_pending,
    check_rank_arrays,
    check_relegation_args,
    check_rows,
    check_waiting,
    check_worst_case,
    draft_request,
    emitted_tokens,
    finished_mask,
    optional_now,
    pages_in_use,
    parse_records,
    plan_classes,
    plan_rows_in_range,
    plan_version,
    read_only,
    records_of,
    request_deadlines,
    rows_argument,
    step_reasons_error,
    submission,
)

__all__ = ["Ledger", "RESIDENT_FIELDS", "Ranker"]

# --- the twin -----------------------------------------------------------------------------------

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _kv_modules() -> tuple[Any, ...]:
    """The KV modules whose page tables the twin drives: the compiled one when built, and the
    pure-Python one (``stepplanner.KVPageTable`` is either, as the install decides)."""
    from ..kv import _kv_py as reference

    try:
        from ..kv import _kv as compiled
    except ImportError:  # a pure-Python install
        return (reference,)
    return (compiled, reference)


def _kv_of(table: Any) -> Any:
    """The KV module of ``table``'s own class. The twin drives the table through that class's
    functions and reads its sizes with that module's ``geometry`` (the storage, as the compiled
    ledger reads the C struct), so a subclass's overridden properties or methods are never
    what it reads or calls."""
    return next(module for module in _kv_modules() if isinstance(table, module.KVPageTable))


# How a call takes the ledger's lock: as the compiled ledger's CALL_GUEST/QUIET/BUSY.
_GUEST = 0  # submit, cancel: from any thread; waits for the call running
_QUIET = 1  # runs no caller code: waits for a call on another thread
_BUSY = 2  # runs caller code: a call from another thread meanwhile is refused


def _exclusive(kind: int) -> Callable[[_Method], _Method]:
    """One call at a time, under the ledger's lock, taken as the compiled ledger's ``_acquire``
    takes it: a call that finds it held by its own thread is a re-entry from caller code the
    ledger runs (``__array__``, ``__index__``, a Mapping's ``__getitem__``, a planner) and is
    refused; held by another thread, ``submit``/``cancel`` wait, and the loop's calls wait unless
    the running call runs caller code (then they are refused, as before)."""

    def wrap(method: _Method) -> _Method:
        @functools.wraps(method)
        def call(self: Ledger, *args: Any, **kwargs: Any) -> Any:
            me = threading.get_ident()
            lock = self._lock
            if not lock.acquire(blocking=False):
                if self._holder == me or (kind != _GUEST and self._busy):
                    raise _errors.ledger_reentered()
                lock.acquire()
            self._holder, self._busy = me, kind == _BUSY
            try:
                return method(self, *args, **kwargs)
            finally:
                self._holder, self._busy = 0, False
                lock.release()

        return call  # type: ignore[return-value]

    return wrap


class Ledger:
    """Dense resident table, waiting queue and output accounting for one engine (pure Python).

    See ``stepplanner.ledger`` for the surface; this class and the compiled one behave alike.
    """

    _initialised = False

    def __init__(
        self,
        limits: StepPlannerLimits,
        policy: ResolvedSchedulingPolicy | None = None,
        *,
        max_waiting: int | None = None,
        page_table: Any = None,
        slo_classes: Mapping[int, Any] | None = None,
        step_time: tuple[float, float] | None = None,
        relegated_wait: float | None = None,
        never_relegate_below: int = NEVER_RELEGATE_BELOW,
        max_loras: SupportsIndex | None = None,
        admission: AdmissionOrder = AdmissionOrder.ARRIVAL,
        starvation_steps: SupportsIndex | None = None,
        starvation_seconds: float | None = None,
    ) -> None:
        if self._initialised:
            raise _errors.already_initialised("Ledger")
        (
            (self.by_priority, self.reserved_slots, self.max_waiting),
            deadlines,
            relegation,
            loras,
            (order, self._starve_after, self._by_seconds),
        ) = check_constructor(
            limits,
            policy,
            max_waiting,
            slo_classes,
            step_time,
            relegated_wait,
            never_relegate_below,
            max_loras,
            admission,
            starvation_steps,
            starvation_seconds,
        )
        self._max_loras = loras  # 0: no limit
        # Uncached work first (docs/scheduling.md): the waiting keys hold each request's
        # uncached prompt tokens, -1 once it has waited past the bound; _aging lists the
        # requests not yet starved in submission order (the compiled QueueC's ring).
        self._uncached = order == AdmissionOrder.UNCACHED_FIRST
        self._aging: collections.deque[tuple[int, int]] = collections.deque()
        self._passes = 0  # admission passes so far (the clock of starvation_steps)
        self._latest_since = -math.inf  # starvation_seconds: arrival times, never decreasing
        self._d = _Deadlines(limits, deadlines, relegation)
        self._ranking = self._d.ranking
        self._classes = deadlines[1]
        self._policy_name = policy.scheduling_policy.name if policy is not None else "FCFS"
        self._kv: Any = None
        if page_table is not None:
            check_page_table(
                page_table,
                limits,
                tuple(m.KVPageTable for m in _kv_modules()),
                "a stepplanner KVPageTable (kv._kv_py or kv._kv)",
                lambda table: _kv_of(table).geometry(table),
            )
            self._kv = _kv_of(page_table)
        self._table = page_table
        self.limits = limits
        b = limits.max_batch_size
        # The rows live in a bytearray that no one can resize while an array views it; every
        # view handed out is made from it afresh, so none reaches ``_rows`` through ``.base``
        # (whose dtype or shape a caller could otherwise change under the ledger).
        self._rows_memory = bytearray(b * RESIDENT_DTYPE.itemsize)
        self._rows = np.frombuffer(self._rows_memory, dtype=RESIDENT_DTYPE)
        self._ids = np.full(b, -1, dtype=np.int64)
        self._generated = np.zeros(b, dtype=np.int64)
        self._max_new = np.zeros(b, dtype=np.int64)  # 0: no limit
        self._done = np.zeros(b, dtype=bool)
        self._finished = np.zeros(b, dtype=np.int64)
        self._num_finished = 0
        self._admitted = np.zeros(b, dtype=np.int64)
        self._num_admitted = 0
        # Deadlines (docs/scheduling.md): per row, the first token's due time and the per-token
        # gap (inf, 0: no objectives), the submission stamp (the rows' arrival holds the rank
        # under EDF/DEADLINE) and whether DEADLINE relegated it.
        self._first_due = np.full(b, np.inf)
        self._gap = np.zeros(b)
        self._stamp = np.zeros(b, dtype=np.uint64)
        self._klass = np.zeros(b, dtype=np.int32)
        self._relegated = np.zeros(b, dtype=bool)
        self._lora = np.zeros(b, dtype=np.int64)  # each row's adapter (0: the base model)
        self._relegated_ids: list[int] = []
        self._count = 0
        self._next_arrival = 0
        # Two heaps so that an urgent request can be found behind a held-back head in O(log n);
        # a cancelled entry stays in its heap, marked dead, until it reaches the top.
        self._urgent: list[list[Any]] = []
        self._normal: list[list[Any]] = []
        self._losing: list[list[Any]] = []  # DEADLINE: relegated, by (shed_at, stamp)
        # At most the earliest first-token deadline that may be missed: the sweep's trigger.
        self._earliest = math.inf
        self._shed: list[int] = []  # the last loop call's shed ids, then those submit shed since
        self._shed_reported = 0
        self._waiting: dict[int, list[Any]] = {}  # id -> its live heap entry
        self._row_of: dict[int, int] = {}  # resident id -> row
        self._pending: Any = None  # the plan of step() not yet applied
        self._pending_version: int | None = 0  # its version when step() returned it
        self._cancelled: set[int] = set()  # rows cancelled while a plan was pending
        self._lock = threading.Lock()  # held by every call (see _exclusive)
        self._holder = 0  # the thread holding it (0: none)
        self._busy = False  # the holder runs caller code
        self._initialised = True

    # --- views ------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return len(self._rows)

    @property
    def count(self) -> int:
        return self._count

    @property
    def free_slots(self) -> int:
        return len(self._rows) - self._count

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def max_loras(self) -> int | None:
        return self._max_loras or None

    @property
    def relegated_waiting(self) -> int:
        return sum(1 for entry in self._losing if entry[6])

    @property
    def residents(self) -> np.ndarray:
        return np.frombuffer(self._rows_memory, dtype=RESIDENT_DTYPE, count=self._count)

    @property
    def request_ids(self) -> np.ndarray:
        return read_only(self._ids[: self._count])

    @property
    def output_tokens(self) -> np.ndarray:
        return read_only(self._generated[: self._count])

    @property
    def finished_ids(self) -> np.ndarray:
        return read_only(self._finished[: self._num_finished])

    @property
    def admitted_ids(self) -> np.ndarray:
        return read_only(self._admitted[: self._num_admitted])

    @property
    def relegated_ids(self) -> np.ndarray:
        return read_only(np.array(self._relegated_ids, dtype=np.int64))

    @property
    def shed_ids(self) -> np.ndarray:
        return read_only(np.array(self._shed[: self._shed_reported], dtype=np.int64))

    @property
    def step_time_estimate(self) -> float:
        return self._d.estimate_seconds()

    @property
    def page_table(self) -> Any:
        return self._table

    @property
    def reserved_pages(self) -> int:
        if self._table is None:
            return 0
        sizes = self._kv.geometry(self._table)
        return int(sizes.num_pages - sizes.num_free_pages)

    @property
    def held_back(self) -> int:
        # Without a page table nothing waits for pages: 0, read without the lock like
        # reserved_pages (as the compiled ledger does); with one it is a loop call.
        return 0 if self._table is None else self._held_back()

    @_exclusive(_QUIET)  # _next_heap pops cancelled entries: never beside a submit
    def _held_back(self) -> int:
        # The request admission takes next: the first whose adapter can join (the compiled
        # ledger's walk; the ones passed over go back as they were).
        slots = AdapterSlots(self._max_loras, self._lora[: self._count].tolist())
        passed: list[tuple[list[list[Any]], list[Any]]] = []
        try:
            while (heap := self._next_heap()) is not None:
                if slots.join(heap[0][12]):
                    return 0 if self._fits(heap[0]) else len(self._waiting)
                passed.append((heap, heapq.heappop(heap)))
            return 0
        finally:
            for heap, entry in passed:
                heapq.heappush(heap, entry)

    def kv_pages_in_use(self) -> int:
        return pages_in_use(self._rows["committed"][: self._count], self.limits.kv_page_size)

    def __repr__(self) -> str:
        return (
            f"Ledger(count={self._count}, capacity={self.capacity}, waiting={self.waiting}, "
            f"max_waiting={self.max_waiting}, reserved_slots={self.reserved_slots}, "
            f"order={self._order_name()})"
        )

    def _order_name(self) -> str:
        if self._ranking != RANK_NONE:
            return self._policy_name
        return "PRIORITY" if self.by_priority else "FCFS"

    # --- admission ----------------------------------------------------------------------------

    @_exclusive(_GUEST)
    def submit(
        self,
        request_id: int,
        prompt_length: int,
        priority: int = 0,
        max_new_tokens: int | None = None,
        *,
        arrival_time: float | None = None,
        slo: Any = None,
        lora_id: SupportsIndex = 0,
        cached_tokens: SupportsIndex = 0,
    ) -> int:
        rid, length, prio, limit = submission(
            request_id, prompt_length, priority, max_new_tokens, self.limits.max_input_length
        )
        lora = as_lora_id(lora_id)
        work = length - as_cached_tokens(cached_tokens, length)
        if self._by_seconds and arrival_time is None:
            raise _errors.arrival_time_for_starvation(rid)
        due, gap, ttft = request_deadlines(rid, prio, arrival_time, slo, self._classes)
        if self._table is not None:
            check_worst_case(rid, length, limit, self._kv.geometry(self._table))
        if rid in self._waiting or rid in self._row_of:
            raise _errors.duplicate_request(rid)
        full = len(self._waiting) >= self.max_waiting
        if full and not self._may_shed(prio, length, ttft):
            raise _errors.queue_full(rid, self.max_waiting)
        if self._next_arrival > UINT64_MAX:
            raise _errors.stamps_exhausted(rid)
        if full:  # a relegated request gives its place up (_may_shed)
            self._shed_entry(self._next_heap_entries(self._losing)[0])
        arrival = self._next_arrival
        self._next_arrival += 1
        if self._uncached and self._ranking != RANK_NONE:  # slack to spare: by uncached work
            key: tuple[Any, ...] = (1, work, arrival)
            if self._ranking == RANK_DEADLINE:
                key = (prio, *key)
        elif self._ranking == RANK_DEADLINE:  # by class, then deadline (see the compiled heap)
            key = (prio, due, arrival)
        elif self._ranking == RANK_EDF:
            key = (due, arrival)
        elif self._uncached:  # by class, then uncached work (-1 once starved), then arrival
            key = (prio, work, arrival) if self.by_priority else (work, arrival)
        else:
            key = (prio, arrival) if self.by_priority else (arrival,)
        if self._uncached:
            if self._by_seconds:  # measured from the latest arrival so far (the C ring's order)
                self._latest_since = max(self._latest_since, as_time("arrival_time", arrival_time))
                since = self._latest_since
            else:
                since = float(self._passes)
            self._aging.append((rid, arrival))
        else:
            since = 0.0
        wait = ttft if math.isnan(self._d.relegated_wait) else self._d.relegated_wait
        # The fields: key, id, prompt, class, stamp, max_new, live, first due, gap, relegated,
        # wait once relegated, shed at, adapter, uncached work, waiting since (the compiled
        # WaitingC's).
        entry = [key, rid, length, prio, arrival, limit, True, due, gap, False, wait, math.inf]
        entry += [lora, work, since]
        if due < self._earliest and prio >= self._d.never_below:
            self._earliest = due
        heapq.heappush(self._urgent if prio < 0 else self._normal, entry)
        self._waiting[rid] = entry
        return arrival

    def _may_shed(self, prio: int, length: int, ttft: float) -> bool:
        """Whether a full queue makes room for a new request by shedding a relegated one (the
        compiled ledger's ``_may_shed``)."""
        if not self._next_heap_entries(self._losing):
            return False
        d = self._d
        return (
            d.ranking != RANK_DEADLINE or prio < d.never_below or not d.too_late(length, ttft, 0.0)
        )

    @staticmethod
    def _next_heap_entries(heap: list[list[Any]]) -> list[list[Any]]:
        """``heap`` with its dead (cancelled, moved or shed) head entries popped."""
        while heap and not heap[0][6]:
            heapq.heappop(heap)
        return heap

    def _shed_entry(self, entry: list[Any]) -> None:
        """Hand a waiting request back to the runtime (``shed_ids``)."""
        entry[6] = False
        del self._waiting[entry[1]]
        self._shed.append(entry[1])

    def _lose(self, entry: list[Any], now: float) -> None:
        """A waiting request that cannot make its first token in time: relegated, behind every
        request that still can until ``now`` + its wait, then shed (the compiled
        ``lose_waiting``)."""
        entry[6] = False  # the entry in its old heap is dead; a new one goes to _losing
        moved = list(entry)
        moved[6], moved[9], moved[11] = True, True, now + moved[10]
        moved[0] = (moved[11], moved[4])
        heapq.heappush(self._losing, moved)
        self._waiting[moved[1]] = moved
        self._relegated_ids.append(moved[1])
        if not moved[11] > now:
            self._shed_entry(moved)

    def _relegate_hopeless(self, now: float) -> None:
        """Every waiting request that cannot make its first token even if served at once,
        wherever it stands (the compiled ``relegate_hopeless``)."""
        if not now >= self._earliest:
            return
        d = self._d
        found = []
        earliest = math.inf
        for heap in (self._normal, self._urgent):
            for entry in heap:
                if not entry[6] or entry[3] < d.never_below or entry[7] == math.inf:
                    continue
                if d.too_late(entry[2], entry[7], now):
                    found.append(entry)
                elif entry[7] < earliest:
                    earliest = entry[7]
        self._earliest = earliest
        for entry in sorted(found, key=lambda e: e[4]):
            self._lose(entry, now)

    def _shed_expired(self, now: float) -> None:
        losing = self._losing
        while self._next_heap_entries(losing) and losing[0][11] <= now:
            self._shed_entry(heapq.heappop(losing))

    @_exclusive(_GUEST)
    def cancel(self, request_id: object) -> None:
        rid = as_request_id(request_id)
        entry = self._waiting.pop(rid, None)
        if entry is not None:
            entry[6] = False
            return
        row = self._row_of.get(rid)
        if row is None or row in self._cancelled:
            raise _errors.not_in_ledger(rid)
        if self._pending is None:
            self._remove([row])
            return
        # Rows stay put while a step() plan is pending (see the compiled ledger's _cancel).
        self._cancelled.add(row)
        self._done[row] = True

    @_exclusive(_QUIET)
    def admit(self, *, now: float | None = None) -> list[int]:
        when = admission_now("admit", now, self._ranking, RANK_DEADLINE, self._by_seconds)
        if self._cancelled:
            self._remove([])
        self._relegated_ids = []
        self._admit(when)
        admitted: list[int] = self.admitted_ids.tolist()
        return admitted

    def _admit(self, now: float | None = None) -> None:
        self._pending = None
        table = self._table
        n = 0
        # Each admission pass reports what it (and submit since the last) shed.
        del self._shed[: self._shed_reported]
        self._shed_reported = 0
        if now is not None and self._ranking == RANK_DEADLINE:
            self._relegate_hopeless(now)
            self._shed_expired(now)
        if self._uncached:
            self._starve(now)
            if now is not None and self._ranking != RANK_NONE:
                self._lose_slack(now)
        slots = AdapterSlots(self._max_loras, self._lora[: self._count].tolist())
        passed: list[tuple[list[list[Any]], list[Any]]] = []  # (its heap, entry): put back after
        while self._count < len(self._rows):
            heap = self._next_heap()
            if heap is None:
                break
            head = heap[0]
            if (
                now is not None
                and self._ranking == RANK_DEADLINE
                and heap is not self._losing
                and head[3] >= self._d.never_below
                and self._d.too_late(head[2], head[7], now)
            ):
                # It cannot make its first token in time even if served at once: behind every
                # request that still can, until its wait is over.
                heapq.heappop(heap)
                self._lose(head, now)
                continue
            if not slots.join(head[12]):
                # Its adapter cannot join this step: it keeps its place, the queue is read on.
                passed.append((heap, heapq.heappop(heap)))
                continue
            # No overtaking: the first request whose worst case the free pool cannot hold
            # stops admission, so a large request is never starved by smaller ones behind it.
            if table is not None and not self._fits(heap[0]):
                break
            entry = heapq.heappop(heap)
            _, rid, length, prio, arrival, limit, _, due, gap, lost, _, _, lora, _, _ = entry
            del self._waiting[rid]
            row = self._count
            # Uncached first: the row's arrival is a fresh stamp, so the planner chunks the
            # residents' prompts in the order they were admitted (the stamp stays the key of
            # the deadline policies, which this order is not combined with).
            order_key = arrival
            if self._uncached and self._next_arrival < UINT64_MAX:
                order_key = self._next_arrival
                self._next_arrival += 1
            self._rows[row] = (prio, order_key, length, 0, False, 0)
            self._first_due[row] = due
            self._gap[row] = gap
            self._stamp[row] = arrival
            self._klass[row] = prio
            self._relegated[row] = lost
            self._lora[row] = lora
            self._ids[row] = rid
            self._generated[row] = 0
            self._max_new[row] = limit
            self._done[row] = False
            self._row_of[rid] = row
            if table is not None:  # the worst case, which fits (checked above)
                self._kv.KVPageTable.ensure(table, row, length + limit)
            self._count += 1
            self._admitted[n] = rid
            n += 1
        for heap, entry in passed:
            heapq.heappush(heap, entry)
        self._num_admitted = n
        self._shed_reported = len(self._shed)

    def _starve(self, now: float | None) -> None:
        """Every waiting request that has waited past the starvation bound goes back to arrival
        order: its key's work becomes -1, ahead of every request not starved, among them by
        arrival (the compiled ``starve_waiting``). One admission pass is one step of the bound."""
        self._passes += 1
        clock = (math.nan if now is None else now) if self._by_seconds else float(self._passes)
        aging = self._aging
        while aging:
            rid, stamp = aging[0]
            entry = self._waiting.get(rid)
            if entry is None or entry[4] != stamp or entry[13] < 0:  # gone, or another's
                aging.popleft()
                continue
            if not entry[14] + self._starve_after <= clock:
                break
            aging.popleft()
            self._to_policy_order(entry)

    def _lose_slack(self, now: float) -> None:
        """Uncached first under EDF/DEADLINE: every waiting request with a first-token deadline
        and no slack to spare at ``now`` (its uncached work, started now at a chunk a step,
        would not bring its first token a step before it is due) goes to the policy's own
        order (the compiled ``lose_slack``, which reads the queue only when one may have)."""
        d = self._d
        est = d.estimate_seconds()
        for entry in list(self._waiting.values()):
            if entry[9] or entry[13] < 0 or entry[7] == math.inf:
                continue
            if now + d.prompt_seconds(entry[13], d.chunk) + est > entry[7]:
                self._to_policy_order(entry)

    def _to_policy_order(self, entry: list[Any]) -> None:
        """A starved request, or one out of slack: its key's work becomes -1, ahead of every
        request of its class still ordered by work; among them by arrival, or under EDF and
        DEADLINE by first-token deadline, then arrival."""
        entry[6] = False  # the entry in its heap is dead; a moved copy takes its place
        moved = list(entry)
        moved[6], moved[13] = True, -1
        if self._ranking == RANK_NONE:
            moved[0] = (moved[3], -1, moved[4]) if self.by_priority else (-1, moved[4])
        else:
            moved[0] = (0, moved[7], moved[4])
            if self._ranking == RANK_DEADLINE:
                moved[0] = (moved[3], *moved[0])
        self._waiting[moved[1]] = moved
        heapq.heappush(self._urgent if moved[3] < 0 else self._normal, moved)

    def _fits(self, entry: list[Any]) -> bool:
        """Whether the free pool holds a waiting entry's worst case (prompt + max_new_tokens)."""
        length, limit = entry[2], entry[5]
        sizes = self._kv.geometry(self._table)
        pages: int = -(-(length + limit) // sizes.kv_page_size)
        return pages <= int(sizes.num_free_pages)

    def _next_heap(self) -> list[list[Any]] | None:
        urgent, normal, losing = (
            self._next_heap_entries(heap) for heap in (self._urgent, self._normal, self._losing)
        )
        head = urgent if urgent and (not normal or urgent[0][0] < normal[0][0]) else normal
        if not head:
            # Relegated requests come after every other, and never take a reserved slot
            # unless they are urgent themselves.
            if losing and (self.free_slots > self.reserved_slots or losing[0][3] < 0):
                return losing
            return None
        if head is normal and self.free_slots <= self.reserved_slots:
            return urgent or None
        return head

    @_exclusive(_QUIET)
    def waiting_ids(self) -> list[int]:
        """Waiting request ids in queue order (for reports; O(n log n))."""
        return [entry[1] for entry in sorted(self._waiting.values(), key=lambda e: (e[9], e[0]))]

    # --- the step -----------------------------------------------------------------------------

    @_exclusive(_BUSY)
    def apply(
        self,
        plan: Any,
        finished: np.ndarray | None = None,
        *,
        accepted: np.ndarray | None = None,
        retire: bool = False,
        now: float | None = None,
    ) -> np.ndarray:
        when = optional_now("apply", now, self._ranking, RANK_DEADLINE)
        seq, mask, emitted = self._check_apply(plan, finished, accepted)
        self._relegated_ids = []
        self._apply(plan, seq, mask, emitted, retire, when)
        return self.finished_ids

    def _check_apply(
        self, plan: Any, finished: object, accepted: object = None
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        if not isinstance(plan, plan_classes()):
            raise _errors.plan_type(plan, "StepPlan")
        n = plan.num_residents
        if n != self._count:
            raise _errors.plan_count(n, self._count)
        # A copy: apply_to() runs before the accounting reads the rows.
        seq = np.array(plan.as_array(), dtype=SEQUENCE_DTYPE, order="C").reshape(-1)
        paused = np.array(plan.paused_array(), dtype=np.int32, order="C").reshape(-1)
        plan_rows_in_range(seq["resident"], paused, self._count)
        if self._table is not None:
            self._check_reserved(seq)
        mask = finished_mask(finished, len(seq))
        if mask is not None:
            silent = np.flatnonzero(mask & ~seq["select_last_token_logits"])
            if silent.size:
                k = int(silent[0])
                raise _errors.finished_without_token(k, int(seq["resident"][k]))
        emitted = emitted_tokens(seq, accepted_counts(accepted, seq))
        self._check_emitted(seq, emitted)
        return seq, mask, emitted

    def _check_emitted(self, seq: np.ndarray, emitted: np.ndarray) -> None:
        """No request emits past its max_new_tokens (only a row verifying drafts can)."""
        rows = seq["resident"]
        limit = self._max_new[rows]
        over = (~self._done[rows]) & (limit > 0) & (self._generated[rows] + emitted > limit)
        if over.any():
            k = int(np.flatnonzero(over)[0])
            r = int(rows[k])
            raise _errors.emitted_past_max_new(
                k, int(self._ids[r]), int(emitted[k]), int(self._generated[r]), int(limit[k])
            )

    def _check_reserved(self, seq: np.ndarray) -> None:
        """No plan row writes KV beyond the pages its row holds."""
        rows = seq["resident"].astype(np.intp)
        tokens = seq["past_length"].astype(np.int64) + seq["query_length"]
        page_size = self._kv.geometry(self._table).kv_page_size
        held = self._kv.counts(self._table)[rows].astype(np.int64) * page_size
        over = np.flatnonzero(tokens > held)
        if over.size:
            k = int(over[0])
            row = int(rows[k])
            raise _errors.ledger_pages_exceeded(
                k, row, int(self._ids[row]), int(tokens[k]), int(held[k])
            )

    def _apply(
        self,
        plan: Any,
        seq: np.ndarray,
        mask: np.ndarray | None,
        emitted: np.ndarray,
        retire: bool,
        now: float | None = None,
    ) -> None:
        plan.apply_to(self.residents)  # checks overflow before it writes anything
        self._pending = None
        # Rejected drafts (SPEC §8): apply_to committed every verified position; the ones after
        # the accepted drafts are not committed (the next step writes over their KV).
        decode = seq["work"] == SequenceWork.DECODE
        rejected = np.where(decode, seq["query_length"] - emitted, 0)
        if rejected.any():
            self._rows["committed"][seq["resident"]] -= rejected.astype(np.int32)
        emitting = seq["select_last_token_logits"]
        rows = seq["resident"][emitting]
        if now is not None and self._ranking == RANK_DEADLINE:
            for row in rows.tolist():  # a token later than its deadline: the request is lost
                if (
                    not self._relegated[row]
                    and self._klass[row] >= self._d.never_below
                    and now > next_due(self._first_due, self._gap, self._generated, row)
                ):
                    self._relegated[row] = True
                    self._relegated_ids.append(int(self._ids[row]))
        self._generated[rows] += emitted[emitting]
        limit = self._max_new[rows]
        done = (limit > 0) & (self._generated[rows] >= limit)
        if mask is not None:
            done |= mask[emitting]
        done &= ~self._done[rows]
        newly = rows[done]
        self._done[newly] = True
        self._num_finished = len(newly)
        self._finished[: len(newly)] = self._ids[newly]
        if retire:
            self._retire_done()
        elif self._cancelled:  # they left with the plan they were pending in
            self._remove([])

    @_exclusive(_QUIET)
    def retire_finished(self) -> None:
        """Remove every resident that an ``apply`` marked finished."""
        self._retire_done()

    def _retire_done(self) -> None:
        self._remove(np.flatnonzero(self._done[: self._count]).tolist())

    @_exclusive(_BUSY)
    def step(
        self,
        planner: Any,
        finished: np.ndarray | None = None,
        *,
        accepted: np.ndarray | None = None,
        drafts: Any = None,
        reasons: np.ndarray | None = None,
        now: float | None = None,
    ) -> Any:
        if getattr(planner, "limits", None) != self.limits:
            raise _errors.planner_mismatch(getattr(planner, "limits", None), self.limits)
        when = admission_now("step", now, self._ranking, RANK_EDF, self._by_seconds)
        proposed = None if drafts is None else draft_request(drafts)
        pending = self._pending
        if pending is None:
            if finished is not None:
                raise _errors.nothing_pending()
            if accepted is not None:
                raise _errors.nothing_pending("accepted")
            # Rows that load() or the caller wrote are checked before anything changes (a
            # pending plan's rows were checked when it was made, and applying keeps them valid).
            planner.plan(self.residents)
        else:
            check_pending(pending, self._pending_version)
            seq, mask, emitted = self._check_apply(pending, finished, accepted)
        if reasons is not None:
            _check_reasons(reasons, self.capacity)
        self._relegated_ids = []
        if when is not None:
            self._d.measure(
                when, pending is not None and pending.num_prefill + pending.num_decode > 0
            )
        if pending is not None:
            self._apply(pending, seq, mask, emitted, True, when)
        self._admit(when)
        if when is not None and self._ranking != RANK_NONE:
            self._rank(when)
        if proposed is None:  # a planner of another kind need not know drafts
            plan = planner.plan(self.residents, reasons=reasons)
        else:
            plan = planner.plan(
                self.residents, reasons=reasons, drafts=self._draft_counts(proposed)
            )
        self._pending = plan
        self._pending_version = plan_version(plan)
        return plan

    def _draft_counts(self, proposed: int | dict[int, int]) -> np.ndarray:
        """Each row's drafts for this plan (SPEC §8): as proposed, for the requests decoding
        now (an entry for one that is not, a request waiting, prefilling or gone since the
        proposer saw it decode, is passed over), never past the request's max_new_tokens: a row
        verifying g drafts emits up to g + 1 tokens."""
        n = self._count
        decoding = self.residents["context_committed"].astype(bool)
        if isinstance(proposed, dict):
            out = np.zeros(n, dtype=np.int64)
            for rid, k in proposed.items():
                row = self._row_of.get(rid)
                if row is not None and row < n:
                    out[row] = k
        else:
            out = np.full(n, proposed, dtype=np.int64)
        out[~decoding] = 0  # a mapping's entry or the int alike: only decoding rows draft
        limit = self._max_new[:n]
        room = np.maximum(limit - self._generated[:n] - 1, 0)
        capped = decoding & (limit > 0)
        out[capped] = np.minimum(out[capped], room[capped])
        return out.astype(np.int32)

    @_exclusive(_QUIET)
    def rank(self, now: float) -> None:
        """Write each row's priority and arrival from its deadlines at ``now`` (what ``step``
        does before it plans); a no-op under FCFS and PRIORITY."""
        when = as_time("now", now)
        self._relegated_ids = []
        if self._ranking != RANK_NONE:
            self._rank(when)

    @_exclusive(_QUIET)
    def measure(self, now: float, ran: bool = True) -> None:
        """A step (``ran``: one that planned work) ended at ``now``: the measured estimate
        (``step_time=None``) moves towards the time since the previous one. ``step`` does this
        itself; a runtime that plans with ``admit``/``rank``/``apply`` calls it once a step."""
        self._d.measure(as_time("now", now), bool(ran))

    def _rank(self, now: float) -> None:
        lost = rank_rows(
            self._d,
            self._rows[: self._count],
            self._first_due,
            self._gap,
            self._generated,
            self._stamp,
            self._relegated,
            now,
            self._klass,
        )
        self._relegated_ids.extend(int(self._ids[r]) for r in lost)

    @_exclusive(_BUSY)
    def retire(self, request_ids: Iterable[int]) -> None:
        """Remove finished requests by id; the last rows move into the freed slots."""
        ids = [as_request_id(r) for r in request_ids]
        if len(set(ids)) != len(ids):
            raise _errors.repeated_ids(ids)
        rows = []
        for rid in ids:
            row = self._row_of.get(rid)
            if row is None:
                raise _errors.not_resident(rid)
            rows.append(row)
        self._remove(rows)

    @_exclusive(_BUSY)
    def retire_rows(self, rows: Sequence[int] | np.ndarray) -> None:
        """Remove residents by row index."""
        listed = rows_argument(rows)
        check_rows(listed, self._count)
        self._remove(listed)

    def _remove(self, rows: list[int]) -> None:
        # The cancelled rows go in the same pass: ``rows`` index the table as it is.
        self._pending = None
        rows = sorted(set(rows) | self._cancelled, reverse=True)
        self._cancelled = set()
        table = self._table
        last = self._count - 1
        # Highest row first: the last row is then never one still waiting to be removed.
        for row in rows:
            del self._row_of[int(self._ids[row])]
            if table is not None:  # slot i stays row i: the pages move as the row does
                self._kv.KVPageTable.release(table, row)
                if row != last:
                    self._kv.KVPageTable.move(table, last, row)
            if row != last:
                for column in (
                    self._rows,
                    self._ids,
                    self._generated,
                    self._max_new,
                    self._done,
                    self._first_due,
                    self._gap,
                    self._stamp,
                    self._klass,
                    self._relegated,
                    self._lora,
                ):
                    column[row] = column[last]
                self._row_of[int(self._ids[row])] = row
            last -= 1
        old, self._count = self._count, last + 1
        self._rows[self._count : old] = 0
        self._ids[self._count : old] = -1

    # --- snapshots (explain, record/replay) ---------------------------------------------------

    @_exclusive(_BUSY)
    def load(self, residents: Sequence[Mapping[str, Any]]) -> None:
        if self._table is not None:
            raise _errors.ledger_load_with_pages()
        if self._ranking != RANK_NONE:
            raise _errors.ledger_load_with_deadlines(self._policy_name)
        table, ids, loras = parse_records(residents, self.capacity, self._max_loras)
        check_waiting(table, ids, {rid: entry[4] for rid, entry in self._waiting.items()})
        n = len(table)
        self._pending = None
        self._rows[:] = 0
        self._ids[:] = -1
        self._rows[:n] = table
        self._ids[:n] = ids
        self._generated[:] = 0
        self._max_new[:] = 0
        self._done[:] = False
        self._first_due[:] = np.inf
        self._gap[:] = 0.0
        self._relegated[:] = False
        self._lora[:] = 0
        self._lora[:n] = loras
        self._cancelled = set()
        self._num_finished = self._num_admitted = 0
        self._row_of = {rid: row for row, rid in enumerate(ids.tolist())}
        self._count = n
        if n:
            self._next_arrival = max(self._next_arrival, int(table["arrival"].max()) + 1)

    @_exclusive(_QUIET)
    def to_records(self) -> list[dict[str, Any]]:
        count = self._count
        return records_of(self._rows[:count], self._ids[:count], self._lora[:count])


# --- deadlines: the rank pass (docs/scheduling.md), as the compiled ledger's C ---------------


class _Deadlines:
    """The rank pass's policy and step-time estimate (the compiled ledger's ``DeadlineC``)."""

    def __init__(
        self, limits: StepPlannerLimits, checked: DeadlineArgs, relegation: tuple[float, int]
    ) -> None:
        # ``checked``, ``relegation``: what _shared.check_deadline_args and
        # check_relegation_args returned for the constructor's arguments.
        (
            self.ranking,
            _,
            self.base,
            self.per_token,
            self.measured,
            self.step_tokens,
            self.chunk,
        ) = checked
        self.relegated_wait, self.never_below = relegation
        self.page_size = limits.kv_page_size
        self.estimate = 0.0  # the measured step time (step_time=None)
        self.sampled = False  # whether it has been measured yet
        self.last_now = math.nan  # the now of the previous step

    def estimate_seconds(self) -> float:
        if self.measured:
            return self.estimate
        return self.base + self.per_token * self.step_tokens

    def prompt_seconds(self, tokens: int, chunk: int) -> float:
        """A prompt of ``tokens`` at ``chunk`` tokens a step: steps x the step estimate."""
        return ((tokens + chunk - 1) // chunk) * self.estimate_seconds()

    def too_late(self, tokens: int, due: float, now: float) -> bool:
        """Whether a prompt of ``tokens`` misses a first token due at ``due`` even if served at
        once from ``now`` (the compiled ``too_late``: the one relegation test of a waiting
        request)."""
        return now + self.prompt_seconds(tokens, self.chunk) > due

    def measure(self, now: float, ran: bool) -> None:
        """step_time=None: a step's duration (between two steps' now) moves the estimate."""
        last, self.last_now = self.last_now, now
        if not self.measured or not ran or math.isnan(last):
            return
        sample = now - last
        # Neither a clock that went back nor one that jumped past a float's span (inf) is a
        # sample: the estimate stays finite.
        if not 0 < sample < math.inf:
            return
        if self.sampled:
            self.estimate += STEP_TIME_WEIGHT * (sample - self.estimate)
        else:
            self.estimate, self.sampled = sample, True


def next_due(first_due: np.ndarray, gap: np.ndarray, generated: np.ndarray, row: int) -> float:
    """When the row's next token is due (inf: no deadline)."""
    return due_of(float(first_due[row]), float(gap[row]), int(generated[row]))


def rank_rows(
    d: _Deadlines,
    rows: np.ndarray,
    first_due: np.ndarray,
    gap: np.ndarray,
    generated: np.ndarray,
    stamp: np.ndarray,
    relegated: np.ndarray,
    now: float,
    classes: np.ndarray | None = None,
) -> list[int]:
    """Write each row's priority and arrival from its deadlines at ``now``; returns the rows
    it relegated (the compiled ``rank_rows``)."""
    lost: list[int] = []
    never_below = d.never_below
    count = len(rows)
    est = d.estimate_seconds()
    decoding = int(rows["context_committed"].astype(bool).sum())
    normal = max(d.page_size, min(d.chunk, d.step_tokens - decoding))
    for r in range(count):
        committed = bool(rows["context_committed"][r])
        due = next_due(first_due, gap, generated, r) if committed else float(first_due[r])
        key = int(stamp[r])
        if d.ranking == RANK_EDF:
            prio = (
                2**31 - 1
                if due == math.inf
                else int(max(min((due - now) * 1000.0, EDF_SPAN), -EDF_SPAN))
            )
            rows["priority"][r], rows["arrival"][r] = prio, key
            continue
        klass = 0 if classes is None else max(min(int(classes[r]), CLASS_SPAN), -CLASS_SPAN)
        if relegated[r]:
            level = LEVEL_RELEGATED
        elif due == math.inf:
            level, key = LEVEL_SLACK, KEY_NONE + min(key, KEY_NONE - 1)
        elif committed and due < now and klass_of(classes, r) >= never_below:
            # its next token is late whenever it comes
            relegated[r] = True
            lost.append(r)
            level = LEVEL_RELEGATED
        elif committed:  # a decode keeps its stamp: its place in its level changes no plan
            level = LEVEL_DUE if due - now - est < est else LEVEL_SLACK
        else:
            rest = int(rows["prompt_length"][r]) - int(rows["committed"][r])
            urgent = d.prompt_seconds(rest, d.chunk)
            if now + urgent > due and klass_of(classes, r) >= never_below:
                relegated[r] = True
                lost.append(r)
                level = LEVEL_RELEGATED
            else:
                at_risk = now + d.prompt_seconds(rest, normal) + est > due
                level = LEVEL_AT_RISK if at_risk else LEVEL_SLACK
                key = _slack_key(due - now - urgent)
        rows["priority"][r], rows["arrival"][r] = level * LEVEL_STRIDE + klass, key
    return lost


class Ranker:
    """The ledger's rank pass over rows a runtime keeps itself (the vLLM scheduler keeps no
    ``Ledger``): the same C as the ledger's, so an adapter keeps no copy of the policy."""

    def __init__(
        self,
        limits: StepPlannerLimits,
        policy: ResolvedSchedulingPolicy,
        *,
        step_time: tuple[float, float] | None = None,
        relegated_wait: float | None = None,
        never_relegate_below: int = NEVER_RELEGATE_BELOW,
    ) -> None:
        if not isinstance(policy, ResolvedSchedulingPolicy):
            raise _errors.wrong_type("policy", "ResolvedSchedulingPolicy", policy)
        check_ledger_args(limits, policy, 0)
        self.limits, self.policy = limits, policy
        self._d = _Deadlines(
            limits,
            check_deadline_args(policy, limits, None, step_time),
            check_relegation_args(relegated_wait, never_relegate_below),
        )

    @property
    def step_time_estimate(self) -> float:
        return self._d.estimate_seconds()

    def measure(self, now: float, ran: bool = True) -> None:
        """A step (``ran``: one that planned work) ended at ``now``: the measured estimate
        (``step_time=None``) moves towards the time since the previous one."""
        self._d.measure(as_time("now", now), bool(ran))

    def relegated_wait(self, ttft: float) -> float:
        """Seconds a request relegated while waiting may still wait before it is handed back:
        ``relegated_wait``, or (None) its own TTFT objective ``ttft``."""
        if math.isnan(self._d.relegated_wait):
            return as_time("ttft", ttft)
        return self._d.relegated_wait

    def admits(self, prompt_tokens: int, first_due: float, now: float, priority: int = 0) -> bool:
        """Whether a waiting prompt can still make its first token in time if served at once
        (always True but under DEADLINE, and for a ``priority`` below ``never_relegate_below``):
        the ledger relegates one that cannot at admission."""
        tokens, due, when = check_admits_args(prompt_tokens, first_due, now)
        klass = as_int32("priority", priority)
        if self._d.ranking != RANK_DEADLINE or klass < self._d.never_below:
            return True
        return not self._d.too_late(tokens, due, when)

    def rank(
        self,
        rows: np.ndarray,
        first_due: np.ndarray,
        gap: np.ndarray,
        generated: np.ndarray,
        stamp: np.ndarray,
        relegated: np.ndarray,
        now: float,
        *,
        classes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Write ``rows``' priority and arrival as the ledger does before it plans; returns the
        positions it relegated (and sets them in ``relegated``). ``classes``: each row's own
        priority (int32; None: all 0), which orders rows within a DEADLINE level. A no-op under
        FCFS/PRIORITY."""
        check_rank_arrays(
            rows, (first_due, gap, generated, stamp, relegated), self.limits.max_batch_size, classes
        )
        when = as_time("now", now)
        if self._d.ranking == RANK_NONE:
            return np.zeros(0, dtype=np.int64)
        lost = rank_rows(self._d, rows, first_due, gap, generated, stamp, relegated, when, classes)
        return np.array(lost, dtype=np.int64)


def klass_of(classes: np.ndarray | None, r: int) -> int:
    """Row ``r``'s own class, as the relegation floor reads it (unclamped)."""
    return 0 if classes is None else int(classes[r])


def _slack_key(slack: float) -> int:
    """A slack in seconds as DEADLINE's uint64 order key: microseconds around KEY_ZERO."""
    return KEY_ZERO + int(max(min(slack * 1e6, KEY_SPAN), -KEY_SPAN))  # truncated, as C casts


def _check_reasons(reasons: object, capacity: int) -> None:
    if (
        not isinstance(reasons, np.ndarray)
        or reasons.dtype != np.uint8
        or reasons.ndim != 1
        or not reasons.flags.writeable
        or not reasons.flags.c_contiguous
        or len(reasons) < capacity
    ):
        raise step_reasons_error(capacity)
