"""KV pages beside a ledger: how many pages a request can ever need, and the page table's side
of a ledger's swap-remove.

``Ledger(limits, policy, page_table=table)`` does both itself: it reserves each request's worst
case (``worst_case_pages``) at admission, so a step never runs out of pages, and moves the pages
with the rows. ``release_rows`` is for a runtime that keeps its own page table beside a ledger
without one (and grows each slot with ``KVPageTable.ensure`` as its rows grow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _errors
from ..planner._fields import as_int32

__all__ = ["release_rows", "worst_case_pages"]


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
        raise _errors.out_of_range(
            "prompt_length + max_new_tokens",
            total,
            f"<= {_errors.INT32_MAX}, so that token counts fit int32",
        )
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
            f"rows {listed} repeat a row; allowed: each at most once"
        )
    last = n - 1
    for row in sorted(listed, reverse=True):  # the ledger's order: highest row first
        page_table.release(row)
        if row != last:
            page_table.move(last, row)
        last -= 1
