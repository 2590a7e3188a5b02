"""Capacity: the highest arrival rate at which a configuration still meets its SLOs.

This is the number the chunked-prefill literature reports (Sarathi-Serve's "capacity under a
P99 TBT SLO"). The workload is the same requests at every probed rate, only their time axis
scaled: the synthetic workload regenerated with the same seed (its exponential inter-arrival
draws scale exactly with 1/rate), or a trace's arrivals multiplied by ``trace_rate / rate``.

``find_capacity`` brackets the answer from a starting rate (doubling while the SLOs hold,
halving while they do not), then bisects until the bracket is no wider than ``tolerance``
req/s, and reports the low end: a rate that was *measured* to meet the SLOs. It assumes that
meeting the SLOs is monotone in the rate, which queueing makes true in practice; every probe is
kept in the result so a non-monotone case can be seen.

A rate must also be *stable*: by default the median queueing delay (arrival to admission) stays
within 2 s (``slo.STABILITY``, Sarathi-Serve's condition beside its P99 TBT SLO). Without it a
TPOT-only objective holds at any rate, because past saturation the waiting queue, not the batch,
absorbs the excess. A configuration that still meets everything at ``max_rate`` has no measured
capacity: its record says ``unbounded`` with ``capacity`` None and ``max_rate`` as the bound
that was met, never the ceiling as if it were the answer.

When the workload's requests carry objectives (``Workload.objectives``), each record also has
``attainment_capacity``: per share in ``ATTAINMENT_TARGETS`` (90% and 99%), the highest rate at
which that share of all arrivals attains every deadline (``sim.goodput``; DistServe's definition
of capacity under an attainment target), under the same stability condition. Every rate is
simulated once per configuration, whichever searches probe it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from .._errors import StepPlannerTypeError, StepPlannerValueError
from ..planner._slo import SLO
from ..sim.latency import LatencyModel
from ..sim.simulator import simulate
from ..sim.workloads import Workload, check_rate, synthetic
from .backends import Outcome, Progress, run_tasks
from .grid import GridPoint, expand_grid
from .slo import STABILITY, SloTarget, slo_report
from .sweep import assess

__all__ = ["CapacityResult", "ScaledTrace", "SyntheticRates", "capacity", "find_capacity"]


class RateSource(Protocol):
    """A workload at any arrival rate (req/s); ``rate`` is the one it was given at."""

    rate: float

    def at(self, rate: float) -> Workload: ...


@dataclasses.dataclass(frozen=True)
class SyntheticRates:
    """The embedded synthetic workload (``workloads.synthetic``) at any rate, fixed seed, with
    ``burstiness`` and ``slo_classes`` as ``synthetic`` takes them."""

    requests: int = 6000
    seed: int = 0
    rate: float = 28.0
    burstiness: float = 1.0
    slo_classes: dict[int, SLO] | None = None

    def at(self, rate: float) -> Workload:
        return synthetic(
            requests=self.requests,
            rate=rate,
            seed=self.seed,
            burstiness=self.burstiness,
            slo_classes=self.slo_classes,
        )


@dataclasses.dataclass(frozen=True)
class ScaledTrace:
    """A trace's requests with the time axis scaled; its own rate is (n - 1) / duration."""

    workload: Workload

    @property
    def rate(self) -> float:
        rate = self.workload.rate
        if rate is None:
            raise StepPlannerValueError(
                "a trace needs at least two requests at different times to be scaled to a rate"
            )
        return float(rate)

    def at(self, rate: float) -> Workload:
        return self.workload.at_rate(rate)


@dataclasses.dataclass
class CapacityResult:
    """``capacity`` req/s met the SLOs; ``capacity + tolerance`` (or ``upper``) did not."""

    capacity: float
    upper: float | None
    tolerance: float
    probes: list[tuple[float, bool]]

    @property
    def bounded(self) -> bool:
        """False when the search hit ``max_rate`` with the SLOs still met."""
        return self.upper is not None


