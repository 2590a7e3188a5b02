"""Sweep throughput: 64 configurations x the default 6,000-request workload, per backend.

    pytest benchmarks/test_sweep.py --benchmark-group-by=group

One round each (a sweep is minutes of work, and the machine is often shared): the report is the
wall time of the whole sweep and, in ``extra_info``, configurations per second. The target is
under 90 s with the process backend on 2 cores.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from stepplanner import SchedulingOptions, synthetic
from stepplanner.sim.latency import DEFAULT_LATENCY
from stepplanner.sim.simulator import DEFAULT_LIMITS
from stepplanner.tuning import parse_grid, parse_slos, sweep

GRID = parse_grid(
    [
        "max_num_tokens=512,768,1024,1536,2048,3072,4096,8192",
        "max_chunk_tokens=32,64,128,256",
        "policy=fcfs,priority",
    ]
)
BACKENDS = ["serial", "process"] + (["ray"] if importlib.util.find_spec("ray") else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep_64_configurations(benchmark, backend: str) -> None:
    benchmark.group = "sweep: 64 configurations x 6,000 requests"
    workload = synthetic(requests=6000, rate=28.0, seed=0)
    slos = parse_slos(["ttft_p99=500ms", "tpot_p99=20ms"])

    def run() -> list[dict]:
        records, outcome = sweep(
            workload,
            GRID,
            DEFAULT_LIMITS,
            SchedulingOptions(),
            DEFAULT_LATENCY,
            slos,
            backend=backend,
        )
        benchmark.extra_info.update(workers=outcome.workers, cpu_seconds=outcome.cpu_seconds)
        return records

    records = benchmark.pedantic(run, rounds=1, iterations=1)
    assert len(records) == 64 and not any(r["error"] for r in records)
    seconds = benchmark.stats.stats.max
    cpu = benchmark.extra_info["cpu_seconds"]
    benchmark.extra_info["configurations_per_s"] = 64 / seconds
    # On a shared machine the wall time says more about the neighbours than about us; the
    # tasks' CPU seconds over the cores is what an idle machine would take.
    print(
        f"\n{backend}: 64 configurations in {seconds:.1f} s = {64 / seconds:.2f} configs/s "
        f"({benchmark.extra_info['workers']} workers); tasks {cpu:.1f} CPU s = "
        f"{cpu / 64:.2f} per configuration; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
