"""Service-level objectives: what a request's deadlines are (docs/scheduling.md).

A request that arrives at ``t`` with ``SLO(ttft, tpot)`` should emit its first token by
``t + ttft`` and its token ``i`` (0 = the first) by ``t + ttft + i * tpot``: the deadlines Etalon's
fluidity index defines, where a token that comes early carries its slack forward. ``tpot=None``
sets no per-token objective. The ledger's deadline policies (``SchedulingPolicy.EDF``,
``DEADLINE``) rank by these deadlines; the simulator and the tools measure attainment against them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .. import _errors
from ._fields import as_float

__all__ = ["SLO", "check_slo_classes", "deadline_of", "due_of", "slo_fields"]


def _seconds(field: str, value: object, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        allowed = "a number of seconds > 0" + (" or None" if optional else "")
        raise _errors.StepPlannerTypeError(f"{field} must be {allowed}, got {type(value).__name__}")
    seconds = as_float(value)
    if seconds is None or not (math.isfinite(seconds) and seconds > 0):
        raise _errors.out_of_range(field, value, "a finite number of seconds > 0")
    return seconds


@dataclasses.dataclass(frozen=True, slots=True)
class SLO:
    """A request's objectives in seconds: first token within ``ttft`` of its arrival, then one
    token every ``tpot`` on average, counted from that first deadline (``None``: no per-token
    objective). A per-token objective needs a TTFT one: token ``i``'s deadline starts from it."""

    ttft: float
    tpot: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttft", _seconds("ttft", self.ttft, optional=False))
        object.__setattr__(self, "tpot", _seconds("tpot", self.tpot, optional=True))


def check_slo(field: str, value: object) -> SLO | None:
    """``value`` as a request's objectives: an ``SLO`` or ``None``."""
    if value is None or isinstance(value, SLO):
        return value
    raise _errors.StepPlannerTypeError(
        f"{field} must be an SLO or None, got {type(value).__name__}"
    )


def check_slo_classes(value: object) -> dict[int, SLO]:
    """``slo_classes`` as a dict: priority class (an int32) -> ``SLO``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _errors.StepPlannerTypeError(
            f"slo_classes must be a mapping from priority to SLO, or None, got "
            f"{type(value).__name__}"
        )
    out: dict[int, SLO] = {}
    for key, slo in value.items():
        if isinstance(key, bool) or not isinstance(key, int) or not -(2**31) <= key < 2**31:
            raise _errors.StepPlannerValueError(
                f"slo_classes key {key!r} is not a priority; allowed: an int32"
            )
        if not isinstance(slo, SLO):
            raise _errors.StepPlannerTypeError(
                f"slo_classes[{key}] must be an SLO, got {type(slo).__name__}"
            )
        out[key] = slo
    return out


def deadline_of(arrival_time: float, slo: SLO, token: int) -> float:
    """When token ``token`` (0 = the first) of a request is due; ``inf`` when ``slo`` sets no
    deadline for it (a token after the first without a per-token objective)."""
    return due_of(*slo_fields(slo, arrival_time), token)


def due_of(first_due: float, gap: float, token: int) -> float:
    """The same from the ledger's two numbers (``slo_fields``): ``first_due`` for token 0, then
    ``gap`` more per token (``inf`` when ``gap`` is 0). The compiled ledger's ``next_due``
    computes it in C, in the same order of operations."""
    if token == 0:
        return first_due
    return first_due + token * gap if gap > 0 else math.inf


def slo_fields(slo: SLO | None, arrival_time: Any) -> tuple[float, float]:
    """The ledger's two numbers for a request: (first token due, per-token gap); ``(inf, 0)``
    without objectives."""
    if slo is None:
        return math.inf, 0.0
    return arrival_time + slo.ttft, slo.tpot or 0.0
