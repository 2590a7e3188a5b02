"""Request workloads for the simulator: a seeded synthetic default and a loader for real traces.

A workload is four aligned columns, one row per request, sorted by arrival:
``arrival_time`` (seconds from the start), ``prompt_tokens``, ``output_tokens`` (>= 1: the chunk
that completes the prompt yields the first one) and ``priority`` (lower is served first under
``SchedulingPolicy.PRIORITY``; < 0 marks urgent requests that may use reserved slots).

Trace files are CSV (a header row) or JSON Lines (one object per line) with the columns
``arrival_time``, ``prompt_tokens``, ``output_tokens`` and optionally ``priority`` (default 0);
other columns are ignored. Errors name the file, the line and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pathlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .._errors import (
    INT32_MAX,
    INT32_MIN,
    StepPlannerOverflowError,
    StepPlannerTypeError,
    StepPlannerValueError,
)

__all__ = [
    "DEFAULT_CLASSES",
    "DEFAULT_RATE",
    "DEFAULT_REQUESTS",
    "PriorityClass",
    "Workload",
    "synthetic",
]

# The columns of the stepplanner trace layout, as ``to_csv`` writes them and ``load_trace`` reads.
TRACE_COLUMNS = ("arrival_time", "prompt_tokens", "output_tokens", "priority")
# The embedded default workload, which `stepplanner simulate` runs with no arguments.
DEFAULT_REQUESTS = 6000
DEFAULT_RATE = 28.0


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """Requests as columns; ``Workload(...)`` validates and sorts them stably by arrival."""

    arrival_time: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray
    source: str = "arrays"

    def __post_init__(self) -> None:
        cols = {
            "arrival_time": np.asarray(self.arrival_time, dtype=np.float64),
            "prompt_tokens": _int_column("prompt_tokens", self.prompt_tokens),
            "output_tokens": _int_column("output_tokens", self.output_tokens),
            "priority": _int_column("priority", self.priority),
        }
        lengths = {name: col.shape for name, col in cols.items()}
        if any(col.ndim != 1 for col in cols.values()) or len(set(lengths.values())) != 1:
            raise StepPlannerValueError(
                f"workload columns must be 1-D and of one length; got shapes {lengths}")
        if cols["arrival_time"].size == 0:
            # A run needs a start time and a report needs a request to describe.
            raise StepPlannerValueError("workload has no requests; allowed: at least one request")
        _check(cols["arrival_time"], "arrival_time", lambda a: np.isfinite(a) & (a >= 0),
               "a finite number of seconds >= 0")
        _check(cols["prompt_tokens"], "prompt_tokens", lambda a: a >= 1, ">= 1")
        _check(cols["output_tokens"], "output_tokens", lambda a: a >= 1,
               ">= 1 (the chunk completing the prompt yields the first output token)")
        order = np.argsort(cols["arrival_time"], kind="stable")
        for name, col in cols.items():
            col = np.ascontiguousarray(col[order])
            col.flags.writeable = False
            object.__setattr__(self, name, col)

    def __len__(self) -> int:
        return len(self.arrival_time)

    def __repr__(self) -> str:
        # The dataclass default would print every row of every column.
        s = self.summary()
        return (f"Workload(source={self.source!r}, requests={s['requests']}, "
                f"duration_s={s['duration_s']:.1f}, classes={s['classes']})")

    @property
    def classes(self) -> list[int]:
        """The distinct priority values, ascending."""
        return sorted(int(p) for p in np.unique(self.priority))

    def summary(self) -> dict[str, Any]:
        n = len(self)
        span = float(self.arrival_time[-1] - self.arrival_time[0])
        # No rate when the arrivals span no time, or a span so small (subnormal) that the rate
        # overflows: a report holds numbers or None, never inf.
        rate = (n - 1) / span if span > 0 else None
        return {
            "source": self.source,
            "requests": n,
            "duration_s": span,
            "rate_per_s": rate if rate is not None and math.isfinite(rate) else None,
            "prompt_tokens_mean": float(self.prompt_tokens.mean()),
            "output_tokens_mean": float(self.output_tokens.mean()),
            "classes": {str(p): int((self.priority == p).sum()) for p in self.classes},
        }

    def to_csv(self, path: str | pathlib.Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(TRACE_COLUMNS)
            for row in zip(self.arrival_time, self.prompt_tokens, self.output_tokens,
                           self.priority):
                writer.writerow((f"{row[0]:.6f}", int(row[1]), int(row[2]), int(row[3])))


def _int_column(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise StepPlannerTypeError(
            f"workload column {name} must hold integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < INT32_MIN or arr.max() > INT32_MAX):
        raise StepPlannerOverflowError(f"workload column {name} has values outside int32")
    return arr.astype(np.int32)


def _check(col: np.ndarray, name: str, ok: Any, allowed: str) -> None:
    bad = np.flatnonzero(~ok(col))
    if bad.size:
        i = int(bad[0])
        raise StepPlannerValueError(
            f"workload request {i}: {name}={col[i].item()!r} is out of range; "
            f"allowed: {allowed}")


# --- synthetic -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PriorityClass:
    """One class of traffic: its share of requests and lognormal length distributions.

    Lengths are ``round(median * exp(sigma * N(0, 1)))``, clipped to [1, max]: long-tailed, as
    prompt and output lengths of production chat traces are.
    """

    name: str
    priority: int
    share: float
    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float


DEFAULT_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("urgent", -1, 0.10, 256, 0.8, 64, 0.8),
    PriorityClass("interactive", 0, 0.60, 512, 1.0, 160, 0.9),
    PriorityClass("batch", 1, 0.30, 1024, 1.0, 320, 1.0),
)


def synthetic(requests: int = DEFAULT_REQUESTS, rate: float = DEFAULT_RATE, seed: int = 0,
              classes: Sequence[PriorityClass] = DEFAULT_CLASSES,
              max_prompt: int = 4096, max_output: int = 2048) -> Workload:
    """Poisson arrivals at ``rate`` requests/s; class drawn by share; lognormal lengths."""
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise StepPlannerValueError(
            f"requests={requests!r} is out of range; allowed: an integer >= 1")
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise StepPlannerValueError(f"rate={rate!r} is out of range; allowed: requests/s > 0")
    for name, value in (("max_prompt", max_prompt), ("max_output", max_output)):
        if not isinstance(value, int) or not 1 <= value <= INT32_MAX:
            raise StepPlannerValueError(
                f"{name}={value!r} is out of range; allowed: 1..{INT32_MAX}")
    if not classes:
        raise StepPlannerValueError("classes is empty; allowed: at least one PriorityClass")
    shares = np.array([c.share for c in classes], dtype=np.float64)
    if not np.all(np.isfinite(shares) & (shares >= 0)) or shares.sum() <= 0:
        raise StepPlannerValueError(
            f"class shares {shares.tolist()} must be >= 0 with a positive sum")

    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=requests))
    arrival -= arrival[0]
    which = rng.choice(len(classes), size=requests, p=shares / shares.sum())
    z_prompt = rng.standard_normal(requests)
    z_output = rng.standard_normal(requests)
    table = np.array([(c.priority, c.prompt_median, c.prompt_sigma, c.output_median,
                       c.output_sigma) for c in classes], dtype=np.float64)[which]
    prompt = np.clip(np.rint(table[:, 1] * np.exp(table[:, 2] * z_prompt)), 1, max_prompt)
    output = np.clip(np.rint(table[:, 3] * np.exp(table[:, 4] * z_output)), 1, max_output)
    return Workload(arrival, prompt.astype(np.int32), output.astype(np.int32),
                    table[:, 0].astype(np.int32),
                    source=f"synthetic(requests={requests}, rate={rate:g}/s, seed={seed})")


def json_lines(lines: Iterable[str], where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank JSON-lines record; errors name ``where`` and
    the line. Shared by trace loading and step-record replay."""
    for line, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise StepPlannerValueError(
                f"{where} line {line}: not valid JSON ({exc.msg})") from None
        except RecursionError:  # json's C decoder recurses once per nesting level
            raise StepPlannerValueError(
                f"{where} line {line}: not valid JSON (nested too deeply)") from None
        if not isinstance(record, dict):
            raise StepPlannerValueError(
                f"{where} line {line}: expected a JSON object, "
                f"got {type(record).__name__}")
        yield line, record
