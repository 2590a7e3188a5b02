"""A grid of configurations: ``--grid NAME=V1,V2,...`` over ``SchedulingOptions`` and limits.

NAME and the values are the configuration keys of ``compare --config`` (one table,
``stepplanner.planner._config_keys``): any ``SchedulingOptions`` or ``StepPlannerLimits`` field,
spelled with ``_`` or ``-``, or an alias users bring from the CLI and from vLLM (``mode``,
``policy``, ``reserved``, ``max_num_seqs`` for B, ``block_size`` for P, ``max_num_batched_tokens``
for ``max_step_tokens``); enum members by name in any case (``mixed``, ``prefill_first``) or number,
integers in decimal.

The grid is the Cartesian product of the value lists, in the order the names were given (the
last name varies fastest). A point whose limits or budgets do not resolve is kept, with the
error, so a sweep can list it instead of silently dropping it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._errors import StepPlannerValueError
from ..planner._config_keys import apply_fields, field_name, field_value
from ..planner._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from ..sim.simulator import policy_to_dict

__all__ = ["GridPoint", "expand_grid", "parse_grid"]


def parse_grid(texts: Iterable[str]) -> dict[str, list[str]]:
    """``["mode=mixed,prefill_first", "max_num_tokens=320,768"]`` -> field -> value texts.

    Values are checked for their type here (so a typo fails before any run); ranges, which
    depend on the other fields, are checked per point.
    """
    grid: dict[str, list[str]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        if not sep or not name.strip():
            raise StepPlannerValueError(f"grid {text!r} is not NAME=V1,V2,...")
        field = field_name(name, "grid name")
        if field in grid:
            raise StepPlannerValueError(
                f"grid name {field} is given twice; allowed: once, with all its values"
            )
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not items:
            raise StepPlannerValueError(f"grid {text!r} has no values; allowed: NAME=V1,V2,...")
        for item in items:
            field_value(field, item, "grid value ")
        grid[field] = items
    return grid


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One configuration: the grid values as given, and what they resolved to (or the error)."""

    index: int
    values: dict[str, str]
    limits: StepPlannerLimits | None
    policy: ResolvedSchedulingPolicy | None
    error: str | None

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items()) or "base"

    def record(self) -> dict[str, Any]:
        """The start of this point's result record: what it is, and what it resolved to."""
        out: dict[str, Any] = {
            "index": self.index,
            "options": dict(self.values),
            "label": self.label,
            "error": self.error,
        }
        if self.limits is not None and self.policy is not None:
            out["limits"] = dataclasses.asdict(self.limits)
            out["policy"] = policy_to_dict(self.policy)
        return out


def resolve_point(
    values: Mapping[str, str], base_limits: StepPlannerLimits, base_options: SchedulingOptions
) -> tuple[StepPlannerLimits, ResolvedSchedulingPolicy]:
    """Base limits and options with ``values`` (field -> text) applied, resolved (SPEC §2)."""
    limits, options = apply_fields(values, base_limits, base_options, "grid value ")
    return limits, resolve_scheduling_policy(options, limits)


def grid_size(grid: Mapping[str, Sequence[str]]) -> int:
    """How many points ``expand_grid`` makes of ``grid`` (the product of its value counts; 1,
    the base, for an empty grid), without resolving any."""
    return math.prod(len(values) for values in grid.values())


def expand_grid(
    grid: Mapping[str, Sequence[str]],
    base_limits: StepPlannerLimits,
    base_options: SchedulingOptions,
) -> list[GridPoint]:
    """Every point of the grid (one point, the base, for an empty grid)."""
    names = list(grid)
    points = []
    for index, combo in enumerate(itertools.product(*(grid[n] for n in names))):
        values = dict(zip(names, combo))
        try:
            limits, policy = resolve_point(values, base_limits, base_options)
        except (TypeError, ValueError, OverflowError) as exc:
            points.append(GridPoint(index, values, None, None, str(exc)))
            continue
        points.append(GridPoint(index, values, limits, policy, None))
    return points
