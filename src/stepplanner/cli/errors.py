"""Which exceptions become a one-line ``Error: ...`` and which keep their traceback.

The library validates its input up front and says what is wrong in a ``raise`` statement of its
own (a ``ValueError``/``TypeError``/``OverflowError`` naming the field, the value and what is
allowed; ``MemoryError`` when a limit needs more memory than the machine gives). Those are messages
for the user. Anything else — an exception out of Python itself, numpy or another package, or a
library bug such as an unsupported operand — is a bug report and keeps its traceback.

Exit status: 0 done; 1 the command ran and found something (``replay``: plans differ) or could not
finish (out of memory); 2 the command line or an input file is wrong (click's own usage errors use
2 too, so ``--rate 0`` and ``-B 0`` end alike).
"""

from __future__ import annotations

import linecache
import pathlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

import click

_PACKAGE = pathlib.Path(__file__).resolve().parent.parent
_INPUT_ERRORS = (ValueError, TypeError, OverflowError)


class InputError(click.ClickException):
    """A one-line error about the command line or an input file: exit status 2."""

    exit_code = 2


def raised_by_the_library(exc: BaseException) -> bool:
    """True when the innermost frame is stepplanner code executing a ``raise`` statement."""
    tb: TracebackType | None = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    if filename.endswith(".pyx"):
        # The compiled core: its errors are raised at the boundary after validation.
        return pathlib.Path(filename).stem == "_core"
    try:
        inside = pathlib.Path(filename).resolve().is_relative_to(_PACKAGE)
    except (OSError, ValueError):
        return False
    if not inside:
        return False
    line = linecache.getline(filename, tb.tb_lineno).strip()
    # Without the source (a .pyc-only install) the origin is known but the statement is not.
    return line == "" or line.startswith("raise")


def library_errors(f: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's own validation errors into one-line CLI errors (see the module)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except MemoryError as exc:
            if not raised_by_the_library(exc):
                raise
            raise click.ClickException(str(exc)) from None
        except UnicodeDecodeError as exc:
            # Always a file's bytes, never the code: the codec raises it from C.
            raise InputError(f"an input file is not UTF-8 text ({exc})") from None
        except _INPUT_ERRORS as exc:
            if not raised_by_the_library(exc):
                raise
            raise InputError(str(exc)) from None
    wrapper.__name__, wrapper.__doc__ = f.__name__, f.__doc__
    return wrapper
