"""The pure-Python twin of the compiled ledger (``stepplanner.ledger._ledger``): same surface, same
behaviour, same messages; the tests hold the two to each other. See ``stepplanner.ledger`` for
what a ledger is and the decisions behind it; the checks both share are in ``_shared``.
"""

from __future__ import annotations

import functools
import heapq
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from .. import _errors
from ..planner._policy import ResolvedSchedulingPolicy, StepPlannerLimits
from ..planner._types import RESIDENT_DTYPE, RESIDENT_FIELDS, SEQUENCE_DTYPE
from ._shared import (
    UINT64_MAX,
    as_request_id,
    check_ledger_args,
    check_page_table,
    check_pending,
    check_rows,
    check_waiting,
    check_worst_case,
    finished_mask,
    pages_in_use,
    parse_records,
    plan_classes,
    plan_rows_in_range,
    plan_version,
    read_only,
    records_of,
    rows_argument,
    step_reasons_error,
    submission,
)

__all__ = ["Ledger", "RESIDENT_FIELDS"]

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
_BUSY = 2   # runs caller code: a call from another thread meanwhile is refused


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

    def __init__(self, limits: StepPlannerLimits, policy: ResolvedSchedulingPolicy | None = None,
                 *, max_waiting: int | None = None, page_table: Any = None) -> None:
        if self._initialised:
            raise _errors.already_initialised("Ledger")
        self.by_priority, self.reserved_slots, self.max_waiting = check_ledger_args(
            limits, policy, max_waiting)
        self._kv: Any = None
        if page_table is not None:
            check_page_table(page_table, limits, tuple(m.KVPageTable for m in _kv_modules()),
                             "a stepplanner KVPageTable (kv._kv_py or kv._kv)",
                             lambda table: _kv_of(table).geometry(table))
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
        self._count = 0
        self._next_arrival = 0
        # Two heaps so that an urgent request can be found behind a held-back head in O(log n);
        # a cancelled entry stays in its heap, marked dead, until it reaches the top.
        self._urgent: list[list[Any]] = []
        self._normal: list[list[Any]] = []
        self._waiting: dict[int, list[Any]] = {}  # id -> its live heap entry
        self._row_of: dict[int, int] = {}         # resident id -> row
        self._pending: Any = None                 # the plan of step() not yet applied
        self._pending_version: int | None = 0     # its version when step() returned it
        self._cancelled: set[int] = set()         # rows cancelled while a plan was pending
        self._lock = threading.Lock()             # held by every call (see _exclusive)
        self._holder = 0                          # the thread holding it (0: none)
        self._busy = False                        # the holder runs caller code
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
    def residents(self) -> np.ndarray:
        return np.frombuffer(self._rows_memory, dtype=RESIDENT_DTYPE, count=self._count)

    @property
    def request_ids(self) -> np.ndarray:
        return read_only(self._ids[:self._count])

    @property
    def output_tokens(self) -> np.ndarray:
        return read_only(self._generated[:self._count])

    @property
    def finished_ids(self) -> np.ndarray:
        return read_only(self._finished[:self._num_finished])

    @property
    def admitted_ids(self) -> np.ndarray:
        return read_only(self._admitted[:self._num_admitted])

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
        return self._held_back()

    @_exclusive(_QUIET)  # _next_heap pops cancelled entries: never beside a submit
    def _held_back(self) -> int:
        heap = None if self._table is None else self._next_heap()
        return 0 if heap is None or self._fits(heap[0]) else len(self._waiting)

    def kv_pages_in_use(self) -> int:
        return pages_in_use(self._rows["committed"][:self._count], self.limits.kv_page_size)

    def __repr__(self) -> str:
        return (f"Ledger(count={self._count}, capacity={self.capacity}, waiting={self.waiting}, "
                f"max_waiting={self.max_waiting}, reserved_slots={self.reserved_slots}, "
                f"order={'PRIORITY' if self.by_priority else 'FCFS'})")

    # --- admission ----------------------------------------------------------------------------

    @_exclusive(_GUEST)
    def submit(self, request_id: int, prompt_length: int, priority: int = 0,
               max_new_tokens: int | None = None) -> int:
        rid, length, prio, limit = submission(request_id, prompt_length, priority,
                                              max_new_tokens, self.limits.max_input_length)
        if self._table is not None:
            check_worst_case(rid, length, limit, self._kv.geometry(self._table))
        if rid in self._waiting or rid in self._row_of:
            raise _errors.duplicate_request(rid)
        if len(self._waiting) >= self.max_waiting:
            raise _errors.queue_full(rid, self.max_waiting)
        if self._next_arrival > UINT64_MAX:
            raise _errors.stamps_exhausted(rid)
        arrival = self._next_arrival
        self._next_arrival += 1
        key = (prio, arrival) if self.by_priority else (arrival,)
        entry = [key, rid, length, prio, arrival, limit, True]
        heapq.heappush(self._urgent if prio < 0 else self._normal, entry)
        self._waiting[rid] = entry
        return arrival

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
    def admit(self) -> list[int]:
        if self._cancelled:
            self._remove([])
        self._admit()
        admitted: list[int] = self.admitted_ids.tolist()
        return admitted

    def _admit(self) -> None:
        self._pending = None
        table = self._table
        n = 0
        while self._count < len(self._rows):
            heap = self._next_heap()
            if heap is None:
                break
            # No overtaking: the first request whose worst case the free pool cannot hold
            # stops admission, so a large request is never starved by smaller ones behind it.
            if table is not None and not self._fits(heap[0]):
                break
            _, rid, length, prio, arrival, limit, _ = heapq.heappop(heap)
            del self._waiting[rid]
            row = self._count
            self._rows[row] = (prio, arrival, length, 0, False, 0)
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
        self._num_admitted = n

    def _fits(self, entry: list[Any]) -> bool:
        """Whether the free pool holds a waiting entry's worst case (prompt + max_new_tokens)."""
        _, _, length, _, _, limit, _ = entry
        sizes = self._kv.geometry(self._table)
        pages: int = -(-(length + limit) // sizes.kv_page_size)
        return pages <= int(sizes.num_free_pages)

    def _next_heap(self) -> list[list[Any]] | None:
        urgent, normal = self._urgent, self._normal
        for heap in (urgent, normal):
            while heap and not heap[0][6]:
                heapq.heappop(heap)
        head = urgent if urgent and (not normal or urgent[0][0] < normal[0][0]) else normal
        if not head:
            return None
        if head is normal and self.free_slots <= self.reserved_slots:
            return urgent or None
        return head

    @_exclusive(_QUIET)
    def waiting_ids(self) -> list[int]:
        """Waiting request ids in queue order (for reports; O(n log n))."""
        return [entry[1] for entry in sorted(self._waiting.values())]

    # --- the step -----------------------------------------------------------------------------

    @_exclusive(_BUSY)
    def apply(self, plan: Any, finished: np.ndarray | None = None, *,
              retire: bool = False) -> np.ndarray:
        seq, mask = self._check_apply(plan, finished)
        self._apply(plan, seq, mask, retire)
        return self.finished_ids

    def _check_apply(self, plan: Any, finished: object) -> tuple[np.ndarray, np.ndarray | None]:
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
        return seq, mask

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
            raise _errors.ledger_pages_exceeded(k, row, int(self._ids[row]), int(tokens[k]),
                                                int(held[k]))

    def _apply(self, plan: Any, seq: np.ndarray, mask: np.ndarray | None, retire: bool) -> None:
        plan.apply_to(self.residents)  # checks overflow before it writes anything
        self._pending = None
        emitting = seq["select_last_token_logits"]
        rows = seq["resident"][emitting]
        self._generated[rows] += 1
        limit = self._max_new[rows]
        done = (limit > 0) & (self._generated[rows] >= limit)
        if mask is not None:
            done |= mask[emitting]
        done &= ~self._done[rows]
        newly = rows[done]
        self._done[newly] = True
        self._num_finished = len(newly)
        self._finished[:len(newly)] = self._ids[newly]
        if retire:
            self._retire_done()
        elif self._cancelled:  # they left with the plan they were pending in
            self._remove([])

    @_exclusive(_QUIET)
    def retire_finished(self) -> None:
        """Remove every resident that an ``apply`` marked finished."""
        self._retire_done()

    def _retire_done(self) -> None:
        self._remove(np.flatnonzero(self._done[:self._count]).tolist())

    @_exclusive(_BUSY)
    def step(self, planner: Any, finished: np.ndarray | None = None, *,
             reasons: np.ndarray | None = None) -> Any:
        if getattr(planner, "limits", None) != self.limits:
            raise _errors.planner_mismatch(getattr(planner, "limits", None), self.limits)
        pending = self._pending
        if pending is None:
            if finished is not None:
                raise _errors.nothing_pending()
            # Rows that load() or the caller wrote are checked before anything changes (a
            # pending plan's rows were checked when it was made, and applying keeps them valid).
            planner.plan(self.residents)
        else:
            check_pending(pending, self._pending_version)
            seq, mask = self._check_apply(pending, finished)
        if reasons is not None:
            _check_reasons(reasons, self.capacity)
        if pending is not None:
            self._apply(pending, seq, mask, retire=True)
        self._admit()
        plan = planner.plan(self.residents, reasons=reasons)
        self._pending = plan
        self._pending_version = plan_version(plan)
        return plan

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
                for column in (self._rows, self._ids, self._generated, self._max_new, self._done):
                    column[row] = column[last]
                self._row_of[int(self._ids[row])] = row
            last -= 1
        old, self._count = self._count, last + 1
        self._rows[self._count:old] = 0
        self._ids[self._count:old] = -1

    # --- snapshots (explain, record/replay) ---------------------------------------------------

    @_exclusive(_BUSY)
    def load(self, residents: Sequence[Mapping[str, Any]]) -> None:
        if self._table is not None:
            raise _errors.ledger_load_with_pages()
        table, ids = parse_records(residents, self.capacity)
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
        self._cancelled = set()
        self._num_finished = self._num_admitted = 0
        self._row_of = {rid: row for row, rid in enumerate(ids.tolist())}
        self._count = n
        if n:
            self._next_arrival = max(self._next_arrival, int(table["arrival"].max()) + 1)

    @_exclusive(_QUIET)
    def to_records(self) -> list[dict[str, Any]]:
        return records_of(self._rows[:self._count], self._ids[:self._count])


def _check_reasons(reasons: object, capacity: int) -> None:
    if (not isinstance(reasons, np.ndarray) or reasons.dtype != np.uint8 or reasons.ndim != 1
            or not reasons.flags.writeable or not reasons.flags.c_contiguous
            or len(reasons) < capacity):
        raise step_reasons_error(capacity)
