"""Reading the files commands take (ledgers, configuration lists, step records): an unreadable
file is a ``ValueError`` naming it, never a decoder's traceback."""

from __future__ import annotations

import json
from typing import IO, Any


def read_text(handle: IO[str]) -> str:
    """All of ``handle``; a file that is not UTF-8 text is a ``ValueError`` naming it."""
    try:
        return handle.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{handle.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") \
            from None


def read_json(handle: IO[str]) -> Any:
    """The JSON document in ``handle``; bad text or JSON is a ``ValueError`` naming the file."""
    text = read_text(handle)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{handle.name}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{handle.name}: not valid JSON (nested too deeply)") from None
