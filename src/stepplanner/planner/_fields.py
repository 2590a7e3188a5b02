"""Conversion of Python values into the C field types of the contract (int32, uint64, bool).

The pure-Python side (configuration dataclasses, the reference ``ResidentState``) converts through
these; the compiled ``ResidentState`` does the same checks in C and raises the same messages.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from enum import IntEnum
from typing import Any, TypeVar, get_type_hints

import numpy as np

from .. import _errors
from ._types import RESIDENT_DTYPE, RESIDENT_FIELDS

E = TypeVar("E", bound=IntEnum)


def as_int(field: str, value: object) -> int:
    """Any integer-like value (``int``, ``numpy.int64``, ``bool``); never a float or string."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise _errors.not_integer(field, value) from None


def as_float(value: int | float) -> float | None:
    """A number (an int or a float, checked by the caller) as a float; None for an int beyond a
    float's range, for which ``float()`` raises an OverflowError that names no field: the
    caller refuses it with its own message, naming the field."""
    try:
        return float(value)
    except OverflowError:
        return None


def as_int32(field: str, value: object) -> int:
    v = as_int(field, value)
    if not _errors.INT32_MIN <= v <= _errors.INT32_MAX:
        raise _errors.out_of_int32(field, v)
    return v


def as_uint64(field: str, value: object) -> int:
    v = as_int(field, value)
    if not 0 <= v <= _errors.UINT64_MAX:
        raise _errors.out_of_uint64(field, v)
    return v


def as_bool(field: str, value: object) -> bool:
    """``True``/``False``, numpy booleans, or the integers 0 and 1."""
    if isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise _errors.not_bool(field, value) from None
    if v not in (0, 1):
        raise _errors.not_bool(field, value)
    return bool(v)


# The converter of each resident field, from its C type in RESIDENT_DTYPE.
_BY_CTYPE: dict[np.dtype, Callable[[str, object], object]] = {
    np.dtype(np.int32): as_int32,
    np.dtype(np.uint64): as_uint64,
    np.dtype(np.bool_): as_bool,
}
RESIDENT_CONVERTERS: dict[str, Callable[[str, object], object]] = {
    name: _BY_CTYPE[RESIDENT_DTYPE[name]] for name in RESIDENT_FIELDS
}


def as_enum(field: str, value: object, enum_type: type[E]) -> E:
    if isinstance(value, enum_type):
        return value
    v = as_int(field, value)
    try:
        return enum_type(v)
    except ValueError:
        raise _errors.not_enum(field, value, enum_type) from None


def enum_from_text(field: str, value: object, enum_type: type[E]) -> E:
    """A member as a config file or command line writes it: by name in any case (``-`` for
    ``_``) or by number; members and integers pass through ``as_enum``."""
    if not isinstance(value, str):
        return as_enum(field, value, enum_type)
    text = value.strip()
    if text.lstrip("-").isdigit():
        return as_enum(field, int(text), enum_type)
    try:
        return enum_type[text.upper().replace("-", "_")]
    except KeyError:
        raise _errors.not_enum(field, value, enum_type) from None


def enum_fields(cls: Any) -> dict[str, type[IntEnum]]:
    """The enum-typed fields of a dataclass by name, read from its annotations: the one source
    for every place that writes those fields as text (JSON, config files, the command line)."""
    hints = get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if isinstance(hints[f.name], type) and issubclass(hints[f.name], IntEnum)
    }
