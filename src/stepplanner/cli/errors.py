"""Which exceptions become a one-line ``Error: ...`` and which keep their traceback.

The library validates its input up front and raises a :class:`~stepplanner.StepPlannerError`
that says what is wrong (``StepPlannerValueError``/``TypeError``/``OverflowError`` name the field,
the value and what is allowed; ``StepPlannerMemoryError`` says a limit needs more memory than the
machine gives). Those are messages for the user, and they are told apart by their type. Anything
else — an exception out of Python itself, numpy or another package, a library bug such as an
unsupported operand, or a ``StepPlannerRuntimeError`` (an API used against its contract, which a
command line cannot cause) — is a bug report and keeps its traceback.

Exit status: 0 done; 1 the command ran and found something (``replay``: plans differ) or could not
finish (out of memory); 2 the command line or an input file is wrong (click's own usage errors use
2 too, so ``--rate 0`` and ``-B 0`` end alike).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .._errors import (
    StepPlannerMemoryError,
    StepPlannerOverflowError,
    StepPlannerTypeError,
    StepPlannerValueError,
)

_INPUT_ERRORS = (StepPlannerValueError, StepPlannerTypeError, StepPlannerOverflowError)


class InputError(click.ClickException):
    """A one-line error about the command line or an input file: exit status 2."""

    exit_code = 2


def library_errors(f: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's own validation errors into one-line CLI errors (see the module)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except StepPlannerMemoryError as exc:
            raise click.ClickException(str(exc)) from None
        except UnicodeDecodeError as exc:
            # Always a file's bytes, never the code: the codec raises it from C.
            raise InputError(f"an input file is not UTF-8 text ({exc})") from None
        except _INPUT_ERRORS as exc:
            raise InputError(str(exc)) from None

    wrapper.__name__, wrapper.__doc__ = f.__name__, f.__doc__
    return wrapper
