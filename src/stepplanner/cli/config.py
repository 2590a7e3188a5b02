"""The ``KEY=VALUE,...`` configuration syntax of ``compare --config``, ``replay --config`` and
ledger files: SchedulingOptions and StepPlannerLimits fields by name or alias, the same keys
``--grid`` takes (one table, in ``stepplanner.planner._config_keys``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._errors import StepPlannerValueError
from ..planner._config_keys import apply_fields, canonical_key, field_name
from ..planner._policy import SchedulingOptions, StepPlannerLimits

__all__ = ["Config", "canonical_key", "parse_config", "parse_config_text"]


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration to simulate: a name, the engine limits and the scheduling options."""

    name: str
    limits: StepPlannerLimits
    options: SchedulingOptions


def parse_config(
    items: dict[str, Any],
    base_limits: StepPlannerLimits,
    base_options: SchedulingOptions,
    name: str | None = None,
) -> Config:
    """``{"policy": "priority", "max_num_tokens": 1024, ...}`` on top of the bases.

    Keys: those of ``--grid`` (``stepplanner.planner._config_keys``: the SchedulingOptions and
    StepPlannerLimits field names with dashes or underscores, and their aliases) and name.
    Enum values by name (any case) or number.
    """
    values: dict[str, Any] = {}
    for raw_key, value in items.items():
        if canonical_key(raw_key) == "name":
            name = str(value)
        else:
            values[field_name(raw_key, "config key", extra=("name",))] = value
    limits, options = apply_fields(values, base_limits, base_options)
    label = name or ", ".join(f"{k}={v}" for k, v in items.items()) or "default"
    return Config(label, limits, options)


def parse_config_text(text: str) -> dict[str, Any]:
    """``"policy=priority, preemption=pause, max_num_tokens=1024"`` -> dict."""
    items: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise StepPlannerValueError(f"config item {part!r} is not KEY=VALUE")
        items[key.strip()] = value.strip()
    return items
