"""The files commands read (ledgers, configuration lists, step records) and write (records,
plots): an unreadable input is a ``ValueError`` naming it, never a decoder's traceback, and an
output path that cannot be written, or that would overwrite an input of the command or another
output, is refused before anything runs (``check_files``: the one rule of every command that
writes files)."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import IO, Any

from .._errors import StepPlannerValueError
from .errors import InputError


def read_text(handle: IO[str]) -> str:
    """All of ``handle``; a file that is not UTF-8 text is a ``ValueError`` naming it."""
    try:
        return handle.read()
    except UnicodeDecodeError as exc:
        raise StepPlannerValueError(
            f"{handle.name}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def read_json(handle: IO[str]) -> Any:
    """The JSON document in ``handle``; bad text or JSON is a ``ValueError`` naming the file."""
    text = read_text(handle)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StepPlannerValueError(f"{handle.name}: not valid JSON ({exc})") from None
    except RecursionError:
        raise StepPlannerValueError(f"{handle.name}: not valid JSON (nested too deeply)") from None


STDOUT = ("-", "<stdout>")


def check_files(
    outputs: Mapping[str, str | None], inputs: Mapping[str, str | None] | None = None
) -> None:
    """Before the run, for every output given (``{"--json": path}``; None: not asked, ``-``:
    stdout): its directory exists and is writable, it is none of ``inputs`` (the files the
    command reads, by the names its messages use) and no other output. Paths are compared by
    the file they name, so a symlink, a hard link or ``./x`` for ``x`` is caught: a command
    never overwrites what it reads, and two outputs never leave only the last one written."""
    given = [
        (option, path)
        for option, path in outputs.items()
        if path is not None and path not in STDOUT
    ]
    for option, path in given:
        check_output_path(option, path)
    read = [(option, path) for option, path in (inputs or {}).items() if path is not None]
    for k, (option, path) in enumerate(given):
        for input_option, input_path in read:
            if same_file(path, input_path):
                raise InputError(
                    f"{option} {path}: is an input of this command "
                    f"({input_option} {input_path}); allowed: another file"
                )
        for other_option, other_path in given[:k]:
            if same_file(path, other_path):
                raise InputError(
                    f"{option} {path}: is also the file of {other_option} "
                    f"{other_path}; allowed: a file of its own for each output"
                )


def same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one file: by device and inode when both exist (hard links
    too), else by their real paths (symlinks resolved, ``.`` and ``..`` dropped)."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def check_output_path(option: str, path: str) -> None:
    """Before the run: ``path``'s directory exists and is writable (``-`` is stdout)."""
    if path in STDOUT:
        return
    folder = pathlib.Path(path).parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: directory {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{option} {path}: directory {str(folder)!r} is not writable")
