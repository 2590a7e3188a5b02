"""The pure-Python twin of the compiled ledger (``stepplanner._ledger_core``): same surface, same
behaviour, same messages; the tests hold the two to each other. See ``stepplanner.ledger`` for
what a ledger is and the decisions behind it.

It also holds what both implementations share in Python: argument conversion, the messages'
inputs, and ``load()``'s parsing of records (that runs once per snapshot, never per step).
"""

from __future__ import annotations

import heapq
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from . import _errors
from ._fields import as_bool, as_int, as_int32, as_uint64
from ._kv_checks import check_table_fits
from ._policy import ResolvedSchedulingPolicy, StepPlannerLimits, check_reserved_slots
from ._types import RESIDENT_DTYPE, RESIDENT_FIELDS, SEQUENCE_DTYPE, SchedulingPolicy

__all__ = ["Ledger", "RESIDENT_FIELDS"]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
# Queue bound when none is given: sixteen times the batch, a few seconds of arrivals for an
# engine of that size; past it a server should push back (HTTP 429), not queue without bound.
WAITING_PER_SLOT = 16
_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


# --- what both implementations share ----------------------------------------------------------


def as_request_id(value: object, field: str = "request_id") -> int:
    rid = as_int(field, value)
    if not INT64_MIN <= rid <= INT64_MAX:
        raise _errors.not_int64(field, rid)
    return rid


def check_ledger_args(limits: object, policy: object,
                      max_waiting: object) -> tuple[bool, int, int]:
    """(by_priority, reserved_slots, max_waiting) of a new ledger, every argument checked."""
    if not isinstance(limits, StepPlannerLimits):
        raise _errors.StepPlannerTypeError(
            f"limits must be a StepPlannerLimits, got {type(limits).__name__}")
    if policy is not None and not isinstance(policy, ResolvedSchedulingPolicy):
        raise _errors.StepPlannerTypeError(
            "policy must be a ResolvedSchedulingPolicy or None, got "
            f"{type(policy).__name__}")
    reserved = policy.priority_reserved_slots if policy is not None else 0
    check_reserved_slots(reserved, limits)
    by_priority = policy is not None and policy.scheduling_policy == SchedulingPolicy.PRIORITY
    if max_waiting is None:
        bound = WAITING_PER_SLOT * limits.max_batch_size
    else:
        bound = as_int("max_waiting", max_waiting)
    if not 0 <= bound <= 2**31 - 1:
        raise _errors.out_of_range("max_waiting", bound, f"0..{2**31 - 1} (or None: "
                                   f"{WAITING_PER_SLOT} x max_batch_size)")
    return by_priority, reserved, bound


