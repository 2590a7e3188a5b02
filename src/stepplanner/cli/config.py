"""The ``KEY=VALUE,...`` configuration syntax of ``compare --config``, ``replay --config`` and
ledger files: SchedulingOptions and StepPlannerLimits fields by name, a few short aliases."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._errors import StepPlannerValueError
from .._fields import enum_fields, enum_from_text
from .._policy import SchedulingOptions, StepPlannerLimits

_ENUMS = enum_fields(SchedulingOptions)
_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulingOptions))
_LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(StepPlannerLimits))
_ALIASES = {"mode": "ifb_scheduling_mode", "policy": "scheduling_policy",
            "reserved": "priority_reserved_slots", "reserved_slots": "priority_reserved_slots"}


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration to simulate: a name, the engine limits and the scheduling options."""

    name: str
    limits: StepPlannerLimits
    options: SchedulingOptions


def parse_config(items: dict[str, Any], base_limits: StepPlannerLimits,
                 base_options: SchedulingOptions, name: str | None = None) -> Config:
    """``{"policy": "priority", "max_num_tokens": 1024, ...}`` on top of the bases.

    Keys: the SchedulingOptions and StepPlannerLimits field names (with dashes or underscores,
    as the flags spell them), the aliases mode, policy and reserved, and name. Enum values by
    name (any case) or number.
    """
    options = dataclasses.asdict(base_options)
    limits = dataclasses.asdict(base_limits)
    for raw_key, value in items.items():
        key = canonical_key(raw_key)
        if key == "name":
            name = str(value)
            continue
        if key in _ENUMS and isinstance(value, str):
            value = enum_from_text(key, value, _ENUMS[key])
        elif key in _OPTION_FIELDS or key in _LIMIT_FIELDS:
            value = _int(key, value)
        else:
            allowed = sorted({*_OPTION_FIELDS, *_LIMIT_FIELDS, *_ALIASES, "name"})
            raise StepPlannerValueError(
                f"config key {raw_key!r} is not known; allowed: {', '.join(allowed)}")
        (options if key in _OPTION_FIELDS else limits)[key] = value
    label = name or ", ".join(f"{k}={v}" for k, v in items.items()) or "default"
    return Config(label, StepPlannerLimits(**limits), SchedulingOptions(**options))


def canonical_key(raw_key: str) -> str:
    """The field a configuration key names: any case, dashes or underscores, aliases resolved."""
    key = raw_key.strip().lower().replace("-", "_")
    return _ALIASES.get(key, key)


def parse_config_text(text: str) -> dict[str, Any]:
    """``"policy=priority, preemption=pause, max_num_tokens=1024"`` -> dict."""
    items: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise StepPlannerValueError(f"config item {part!r} is not KEY=VALUE")
        items[key.strip()] = value.strip()
    return items


def _int(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise StepPlannerValueError(f"{key}={value!r} is not an integer") from None
