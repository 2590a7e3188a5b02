"""The benchmarks run and their rows mean what their tables say."""

from __future__ import annotations

import json
import pathlib
import statistics
import subprocess
import sys

import pytest

pytest.importorskip("pytest_benchmark", reason="the benchmarks need pytest-benchmark")

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="runs from a checkout (benchmarks/)")
def test_the_c_loop_row_is_one_plan(tmp_path: pathlib.Path) -> None:
    """The row's median is the median of the per-call means the C loop measured, not a round
    of 100 calls (which made the C loop look 50-100x slower than plan() in the native table)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(BENCHMARKS / "test_plan.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "c_loop and mixed and B8",
            f"--benchmark-json={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["benchmarks"]
    per_call = row["extra_info"]["per_call_ns"]
    assert row["stats"]["iterations"] == 1 and row["stats"]["rounds"] == len(per_call)
    assert row["stats"]["median"] * 1e9 == pytest.approx(statistics.median(per_call), rel=1e-6)


@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="runs from a checkout (benchmarks/)")
def test_the_step_inputs_loop_times_every_steady_step() -> None:
    """benchmarks/step_inputs_loop.py runs its serving loop for each layout and keeps one
    plan() and one prepare time per step past the first B."""
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "step_inputs_loop.py"),
            "--steps",
            "120",
            "--batch",
            "16",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "B=16, 1 x 104 steady steps per layout; medians:"
    assert [line.split()[0] for line in lines[2:]] == ["all", "flash_attn", "flashinfer"]


def test_deadline_cost_pairs_rounds_of_both_policies() -> None:
    """bench --deadline-cost on a small engine: both policies ran busy steps in the same rounds,
    the ratio is the rounds' median, and the plans (hence what a busy step did) are the same
    in every repeat, only the timings differ."""
    from stepplanner.bench import deadline

    first = deadline.measure_case(16, 1.5, 400, repeats=2)
    again = deadline.measure_case(16, 1.5, 400, repeats=1)
    assert first.rounds > 0 and min(first.busy_steps) > 0
    assert first.ratio_quartiles[0] <= first.ratio <= first.ratio_quartiles[1]
    assert 0 < first.rank_ns and 16 * deadline.BUSY <= first.rank_rows <= 16
    assert (first.busy_steps, first.decode_rows, first.paused_rows) == (
        again.busy_steps,
        again.decode_rows,
        again.paused_rows,
    )
    assert "deadline-aware host step" in deadline.render_deadline_cost([first])
