"""tools/fidelity_tables.py (the tables of docs/simulator.md "Fidelity") on a matrix of runs the
simulator made and wrote in the harness's layouts: priced by their own timings every error is 0;
priced by a machine twice as slow the tables say so."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import pathlib

import numpy as np
import pytest

from stepplanner.fidelity.simulated import simulated_results
from stepplanner.planner._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.planner._types import IfbSchedulingMode, PreemptionMode, SchedulingPolicy
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.simulator import simulate
from stepplanner.sim.traces import read_trace
from stepplanner.sim.workloads import synthetic

TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "fidelity_tables.py"
LIMITS = StepPlannerLimits(
    max_batch_size=8, max_input_length=400, kv_page_size=16, max_step_tokens=256
)
LATENCY = LatencyModel(a=3e-4, b=2e-4, c=6e-6, name="cpu")
FCFS = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=256)
PRIORITY_PAUSE = SchedulingOptions(
    ifb_scheduling_mode=IfbSchedulingMode.MIXED,
    max_num_tokens=256,
    scheduling_policy=SchedulingPolicy.PRIORITY,
    preemption=PreemptionMode.PAUSE,
    max_pause_steps=8,
    priority_reserved_slots=1,
)
RATES = {"30": 2.0, "60": 4.0, "85": 6.0}


def load_tool(name: str = "fidelity_tables"):
    path = TOOL.parent / f"{name}.py"
    if not path.exists():
        pytest.skip(f"tools/{name}.py is not beside this tests/ (e.g. a wheel test run)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_timings(path: pathlib.Path, workload, options, latency: LatencyModel) -> None:
    """The steps of the simulated run, timed by ``latency``: the old three-column layout and the
    ``start`` the pace is measured from."""
    steps = simulate(workload, LIMITS, options, LATENCY).steps
    first = float(workload.arrival_time[0])
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["seconds", "tokens", "context", "start"])
        for tokens, context, end, seconds in zip(
            *(steps[k].tolist() for k in ("tokens", "context", "end_time", "seconds"))
        ):
            out.writerow(
                [latency.step_seconds(tokens, context), tokens, context, end - seconds - first]
            )


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("matrix")
    for load, rate in RATES.items():
        trace = folder / f"trace-{load}.csv"
        synthetic(requests=40, rate=rate, seed=int(load), max_prompt=400, max_output=32).to_csv(
            trace
        )
        workload = read_trace(trace)
        runs = [("fcfs", FCFS), ("pp", PRIORITY_PAUSE)] + ([("fifo", FCFS)] if load == "85" else [])
        for key, options in runs:
            doc = simulated_results(workload, LIMITS, options, LATENCY, trace=str(trace))
            if key == "fifo":  # the runtime's own scheduler: no stepplanner policy recorded
                doc["stepplanner"].update(scheduler="fifo", options=None)
            for rep in "ab":
                (folder / f"{key}-{load}-{rep}.json").write_text(json.dumps(doc))
                write_timings(folder / f"{key}-{load}-{rep}.csv", workload, options, LATENCY)
    slow = LatencyModel(a=2 * LATENCY.a, b=2 * LATENCY.b, c=2 * LATENCY.c, name="slow")
    write_timings(folder / "slow.csv", read_trace(folder / "trace-85.csv"), FCFS, slow)
    return folder


def tables(folder: pathlib.Path, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        load_tool().main([str(folder), *args])
    return out.getvalue()


def test_runs_priced_by_their_own_timings_agree_exactly(matrix: pathlib.Path) -> None:
    text = tables(matrix)
    exact = "0.0% / 0.0% / 0 of 36"
    assert f"| the run's own timings | all | {exact} | {exact} |" in text
    assert f"| the other repeat's timings | abc | {exact} | {exact} |" in text
    assert (
        f"| the run's own timings, pace replayed in 0.5-s windows | all | {exact} | {exact} |"
        in text
    )
    assert f"| every other run of the repeat, pooled | all | {exact} | {exact} |" in text
    assert f"real vs real (b against a): {exact}" in text
    # the agreement table: 6 figures x 3 loads x 2 policies, every error 0 with the run's own
    # model and with its pace replayed, and the real repeats alike
    rows = [line for line in text.splitlines() if line.startswith(("| 30%", "| 60%", "| 85%"))]
    assert len(rows) == 36
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert {c.lstrip("+-") for c in cells[5:7] + cells[9:12]} == {"0.0%"}, row
    policy_rows = [
        line
        for line in text.splitlines()
        if line.startswith(("| transformers fifo |", "| FCFS |", "| PRIORITY+PAUSE |"))
    ]
    assert len(policy_rows) == 6
    for row in policy_rows:  # real, simulated and paced urgent TTFT p99 and TPOT p99 alike
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[2] == cells[3] == cells[4] and cells[5] == cells[6] == cells[7], row


def test_a_machine_twice_as_slow_shows_in_every_figure(matrix: pathlib.Path) -> None:
    text = tables(matrix, "--calibrate-on", str(matrix / "slow.csv"), "--pace-windows", "2")
    assert "| the run's own timings, pace replayed in 2-s windows | all | 0.0% / 0.0%" in text
    row = next(line for line in text.splitlines() if line.startswith("| slow.csv | abc |"))
    for cell in row.split("|")[3:-1]:
        median, worst, over = (part.strip() for part in cell.split("/"))
        assert float(median.rstrip("%")) >= 90.0, row  # every step costs twice: at least +90%
        assert over == "36 of 36", row


def test_the_matrix_scales_each_trace_to_its_share_of_the_capacity(tmp_path: pathlib.Path) -> None:
    matrix_tool = load_tool("fidelity_matrix")
    for load in (30, 85):
        original = read_trace(matrix_tool.TRACES / f"trace-{load}.csv")
        scaled = read_trace(matrix_tool.scaled_trace(load, 12.5, tmp_path))
        rate = (len(scaled) - 1) / (scaled.arrival_time[-1] - scaled.arrival_time[0])
        assert rate == pytest.approx(load / 100 * 12.5, rel=1e-4)
        # the same requests in the same order; only the gaps between arrivals changed
        for column in ("prompt_tokens", "output_tokens", "priority"):
            assert getattr(scaled, column).tolist() == getattr(original, column).tolist()
        gaps, old_gaps = np.diff(scaled.arrival_time), np.diff(original.arrival_time)
        np.testing.assert_allclose(gaps, old_gaps * (gaps.sum() / old_gaps.sum()), atol=2e-6)
