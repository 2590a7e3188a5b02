"""The resident ledger a serving loop keeps between steps (SPEC §6), and its admission queue.

A ``Ledger`` owns a dense ``RESIDENT_DTYPE`` table of ``max_batch_size`` rows and one int64
request id per row; rows ``0..count-1`` are the residents, always dense. ``ledger.residents`` is
a view of those rows that ``StepPlanner.plan()`` reads in place, so a serving loop is::

    ledger.submit(request_id, prompt_length, priority)   # on each arrival
    ledger.admit()                                       # before each step
    plan = planner.plan(ledger.residents)
    ...run the step...
    ledger.apply(plan)                                   # SPEC §6, in C (StepPlan.apply_to)
    ledger.retire(finished_request_ids)

Decisions where SPEC §6 is silent (documented in docs/simulator.md):

* Retiring swap-removes: the last rows move into the holes. Rows carry no order; the planner
  orders by (priority, arrival) keys, and a swap disturbs its previous order by one key per
  retired row, where shifting would renumber every later row.
* Arrival stamps are the ledger's own submission counter (0, 1, 2, ...), so they are monotonic
  and unique by construction.
* ``priority < 0`` marks an urgent request: it may take the ``priority_reserved_slots`` that
  requests with ``priority >= 0`` may not. Under ``FCFS`` the queue is otherwise in arrival
  order, but when its head is held back by the reservation an urgent request behind it may still
  take a reserved slot (that is what the reservation is for). Under ``PRIORITY`` urgent requests
  sort first anyway.
* Every operation checks everything first; one that raises leaves the ledger unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _errors
from ._errors import StepPlannerOverflowError, StepPlannerTypeError, StepPlannerValueError
from ._fields import as_bool, as_int, as_int32, as_uint64
from ._policy import ResolvedSchedulingPolicy, StepPlannerLimits, check_reserved_slots
from ._types import RESIDENT_DTYPE, RESIDENT_FIELDS, SchedulingPolicy

__all__ = ["Ledger", "RESIDENT_FIELDS"]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _request_id(value: object, field: str = "request_id") -> int:
    rid = as_int(field, value)
    if not INT64_MIN <= rid <= INT64_MAX:
        raise StepPlannerOverflowError(f"{field}={rid} does not fit int64")
    return rid


class Ledger:
    """Dense resident table + waiting queue for one engine (see the module doc).

    ``policy`` supplies ``scheduling_policy`` (queue order) and ``priority_reserved_slots``;
    without one the queue is FCFS with no reserved slots.
    """

    def __init__(self, limits: StepPlannerLimits,
                 policy: ResolvedSchedulingPolicy | None = None) -> None:
        if not isinstance(limits, StepPlannerLimits):
            raise _errors.wrong_type("limits", "StepPlannerLimits", limits)
        if policy is not None and not isinstance(policy, ResolvedSchedulingPolicy):
            raise StepPlannerTypeError(
                "policy must be a ResolvedSchedulingPolicy or None, got "
                f"{type(policy).__name__}")
        reserved = policy.priority_reserved_slots if policy is not None else 0
        check_reserved_slots(reserved, limits)
        self.limits = limits
        self.by_priority = (policy is not None
                            and policy.scheduling_policy == SchedulingPolicy.PRIORITY)
        self.reserved_slots = reserved
        self._rows = np.zeros(limits.max_batch_size, dtype=RESIDENT_DTYPE)
        self._ids = np.full(limits.max_batch_size, -1, dtype=np.int64)
        self._count = 0
        self._view = self._rows[:0]  # rows[:count], rebuilt only when count changes
        self._next_arrival = 0
        # Two heaps so that an urgent request can be found behind a held-back head in O(log n).
        self._urgent: list[tuple[Any, ...]] = []
        self._normal: list[tuple[Any, ...]] = []
        self._known: set[int] = set()

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
        return len(self._urgent) + len(self._normal)

    @property
    def residents(self) -> np.ndarray:
        """Rows ``0..count-1`` as a writable view: what ``planner.plan()`` reads in place.

        The view is valid until the next admit/retire/load changes ``count``."""
        return self._view

    @property
    def request_ids(self) -> np.ndarray:
        """The request id of each resident row, as a read-only view."""
        view = self._ids[:self._count]
        view.flags.writeable = False
        return view

    def __repr__(self) -> str:
        return (f"Ledger(count={self._count}, capacity={self.capacity}, waiting={self.waiting}, "
                f"reserved_slots={self.reserved_slots}, "
                f"order={'PRIORITY' if self.by_priority else 'FCFS'})")

    # --- admission ----------------------------------------------------------------------------

    def submit(self, request_id: int, prompt_length: int, priority: int = 0) -> int:
        """Queue a request; returns its arrival stamp.

        A prompt longer than ``max_input_length`` is refused here with ``ValueError``: the
        planner can never schedule it, and truncating it would change the answer.
        """
        rid = _request_id(request_id)
        length = as_int32("prompt_length", prompt_length)
        prio = as_int32("priority", priority)
        s_in = self.limits.max_input_length
        if length < 1:
            raise StepPlannerValueError(
                f"prompt_length={length} is out of range; allowed: 1..{s_in}")
        if length > s_in:
            raise StepPlannerValueError(
                f"prompt_length={length} exceeds max_input_length={s_in}: request {rid} is "
                f"refused (a prompt is never truncated); allowed: 1..{s_in}")
        if rid in self._known:
            raise StepPlannerValueError(
                f"request_id={rid} is already waiting or resident; allowed: an id "
                "not in the ledger")
        arrival = self._next_arrival
        self._next_arrival += 1
        key = (prio, arrival) if self.by_priority else (arrival,)
        heapq.heappush(self._urgent if prio < 0 else self._normal,
                       (key, rid, length, prio, arrival))
        self._known.add(rid)
        return arrival

    def admit(self) -> list[int]:
        """Move waiting requests into free slots in queue order; returns the admitted ids.

        A request with ``priority >= 0`` is admitted only while more than
        ``priority_reserved_slots`` slots are free; an urgent one (``< 0``) may use them.
        """
        admitted: list[int] = []
        while self._count < len(self._rows):
            heap = self._next_heap()
            if heap is None:
                break
            _, rid, length, prio, arrival = heapq.heappop(heap)
            self._rows[self._count] = (prio, arrival, length, 0, False, 0)
            self._ids[self._count] = rid
            self._count += 1
            admitted.append(rid)
        if admitted:
            self._view = self._rows[:self._count]
        return admitted

    def _next_heap(self) -> list[tuple[Any, ...]] | None:
        urgent, normal = self._urgent, self._normal
        head = urgent if urgent and (not normal or urgent[0][0] < normal[0][0]) else normal
        if not head:
            return None
        if head is normal and self.free_slots <= self.reserved_slots:
            return urgent or None
        return head

    def waiting_ids(self) -> list[int]:
        """Waiting request ids in queue order (for reports; O(n log n))."""
        return [entry[1] for entry in sorted(self._urgent + self._normal)]

    # --- the step -----------------------------------------------------------------------------

    def apply(self, plan: Any) -> None:
        """Advance the residents by ``plan`` (SPEC §6) via ``plan.apply_to``, in C.

        The plan must have been made over exactly this ledger's ``count`` rows.
        """
        try:
            n = plan.num_residents
            apply_to = plan.apply_to
        except AttributeError:
            raise _errors.wrong_type("plan", "StepPlan", plan) from None
        if n != self._count:
            raise StepPlannerValueError(
                f"plan was made over {n} residents but the ledger holds "
                f"count={self._count}; allowed: a plan of ledger.residents")
        apply_to(self._view)

    def retire(self, request_ids: Iterable[int]) -> None:
        """Remove finished requests by id; the last rows move into the freed slots."""
        ids = [_request_id(r) for r in request_ids]
        if len(set(ids)) != len(ids):
            raise StepPlannerValueError(
                f"request_ids {ids} repeat an id; allowed: each at most once")
        live = self._ids[:self._count]
        rows = []
        for rid in ids:
            hit = np.flatnonzero(live == rid)
            if not hit.size:
                raise StepPlannerValueError(
                    f"request_id={rid} is not resident; allowed: one of "
                    "ledger.request_ids")
            rows.append(int(hit[0]))
        self._remove(rows)

    def retire_rows(self, rows: Sequence[int] | np.ndarray) -> None:
        """Remove residents by row index (the path the simulator uses)."""
        try:
            arr = np.asarray(rows)
        except ValueError:  # ragged nesting: numpy's message would not say which argument
            raise StepPlannerValueError(
                f"rows={rows!r} is not a flat sequence of row indices") from None
        if arr.size and arr.dtype.kind not in "iu":
            raise StepPlannerTypeError(f"rows must be integers, got dtype {arr.dtype}")
        listed = arr.ravel().tolist()
        for row in listed:
            if not 0 <= row < self._count:
                raise StepPlannerValueError(
                    f"row {row} is out of range; allowed: 0..{self._count - 1}")
        if len(set(listed)) != len(listed):
            raise StepPlannerValueError(f"rows {listed} repeat a row; allowed: each at most once")
        self._remove(listed)

    def _remove(self, rows: list[int]) -> None:
        # Highest row first: the last row is then never one still waiting to be removed.
        rows_, ids = self._rows, self._ids
        old = self._count
        self._known.difference_update(ids[rows].tolist())
        last = old - 1
        for row in sorted(rows, reverse=True):
            if row != last:
                rows_[row] = rows_[last]
                ids[row] = ids[last]
            last -= 1
        self._count = last + 1
        rows_[self._count:old] = 0
        ids[self._count:old] = -1
        self._view = rows_[:self._count]

    # --- snapshots (explain, record/replay) ---------------------------------------------------

    def load(self, residents: Sequence[Mapping[str, Any]]) -> None:
        """Replace the resident table with ``residents`` (dicts of RESIDENT_DTYPE fields, plus an
        optional ``request_id``: when absent, the row index; ``None`` is refused like any
        field's). Arrivals must be unique; new stamps continue after the largest. The waiting
        queue is kept."""
        if len(residents) > self.capacity:
            raise StepPlannerValueError(
                f"{len(residents)} residents exceed max_batch_size="
                f"{self.capacity}; allowed: 0..{self.capacity}")
        table = np.zeros(len(residents), dtype=RESIDENT_DTYPE)
        ids = np.arange(len(residents), dtype=np.int64)
        for i, record in enumerate(residents):
            table[i], rid = _row(i, record)
            if rid is not None:
                ids[i] = rid
        for name, column in (("arrival", table["arrival"]), ("request_id", ids)):
            if np.unique(column).size != column.size:
                raise StepPlannerValueError(
                    f"two residents have the same {name}; allowed: unique values")
        waiting = self._known_waiting()
        clash = waiting & set(ids.tolist())
        if clash:
            raise StepPlannerValueError(f"request_id {sorted(clash)[0]} is also waiting")
        self._known = waiting | set(ids.tolist())
        n = len(residents)
        self._rows[:] = 0
        self._ids[:] = -1
        self._rows[:n] = table
        self._ids[:n] = ids
        self._count = n
        self._view = self._rows[:n]
        if n:
            self._next_arrival = max(self._next_arrival, int(table["arrival"].max()) + 1)

    def _known_waiting(self) -> set[int]:
        return {entry[1] for entry in self._urgent + self._normal}

    def to_records(self) -> list[dict[str, Any]]:
        """The residents as JSON-ready dicts (``load`` reads them back)."""
        out = []
        for row, rid in zip(self.residents.tolist(), self._ids[:self._count].tolist()):
            record = dict(zip(RESIDENT_FIELDS, row))
            record["context_committed"] = bool(record["context_committed"])
            record["request_id"] = rid
            out.append(record)
        return out


def _row(index: int, record: Mapping[str, Any]) -> tuple[tuple[Any, ...], int | None]:
    if not isinstance(record, Mapping):
        raise StepPlannerTypeError(
            f"residents[{index}] must be an object/dict, got "
            f"{type(record).__name__}")
    unknown = set(record) - set(RESIDENT_FIELDS) - {"request_id"}
    if unknown:
        raise StepPlannerValueError(
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
    return row, _request_id(record["request_id"], where + "request_id")
