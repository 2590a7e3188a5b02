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


def as_int32_in(field: str, value: object, low: int, high: int = _errors.INT32_MAX) -> int:
    """An int32 field whose range is ``low..high``, stated the same way whether the value falls
    below it or past int32: one range per field."""
    v = as_int(field, value)
    if not low <= v <= high:
        raise out_of_field_range(field, v, f"{low}..{high}")
    return v


def out_of_field_range(field: str, value: int, allowed: str) -> Exception:
    """``value`` refused with the field's one range ``allowed``: an OverflowError past int32
    (what ``as_int32`` raises), a ValueError within it."""
    if not _errors.INT32_MIN <= value <= _errors.INT32_MAX:
        return _errors.out_of_int32(field, value, allowed)
    return _errors.out_of_range(field, value, allowed)


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
    """A member, its number, or its name as a person types it: any case, ``-`` for ``_``,
    spaces around it ignored (``"priority"``, ``"Prefill-First"``, ``"1"``). The one conversion
    for every place that takes an enum option: the configuration dataclasses (so both planner
    implementations), config files, the command line and the runtime adapters."""
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return as_enum(field, int(text), enum_type)
        try:
            return enum_type[text.upper().replace("-", "_")]
        except KeyError:
            raise _errors.not_enum(field, value, enum_type) from None
    v = as_int(field, value)
    try:
        return enum_type(v)
    except ValueError:
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