def find_capacity(
    meets: Callable[[float], bool], start: float, tolerance: float, max_rate: float = 1e6
) -> CapacityResult:
    """Highest rate r (to within ``tolerance``) with ``meets(r)``; 0 when even ``tolerance``
    req/s fails."""
    for name, value in (("start", start), ("tolerance", tolerance)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise StepPlannerValueError(
                f"{name}={value!r} is out of range; allowed: a finite rate > 0"
            )
    check_rate("max_rate", max_rate)
    probes: list[tuple[float, bool]] = []

    def probe(rate: float) -> bool:
        ok = bool(meets(rate))
        probes.append((rate, ok))
        return ok

    low, high = 0.0, None
    rate = min(start, max_rate)
    if probe(rate):
        low = rate
        while high is None:
            if low >= max_rate:
                return CapacityResult(low, None, tolerance, probes)
            rate = min(low * 2, max_rate)
            if probe(rate):
                low = rate
            else:
                high = rate
    else:
        high = rate
        while low == 0.0 and high > tolerance:
            rate = high / 2
            if probe(rate):
                low = rate
            else:
                high = rate
    while high - low > tolerance:
        mid = (low + high) / 2
        if probe(mid):
            low = mid
        else:
            high = mid
    return CapacityResult(low, high, tolerance, probes)


@dataclasses.dataclass(frozen=True)
class CapacityTask:
    point: GridPoint
    source: Any  # a RateSource; Any so that dataclass pickling needs no Protocol check
    latency: LatencyModel
    slos: tuple[SloTarget, ...]
    tolerance: float
    max_rate: float
    stability: SloTarget | None = STABILITY


def capacity_of(task: CapacityTask) -> dict[str, Any]:
    """One configuration's capacity record (module-level for process and Ray workers)."""
    point = task.point
    record = point.record()
    if point.limits is None or point.policy is None:
        return record
    limits, policy = point.limits, point.policy
    at_rate: dict[float, dict[str, Any]] = {}

    def probe(rate: float) -> dict[str, Any]:
        """The run at ``rate``, assessed; each rate is simulated once for every search."""
        if rate in at_rate:
            return at_rate[rate]
        result = simulate(task.source.at(rate), limits, policy, task.latency)
        assessed = assess(result, task.slos)
        stable = None
        if task.stability is not None:
            # Beside the SLOs, not among them: a run-level condition, so it does not decide
            # which requests count towards goodput.
            w = result.workload
            (stable,) = slo_report(
                [task.stability],
                result.latencies(),
                w.priority,
                ~np.isnan(result.finish_time),
                w.output_tokens,
            )
        assessed["stable"] = stable
        at_rate[rate] = assessed
        return assessed

    def is_stable(assessed: dict[str, Any]) -> bool:
        return assessed["stable"] is None or bool(assessed["stable"]["met"])

    def meets(rate: float) -> bool:
        assessed = probe(rate)
        return bool(assessed["meets_slo"]) and is_stable(assessed)

    found = find_capacity(meets, task.source.rate, task.tolerance, task.max_rate)
    best = at_rate.get(found.capacity)
    record.update(
        {
            # Unbounded: every probe up to max_rate met everything, so there is no capacity to
            # report, only the bound it is at least.
            "capacity": found.capacity if found.bounded else None,
            "unbounded": not found.bounded,
            "max_rate": task.max_rate,
            "upper": found.upper,
            "tolerance": found.tolerance,
            "probes": [
                {
                    "rate": r,
                    "meets_slo": bool(at_rate[r]["meets_slo"]),
                    "stable": None if at_rate[r]["stable"] is None else at_rate[r]["stable"]["met"],
                    "meets": ok,
                }
                for r, ok in found.probes
            ],
            "at_capacity": None
            if best is None
            else {
                "rate": found.capacity,
                "goodput": best["goodput"],
                "throughput": best["throughput"],
                "slo": best["slo"],
                "stability": best["stable"],
                "p99_ttft_ms": best["metrics"]["p99_ttft_ms"],
                "p99_tpot_ms": best["metrics"]["p99_tpot_ms"],
            },
        }
    )
    if at_rate[found.probes[0][0]]["attainment"] is not None:
        record["attainment_capacity"] = {
            f"{target:g}": _attainment_capacity(task, probe, is_stable, target)
            for target in ATTAINMENT_TARGETS
        }
    return record


#: The attainment shares capacity reports a rate for (DistServe: the highest rate at which
#: this share of requests attain their objectives).
ATTAINMENT_TARGETS = (0.9, 0.99)


def _attainment_capacity(
    task: CapacityTask,
    probe: Callable[[float], dict[str, Any]],
    is_stable: Callable[[dict[str, Any]], bool],
    target: float,
) -> dict[str, Any]:
    """The highest rate at which ``target`` of all arrivals attain their objectives, under the
    stability condition (not the --slo objectives): DistServe's capacity, Sarathi's condition."""

    def share(rate: float) -> float | None:
        attained: float | None = probe(rate)["attainment"]["classes"]["all"]["attainment"]
        return attained

    def meets(rate: float) -> bool:
        attained = share(rate)
        return attained is not None and attained >= target and is_stable(probe(rate))

    found = find_capacity(meets, task.source.rate, task.tolerance, task.max_rate)
    return {
        "target": target,
        "capacity": found.capacity if found.bounded else None,
        "unbounded": not found.bounded,
        "upper": found.upper,
        "probes": [{"rate": r, "attainment": share(r), "meets": ok} for r, ok in found.probes],
        "attainment_at_capacity": share(found.capacity) if found.capacity else None,
    }


def capacity(
    source: RateSource,
    grid: dict[str, list[str]],
    base_limits: Any,
    base_options: Any,
    latency: LatencyModel,
    slos: Sequence[SloTarget],
    tolerance: float = 0.1,
    max_rate: float = 1e4,
    backend: str = "process",
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
    *,
    stability: SloTarget | None = STABILITY,
) -> tuple[list[dict[str, Any]], Outcome]:
    """Capacity of every grid point (configurations run in parallel, probes in sequence) under
    the SLOs and the ``stability`` condition (a ``queue`` SloTarget; None drops it); records
    sorted by capacity, unbounded ones first, errors last."""
    if stability is not None and not isinstance(stability, SloTarget):
        raise StepPlannerTypeError(
            f"stability must be a SloTarget on queueing delay or None, "
            f"got {type(stability).__name__}"
        )
    if stability is not None and (stability.metric != "queue" or stability.priority is not None):
        raise StepPlannerValueError(
            f"stability={stability} is out of range; allowed: a bound on "
            "queueing delay over all requests (e.g. queue_p50=2000ms)"
        )
    if not slos and stability is None:
        raise StepPlannerValueError(
            "capacity needs at least one SLO (--slo METRIC_pN=VALUE) or a "
            "stability condition: without either every rate is sustainable"
        )
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise StepPlannerValueError(f"tolerance={tolerance!r} is out of range; allowed: req/s > 0")
    check_rate("max_rate", max_rate)
    points = expand_grid(grid, base_limits, base_options)
    tasks = [
        CapacityTask(p, source, latency, tuple(slos), float(tolerance), float(max_rate), stability)
        for p in points
    ]
    outcome = run_tasks(capacity_of, tasks, backend, workers, ray_address, progress)
    records = outcome.finished
    records.sort(
        key=lambda r: (
            r.get("error") is not None,
            -math.inf if r.get("unbounded") else -(r.get("capacity") or 0.0),
            r["index"],
        )
    )
    return records, outcome
