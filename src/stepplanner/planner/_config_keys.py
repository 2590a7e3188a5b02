"""Configuration keys and values as people write them, one table for every place that reads
them: ``--grid``, ``compare --config``/``--config-file``, ``replay --config`` and ledger files.

A key is any ``SchedulingOptions`` or ``StepPlannerLimits`` field, spelled with ``_`` or ``-`` in
any case, or an alias: the short CLI names (``mode``, ``policy``, ``reserved``, ``b``, ``p``,
``s_in``) and vLLM's (``max_num_seqs`` for B, ``block_size`` for P, ``max_num_batched_tokens``
for ``max_step_tokens``). Enum values by name (any case) or number; integers in decimal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from .._errors import StepPlannerValueError
from ._fields import as_enum, enum_fields
from ._policy import SchedulingOptions, StepPlannerLimits

__all__ = [
    "ALIASES",
    "LIMIT_FIELDS",
    "OPTION_FIELDS",
    "apply_fields",
    "canonical_key",
    "field_name",
    "field_value",
]

ENUMS = enum_fields(SchedulingOptions)
OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulingOptions))
LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(StepPlannerLimits))
ALIASES = {
    "mode": "ifb_scheduling_mode",
    "policy": "scheduling_policy",
    "reserved": "priority_reserved_slots",
    "reserved_slots": "priority_reserved_slots",
    "b": "max_batch_size",
    "max_num_seqs": "max_batch_size",
    "p": "kv_page_size",
    "block_size": "kv_page_size",
    "s_in": "max_input_length",
    "max_num_batched_tokens": "max_step_tokens",
}


def canonical_key(raw: str) -> str:
    """The field a key names (any case, dashes or underscores, aliases resolved), unchecked."""
    key = raw.strip().lower().replace("-", "_")
    return ALIASES.get(key, key)


def field_name(raw: str, what: str, extra: Iterable[str] = ()) -> str:
    """The field ``raw`` names, or a ``ValueError`` that names ``what`` (``"grid name"``,
    ``"config key"``) and lists every allowed key, ``extra`` ones too."""
    key = canonical_key(raw)
    if key in OPTION_FIELDS or key in LIMIT_FIELDS:
        return key
    allowed = sorted({*OPTION_FIELDS, *LIMIT_FIELDS, *ALIASES, *extra})
    raise StepPlannerValueError(
        f"{what} {raw!r} is not known: not a SchedulingOptions or limits "
        f"field; allowed: {', '.join(allowed)}"
    )


def field_value(field: str, value: Any, what: str = "") -> Any:
    """``value`` (text, or already a number or member) as ``field`` holds it; a value of the wrong
    kind is a ``ValueError`` (``TypeError`` for enums) naming ``what``, the field and the value."""
    if field in ENUMS:
        return as_enum(field, value, ENUMS[field])
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise StepPlannerValueError(f"{what}{field}={value!r} is not an integer") from None


def apply_fields(
    values: Mapping[str, Any],
    base_limits: StepPlannerLimits,
    base_options: SchedulingOptions,
    what: str = "",
) -> tuple[StepPlannerLimits, SchedulingOptions]:
    """The bases with ``values`` (field -> value, fields already checked) applied; the
    dataclasses check the ranges."""
    options = dataclasses.asdict(base_options)
    limits = dataclasses.asdict(base_limits)
    for field, value in values.items():
        (options if field in OPTION_FIELDS else limits)[field] = field_value(field, value, what)
    return StepPlannerLimits(**limits), SchedulingOptions(**options)
