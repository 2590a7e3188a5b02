"""Real beside simulated: the same trace, limits and policy, and how far the simulator is off.

For each side and each class (``"all"``, then every priority when the trace has more than one):
p50/p90/p99 of TTFT, TPOT, ITL and E2E, and (for ``"all"``) requests/s and output tokens/s, with
the relative error ``(simulated - real) / real``. The definitions are vLLM's serving benchmark's
and the project's (``stepplanner.tuning.metrics``): TTFT and E2E per request, TPOT =
(E2E - TTFT) / (output tokens - 1) over outputs of two or more tokens, ITL every gap between two
consecutive tokens with all requests pooled, percentiles numpy's linear interpolation; throughput
over the run's span (first arrival to last token; a vLLM file's ``duration``).

Which requests count: those that succeeded in the real run, on both sides (a failed request is
still simulated, since the engine was given it, but is left out of TTFT/TPOT/E2E and
throughput). The simulator's ITL sample is pooled per class as it runs, so on the simulated side
it also holds a failed request's gaps; with no failures, the usual case, both sides count the
same requests.

The summary is the issue's figure of merit: the median and the largest absolute relative error
over p50 and p90 of TTFT, TPOT and E2E (six figures per class).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import StepPlannerValueError
from ..planner._policy import ResolvedSchedulingPolicy, SchedulingOptions, StepPlannerLimits
from ..sim.latency import LatencyModel
from ..sim.simulator import SimulationResult, policy_to_dict, pooled_itl, simulate
from ..sim.workloads import Workload
from ..tuning.metrics import percentile_word, series_stats, simulated_span, weighted_series_stats
from .results import RunResults

__all__ = [
    "FIGURES",
    "METRICS",
    "PERCENTILES",
    "Fidelity",
    "Sample",
    "check_fidelity",
    "compare_samples",
    "fidelity_report",
    "real_samples",
    "relative_error",
    "simulated_samples",
    "summarize",
]

PERCENTILES = (50.0, 90.0, 99.0)
METRICS = ("ttft", "tpot", "itl", "e2e")
THROUGHPUT = ("requests_per_s", "output_tokens_per_s")
FIGURES = tuple((metric, p) for metric in ("ttft", "tpot", "e2e") for p in (50.0, 90.0))


@dataclasses.dataclass(frozen=True, eq=False)
class Sample:
    """One side of one class: per-request seconds, the pooled ITL gaps as (seconds, count), and
    what throughput needs (``seconds`` None: the span is unknown)."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    itl: tuple[np.ndarray, np.ndarray]
    requests: int
    output_tokens: int
    seconds: float | None

    def percentiles(self, metric: str) -> dict[str, float | None]:
        """``{"p50": seconds, ...}`` by the tuning metrics' definitions; None when empty."""
        if metric == "itl":
            values, counts = self.itl
            empty = not (counts > 0).any()
            stats = weighted_series_stats(metric, values, counts, PERCENTILES)
        else:
            series = getattr(self, metric)
            empty = series.size == 0
            stats = series_stats(metric, series, PERCENTILES)
        return {
            f"p{percentile_word(p)}": None
            if empty
            else stats[f"p{percentile_word(p)}_{metric}_ms"] / 1e3
            for p in PERCENTILES
        }

    def throughput(self) -> dict[str, float | None]:
        if not self.seconds:
            return dict.fromkeys(THROUGHPUT)
        return {
            "requests_per_s": self.requests / self.seconds,
            "output_tokens_per_s": self.output_tokens / self.seconds,
        }


@dataclasses.dataclass(frozen=True, eq=False)
class Fidelity:
    """A comparison: the JSON-ready ``report`` and both sides' samples by class (for plots)."""

    report: dict[str, Any]
    real: dict[str, Sample]
    simulated: dict[str, Sample]


def relative_error(real: float | None, simulated: float | None) -> float | None:
    """``(simulated - real) / real``; None when either is missing or ``real`` is 0."""
    if real is None or simulated is None or real == 0:
        return None
    return (simulated - real) / real


def _class_keys(priority: np.ndarray) -> list[tuple[str, np.ndarray]]:
    classes = np.unique(priority)
    keys = [("all", np.ones(len(priority), dtype=bool))]
    if len(classes) > 1:
        keys += [(str(int(p)), priority == p) for p in classes]
    return keys


def real_samples(results: RunResults) -> dict[str, Sample]:
    """The real run's samples by class (``results`` matched to its workload)."""
    if results.priority is None:
        raise StepPlannerValueError(
            f"{results.where}: not matched to a workload; use served_workload first"
        )
    ok = ~results.failed
    out_lens = results.output_lens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = (results.e2e - results.ttft) / (out_lens - 1)
    seconds = results.duration
    if seconds is None and results.arrival is not None:
        seconds = float((results.arrival + results.e2e)[ok].max() - results.arrival.min())
    samples = {}
    for key, members in _class_keys(results.priority):
        rows = ok & members
        gaps = [results.itls[i] for i in np.flatnonzero(rows)]
        values = np.concatenate(gaps) if gaps else np.zeros(0)
        samples[key] = Sample(
            ttft=results.ttft[rows],
            tpot=tpot[rows & (out_lens > 1)],
            e2e=results.e2e[rows],
            itl=(values, np.ones(values.size, dtype=np.int64)),
            requests=int(rows.sum()),
            output_tokens=int(out_lens[rows].sum()),
            seconds=seconds,
        )
    return samples


