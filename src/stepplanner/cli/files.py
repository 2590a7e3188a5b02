"""The files commands read (ledgers, configuration lists, step records) and write (records,
plots): an unreadable input is a ``ValueError`` naming it, never a decoder's traceback, and an
output path that cannot be written is refused before anything runs."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence
from typing import IO, Any

from .._errors import StepPlannerValueError
from .errors import InputError


def read_text(handle: IO[str]) -> str:
    """All of ``handle``; a file that is not UTF-8 text is a ``ValueError`` naming it."""
    try:
        return handle.read()
    except UnicodeDecodeError as exc:
        raise StepPlannerValueError(
            f"{handle.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") \
            from None


def read_json(handle: IO[str]) -> Any:
    """The JSON document in ``handle``; bad text or JSON is a ``ValueError`` naming the file."""
    text = read_text(handle)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StepPlannerValueError(f"{handle.name}: not valid JSON ({exc})") from None
    except RecursionError:
        raise StepPlannerValueError(f"{handle.name}: not valid JSON (nested too deeply)") from None


def check_output_path(option: str, path: str) -> None:
    """Before the run: ``path``'s directory exists and is writable (``-`` is stdout)."""
    if path in ("-", "<stdout>"):
        return
    folder = pathlib.Path(path).parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: directory {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{option} {path}: directory {str(folder)!r} is not writable")


def check_not_an_input(option: str, path: str | None, inputs: Sequence[str | None]) -> None:
    """An output that would overwrite an input (``--json results.json`` for the argument) is
    refused before anything is read twice or lost."""
    if path is None or not os.path.exists(path):
        return
    for given_path in filter(None, inputs):
        if os.path.samefile(path, given_path):
            raise InputError(f"{option} {path}: is an input of this command; allowed: another "
                             "file")
