"""The Ray backend gives the serial backend's results, on a local Ray instance.

STEPPLANNER_REQUIRE_RAY=1 (CI with the ``ray`` extra) turns a missing Ray into a failure.
"""

from __future__ import annotations

import os

import pytest

from stepplanner import SchedulingOptions, StepPlannerLimits, synthetic
from stepplanner.sim.latency import LatencyModel
from stepplanner.tuning import parse_grid, parse_slos, sweep
from stepplanner.tuning.capacity import SyntheticRates, capacity

if os.environ.get("STEPPLANNER_REQUIRE_RAY") == "1":
    import ray  # noqa: F401  # a failure here is the point
else:
    pytest.importorskip("ray", reason="the ray backend needs the 'ray' extra")

WORKLOAD = synthetic(requests=200, rate=30.0, seed=7)
LIMITS = StepPlannerLimits(64, 4096, 32)
SLOS = parse_slos(["ttft_p99=400ms", "tpot_p99=25ms"])
GRID = parse_grid(["mode=mixed,prefill_first", "max_chunk_tokens=64,256"])


def _sweep(backend: str) -> list[dict]:
    records, outcome = sweep(
        WORKLOAD,
        GRID,
        LIMITS,
        SchedulingOptions(),
        LatencyModel(),
        SLOS,
        (50, 99),
        backend=backend,
        workers=2,
    )
    assert not outcome.interrupted and outcome.backend == backend
    return records


def test_serial_process_and_ray_sweeps_are_identical() -> None:
    serial = _sweep("serial")
    assert serial == _sweep("process")
    assert serial == _sweep("ray")


def test_ray_capacity_equals_serial() -> None:
    source = SyntheticRates(requests=150, seed=2, rate=30.0)
    grid = parse_grid(["mode=mixed,prefill_first"])
    runs = [
        capacity(
            source,
            grid,
            LIMITS,
            SchedulingOptions(),
            LatencyModel(),
            SLOS,
            tolerance=1.0,
            backend=backend,
            workers=2,
        )[0]
        for backend in ("serial", "ray")
    ]
    assert runs[0] == runs[1]
    assert all(r["capacity"] > 0 for r in runs[0])
