"""The checks both KV implementations share, written down once: the arguments of
``KVPageTable`` and ``StepInputs``, and the invariants of a page table, checked over its raw
arrays (both implementations' ``KVPageTable.check()`` run ``check_page_table`` over their own
storage; the differential tests hold the storage itself equal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import _errors
from ..planner._fields import as_int32
from ..planner._policy import StepPlannerLimits
from ._buffers import check_layout

__all__ = [
    "Geometry",
    "PageTableInvariantError",
    "check_page_table",
    "check_table_fits",
    "inputs_arguments",
    "table_arguments",
]


class Geometry(NamedTuple):
    """A page table's sizes as its own storage holds them (the compiled table's C struct, the
    twin's private arrays), read by each implementation's ``geometry(table)``. Every check reads
    these, never the table's Python properties: a subclass may override those, and the kernels
    index by what the storage holds."""

    max_batch_size: int
    max_pages_per_sequence: int
    num_pages: int
    kv_page_size: int
    num_free_pages: int


def _positive(field: str, value: object) -> int:
    v = as_int32(field, value)
    if v < 1:
        raise _errors.out_of_range(field, v, ">= 1")
    return v


def table_arguments(
    max_batch_size: object, max_pages_per_sequence: object, num_pages: object, kv_page_size: object
) -> tuple[int, int, int, int]:
    """``KVPageTable``'s arguments as ints (b, m, n, p), or the error naming the first bad one."""
    b = _positive("max_batch_size", max_batch_size)
    m = _positive("max_pages_per_sequence", max_pages_per_sequence)
    n = _positive("num_pages", num_pages)
    p = _positive("kv_page_size", kv_page_size)
    if b * m > _errors.INT32_MAX:
        raise _errors.out_of_range(
            "max_batch_size * max_pages_per_sequence",
            b * m,
            f"<= {_errors.INT32_MAX}, so that page indices fit int32",
        )
    return b, m, n, p


def inputs_arguments(
    limits: object,
    page_table: Any,
    table_class: type,
    layout: object,
    geometry: Callable[[Any], Geometry],
) -> tuple[str, Geometry]:
    """``StepInputs``' arguments checked (``table_class``: the implementation's own
    ``KVPageTable``, ``geometry`` its reader of a table's storage); returns the layout and the
    table's geometry."""
    if not isinstance(limits, StepPlannerLimits):
        raise _errors.wrong_type("limits", "StepPlannerLimits", limits)
    if not isinstance(page_table, table_class):
        raise _errors.StepPlannerTypeError(
            f"page_table must be a {table_class.__module__}.{table_class.__name__}, got "
            f"{type(page_table).__module__}.{type(page_table).__name__}"
        )
    layout = check_layout(layout)
    sizes = geometry(page_table)
    check_table_fits(sizes, limits)
    return layout, sizes


def check_table_fits(sizes: Geometry, limits: StepPlannerLimits) -> None:
    """A page table (its ``Geometry``) for ``limits``: its page size, and a slot for every
    resident row (the same check for ``StepInputs`` and for a ``Ledger`` that owns the table)."""
    if sizes.kv_page_size != limits.kv_page_size:
        raise _errors.kv_page_size_mismatch(sizes.kv_page_size, limits.kv_page_size)
    if sizes.max_batch_size < limits.max_batch_size:
        raise _errors.kv_slots_short(sizes.max_batch_size, limits.max_batch_size)


class PageTableInvariantError(AssertionError):
    """A page table breaks an invariant; the message says which and where."""


def check_page_table(
    rows: np.ndarray, counts: np.ndarray, free: np.ndarray, num_pages: int
) -> None:
    """``rows`` [slots, max_pages], ``counts`` [slots], ``free``: the free pool's page ids."""
    fail = PageTableInvariantError
    width = rows.shape[1]
    for slot in range(rows.shape[0]):
        n = int(counts[slot])
        if not 0 <= n <= width:
            raise fail(f"slot {slot} counts {n} pages; allowed: 0..{width}")
        row = rows[slot]
        live, tail = row[:n], row[n:]
        if (tail != -1).any():
            k = n + int(np.flatnonzero(tail != -1)[0])
            raise fail(
                f"slot {slot} has page {int(row[k])} at {k}, after its last live page "
                f"({n} live); allowed: -1"
            )
        bad = (live < 0) | (live >= num_pages)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise fail(
                f"slot {slot} holds page id {int(live[k])} at {k}; allowed: 0..{num_pages - 1}"
            )
    used = np.concatenate(
        [rows[s, : int(counts[s])] for s in range(rows.shape[0])] + [np.zeros(0, dtype=rows.dtype)]
    )
    ids, seen = np.unique(used, return_counts=True)
    if (seen > 1).any():
        page = int(ids[np.flatnonzero(seen > 1)[0]])
        holders = [s for s in range(rows.shape[0]) if page in rows[s, : int(counts[s])]]
        raise fail(f"page {page} is held twice (slots {holders})")
    if ((free < 0) | (free >= num_pages)).any():
        raise fail(f"the free pool holds an id outside 0..{num_pages - 1}")
    if np.unique(free).size != free.size:
        raise fail("the free pool holds a page twice")
    both = np.intersect1d(free, used)
    if both.size:
        raise fail(f"page {int(both[0])} is both free and held")
    if free.size + used.size != num_pages:
        raise fail(f"{free.size} free + {used.size} held pages != num_pages={num_pages}")
