"""KV pages and a step's attention inputs (docs/kv_pages.md).

``_kv.pxd`` declares the page table's C structs, ``_kv.pyx`` holds ``KVPageTable`` and
``StepInputs.prepare`` (the fill loops), ``_kv_py.py`` is their pure-Python twin; ``_checks``
holds the argument checks both run, ``_buffers`` the array layouts both fill, and ``paging`` the
helpers for a runtime that keeps its own ledger (``worst_case_pages``, ``release_rows``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._select import implementation
from ._checks import PageTableInvariantError
from .paging import release_rows, worst_case_pages

if TYPE_CHECKING:
    from ._kv import KVPageTable, StepInputs
else:
    _impl = implementation("stepplanner.kv._kv", "stepplanner.kv._kv_py")
    KVPageTable = _impl.KVPageTable
    StepInputs = _impl.StepInputs

__all__ = [
    "KVPageTable",
    "PageTableInvariantError",
    "StepInputs",
    "release_rows",
    "worst_case_pages",
]
