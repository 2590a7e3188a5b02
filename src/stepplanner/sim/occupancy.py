"""What a run on a KV page pool reports of it: ``PageOccupancy`` (``sim.paged``, whose worst
cases are reserved at admission, and ``sim.preemption``, whose pages are taken as KV grows)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["PageOccupancy"]


@dataclasses.dataclass(frozen=True)
class PageOccupancy:
    """Per step (when the plan was made): pages reserved (held by the residents' worst cases)
    and pages holding committed KV, out of ``num_pages``."""

    num_pages: int
    reserved: np.ndarray
    in_use: np.ndarray
    held_back: np.ndarray  # requests waiting behind one whose worst case does not fit
    # Per request (workload order): refused at submission because its worst case exceeds what
    # one row or the whole pool can hold (a prompt over S_in is refused too, but not for pages).
    refused_for_pages: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, dtype=bool)
    )

    def report(self) -> dict[str, Any]:
        """Means and peaks as fractions of the pool, and per series (``reserved``, ``in_use``
        in pages; ``held_back`` in requests) the mean, p50, p99 and max over the steps."""
        n = max(self.num_pages, 1)
        empty = self.reserved.size == 0
        return {
            "num_pages": self.num_pages,
            "reserved_mean": 0.0 if empty else float(self.reserved.mean() / n),
            "reserved_peak": 0.0 if empty else float(self.reserved.max() / n),
            "in_use_mean": 0.0 if empty else float(self.in_use.mean() / n),
            "in_use_peak": 0.0 if empty else float(self.in_use.max() / n),
            "steps_with_requests_held_for_pages": int((self.held_back > 0).sum()),
            "reserved": _stats(self.reserved),
            "in_use": _stats(self.in_use),
            "held_back": _stats(self.held_back),
            "refused_for_pages": int(self.refused_for_pages.sum()),
        }


def _stats(per_step: np.ndarray) -> dict[str, float]:
    if per_step.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "mean": float(per_step.mean()),
        "p50": float(np.percentile(per_step, 50)),
        "p99": float(np.percentile(per_step, 99)),
        "max": float(per_step.max()),
    }
