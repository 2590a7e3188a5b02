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

__all__ = ["PagedLedger", "release_rows", "worst_case_pages"]

# What PagedLedger reads from its ledger as is; every state-changing method is its own or refused.
_FORWARDED = frozenset({"capacity", "count", "free_slots", "residents", "request_ids", "limits",
                        "by_priority", "reserved_slots", "to_records"})
_REFUSED = frozenset({"load"})


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
        raise ValueError(f"rows {listed} repeat a row; allowed: each at most once")
    last = n - 1
    for row in sorted(listed, reverse=True):  # the ledger's order: highest row first
        page_table.release(row)
        if row != last:
            page_table.move(last, row)
        last -= 1


class PagedLedger:
    """A ``Ledger`` with a ``KVPageTable`` attached: slots and pages kept together, and
    admission that reserves each request's worst case so a step never runs out of pages.

    ``submit(request_id, prompt_length, priority, max_new_tokens)`` queues a request here; it
    reaches the ledger's own queue (whose order, FCFS or PRIORITY, then decides admission) only
    once its worst case, ``prompt_length + max_new_tokens`` tokens, fits the free pool beside
    what is already promised to requests ahead of it. Requests wait here in arrival order, so a
    large request at the head is never overtaken for ever by smaller ones. ``admit`` reserves
    each admitted row's worst case (``ensure``), ``retire``/``retire_rows`` release the retired
    rows' pages and move the last rows' pages as the ledger moves their rows. ``apply`` and the
    ledger's read-only members (``residents``, ``request_ids``, ``count``, ...) are the wrapped
    ledger's; its other state-changing methods (``load``) are refused here, since they would
    make residents without pages. Requests enter the ledger only through this object:
    ``admit`` refuses a ledger that was changed behind its back.
    """

    def __init__(self, ledger: Any, page_table: Any) -> None:
        if ledger.count:
            raise ValueError(f"ledger holds count={ledger.count} residents; allowed: an empty "
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
        self._tokens: dict[int, int] = {}   # request id -> worst-case tokens, until it retires

    def __getattr__(self, name: str) -> Any:
        if name in _FORWARDED:
            return getattr(self.ledger, name)
        if name in _REFUSED:
            raise AttributeError(
                f"PagedLedger.{name} is refused: it would change the ledger's residents without "
                "their KV pages; use submit/admit/retire here, or the ledger and page table "
                "directly without a PagedLedger")
        raise AttributeError(f"'PagedLedger' object has no attribute {name!r}")

    def apply(self, plan: Any) -> None:
        """The ledger's ``apply``: it advances residents' tokens, never their rows or pages."""
        self.ledger.apply(plan)

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

    def submit(self, request_id: int, prompt_length: int, priority: int = 0,
               max_new_tokens: int = 0) -> None:
        """Queue a request with its worst case; refused (``ValueError``) when no pool could
        ever hold it or its prompt is one the ledger would refuse."""
        rid = as_int("request_id", request_id)
        length = as_int32("prompt_length", prompt_length)
        s_in = self.ledger.limits.max_input_length
        if not 1 <= length <= s_in:
            raise ValueError(f"prompt_length={length} is out of range; allowed: 1..{s_in}")
        if rid in self._tokens or (self._outside_requests() and (
                rid in self.ledger.request_ids.tolist() or rid in self.ledger.waiting_ids())):
            raise ValueError(f"request_id={rid} is already waiting or resident")
        table = self.page_table
        pages = worst_case_pages(length, max_new_tokens, table.kv_page_size)
        limit = min(table.max_pages_per_sequence, table.num_pages)
        if pages > limit:
            raise ValueError(
                f"request_id={rid}: prompt_length + max_new_tokens = "
                f"{length} + {max_new_tokens} needs {pages} pages; allowed: at most "
                f"{limit} (min of max_pages_per_sequence and num_pages)")
        self._held.append((rid, length, as_int32("priority", priority), pages))
        self._tokens[rid] = length + int(max_new_tokens)

    def admit(self) -> list[int]:
        """Pass held requests whose worst case fits on to the ledger, admit, reserve pages."""
        outside = self._outside_requests()
        if outside:
            raise RuntimeError(
                f"the ledger's residents and queue differ by {outside:+d} request(s) from those "
                "that came through this PagedLedger (submitted, loaded or retired on the ledger "
                "itself); their pages are unknown, so nothing is admitted")
        free = self.page_table.num_free_pages - self._promised
        while self._held and self._held[0][3] <= free:
            rid, length, prio, pages = self._held[0]
            self.ledger.submit(rid, length, prio)
            self._held.popleft()               # only once the ledger took it
            self._promised += pages
            free -= pages
        admitted = self.ledger.admit()
        first = self.ledger.count - len(admitted)
        for row, rid in enumerate(admitted, start=first):
            tokens = self._tokens[rid]
            if not self.page_table.ensure(row, tokens):  # pragma: no cover - promised above
                raise RuntimeError(f"request {rid}: its promised pages were not free")
            self._promised -= -(-tokens // self.page_table.kv_page_size)
        return list(admitted)

    def retire_rows(self, rows: Sequence[int] | np.ndarray) -> None:
        count = self.ledger.count
        live = self.ledger.request_ids.tolist()
        self.ledger.retire_rows(rows)          # checks everything first, then swap-removes
        listed = np.asarray(rows).ravel().tolist()   # valid rows now: the ledger accepted them
        ids = [live[r] for r in listed]
        release_rows(self.page_table, listed, count)
        for rid in ids:
            self._tokens.pop(rid, None)

    def retire(self, request_ids: Iterable[int]) -> None:
        ids = list(request_ids)
        live = self.ledger.request_ids.tolist()
        if len(set(ids)) != len(ids) or not all(r in live for r in ids):
            self.ledger.retire(ids)            # raises the ledger's own error; nothing changed
        self.retire_rows([live.index(r) for r in ids])
