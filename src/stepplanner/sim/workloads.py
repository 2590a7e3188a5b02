"""Request workloads for the simulator: a seeded synthetic default and a loader for real traces.

A workload is four aligned columns, one row per request, sorted by arrival:
``arrival_time`` (seconds from the start), ``prompt_tokens``, ``output_tokens`` (>= 1: the chunk
that completes the prompt yields the first one) and ``priority`` (lower is served first under
``SchedulingPolicy.PRIORITY``; < 0 marks urgent requests that may use reserved slots).

It may carry service-level objectives (docs/simulator.md, "SLOs and goodput"): per request, the
columns ``ttft_slo`` and ``tpot_slo`` (seconds; NaN: none), and per priority class,
``slo_classes`` (priority -> ``SLO``). A request's own objectives replace its class's whole (a
request with a ``ttft_slo`` has no per-token objective unless its ``tpot_slo`` gives one).

Trace files are CSV (a header row) or JSON Lines (one object per line) with the columns
``arrival_time``, ``prompt_tokens``, ``output_tokens`` and optionally ``priority`` (default 0),
``ttft_slo_ms`` and ``tpot_slo_ms`` (empty: none); other columns are ignored. Errors name the
file, the line and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pathlib
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .._errors import (
    INT32_MAX,
    INT32_MIN,
    StepPlannerOverflowError,
    StepPlannerTypeError,
    StepPlannerValueError,
)
from ..planner._slo import SLO, check_slo_classes

__all__ = [
    "DEFAULT_CLASSES",
    "DEFAULT_RATE",
    "DEFAULT_REQUESTS",
    "DEFAULT_SLO_CLASSES",
    "MAX_RATE",
    "PriorityClass",
    "Workload",
    "synthetic",
]

# The columns of the stepplanner trace layout, as ``to_csv`` writes them and ``load_trace`` reads.
TRACE_COLUMNS = ("arrival_time", "prompt_tokens", "output_tokens", "priority")
# Its optional per-request objectives, in milliseconds (an empty cell: none).
SLO_COLUMNS = ("ttft_slo_ms", "tpot_slo_ms")
# The embedded default workload, which `stepplanner simulate` runs with no arguments.
DEFAULT_REQUESTS = 6000
DEFAULT_RATE = 28.0
# The highest arrival rate a workload may have, in requests/s: a microsecond between arrivals,
# when a step takes milliseconds, so a faster one only means every request arrives at once
# (docs/simulator.md, "Ceilings"). Capacity searches stop there too.
MAX_RATE = 1e6


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """Requests as columns; ``Workload(...)`` validates and sorts them stably by arrival."""

    arrival_time: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray
    source: str = "arrays"
    ttft_slo: np.ndarray | None = None
    """Per request, its own TTFT objective in seconds (NaN: none, its class's applies)."""
    tpot_slo: np.ndarray | None = None
    """Per request, its own per-token objective in seconds (NaN: none); needs a ``ttft_slo``."""
    slo_classes: Mapping[int, SLO] | None = None
    """Per priority class present in the workload, the objectives of its requests that carry
    none of their own; stored read-only, ``{}`` when none."""

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
                f"workload columns must be 1-D and of one length; got shapes {lengths}"
            )
        if cols["arrival_time"].size == 0:
            # A run needs a start time and a report needs a request to describe.
            raise StepPlannerValueError("workload has no requests; allowed: at least one request")
        _check(
            cols["arrival_time"],
            "arrival_time",
            lambda a: np.isfinite(a) & (a >= 0),
            "a finite number of seconds >= 0",
        )
        _check(cols["prompt_tokens"], "prompt_tokens", lambda a: a >= 1, ">= 1")
        _check(
            cols["output_tokens"],
            "output_tokens",
            lambda a: a >= 1,
            ">= 1 (the chunk completing the prompt yields the first output token)",
        )
        n = cols["arrival_time"].size
        cols["ttft_slo"] = _slo_column("ttft_slo", self.ttft_slo, n)
        cols["tpot_slo"] = _slo_column("tpot_slo", self.tpot_slo, n)
        orphan = np.flatnonzero(~np.isnan(cols["tpot_slo"]) & np.isnan(cols["ttft_slo"]))
        if orphan.size:
            i = int(orphan[0])
            raise StepPlannerValueError(
                f"workload request {i}: tpot_slo={cols['tpot_slo'][i].item()!r} without a "
                "ttft_slo; "
                "allowed: a per-token objective with a TTFT one (token i is due ttft + i * tpot "
                "after arrival)"
            )
        classes = check_slo_classes(self.slo_classes)
        present = set(np.unique(cols["priority"]).tolist())
        missing = sorted(set(classes) - present)
        if missing:
            raise StepPlannerValueError(
                f"slo_classes has class {missing[0]}, which no request of the workload is in; "
                f"allowed: its classes {', '.join(map(str, sorted(present)))}"
            )
        order = np.argsort(cols["arrival_time"], kind="stable")
        for name, col in cols.items():
            col = np.ascontiguousarray(col[order])
            col.flags.writeable = False
            object.__setattr__(self, name, col)
        object.__setattr__(
            self, "slo_classes", types.MappingProxyType(dict(sorted(classes.items())))
        )

    def __len__(self) -> int:
        return len(self.arrival_time)

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only mapping of slo_classes does not pickle; a plain dict does (workers of
        # the process and Ray backends receive workloads).
        return (
            Workload,
            (
                self.arrival_time,
                self.prompt_tokens,
                self.output_tokens,
                self.priority,
                self.source,
                self.ttft_slo,
                self.tpot_slo,
                dict(self.slo_classes or {}),
            ),
        )

    def __repr__(self) -> str:
        # The dataclass default would print every row of every column.
        s = self.summary()
        return (
            f"Workload(source={self.source!r}, requests={s['requests']}, "
            f"duration_s={s['duration_s']:.1f}, classes={s['classes']})"
        )

    @property
    def classes(self) -> list[int]:
        """The distinct priority values, ascending."""
        return sorted(int(p) for p in np.unique(self.priority))

    @property
    def own_objectives(self) -> bool:
        """Whether any request carries objectives of its own (the trace columns)."""
        assert self.ttft_slo is not None
        return bool((~np.isnan(self.ttft_slo)).any())

    @property
    def has_objectives(self) -> bool:
        """Whether any request has objectives, its own or its class's."""
        return bool(self.slo_classes) or self.own_objectives

    def objectives(self) -> tuple[np.ndarray, np.ndarray]:
        """Per request, the objectives that apply (its own, else its class's) as (TTFT, TPOT)
        seconds; NaN where none (a request without a TTFT objective has none at all)."""
        assert self.ttft_slo is not None and self.tpot_slo is not None
        assert self.slo_classes is not None
        ttft, tpot = self.ttft_slo.copy(), self.tpot_slo.copy()
        by_class = np.isnan(ttft)
        for priority, slo in self.slo_classes.items():
            rows = by_class & (self.priority == priority)
            ttft[rows] = slo.ttft
            tpot[rows] = np.nan if slo.tpot is None else slo.tpot
        return ttft, tpot

    def with_objectives(
        self, slo_classes: Mapping[int, SLO] | None = None, *, own: bool = True
    ) -> Workload:
        """The same requests with ``slo_classes`` as their classes' objectives (None: none);
        ``own=False`` also drops the requests' own. Checked as the constructor checks them."""
        return dataclasses.replace(
            self,
            slo_classes=slo_classes,
            ttft_slo=self.ttft_slo if own else None,
            tpot_slo=self.tpot_slo if own else None,
        )

    def with_arrivals(self, arrival_time: np.ndarray, source: str) -> Workload:
        """The same requests (objectives included) arriving at ``arrival_time`` instead, in the
        same order: a time axis scaled or shifted, as capacity and loads relative to saturation
        need."""
        arrival = np.asarray(arrival_time, dtype=np.float64)
        if arrival.shape != self.arrival_time.shape or np.any(np.diff(arrival) < 0):
            raise StepPlannerValueError(
                f"with_arrivals: {arrival.shape} arrival times for {len(self)} requests; "
                "allowed: one per request, in the workload's (arrival) order"
            )
        return dataclasses.replace(self, arrival_time=arrival, source=source)

    @property
    def rate(self) -> float | None:
        """Its offered rate, (n - 1) / (last arrival - first) requests/s; None when every
        request arrives at once, or over a span so small (subnormal) that the rate overflows:
        a report holds numbers or None, never inf."""
        span = float(self.arrival_time[-1] - self.arrival_time[0])
        rate = (len(self) - 1) / span if span > 0 else None
        return rate if rate is not None and math.isfinite(rate) else None

    def at_rate(self, rate: float) -> Workload:
        """The same requests with the time axis scaled about the first arrival so that the
        offered rate is ``rate`` req/s (only the gaps change)."""
        own = self.rate
        if own is None:
            raise StepPlannerValueError(
                "a workload needs at least two requests at different times to be scaled to a rate"
            )
        check_rate("rate", rate)
        start = self.arrival_time[0]
        return self.with_arrivals(
            start + (self.arrival_time - start) * (own / rate),
            f"{self.source} scaled to {rate:.4g}/s",
        )

    def summary(self) -> dict[str, Any]:
        n = len(self)
        span = float(self.arrival_time[-1] - self.arrival_time[0])
        out = {
            "source": self.source,
            "requests": n,
            "duration_s": span,
            "rate_per_s": self.rate,
            "prompt_tokens_mean": float(self.prompt_tokens.mean()),
            "output_tokens_mean": float(self.output_tokens.mean()),
            "classes": {str(p): int((self.priority == p).sum()) for p in self.classes},
        }
        if self.has_objectives:
            assert self.slo_classes is not None and self.ttft_slo is not None
            out["slo_classes"] = {
                str(p): {"ttft_s": slo.ttft, "tpot_s": slo.tpot}
                for p, slo in self.slo_classes.items()
            }
            out["requests_with_own_slo"] = int((~np.isnan(self.ttft_slo)).sum())
        return out

    def to_csv(self, path: str | pathlib.Path) -> None:
        """The stepplanner trace layout; ``ttft_slo_ms``/``tpot_slo_ms`` when requests carry
        objectives of their own (class objectives are not columns: give them again with
        ``--slo-class`` or ``slo_classes``)."""
        own = self.own_objectives
        assert self.ttft_slo is not None and self.tpot_slo is not None
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(TRACE_COLUMNS + (SLO_COLUMNS if own else ()))
            for k, row in enumerate(
                zip(self.arrival_time, self.prompt_tokens, self.output_tokens, self.priority)
            ):
                cells: tuple[Any, ...] = (f"{row[0]:.6f}", int(row[1]), int(row[2]), int(row[3]))
                if own:
                    cells += (_ms_cell(self.ttft_slo[k]), _ms_cell(self.tpot_slo[k]))
                writer.writerow(cells)


def _ms_cell(seconds: float) -> str:
    """An objective in a trace cell: milliseconds that read back to the same double; empty for
    none."""
    return "" if math.isnan(seconds) else repr(float(seconds) * 1e3)


def _slo_column(name: str, values: Any, n: int) -> np.ndarray:
    """A per-request objective column in seconds (NaN: none); None is a column of NaN."""
    if values is None:
        return np.full(n, np.nan)
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iuf":
        raise StepPlannerTypeError(
            f"workload column {name} must hold numbers of seconds (NaN: none), got dtype "
            f"{arr.dtype}"
        )
    arr = arr.astype(np.float64)
    if arr.shape != (n,):
        raise StepPlannerValueError(
            f"workload column {name} has shape {arr.shape}; allowed: one value per request ({n},)"
        )
    _check(
        arr,
        name,
        lambda a: np.isnan(a) | (np.isfinite(a) & (a > 0)),
        "a finite number of seconds > 0, or NaN for none",
    )
    return arr


def _int_column(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise StepPlannerTypeError(
            f"workload column {name} must hold integers, got dtype {arr.dtype}"
        )
    if arr.size and (arr.min() < INT32_MIN or arr.max() > INT32_MAX):
        raise StepPlannerOverflowError(f"workload column {name} has values outside int32")
    return arr.astype(np.int32)


def _check(col: np.ndarray, name: str, ok: Any, allowed: str) -> None:
    bad = np.flatnonzero(~ok(col))
    if bad.size:
        i = int(bad[0])
        raise StepPlannerValueError(
            f"workload request {i}: {name}={col[i].item()!r} is out of range; allowed: {allowed}"
        )


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

#: The default classes' objectives (docs/simulator.md, "SLOs and goodput", says why these):
#: priority -> SLO(ttft, tpot) in seconds. The CLI gives them to the embedded workload unless
#: ``--slo-class`` or ``--no-slo`` says otherwise.
DEFAULT_SLO_CLASSES: Mapping[int, SLO] = types.MappingProxyType(
    {
        -1: SLO(ttft=0.25, tpot=0.05),
        0: SLO(ttft=0.25, tpot=0.1),
        1: SLO(ttft=2.0, tpot=0.25),
    }
)
# The random stream of non-Poisson gaps (``synthetic``'s burstiness), beside the seed's own.
BURSTY_STREAM = 1


def check_rate(field: str, rate: object) -> None:
    """``rate`` is an arrival rate in requests/s, 0 < rate <= ``MAX_RATE`` (infinity and 1e308
    alike are past it)."""
    if isinstance(rate, bool) or not (isinstance(rate, (int, float)) and 0 < rate <= MAX_RATE):
        raise StepPlannerValueError(
            f"{field}={rate!r} is out of range; allowed: 0 < {field} <= {MAX_RATE:,.0f} requests/s"
        )


def synthetic(
    requests: int = DEFAULT_REQUESTS,
    rate: float = DEFAULT_RATE,
    seed: int = 0,
    classes: Sequence[PriorityClass] = DEFAULT_CLASSES,
    max_prompt: int = 4096,
    max_output: int = 2048,
    *,
    burstiness: float = 1.0,
    slo_classes: Mapping[int, SLO] | None = None,
) -> Workload:
    """Arrivals at ``rate`` requests/s; class drawn by share; lognormal lengths.

    ``burstiness`` shapes the gaps between arrivals as vLLM's ``benchmark_serving
    --burstiness`` does: gamma-distributed with shape ``burstiness`` and mean ``1 / rate``
    (scale ``1 / (rate * burstiness)``); 1 is a Poisson process (exponential gaps, the draws
    of earlier releases), below 1 burstier, above 1 more regular, ``inf`` constant gaps. The
    requests (classes, lengths) are the same at every burstiness for one seed: only the gaps
    differ. Unlike vLLM, the gaps are not rescaled to make the span exactly ``requests /
    rate``, so that a rate scales the time axis exactly (capacity relies on it).
    ``slo_classes``: the classes' objectives (``DEFAULT_SLO_CLASSES`` for the default classes),
    None for none.
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise StepPlannerValueError(
            f"requests={requests!r} is out of range; allowed: an integer >= 1"
        )
    check_rate("rate", rate)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise StepPlannerValueError(
            f"seed={seed!r} is out of range; allowed: an integer >= 0 (numpy's seeds)"
        )
    if (
        isinstance(burstiness, bool)
        or not isinstance(burstiness, (int, float))
        or not burstiness > 0
    ):
        raise StepPlannerValueError(
            f"burstiness={burstiness!r} is out of range; allowed: a number > 0 (1: Poisson; "
            "inf: constant gaps)"
        )
    for name, value in (("max_prompt", max_prompt), ("max_output", max_output)):
        if not isinstance(value, int) or not 1 <= value <= INT32_MAX:
            raise StepPlannerValueError(
                f"{name}={value!r} is out of range; allowed: 1..{INT32_MAX}"
            )
    if not classes:
        raise StepPlannerValueError("classes is empty; allowed: at least one PriorityClass")
    shares = np.array([c.share for c in classes], dtype=np.float64)
    if not np.all(np.isfinite(shares) & (shares >= 0)) or shares.sum() <= 0:
        raise StepPlannerValueError(
            f"class shares {shares.tolist()} must be >= 0 with a positive sum"
        )

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=requests)  # drawn first at any burstiness
    if math.isinf(burstiness):
        gaps = np.full(requests, 1.0 / rate)
    elif burstiness != 1:
        # Their own stream, so the requests below are those of the Poisson workload.
        gaps = np.random.default_rng([seed, BURSTY_STREAM]).gamma(
            burstiness, 1.0 / (rate * burstiness), size=requests
        )
    arrival = np.cumsum(gaps)
    arrival -= arrival[0]
    which = rng.choice(len(classes), size=requests, p=shares / shares.sum())
    z_prompt = rng.standard_normal(requests)
    z_output = rng.standard_normal(requests)
    table = np.array(
        [
            (c.priority, c.prompt_median, c.prompt_sigma, c.output_median, c.output_sigma)
            for c in classes
        ],
        dtype=np.float64,
    )[which]
    prompt = np.clip(np.rint(table[:, 1] * np.exp(table[:, 2] * z_prompt)), 1, max_prompt)
    output = np.clip(np.rint(table[:, 3] * np.exp(table[:, 4] * z_output)), 1, max_output)
    shape = "" if burstiness == 1 else f", burstiness={burstiness:g}"
    return Workload(
        arrival,
        prompt.astype(np.int32),
        output.astype(np.int32),
        table[:, 0].astype(np.int32),
        source=f"synthetic(requests={requests}, rate={rate:g}/s, seed={seed}{shape})",
        slo_classes=slo_classes,
    )


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
                f"{where} line {line}: not valid JSON ({exc.msg})"
            ) from None
        except RecursionError:  # json's C decoder recurses once per nesting level
            raise StepPlannerValueError(
                f"{where} line {line}: not valid JSON (nested too deeply)"
            ) from None
        if not isinstance(record, dict):
            raise StepPlannerValueError(
                f"{where} line {line}: expected a JSON object, got {type(record).__name__}"
            )
        yield line, record
