"""The invariants of a KV page table, checked over its raw arrays.

Both implementations' ``KVPageTable.check()`` run this one function over their own storage, so
the invariants are written down once; the differential tests hold the storage itself equal.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PageTableInvariantError", "check_page_table"]


class PageTableInvariantError(AssertionError):
    """A page table breaks an invariant; the message says which and where."""


def check_page_table(rows: np.ndarray, counts: np.ndarray, free: np.ndarray,
                     num_pages: int) -> None:
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
            raise fail(f"slot {slot} has page {int(row[k])} at {k}, after its last live page "
                       f"({n} live); allowed: -1")
        bad = (live < 0) | (live >= num_pages)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise fail(f"slot {slot} holds page id {int(live[k])} at {k}; allowed: "
                       f"0..{num_pages - 1}")
    used = np.concatenate([rows[s, :int(counts[s])] for s in range(rows.shape[0])]
                          + [np.zeros(0, dtype=rows.dtype)])
    ids, seen = np.unique(used, return_counts=True)
    if (seen > 1).any():
        page = int(ids[np.flatnonzero(seen > 1)[0]])
        holders = [s for s in range(rows.shape[0]) if page in rows[s, :int(counts[s])]]
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
