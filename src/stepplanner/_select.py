"""Which implementation the package uses, read once from ``STEPPLANNER_IMPL``.

Each part of the serving path (``core``, ``kv``, ``ledger``) has a compiled module and a
pure-Python twin with the same surface; its ``__init__`` asks :func:`implementation` for one.
``STEPPLANNER_IMPL=python`` selects every twin; the default selects every compiled module, and a
compiled module that cannot be imported is an ``ImportError`` that says how to get one, never a
silent switch to the slow path.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["IMPL", "implementation"]

IMPL = os.environ.get("STEPPLANNER_IMPL", "compiled").strip().lower() or "compiled"
if IMPL not in ("compiled", "python"):
    raise ImportError(f"STEPPLANNER_IMPL={IMPL!r} is not known; allowed: 'compiled' or 'python'")


def implementation(compiled: str, reference: str) -> ModuleType:
    """The module of one part: ``compiled`` unless ``STEPPLANNER_IMPL=python``."""
    if IMPL == "python":
        return importlib.import_module(reference)
    try:
        return importlib.import_module(compiled)
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"stepplanner's compiled module {compiled} could not be imported: {exc}. Install a "
            "wheel for this platform or build from source (pip install stepplanner needs a C "
            "compiler when no wheel matches), or select the pure-Python reference explicitly "
            "with STEPPLANNER_IMPL=python (about 100x slower)."
        ) from exc