def worst_case_pages(prompt_length: int, max_new_tokens: int, kv_page_size: int) -> int:
    """Pages for ``prompt_length + max_new_tokens`` tokens: ``ceil(total / kv_page_size)``.

    It counts a KV entry for every generated token, the last one included, so it is the bound
    whichever way a runtime writes the final token's KV.
    """
    prompt = as_int32("prompt_length", prompt_length)
    new = as_int32("max_new_tokens", max_new_tokens)
    page = as_int32("kv_page_size", kv_page_size)
    if prompt < 1:
        raise _errors.out_of_range("prompt_length", prompt, ">= 1")
    if new < 0:
        raise _errors.out_of_range("max_new_tokens", new, ">= 0")
    if page < 1:
        raise _errors.out_of_range("kv_page_size", page, ">= 1")
    total = prompt + new
    if total > _errors.INT32_MAX:
        raise _errors.out_of_range("prompt_length + max_new_tokens", total,
                                   f"<= {_errors.INT32_MAX}, so that token counts fit int32")
    return -(-total // page)


def check_page_table(page_table: Any, limits: StepPlannerLimits, classes: tuple[Any, ...],
                     allowed: str) -> None:
    """A page table a new ledger may own: one of ``classes``, a slot per row, the limits' page
    size, and every page free (slot ``i`` is row ``i`` from the start)."""
    if not isinstance(page_table, classes):
        raise _errors.ledger_page_table_type(page_table, allowed)
    check_table_fits(page_table, limits)
    if page_table.num_free_pages != page_table.num_pages:
        raise _errors.ledger_page_table_in_use(
            page_table.num_pages - page_table.num_free_pages, page_table.num_pages)


def check_worst_case(rid: int, length: int, limit: int, page_table: Any) -> None:
    """A request (``limit`` 0: no ``max_new_tokens``) whose worst case some row can hold."""
    if limit == 0:
        raise _errors.ledger_unbounded_request(rid)
    pages = worst_case_pages(length, limit, page_table.kv_page_size)
    most = min(page_table.max_pages_per_sequence, page_table.num_pages)
    if pages > most:
        raise _errors.ledger_worst_case_pages(rid, length, limit, pages, most)


def pages_in_use(committed: np.ndarray, page_size: int) -> int:
    """Pages that hold committed KV: ``sum(ceil(committed / P))``."""
    return int(((committed.astype(np.int64) + page_size - 1) // page_size).sum())


def submission(rid: object, prompt_length: object, priority: object, max_new_tokens: object,
               max_input_length: int) -> tuple[int, int, int, int]:
    """(request_id, prompt_length, priority, max_new or 0 for none), each field checked."""
    rid_ = as_request_id(rid)
    length = as_int32("prompt_length", prompt_length)
    prio = as_int32("priority", priority)
    limit = 0
    if max_new_tokens is not None:
        limit = as_int("max_new_tokens", max_new_tokens)
        if limit > INT64_MAX:
            raise _errors.not_int64("max_new_tokens", limit)
        if limit < 1:
            raise _errors.max_new_tokens_range(limit)
    if not 1 <= length <= max_input_length:
        raise _errors.ledger_prompt_length(rid_, length, max_input_length)
    return rid_, length, prio, limit


def parse_records(residents: Sequence[Mapping[str, Any]],
                  capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``load()``'s records as (RESIDENT_DTYPE table, int64 ids), checked against each other.

    Every record is read here, before the ledger's own state is: the records' code (a Mapping's
    ``__getitem__``) runs before ``check_waiting`` sees the queue."""
    if len(residents) > capacity:
        raise _errors.StepPlannerValueError(
            f"{len(residents)} residents exceed max_batch_size="
            f"{capacity}; allowed: 0..{capacity}")
    table = np.zeros(len(residents), dtype=RESIDENT_DTYPE)
    ids = np.arange(len(residents), dtype=np.int64)
    for i, record in enumerate(residents):
        table[i], rid = _row(i, record)
        if rid is not None:
            ids[i] = rid
    for name, column in (("arrival", table["arrival"]), ("request_id", ids)):
        if np.unique(column).size != column.size:
            raise _errors.StepPlannerValueError(
                f"two residents have the same {name}; allowed: unique values")
    return table, ids


def check_waiting(table: np.ndarray, ids: np.ndarray, waiting: Mapping[int, int]) -> None:
    """Parsed records against ``waiting`` (request id -> arrival stamp of each waiting request)."""
    for rid in ids.tolist():
        if rid in waiting:
            raise _errors.StepPlannerValueError(f"request_id {rid} is also waiting")
    stamps = {arrival: rid for rid, arrival in waiting.items()}
    for i, arrival in enumerate(table["arrival"].tolist()):
        if arrival in stamps:
            raise _errors.load_arrival_taken(i, arrival, stamps[arrival])


def _row(index: int, record: Mapping[str, Any]) -> tuple[tuple[Any, ...], int | None]:
    if not isinstance(record, Mapping):
        raise _errors.StepPlannerTypeError(
            f"residents[{index}] must be an object/dict, got "
            f"{type(record).__name__}")
    unknown = set(record) - set(RESIDENT_FIELDS) - {"request_id"}
    if unknown:
        raise _errors.StepPlannerValueError(
            f"residents[{index}] has unknown field(s) {sorted(unknown)}; allowed: "
            f"{', '.join(RESIDENT_FIELDS)}, request_id")
    get = record.get
    where = f"residents[{index}]."
    row = (as_int32(where + "priority", get("priority", 0)),
           as_uint64(where + "arrival", get("arrival", index)),
           as_int32(where + "prompt_length", get("prompt_length", 0)),
           as_int32(where + "committed", get("committed", 0)),
           as_bool(where + "context_committed", get("context_committed", False)),
           as_int32(where + "consecutive_paused_steps", get("consecutive_paused_steps", 0)))
    # Absent means the row index; present must be an id (a None is refused, like any field's).
    if "request_id" not in record:
        return row, None
    return row, as_request_id(record["request_id"], where + "request_id")


def rows_argument(rows: object) -> list[int]:
    """``retire_rows``' argument as a list of ints, converted before the ledger reads its count
    (``__array__`` is the caller's code); ``check_rows`` then checks it against the count."""
    try:
        arr = np.asarray(rows)
    except ValueError:  # ragged nesting: numpy's message would not say which argument
        raise _errors.StepPlannerValueError(
            f"rows={rows!r} is not a flat sequence of row indices") from None
    if arr.size and arr.dtype.kind not in "iu":
        raise _errors.StepPlannerTypeError(f"rows must be integers, got dtype {arr.dtype}")
    listed: list[int] = arr.ravel().tolist()
    return listed


def check_rows(listed: list[int], count: int) -> None:
    """Distinct row indices below ``count``."""
    for row in listed:
        if not 0 <= row < count:
            raise _errors.StepPlannerValueError(
                f"row {row} is out of range; allowed: 0..{count - 1}")
    if len(set(listed)) != len(listed):
        raise _errors.StepPlannerValueError(
            f"rows {listed} repeat a row; allowed: each at most once")


def plan_sizes(rows: int, paused: int, count: int) -> None:
    """A plan over ``count`` residents has at most one row and one pause per resident."""
    for where, n in (("num_sequences", rows), ("num_paused", paused)):
        if n > count:
            raise _errors.plan_value(where, n, f"0..{count}, at most one per resident")


def plan_rows_in_range(resident: np.ndarray, paused: int, count: int) -> None:
    """Every plan row names a resident row: the accounting indexes the ledger's tables by it."""
    plan_sizes(len(resident), paused, count)
    bad = np.flatnonzero((resident < 0) | (resident >= count))
    if bad.size:
        k = int(bad[0])
        raise row_out_of_range(k, int(resident[k]), count)


def row_out_of_range(k: int, resident: int, count: int) -> _errors.StepPlannerValueError:
    """The error for plan row ``k``, whose resident is no row below ``count``."""
    return _errors.plan_value(f"sequences[{k}].resident", resident, f"0..{count - 1}")


def step_reasons_error(capacity: int) -> _errors.StepPlannerValueError:
    """The error for a ``reasons`` that ``step()`` refuses: it needs a code per slot (not per
    resident), since admission may fill every slot before the plan is made."""
    return _errors.reasons_array(
        f"must hold a code per slot for step() (len >= capacity={capacity})")


_PLAN_CLASSES: tuple[type, ...] = ()


def plan_classes() -> tuple[Any, ...]:
    """The StepPlan classes a ledger applies: the reference plan's and, when built, the core's.
    A duck-typed plan is refused: the compiled ledger indexes C arrays by what a plan holds."""
    global _PLAN_CLASSES
    if not _PLAN_CLASSES:
        from ._reference import StepPlan as ReferencePlan
        try:
            from ._core import StepPlan as CorePlan
        except ImportError:  # a pure-Python install
            _PLAN_CLASSES = (ReferencePlan,)
        else:
            _PLAN_CLASSES = (ReferencePlan, CorePlan)
    return _PLAN_CLASSES


def finished_mask(finished: object, rows: int) -> np.ndarray | None:
    """The sampler's mask checked: None, or a 1-D bool array of one flag per plan row."""
    if finished is None:
        return None
    if not isinstance(finished, np.ndarray) or finished.dtype != np.bool_:
        raise _errors.finished_type(finished)
    if finished.shape != (rows,):
        raise _errors.finished_shape(finished.shape, rows)
    return finished


def records_of(rows: np.ndarray, ids: np.ndarray) -> list[dict[str, Any]]:
    out = []
    for row, rid in zip(rows.tolist(), ids.tolist()):
        record = dict(zip(RESIDENT_FIELDS, row))
        record["context_committed"] = bool(record["context_committed"])
        record["request_id"] = rid
        out.append(record)
    return out


def read_only(view: np.ndarray) -> np.ndarray:
    """A copy over immutable bytes: neither it nor its ``.base`` can be made writable, as with
    the compiled ledger's views of C memory (the twin pays a copy per read; it is the model)."""
    return np.frombuffer(view.tobytes(), dtype=view.dtype)


# --- the twin -----------------------------------------------------------------------------------

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _kv_classes() -> tuple[Any, ...]:
    """The page tables the twin drives through their Python API: the pure-Python one and, when
    built, the compiled one (``stepplanner.KVPageTable`` is either, as the install decides)."""
    from ._kv_reference import KVPageTable as ReferenceTable
    try:
        from ._kv import KVPageTable as CompiledTable
    except ImportError:  # a pure-Python install
        return (ReferenceTable,)
    return (ReferenceTable, CompiledTable)


def _exclusive(method: _Method) -> _Method:
    """One call at a time: the ledger runs caller code (``__array__``, ``__index__``, a Mapping's
    ``__getitem__``, a planner) inside its calls, and a nested call there is refused, as the
    compiled ledger refuses it."""
    @functools.wraps(method)
    def call(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        if self._busy:
            raise _errors.ledger_reentered()
        self._busy = True
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy = False
    return call  # type: ignore[return-value]



class Ledger:
    """Dense resident table, waiting queue and output accounting for one engine (pure Python).

    See ``stepplanner.ledger`` for the surface; this class and the compiled one behave alike.
    """

    def __init__(self, limits: StepPlannerLimits, policy: ResolvedSchedulingPolicy | None = None,
                 *, max_waiting: int | None = None, page_table: Any = None) -> None:
        self.by_priority, self.reserved_slots, self.max_waiting = check_ledger_args(
            limits, policy, max_waiting)
        if page_table is not None:
            check_page_table(page_table, limits, _kv_classes(),
                             "a stepplanner KVPageTable (_kv_reference or _kv)")
        self._table = page_table
        self.limits = limits
        b = limits.max_batch_size
        self._rows = np.zeros(b, dtype=RESIDENT_DTYPE)
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
        self._busy = False                        # a call is running (see _exclusive)

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
        return self._rows[:self._count]

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
        table = self._table
        return 0 if table is None else int(table.num_pages - table.num_free_pages)

    @property
    def held_back(self) -> int:
        heap = None if self._table is None else self._next_heap()
        return 0 if heap is None or self._fits(heap[0]) else len(self._waiting)

    def kv_pages_in_use(self) -> int:
        return pages_in_use(self._rows["committed"][:self._count], self.limits.kv_page_size)

    def __repr__(self) -> str:
        return (f"Ledger(count={self._count}, capacity={self.capacity}, waiting={self.waiting}, "
                f"max_waiting={self.max_waiting}, reserved_slots={self.reserved_slots}, "
                f"order={'PRIORITY' if self.by_priority else 'FCFS'})")

    # --- admission ----------------------------------------------------------------------------

    @_exclusive
    def submit(self, request_id: int, prompt_length: int, priority: int = 0,
               max_new_tokens: int | None = None) -> int:
        rid, length, prio, limit = submission(request_id, prompt_length, priority,
                                              max_new_tokens, self.limits.max_input_length)
        if self._table is not None:
            check_worst_case(rid, length, limit, self._table)
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

    @_exclusive
    def cancel(self, request_id: object) -> None:
        rid = as_request_id(request_id)
        entry = self._waiting.pop(rid, None)
        if entry is not None:
            entry[6] = False
            return
        row = self._row_of.get(rid)
        if row is None:
            raise _errors.not_in_ledger(rid)
        self._remove([row])

    @_exclusive
    def admit(self) -> list[int]:
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
            if table is not None:
                table.ensure(row, length + limit)   # the worst case, which fits (checked above)
            self._count += 1
            self._admitted[n] = rid
            n += 1
        self._num_admitted = n

    def _fits(self, entry: list[Any]) -> bool:
        """Whether the free pool holds a waiting entry's worst case (prompt + max_new_tokens)."""
        _, _, length, _, _, limit, _ = entry
        pages: int = -(-(length + limit) // self._table.kv_page_size)
        return pages <= int(self._table.num_free_pages)

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

    def waiting_ids(self) -> list[int]:
        """Waiting request ids in queue order (for reports; O(n log n))."""
        return [entry[1] for entry in sorted(self._waiting.values())]

    # --- the step -----------------------------------------------------------------------------

    @_exclusive
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
        plan_rows_in_range(seq["resident"], len(paused), self._count)
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
        held = self._table.page_counts[rows].astype(np.int64) * self._table.kv_page_size
        over = np.flatnonzero(tokens > held)
        if over.size:
            k = int(over[0])
            row = int(rows[k])
            raise _errors.ledger_pages_exceeded(k, row, int(self._ids[row]), int(tokens[k]),
                                                int(held[k]))

    def _apply(self, plan: Any, seq: np.ndarray, mask: np.ndarray | None, retire: bool) -> None:
        plan.apply_to(self._rows[:self._count])  # checks overflow before it writes anything
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

    @_exclusive
    def retire_finished(self) -> None:
        """Remove every resident that an ``apply`` marked finished."""
        self._retire_done()

    def _retire_done(self) -> None:
        self._remove(np.flatnonzero(self._done[:self._count]).tolist())

    @_exclusive
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
            planner.plan(self._rows[:self._count])
        else:
            seq, mask = self._check_apply(pending, finished)
        if reasons is not None:
            _check_reasons(reasons, self.capacity)
        if pending is not None:
            self._apply(pending, seq, mask, retire=True)
        self._admit()
        plan = planner.plan(self._rows[:self._count], reasons=reasons)
        self._pending = plan
        return plan

    @_exclusive
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

    @_exclusive
    def retire_rows(self, rows: Sequence[int] | np.ndarray) -> None:
        """Remove residents by row index."""
        listed = rows_argument(rows)
        check_rows(listed, self._count)
        self._remove(listed)

    def _remove(self, rows: list[int]) -> None:
        # Highest row first: the last row is then never one still waiting to be removed.
        self._pending = None
        table = self._table
        last = self._count - 1
        for row in sorted(rows, reverse=True):
            del self._row_of[int(self._ids[row])]
            if table is not None:  # slot i stays row i: the pages move as the row does
                table.release(row)
                if row != last:
                    table.move(last, row)
            if row != last:
                for column in (self._rows, self._ids, self._generated, self._max_new, self._done):
                    column[row] = column[last]
                self._row_of[int(self._ids[row])] = row
            last -= 1
        old, self._count = self._count, last + 1
        self._rows[self._count:old] = 0
        self._ids[self._count:old] = -1

    # --- snapshots (explain, record/replay) ---------------------------------------------------

    @_exclusive
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
        self._num_finished = self._num_admitted = 0
        self._row_of = {rid: row for row, rid in enumerate(ids.tolist())}
        self._count = n
        if n:
            self._next_arrival = max(self._next_arrival, int(table["arrival"].max()) + 1)

    def to_records(self) -> list[dict[str, Any]]:
        return records_of(self.residents, self._ids[:self._count])


def _check_reasons(reasons: object, capacity: int) -> None:
    if (not isinstance(reasons, np.ndarray) or reasons.dtype != np.uint8 or reasons.ndim != 1
            or not reasons.flags.writeable or not reasons.flags.c_contiguous
            or len(reasons) < capacity):
        raise step_reasons_error(capacity)
