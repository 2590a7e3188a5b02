"""Service-level objectives: parsing ``ttft_p99@-1=200ms``, checking a run against them, goodput;
and parsing the per-class request objectives ``--slo-class -1=ttft:250ms,tpot:50ms`` (the
deadlines ``sim.goodput`` measures attainment against).

An SLO constrains a percentile of one per-request latency metric, optionally for one priority
class only. A run *meets* its SLOs when every constraint holds; a request is *good* when its own
value of every constrained metric is within that constraint's threshold (the DistServe / vLLM
``--goodput`` definition), and goodput is good requests per simulated second.

Decisions (docs/tuning.md repeats them):

* A request that never completed (refused at admission because its prompt exceeds S_in, or cut
  off by ``max_steps``) counts as infinitely late in every percentile: an engine that refuses
  work must not meet a latency objective by doing so.
* TPOT and the longest inter-token gap do not exist for a one-token output. Such requests are
  left out of those percentiles and pass those thresholds for goodput (vLLM counts their TPOT
  as 0 for goodput).
* Percentiles are numpy's default linear interpolation, as vLLM's benchmarks compute them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .._errors import StepPlannerTypeError, StepPlannerValueError
from ..planner._slo import SLO

__all__ = [
    "METRICS",
    "STABILITY",
    "SloTarget",
    "good_requests",
    "goodput",
    "parse_queue_delay",
    "parse_slo",
    "parse_slo_class",
    "parse_slo_classes",
    "parse_slos",
    "slo_report",
]

#: Per-request metrics an SLO may name, as ``SimulationResult.latencies()`` keys them.
METRICS = ("ttft", "tpot", "e2e", "queue", "max_itl")
_PER_SECOND = {"ms": 1e3, "s": 1.0, "us": 1e6}  # divisors: 50000us is exactly 0.05 s
_KEY = re.compile(r"^(?P<metric>[a-z0-9_]+?)_p(?P<pct>\d+(?:\.\d+)?)(?:@(?P<cls>-?\d+))?$")
_VALUE = re.compile(r"^(?P<number>[0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(?P<unit>ms|us|s)$")


@dataclasses.dataclass(frozen=True, slots=True)
class SloTarget:
    """``percentile`` of ``metric`` (over ``priority``'s requests, or all) <= ``seconds``."""

    metric: str
    percentile: float
    seconds: float
    priority: int | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise StepPlannerValueError(
                f"SLO metric {self.metric!r} is not known; allowed: {', '.join(METRICS)}"
            )
        if not (isinstance(self.percentile, (int, float)) and 0 < self.percentile <= 100):
            raise StepPlannerValueError(
                f"SLO percentile {self.percentile!r} is out of range; allowed: 0 < p <= 100"
            )
        if not (
            isinstance(self.seconds, (int, float))
            and math.isfinite(self.seconds)
            and self.seconds >= 0
        ):
            raise StepPlannerValueError(
                f"SLO threshold {self.seconds!r} s is out of range; allowed: a finite number >= 0"
            )

    @property
    def key(self) -> str:
        """``ttft_p99`` or ``ttft_p99@-1``: the name of the constrained value."""
        pct = f"{self.percentile:g}"
        where = "" if self.priority is None else f"@{self.priority}"
        return f"{self.metric}_p{pct}{where}"

    def __str__(self) -> str:
        return f"{self.key}={self.seconds * 1e3:g}ms"


def parse_slo(text: str) -> SloTarget:
    """``"ttft_p99=200ms"``, ``"tpot_p90=0.05s"``, ``"e2e_p50@-1=2s"`` -> ``SloTarget``."""
    if not isinstance(text, str):
        raise StepPlannerTypeError(
            f"SLO must be a string METRIC_pN[@CLASS]=VALUE, got {type(text).__name__}"
        )
    key, sep, value = text.strip().partition("=")
    key, value = key.strip().lower(), value.strip().lower()
    match = _KEY.match(key)
    if not sep or match is None:
        raise StepPlannerValueError(
            f"SLO {text!r} is not METRIC_pN[@CLASS]=VALUE; e.g. ttft_p99=200ms, "
            f"tpot_p90@-1=50ms; METRIC is one of {', '.join(METRICS)}"
        )
    metric = match["metric"]
    if metric not in METRICS:
        raise StepPlannerValueError(
            f"SLO {text!r}: metric {metric!r} is not known; allowed: {', '.join(METRICS)}"
        )
    seconds = _duration(value)
    if seconds is None:
        raise StepPlannerValueError(
            f"SLO {text!r}: value {value!r} is not a duration; allowed: a number "
            "followed by ms, s or us (e.g. 200ms, 0.2s)"
        )
    priority = None if match["cls"] is None else int(match["cls"])
    try:
        return SloTarget(metric, float(match["pct"]), seconds, priority)
    except ValueError as exc:
        raise StepPlannerValueError(f"SLO {text!r}: {exc}") from None


def _duration(value: str) -> float | None:
    """``"200ms"`` -> 0.2 seconds; None when ``value`` is not a number >= 0 with a unit."""
    number = _VALUE.match(value.strip().lower())
    return None if number is None else float(number["number"]) / _PER_SECOND[number["unit"]]


_SLO_CLASS_FORM = "PRIORITY=ttft:VALUE[,tpot:VALUE] with VALUE in ms, s or us"


def parse_slo_class(text: str) -> tuple[int, SLO]:
    """``"0=ttft:250ms,tpot:100ms"`` -> (0, SLO(0.25, 0.1)): a priority class's objectives."""
    if not isinstance(text, str):
        raise StepPlannerTypeError(
            f"SLO class must be a string {_SLO_CLASS_FORM}, got {type(text).__name__}"
        )
    head, sep, body = text.strip().partition("=")
    try:
        priority = int(head.strip())
    except ValueError:
        priority = None
    if not sep or priority is None or not -(2**31) <= priority < 2**31:
        raise StepPlannerValueError(
            f"SLO class {text!r} is not {_SLO_CLASS_FORM} (PRIORITY an "
            "int32); e.g. 0=ttft:250ms,tpot:100ms"
        )
    values: dict[str, float] = {}
    for item in (part.strip() for part in body.split(",")):
        key, colon, raw = item.partition(":")
        key, raw = key.strip().lower(), raw.strip().lower()
        if not colon or key not in ("ttft", "tpot"):
            raise StepPlannerValueError(
                f"SLO class {text!r}: item {item!r} is not ttft:VALUE or tpot:VALUE"
            )
        if key in values:
            raise StepPlannerValueError(f"SLO class {text!r}: {key} is given twice")
        seconds = _duration(raw.lstrip("+-"))
        if seconds is None:
            try:
                unitless = math.isfinite(float(raw))
            except ValueError:
                unitless = False
            why = "has no unit" if unitless else "is not a duration"
            raise StepPlannerValueError(
                f"SLO class {text!r}: {key} value {raw!r} {why}; "
                "allowed: a number followed by ms, s or us (e.g. 250ms)"
            )
        if raw.startswith("-") or seconds <= 0 or not math.isfinite(seconds):
            raise StepPlannerValueError(
                f"SLO class {text!r}: {key} value {raw!r} is out of "
                "range; allowed: a finite duration > 0"
            )
        values[key] = seconds
    if "ttft" not in values:
        raise StepPlannerValueError(
            f"SLO class {text!r} has no ttft; allowed: {_SLO_CLASS_FORM} "
            "(token i is due ttft + i * tpot after arrival)"
        )
    return priority, SLO(values["ttft"], values.get("tpot"))


def parse_slo_classes(texts: Iterable[str]) -> dict[int, SLO]:
    """Every ``--slo-class``; a class given twice is an error."""
    out: dict[int, SLO] = {}
    for text in texts:
        priority, slo = parse_slo_class(text)
        if priority in out:
            raise StepPlannerValueError(
                f"SLO class {priority} is given twice; allowed: one --slo-class per priority class"
            )
        out[priority] = slo
    return out


#: Capacity's default stability condition: median queueing delay (arrival to admission) <= 2 s,
#: Sarathi-Serve's. Past saturation the queue, not the batch, absorbs the excess load, so TPOT
#: alone stays met at any rate; a bound on queueing is what makes a rate sustainable.
STABILITY = SloTarget("queue", 50.0, 2.0)
_QUEUE_KEY = re.compile(r"^p\d+(?:\.\d+)?$")


def parse_queue_delay(text: str) -> SloTarget:
    """``"p50=2s"`` (Sarathi-Serve's) or ``"p99=5s"`` (Vidur's) -> a ``queue`` SloTarget over
    all requests: the percentile of queueing delay, arrival to admission, and its bound."""
    if not isinstance(text, str):
        raise StepPlannerTypeError(
            f"queue delay must be a string pN=VALUE, got {type(text).__name__}"
        )
    key, sep, value = text.strip().partition("=")
    if not sep or _QUEUE_KEY.match(key.strip().lower()) is None:
        raise StepPlannerValueError(
            f"queue delay {text!r} is not pN=VALUE; e.g. p50=2s (Sarathi-Serve), p99=5s (Vidur)"
        )
    try:
        return parse_slo(f"queue_{key.strip()}={value}")
    except ValueError as exc:
        raise StepPlannerValueError(
            f"queue delay {text!r}: {str(exc).split(': ', 1)[-1]}"
        ) from None


def parse_slos(texts: Iterable[str]) -> tuple[SloTarget, ...]:
    """Every ``--slo``; a key given twice is an error (which one would hold?)."""
    out: list[SloTarget] = []
    for text in texts:
        slo = parse_slo(text)
        if any(s.key == slo.key for s in out):
            raise StepPlannerValueError(
                f"SLO {slo.key} is given twice; allowed: one threshold per "
                "metric, percentile and class"
            )
        out.append(slo)
    return tuple(out)


def _class_mask(slo: SloTarget, priority: np.ndarray) -> np.ndarray:
    if slo.priority is None:
        return np.ones(priority.shape, dtype=bool)
    return np.asarray(priority == slo.priority, dtype=bool)


def _observed(
    slo: SloTarget,
    latencies: Mapping[str, np.ndarray],
    priority: np.ndarray,
    completed: np.ndarray,
    output_tokens: np.ndarray,
) -> float | None:
    """The constrained percentile, with unfinished requests counted as infinitely late."""
    mask = _class_mask(slo, priority)
    if slo.metric in ("tpot", "max_itl"):
        mask &= output_tokens > 1  # undefined for one-token outputs
    if not mask.any():
        return None
    values = np.where(completed[mask], latencies[slo.metric][mask], np.inf)
    if np.isinf(values).any():
        # numpy interpolates inf - inf into nan; order statistics need no interpolation there.
        ranked = np.sort(values)
        rank = slo.percentile / 100 * (ranked.size - 1)
        low, high = ranked[math.floor(rank)], ranked[math.ceil(rank)]
        if math.isinf(high):
            return math.inf
        return float(low + (high - low) * (rank - math.floor(rank)))
    return float(np.percentile(values, slo.percentile))


def slo_report(
    slos: Sequence[SloTarget],
    latencies: Mapping[str, np.ndarray],
    priority: np.ndarray,
    completed: np.ndarray,
    output_tokens: np.ndarray,
) -> list[dict[str, Any]]:
    """One row per SLO: its key, threshold, observed value (seconds; None when no request of
    the class has the metric, which counts as met) and whether it holds."""
    rows = []
    for slo in slos:
        observed = _observed(slo, latencies, priority, completed, output_tokens)
        rows.append(
            {
                "slo": slo.key,
                "threshold_s": slo.seconds,
                "observed_s": observed,
                "met": observed is None or observed <= slo.seconds,
            }
        )
    return rows


def good_requests(
    slos: Sequence[SloTarget],
    latencies: Mapping[str, np.ndarray],
    priority: np.ndarray,
    completed: np.ndarray,
) -> np.ndarray:
    """Per request: completed, and within every threshold that applies to its class."""
    good = completed.copy()
    for slo in slos:
        values = latencies[slo.metric]
        within = np.isnan(values) | (values <= slo.seconds)  # NaN: a one-token output's TPOT
        good &= within | ~_class_mask(slo, priority)
    return good


def goodput(
    slos: Sequence[SloTarget],
    latencies: Mapping[str, np.ndarray],
    priority: np.ndarray,
    completed: np.ndarray,
    simulated_seconds: float,
) -> float:
    """Good requests per simulated second."""
    if not simulated_seconds > 0:
        raise StepPlannerValueError(
            f"simulated_seconds={simulated_seconds!r} is out of range; allowed: > 0"
        )
    return float(good_requests(slos, latencies, priority, completed).sum()) / simulated_seconds