def simulated_samples(
    result: SimulationResult, counted: np.ndarray | None = None
) -> dict[str, Sample]:
    """The simulation's samples by class, over the completed requests among ``counted`` (a mask
    over the workload's rows; None: all)."""
    w = result.workload
    lat = result.latencies()
    done = ~np.isnan(result.finish_time)
    if counted is not None:
        done &= counted
    seconds = simulated_span(result)
    classes = list(w.classes)
    samples = {}
    for key, members in _class_keys(w.priority):
        rows = done & members
        tpot = lat["tpot"][rows]
        itl = pooled_itl(result.itl) if key == "all" else result.itl[classes.index(int(key))]
        samples[key] = Sample(
            ttft=lat["ttft"][rows],
            tpot=tpot[~np.isnan(tpot)],
            e2e=lat["e2e"][rows],
            itl=itl,
            requests=int(rows.sum()),
            output_tokens=int(result.generated[rows].sum()),
            seconds=seconds,
        )
    return samples


def _side_by_side(
    real: dict[str, float | None], simulated: dict[str, float | None]
) -> dict[str, dict[str, float | None]]:
    return {
        key: {
            "real": real[key],
            "simulated": simulated[key],
            "error": relative_error(real[key], simulated[key]),
        }
        for key in real
    }


def compare_samples(
    real: dict[str, Sample], simulated: dict[str, Sample]
) -> dict[str, dict[str, Any]]:
    """Per class: each metric's percentiles real, simulated and the relative error; and for
    ``"all"`` the throughput the same way."""
    if list(real) != list(simulated):
        raise StepPlannerValueError(
            f"the real run has classes {list(real)} and the simulation {list(simulated)}; "
            "allowed: the same trace on both sides"
        )
    out: dict[str, dict[str, Any]] = {}
    for key in real:
        out[key] = {
            metric: _side_by_side(real[key].percentiles(metric), simulated[key].percentiles(metric))
            for metric in METRICS
        }
        if key == "all":
            out[key]["throughput"] = _side_by_side(
                real[key].throughput(), simulated[key].throughput()
            )
    return out


def summarize(
    metrics: dict[str, Any], figures: Sequence[tuple[str, float]] = FIGURES
) -> dict[str, Any]:
    """Median and largest |relative error| over ``figures`` (those with both sides known)."""
    errors = {
        f"{metric} p{percentile_word(p)}": metrics[metric][f"p{percentile_word(p)}"]["error"]
        for metric, p in figures
    }
    known = {name: abs(e) for name, e in errors.items() if e is not None}
    worst = max(known, key=known.__getitem__) if known else None
    return {
        "figures": list(errors),
        "known": len(known),
        "median_abs_error": float(np.median(list(known.values()))) if known else None,
        "max_abs_error": known[worst] if worst else None,
        "worst": worst,
    }


def fidelity_report(results: RunResults, result: SimulationResult) -> Fidelity:
    """Compare ``results`` (matched to ``result.workload`` by ``served_workload``) with the
    simulation ``result`` of that workload."""
    if len(results) != len(result.workload):
        raise StepPlannerValueError(
            f"{results.where}: {len(results)} requests, but the simulation ran "
            f"{len(result.workload)}; allowed: the simulation of the workload served_workload "
            "gave"
        )
    real = real_samples(results)
    simulated = simulated_samples(result, ~results.failed)
    metrics = compare_samples(real, simulated)
    _check_finite(results.where, metrics)
    done = ~np.isnan(result.finish_time)
    report = {
        "results": {
            "file": results.where.removeprefix("results "),
            "layout": results.layout,
            "scheduler": results.scheduler,
            "requests": len(results) + (results.num_failed - int(results.failed.sum())),
            "failed": results.num_failed,
            "compared": int((~results.failed).sum()),
        },
        "workload": result.workload.summary(),
        "limits": dataclasses.asdict(result.limits),
        "policy": policy_to_dict(result.policy),
        "latency_model": dataclasses.asdict(result.latency),
        "simulation": {
            "completed": int(done.sum()),
            "refused": int(result.refused.sum()),
            "steps": result.num_steps,
            "truncated_by_max_steps": result.truncated,
        },
        "metrics": metrics,
        "summary": {key: summarize(values) for key, values in metrics.items()},
    }
    return Fidelity(report, real, simulated)


def _check_finite(where: str, metrics: dict[str, dict[str, Any]]) -> None:
    """Every figure is a number: the results' seconds are bounded, but a real figure can still
    be small enough that dividing by it overflows (a subnormal TTFT, a duration near 0)."""
    for key, table in metrics.items():
        for metric, figures in table.items():
            for name, row in figures.items():
                for part in ("real", "simulated", "error"):
                    value = row[part]
                    if value is None or np.isfinite(value):
                        continue
                    what = "relative error" if part == "error" else f"{part} figure"
                    raise StepPlannerValueError(
                        f"{where}: the {what} of class {key}, {metric} {name} is not a finite "
                        f"number (real {row['real']!r} s, simulated {row['simulated']!r} s); "
                        f"allowed: figures whose {what} is a number"
                    )


def check_fidelity(
    results: RunResults,
    workload: Workload,
    limits: StepPlannerLimits,
    options: SchedulingOptions | ResolvedSchedulingPolicy | None,
    latency: LatencyModel,
    *,
    max_steps: int | None = None,
) -> Fidelity:
    """Simulate ``workload`` (the trace ``results`` served, as ``served_workload`` gave it) and
    compare: one load of the fidelity check."""
    return fidelity_report(
        results, simulate(workload, limits, options, latency, max_steps=max_steps)
    )
