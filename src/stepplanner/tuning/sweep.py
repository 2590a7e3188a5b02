"""Sweep a grid of configurations over one workload against SLOs.

``sweep()`` expands the grid, runs every configuration that resolves (on a backend, see
``backends``) and returns one record per configuration: the grid values, the resolved policy,
goodput, throughput, whether the SLOs hold, and the vLLM-style latency metrics. Configurations
that do not resolve are records with an ``error`` and no metrics. ``pareto_front`` marks the
configurations no other one beats on all of TTFT p99, TPOT p99 and throughput at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..planner._policy import SchedulingOptions, StepPlannerLimits
from ..sim.engine import Engine, RunSpec
from ..sim.latency import LatencyModel
from ..sim.paged import simulate_paged_run
from ..sim.prefixes import SharedPrefixes
from ..sim.simulator import SimulationResult, simulate, simulate_run
from ..sim.workloads import Workload
from .backends import Outcome, Progress, run_tasks
from .grid import GridPoint, expand_grid
from .metrics import DEFAULT_PERCENTILES, request_goodput, vllm_metrics
from .slo import SloTarget, goodput, slo_report

__all__ = ["SweepTask", "assess", "evaluate", "pareto_front", "sweep"]

#: The metrics the Pareto front is taken over: (result key, larger is better).
FRONT = (("p99_ttft_ms", False), ("p99_tpot_ms", False), ("request_throughput", True))


@dataclasses.dataclass(frozen=True)
class SweepTask:
    """Everything one configuration's run needs; picklable, so any backend can run it."""

    point: GridPoint
    workload: Workload
    latency: LatencyModel
    slos: tuple[SloTarget, ...]
    percentiles: tuple[float, ...]
    # Engine fields beyond the point's limits and policy: num_pages, max_step_seconds,
    # kv_preemption (sim.engine.Engine); empty: the plain simulator, as before.
    engine: tuple[tuple[str, Any], ...] = ()
    # The workload's shared prefixes (sim.prefixes): the run keeps a prefix cache of them.
    prefixes: SharedPrefixes | None = None


def assess(
    result: SimulationResult,
    slos: Sequence[SloTarget],
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """Goodput, the SLO checks, the vLLM-style metrics and the deadline attainment
    (``SimulationResult.attainment``: None without objectives) of one run.

    p99 is always among the percentiles (the Pareto front and the tables use it).
    """
    w = result.workload
    completed = ~np.isnan(result.finish_time)
    lat = result.latencies()
    metrics = vllm_metrics(result, sorted({*percentiles, 99.0}))
    checks = slo_report(slos, lat, w.priority, completed, w.output_tokens)
    good = goodput(slos, lat, w.priority, completed, metrics["duration"])
    attainment = result.attainment()
    metrics["request_goodput"] = request_goodput(slos, good, attainment)
    return {
        "goodput": good,
        "throughput": metrics["request_throughput"],
        "meets_slo": all(c["met"] for c in checks) and not result.truncated,
        "slo": checks,
        "requests": len(w),
        "refused": int(result.refused.sum()),
        "truncated": result.truncated,
        "steps": result.num_steps,
        "metrics": metrics,
        "attainment": attainment,
    }


def evaluate(task: SweepTask) -> dict[str, Any]:
    """The record of one configuration (module-level so that process and Ray workers can
    import it)."""
    point = task.point
    record = point.record()
    if point.limits is None or point.policy is None:
        return record
    if task.engine or task.prefixes is not None:
        try:  # a point these fields cannot run on (PREFILL_FIRST with a step-time budget)
            engine = Engine(point.limits, point.policy, task.latency, **dict(task.engine))
        except (TypeError, ValueError) as exc:
            record["error"] = str(exc)
            return record
        spec = RunSpec(task.workload, engine, prefixes=task.prefixes)
        result = simulate_paged_run(spec)[0] if engine.num_pages else simulate_run(spec)
    else:
        result = simulate(task.workload, point.limits, point.policy, task.latency)
    record.update(assess(result, task.slos, task.percentiles))
    if result.kv_preemption is not None:
        record["preemptions"] = int(result.preempted.sum())
        record["recomputed_tokens"] = int(result.recomputed_tokens.sum())
    if result.cached_tokens is not None:
        record["prefix_cache"] = result.prefix_cache_report()
    return record


def pareto_front(records: Sequence[dict[str, Any]]) -> set[int]:
    """Indices of the records (without error) that no other record dominates on ``FRONT``."""
    ok = [r for r in records if r.get("error") is None and "metrics" in r]
    points = np.array(
        [[r["metrics"][k] if not larger else -r["metrics"][k] for k, larger in FRONT] for r in ok],
        dtype=np.float64,
    ).reshape(-1, 3)
    front = set()
    for i, r in enumerate(ok):
        others = np.delete(points, i, axis=0)
        dominated = np.any(np.all(others <= points[i], axis=1) & np.any(others < points[i], axis=1))
        if not dominated:
            front.add(r["index"])
    return front


def sweep(
    workload: Workload,
    grid: dict[str, list[str]],
    base_limits: StepPlannerLimits,
    base_options: SchedulingOptions,
    latency: LatencyModel,
    slos: Sequence[SloTarget] = (),
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    backend: str = "process",
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
    engine: dict[str, Any] | None = None,
    prefixes: SharedPrefixes | None = None,
) -> tuple[list[dict[str, Any]], Outcome]:
    """Run the grid; records sorted by goodput (best first, errors last), front marked.
    ``engine``: ``Engine`` fields every point runs with (``SweepTask.engine``); ``prefixes``:
    the workload's shared prefixes, looked up in a prefix cache by every point's run."""
    points = expand_grid(grid, base_limits, base_options)
    fields = tuple(sorted((engine or {}).items()))
    tasks = [
        SweepTask(p, workload, latency, tuple(slos), tuple(percentiles), fields, prefixes)
        for p in points
    ]
    outcome = run_tasks(evaluate, tasks, backend, workers, ray_address, progress)
    records = outcome.finished
    front = pareto_front(records)
    for r in records:
        r["pareto"] = r["index"] in front
    records.sort(key=_rank)
    return records, outcome


def _rank(record: dict[str, Any]) -> tuple[Any, ...]:
    if record.get("error") is not None:
        return (1, 0.0, 0.0, record["index"])
    return (0, -record["goodput"], -record["throughput"], record["index"])
