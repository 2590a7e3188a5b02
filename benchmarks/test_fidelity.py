"""One load of the fidelity check: read a run's results, simulate its 150-request trace, compare.

    pytest benchmarks/test_fidelity.py --benchmark-group-by=group

The case is issue 21's setup: a 150-request Poisson trace at 8.5 req/s (about 85% of the CPU
engine's capacity), prompts 8-400 and outputs 4-64 tokens, priorities -1/0/1, served with B=8,
P=16, 256 tokens per step, MIXED + PRIORITY + PAUSE, and a CPU-sized latency model. The "real"
results are a simulation written in the results layout (``fidelity.simulated``), so the check
does exactly the work it does on a real run. Timed twice: the library calls, and the
``stepplanner fidelity`` command end to end (reading, matching, simulating, rendering). The
target is under 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

from stepplanner.fidelity.compare import check_fidelity
from stepplanner.fidelity.results import read_results, served_workload
from stepplanner.fidelity.simulated import simulated_results
from stepplanner.planner._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.planner._types import IfbSchedulingMode, PreemptionMode, SchedulingPolicy
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.traces import read_trace
from stepplanner.sim.workloads import Workload

LIMITS = StepPlannerLimits(
    max_batch_size=8, max_input_length=400, kv_page_size=16, max_step_tokens=256
)
OPTIONS = SchedulingOptions(
    ifb_scheduling_mode=IfbSchedulingMode.MIXED,
    max_num_tokens=256,
    scheduling_policy=SchedulingPolicy.PRIORITY,
    preemption=PreemptionMode.PAUSE,
)
LATENCY_TEXT = "a=3e-4,b=2e-4,c=6.5e-6"
LATENCY = LatencyModel(a=3e-4, b=2e-4, c=6.5e-6, name="custom")


@pytest.fixture(scope="module")
def run_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    folder = tmp_path_factory.mktemp("fidelity")
    rng = np.random.default_rng(21)
    n = 150
    arrival = np.cumsum(rng.exponential(1 / 8.5, size=n))
    Workload(
        arrival - arrival[0],
        rng.integers(8, 401, size=n),
        rng.integers(4, 65, size=n),
        rng.choice([-1, 0, 1], size=n),
        source="issue 21",
    ).to_csv(folder / "trace.csv")
    served = read_trace(folder / "trace.csv")
    doc = simulated_results(served, LIMITS, OPTIONS, LATENCY, trace="trace.csv")
    (folder / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder / "results.json", folder / "trace.csv"


def test_fidelity_check_library(benchmark, run_files) -> None:
    benchmark.group = "fidelity: 150-request trace"
    results_path, trace_path = run_files

    def once() -> dict:
        results = read_results(results_path)
        workload, matched = served_workload(results, read_trace(trace_path))
        return check_fidelity(matched, workload, results.limits, results.policy, LATENCY).report

    report = benchmark.pedantic(once, rounds=5, iterations=1)
    assert report["summary"]["all"]["max_abs_error"] == pytest.approx(0.0, abs=1e-12)
    _say("library", benchmark)


def test_fidelity_command(benchmark, run_files) -> None:
    pytest.importorskip("click")
    from click.testing import CliRunner

    from stepplanner.cli import main

    benchmark.group = "fidelity: 150-request trace"
    results_path, trace_path = run_files
    args = [
        "fidelity",
        str(results_path),
        "--trace",
        str(trace_path),
        "--latency",
        LATENCY_TEXT,
        "--no-progress",
        "--format",
        "json",
    ]

    def once() -> dict:
        out = CliRunner().invoke(main, args, catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    report = benchmark.pedantic(once, rounds=5, iterations=1)
    assert report["results"]["compared"] == 150
    assert report["summary"]["all"]["max_abs_error"] == pytest.approx(0.0, abs=1e-12)
    _say("command", benchmark)


def _say(what: str, benchmark) -> None:
    stats = benchmark.stats.stats
    print(
        f"\n{what}: median {stats.median * 1e3:.0f} ms (min {stats.min * 1e3:.0f}, max "
        f"{stats.max * 1e3:.0f}) per load; target 120 s; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
