"""KV pages beside the ledger: how many pages a request can ever need, and the page table's
side of a ledger's swap-remove.

A runtime that reserves a request's worst case at admission (prompt + ``max_new_tokens``) never
has a step run out of pages, so it never evicts: the reservation is ``worst_case_pages`` pages,
taken with ``KVPageTable.ensure(slot, prompt_length + max_new_tokens)`` when the request gets its
slot, and given back with ``release`` when it retires.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from . import _errors
from ._fields import as_int, as_int32
from ._ledger_reference import as_request_id, submission

__all__ = ["PagedLedger", "release_rows", "worst_case_pages"]

# What PagedLedger reads from its ledger as is; every state-changing method is its own or refused.
_FORWARDED = frozenset({"capacity", "count", "free_slots", "residents", "request_ids", "limits",
                        "by_priority", "reserved_slots", "max_waiting", "output_tokens",
                        "finished_ids", "admitted_ids", "to_records"})
_REFUSED = {
    "load": "it would make residents without their KV pages; submit and admit here instead",
    "step": "use apply(plan, finished, retire=True), admit() and planner.plan(residents), "
            "which keep the pages beside the rows",
}


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
    total = as_int("prompt_length + max_new_tokens", prompt + new)
    if total > _errors.INT32_MAX:
        raise _errors.out_of_range("prompt_length + max_new_tokens", total,
                                   f"<= {_errors.INT32_MAX}, so that token counts fit int32")
    return -(-total // page)


def release_rows(page_table: Any, rows: Sequence[int], count: int) -> None:
    """The page table's side of ``Ledger.retire_rows(rows)`` over ``count`` residents: each
    retired row's pages go back to the pool, and the last rows' pages move into the holes
    exactly as the ledger's swap-remove moves their rows, so slot ``i`` stays ledger row ``i``.

    Everything is checked before anything changes.
    """
    n = as_int32("count", count)
    if not 0 <= n <= page_table.max_batch_size:
        raise _errors.out_of_range("count", n, f"0..{page_table.max_batch_size}")
    listed = [as_int32("rows", r) for r in rows]
    for row in listed:
        if not 0 <= row < n:
            raise _errors.out_of_range("rows", row, f"0..{n - 1} (a row below count)")
    if len(set(listed)) != len(listed):
        raise _errors.StepPlannerValueError(
            f"rows {listed} repeat a row; allowed: each at most once")
    last = n - 1
    for row in sorted(listed, reverse=True):  # the ledger's order: highest row first
        page_table.release(row)
        if row != last:
            page_table.move(last, row)
        last -= 1


class PagedLedger:
    """A ``Ledger`` with a ``KVPageTable`` attached: slots and pages kept together, and
    admission that reserves each request's worst case so a step never runs out of pages.

    ``submit(request_id, prompt_length, priority, max_new_tokens=N)`` queues a request here; it
    reaches the ledger's own queue (whose order, FCFS or PRIORITY, then decides admission) only
    once its worst case, ``prompt_length + N`` tokens, fits the free pool beside what is already
    promised to requests ahead of it. Requests wait here in arrival order, so a large request at
    the head is never overtaken for ever by smaller ones. ``N`` goes on to the ledger, which
    finishes the request once it has emitted ``N`` tokens, so no request outgrows its
    reservation. ``admit`` reserves each admitted row's worst case (``ensure``); ``apply``,
    ``retire_finished``, ``retire``, ``retire_rows`` and ``cancel`` release the pages of the
    requests they remove and move the last rows' pages as the ledger moves their rows. The
    ledger's read-only members (``residents``, ``request_ids``, ``count``, ``finished_ids``,
    ...) are the wrapped ledger's; its ``load`` is refused (it would make residents without
    pages), and so is the fused ``step`` (the separate calls are the paged loop). Requests enter
    the ledger only through this object: ``admit`` refuses a ledger changed behind its back.
    """

    def __init__(self, ledger: Any, page_table: Any) -> None:
        if ledger.count:
            raise _errors.StepPlannerValueError(
                f"ledger holds count={ledger.count} residents; allowed: an empty "
                "ledger (their pages would be unknown)")
        if page_table.max_batch_size < ledger.capacity:
            raise _errors.kv_slots_short(page_table.max_batch_size, ledger.capacity)
        if page_table.kv_page_size != ledger.limits.kv_page_size:
            raise _errors.kv_page_size_mismatch(page_table.kv_page_size,
                                                ledger.limits.kv_page_size)
        self.ledger = ledger
        self.page_table = page_table
        self._held: deque[tuple[int, int, int, int]] = deque()   # not yet in the ledger
        self._promised = 0         # pages of requests in the ledger's queue, not yet admitted
        self._tokens: dict[int, int] = {}   # request id -> worst-case tokens, until it leaves

    def __getattr__(self, name: str) -> Any:
        if name in _FORWARDED:
            return getattr(self.ledger, name)
        if name in _REFUSED:
            raise AttributeError(f"PagedLedger.{name} is refused: {_REFUSED[name]}")
        raise AttributeError(f"'PagedLedger' object has no attribute {name!r}")

    def waiting_ids(self) -> list[int]:
        """The ledger's queue in order, then the requests held back for pages, in arrival order."""
        return list(self.ledger.waiting_ids()) + [held[0] for held in self._held]

    def _outside_requests(self) -> int:
        """Requests the ledger holds that did not come through this object (0 when none)."""
        mine = len(self._tokens) - len(self._held)
        return int(self.ledger.count) + int(self.ledger.waiting) - mine

    @property
    def waiting(self) -> int:
        return len(self._held) + int(self.ledger.waiting)

    @property
    def held_back(self) -> int:
        """Requests waiting for their worst case to fit (not yet in the ledger's queue)."""
        return len(self._held)

    @property
    def reserved_pages(self) -> int:
        """Pages held by residents (their worst cases) and promised to queued requests."""
        table = self.page_table
        return int(table.num_pages - table.num_free_pages) + self._promised

    def kv_pages_in_use(self) -> int:
        """Pages that hold committed KV now: ``sum(ceil(committed / P))`` over the residents."""
        p = self.page_table.kv_page_size
        return int(((self.ledger.residents["committed"].astype(np.int64) + p - 1) // p).sum())

    def _pages(self, tokens: int) -> int:
        return -(-tokens // int(self.page_table.kv_page_size))

    # --- admission ----------------------------------------------------------------------------

    def submit(self, request_id: int, prompt_length: int, priority: int = 0, *,
               max_new_tokens: int) -> None:
        """Queue a request with its worst case. Every field is checked as the ledger checks it
        (so ``admit`` never meets a request the ledger refuses); refused besides when no pool
        could ever hold it, and with ``QueueFullError`` when ``max_waiting`` requests already
        wait here and in the ledger's queue together."""
        if max_new_tokens is None:
            raise _errors.StepPlannerValueError(
                "max_new_tokens=None is refused: a PagedLedger reserves each request's worst "
                "case, so it needs a bound; allowed: >= 1")
        rid, length, prio, new = submission(request_id, prompt_length, priority,
                                            max_new_tokens, self.ledger.limits.max_input_length)
        if rid in self._tokens or (self._outside_requests() and (
                rid in self.ledger.request_ids.tolist() or rid in self.ledger.waiting_ids())):
            raise _errors.duplicate_request(rid)
        table = self.page_table
        pages = worst_case_pages(length, new, table.kv_page_size)
        limit = min(table.max_pages_per_sequence, table.num_pages)
        if pages > limit:
            raise _errors.StepPlannerValueError(
                f"request_id={rid}: prompt_length + max_new_tokens = "
                f"{length} + {new} needs {pages} pages; allowed: at most "
                f"{limit} (min of max_pages_per_sequence and num_pages)")
        if self.waiting >= self.ledger.max_waiting:
            raise _errors.queue_full(rid, self.ledger.max_waiting)
        self._held.append((rid, length, prio, new))
        self._tokens[rid] = length + new

    def admit(self) -> list[int]:
        """Pass held requests whose worst case fits on to the ledger, admit, reserve pages.

        A request leaves the hold only once the ledger has taken it, so when passing one on
        raises, the requests before it are in the ledger's queue with their pages promised, it
        and those behind it are still held, and the next ``admit`` carries on from there.
        """
        outside = self._outside_requests()
        if outside:
            raise _errors.StepPlannerRuntimeError(
                f"the ledger's residents and queue differ by {outside:+d} request(s) from those "
                "that came through this PagedLedger (submitted, loaded or retired on the ledger "
                "itself); their pages are unknown, so nothing is admitted")
        free = self.page_table.num_free_pages - self._promised
        room = self.ledger.max_waiting - self.ledger.waiting   # submit keeps it >= len(held)
        while self._held and room > 0:
            rid, length, prio, new = self._held[0]
            pages = self._pages(length + new)
            if pages > free:
                break
            self.ledger.submit(rid, length, prio, max_new_tokens=new)
            self._held.popleft()               # only once the ledger took it
            self._promised += pages
            free -= pages
            room -= 1
        admitted = self.ledger.admit()
        first = self.ledger.count - len(admitted)
        for row, rid in enumerate(admitted, start=first):
            tokens = self._tokens[rid]
            if not self.page_table.ensure(row, tokens):  # pragma: no cover - promised above
                raise RuntimeError(f"request {rid}: its promised pages were not free")
            self._promised -= self._pages(tokens)
        return list(admitted)

    # --- the step -----------------------------------------------------------------------------

    def apply(self, plan: Any, finished: np.ndarray | None = None, *,
              retire: bool = False) -> np.ndarray:
        """The ledger's ``apply`` (output accounting, ``finished``, ``retire``), refused first
        when a plan row would write KV beyond the pages reserved for it; with ``retire`` the
        retired rows' pages go back to the pool. Returns the ledger's ``finished_ids``."""
        self._check_reserved(plan)
        count = int(self.ledger.count)
        live = self.ledger.request_ids.copy() if retire else None
        done: np.ndarray = self.ledger.apply(plan, finished, retire=retire)
        if live is not None:
            self._release_removed(live, count)
        return done

    def _check_reserved(self, plan: Any) -> None:
        try:
            seq = plan.as_array()
            n = plan.num_residents
        except AttributeError:
            return                       # not a StepPlan: the ledger's apply says so
        if n != self.ledger.count:
            return                       # the ledger's apply says so
        p = self.page_table.kv_page_size
        rows = seq["resident"].astype(np.intp)
        need = seq["past_length"].astype(np.int64) + seq["query_length"]
        cap = self.page_table.page_counts[rows].astype(np.int64) * p
        over = np.flatnonzero(need > cap)
        if over.size:
            k = int(over[0])
            row = int(rows[k])
            raise _errors.StepPlannerValueError(
                f"plan row {k} (resident {row}, request {int(self.ledger.request_ids[row])}) "
                f"would hold {int(need[k])} tokens of KV; allowed: at most the {int(cap[k])} "
                f"its reserved pages hold (a request finished but not retired must be retired "
                "before it is planned a second time)")

    def retire_finished(self) -> None:
        """Retire every resident the ledger marked finished and release its pages."""
        count = int(self.ledger.count)
        live = self.ledger.request_ids.copy()
        self.ledger.retire_finished()
        self._release_removed(live, count)

    def _release_removed(self, live: np.ndarray, count: int) -> None:
        """The page table's side of a ledger call that swap-removed rows of ``live``."""
        if int(self.ledger.count) == count:
            return
        now = set(self.ledger.request_ids.tolist())   # a set: np.isin costs ~5x more here
        ids = live.tolist()
        gone = [row for row, rid in enumerate(ids) if rid not in now]
        release_rows(self.page_table, gone, count)
        for row in gone:
            self._tokens.pop(ids[row], None)

    # --- leaving ------------------------------------------------------------------------------

    def cancel(self, request_id: object) -> None:
        """Remove a request wherever it is: held back here, in the ledger's queue (its promised
        pages are given back) or resident (its pages are released, the last row's move in)."""
        rid = as_request_id(request_id)
        if rid not in self._tokens:
            raise _errors.not_in_ledger(rid)
        for i, held in enumerate(self._held):
            if held[0] == rid:
                del self._held[i]
                del self._tokens[rid]
                return
        rows = np.flatnonzero(self.ledger.request_ids == rid)
        count = int(self.ledger.count)
        self.ledger.cancel(rid)
        if rows.size:
            release_rows(self.page_table, [int(rows[0])], count)
        else:
            self._promised -= self._pages(self._tokens[rid])
        del self._tokens[rid]

    def retire_rows(self, rows: Sequence[int] | np.ndarray) -> None:
        count = int(self.ledger.count)
        live = self.ledger.request_ids.copy()
        self.ledger.retire_rows(rows)          # checks everything first, then swap-removes
        self._release_removed(live, count)

    def retire(self, request_ids: Iterable[int]) -> None:
        count = int(self.ledger.count)
        live = self.ledger.request_ids.copy()
        self.ledger.retire(request_ids)        # checks everything first, then swap-removes
        self._release_removed(live, count)
