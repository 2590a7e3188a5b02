"""The engine's measured pace (``EnginePace``, ``measured_pace``) and its replay in the simulator
and in ``stepplanner fidelity --pace-from``: the diagnostic that separates the error an engine's
changing speed makes from the rest (docs/simulator.md, "Fidelity")."""

from __future__ import annotations

import csv
import json
import math
import pathlib
import re

import numpy as np
import pytest

from stepplanner._errors import StepPlannerTypeError, StepPlannerValueError
from stepplanner.fidelity.simulated import simulated_results
from stepplanner.planner._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.planner._types import IfbSchedulingMode
from stepplanner.sim.latency import EnginePace, LatencyModel
from stepplanner.sim.latency_models import (
    MAX_PACE_WINDOWS,
    StepTimings,
    measured_pace,
    read_step_timings,
)
from stepplanner.sim.paged import simulate_paged
from stepplanner.sim.simulator import simulate
from stepplanner.sim.workloads import synthetic

LIMITS = StepPlannerLimits(
    max_batch_size=8, max_input_length=400, kv_page_size=16, max_step_tokens=256
)
OPTIONS = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=256)
MODEL = LatencyModel(a=3e-4, b=2e-4, c=6e-6, name="cpu", d=1e-9, f=1e-4)
LATENCY_TEXT = "a=3e-4,b=2e-4,c=6e-6,d=1e-9,f=1e-4"
# Slow in the second second, fast from the fourth: what a shared machine does to a run.
PACE = EnginePace(1.0, (1.0, 1.8, 1.0, 0.6))


def workload(requests: int = 60):
    return synthetic(requests=requests, rate=12.0, seed=5, max_prompt=400, max_output=40)


def scaled(model: LatencyModel, k: float) -> LatencyModel:
    return LatencyModel(
        a=model.a * k,
        b=model.b * k,
        c=model.c * k,
        name="scaled",
        d=model.d * k,
        e=model.e * k,
        f=model.f * k,
    )


# --- EnginePace --------------------------------------------------------------------------------


def test_a_step_takes_the_factor_of_the_window_it_starts_in() -> None:
    pace = EnginePace(0.5, [2, 1.5, 3])
    assert pace.factors == (2.0, 1.5, 3.0)
    assert [pace.at(t) for t in (-1.0, 0.0, 0.49, 0.5, 0.99, 1.0, 1.49, 7.0)] == [
        2.0,
        2.0,
        2.0,
        1.5,
        1.5,
        3.0,
        3.0,
        3.0,
    ]  # the last factor holds after the last window


@pytest.mark.parametrize(
    "window, factors, error, message",
    [
        (0, (1.0,), StepPlannerValueError, "EnginePace.window=0 is out of range"),
        (-1.0, (1.0,), StepPlannerValueError, "EnginePace.window=-1.0 is out of range"),
        (math.inf, (1.0,), StepPlannerValueError, "EnginePace.window=inf is out of range"),
        (True, (1.0,), StepPlannerTypeError, "EnginePace.window must be a number of seconds"),
        ("1", (1.0,), StepPlannerTypeError, "EnginePace.window must be a number of seconds"),
        (1.0, (), StepPlannerValueError, "EnginePace.factors is empty"),
        (1.0, "12", StepPlannerTypeError, "EnginePace.factors must be a sequence of numbers"),
        (1.0, (1.0, 0.0), StepPlannerValueError, "EnginePace.factors[1]=0.0 is out of range"),
        (1.0, (math.nan,), StepPlannerValueError, "EnginePace.factors[0]=nan is out of range"),
        (1.0, (1.0, "2"), StepPlannerTypeError, "EnginePace.factors[1] must be a number"),
    ],
)
def test_a_bad_pace_names_the_field_and_what_is_allowed(
    window, factors, error, message: str
) -> None:
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        EnginePace(window, factors)


# --- measured_pace -----------------------------------------------------------------------------


def timings(starts, tokens, context, rows, speed) -> StepTimings:
    tokens, context, rows = (np.array(v, dtype=np.float64) for v in (tokens, context, rows))
    modelled = np.array(
        [MODEL.step_seconds(int(t), int(c), int(r)) for t, c, r in zip(tokens, context, rows)]
    )
    return StepTimings(
        modelled * np.array(speed),
        tokens,
        context,
        rows=rows,
        start=np.array(starts, dtype=np.float64),
    )


def test_the_pace_is_measured_over_modelled_seconds_per_window() -> None:
    # window 0 at the model's speed, window 1 twice as slow, window 2 idle, window 3 mixed
    steps = timings(
        starts=[0.1, 0.5, 1.2, 1.9, 3.0, 3.5],
        tokens=[8, 200, 8, 8, 100, 4],
        context=[800, 400, 900, 950, 300, 40],
        rows=[8, 2, 8, 8, 3, 4],
        speed=[1, 1, 2, 2, 0.5, 1.5],
    )
    pace = measured_pace(steps, MODEL, 1.0)
    seconds = steps.seconds
    modelled = seconds / np.array([1, 1, 2, 2, 0.5, 1.5])
    third = (seconds[4] + seconds[5]) / (modelled[4] + modelled[5])
    assert pace.window == 1.0
    assert pace.factors == pytest.approx((1.0, 2.0, 2.0, third))  # idle keeps the one before
    assert measured_pace(steps, MODEL, 2.0).factors == pytest.approx(
        (seconds[:4].sum() / modelled[:4].sum(), third)
    )


def test_the_pace_needs_the_start_column_and_the_terms_columns(tmp_path: pathlib.Path) -> None:
    no_start = StepTimings(
        np.array([0.01]), np.array([8.0]), np.array([80.0]), rows=np.array([8.0])
    )
    with pytest.raises(
        StepPlannerValueError,
        match="run.csv: no 'start' column; allowed: a timings file with each step's start",
    ):
        measured_pace(no_start, MODEL, 1.0, "run.csv")
    no_rows = StepTimings(
        np.array([0.01]), np.array([8.0]), np.array([80.0]), start=np.array([0.0])
    )
    with pytest.raises(StepPlannerValueError, match="no 'rows' column, and the model has f="):
        measured_pace(no_rows, MODEL, 1.0)
    with pytest.raises(StepPlannerValueError, match="EnginePace.window=0 is out of range"):
        measured_pace(timings([0.0], [8], [80], [8], [1]), MODEL, 0)
    path = tmp_path / "t.csv"
    path.write_text("seconds,tokens,context,start,other\n0.5,8,80,0.25,x\n")
    read = read_step_timings(path)
    assert read.start.tolist() == [0.25]  # read when present; other columns still ignored
    abc = LatencyModel(a=MODEL.a, b=MODEL.b, c=MODEL.c)
    assert measured_pace(read, abc, 1.0).factors == pytest.approx((0.5 / abc.step_seconds(8, 80),))


def test_a_model_that_prices_every_step_at_zero_has_no_pace() -> None:
    # a=0 and steps of 0 tokens: no window has a modelled second to divide by (the factors were
    # read from uninitialised memory)
    steps = StepTimings(
        np.array([0.01, 0.02, 0.03]), np.zeros(3), np.zeros(3), start=np.array([0.0, 0.7, 1.6])
    )
    zero = LatencyModel(a=0.0, b=1e-4, c=1e-6)
    with pytest.raises(
        StepPlannerValueError,
        match=r"^t.csv: the model prices every timed step "
        r"at 0 s, so no window has a ratio",
    ):
        measured_pace(steps, zero, 0.5, "t.csv")
    # a window whose steps alone are priced at 0 keeps the factor before it, as an idle one does
    some = StepTimings(
        np.array([0.01, 0.02]),
        np.array([10.0, 0.0]),
        np.array([10.0, 0.0]),
        start=np.array([0.0, 0.7]),
    )
    assert measured_pace(some, zero, 0.5).factors == pytest.approx(
        (0.01 / zero.step_seconds(10, 10),) * 2
    )


@pytest.mark.parametrize(
    ("window", "start"), [(1e-300, 1.0), (0.5, 1e300), (1e-9, 11.0), (1.0, float(MAX_PACE_WINDOWS))]
)
def test_the_number_of_windows_is_bounded(window: float, start: float) -> None:
    # int64 overflowed into np.bincount, and a window of 1e-9 s over 11 s asked for 88 GB
    steps = timings([0.0, start], [8, 8], [80, 80], [8, 8], [1, 1])
    with pytest.raises(
        StepPlannerValueError,
        match="^"
        + re.escape(
            f"t.csv: steps start up to {start!r} s, more than {MAX_PACE_WINDOWS} windows of "
            f"{window!r} s; allowed: at most {MAX_PACE_WINDOWS} windows (a longer window)"
        ),
    ):
        measured_pace(steps, MODEL, window, "t.csv")
    most = measured_pace(
        timings([0.0, MAX_PACE_WINDOWS - 1.0], [8, 8], [80, 80], [8, 8], [1, 1]), MODEL, 1.0
    )
    assert len(most.factors) == MAX_PACE_WINDOWS


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("zero", "the model prices every timed step at 0 s"),
        (
            "window",
            f"steps start up to 1.0 s, more than {MAX_PACE_WINDOWS} windows of 1e-300 s; "
            f"allowed: at most {MAX_PACE_WINDOWS} windows (a longer window)",
        ),
        ("start", f"steps start up to 1e+300 s, more than {MAX_PACE_WINDOWS} windows"),
    ],
)
def test_pace_from_that_gives_no_pace_is_one_line_with_status_2(
    tmp_path: pathlib.Path, case: str, message: str
) -> None:
    results, _ = write_run(tmp_path, PACE)
    path = tmp_path / "hostile.csv"
    start = "1e300" if case == "start" else "1.0"
    tokens = "0" if case == "zero" else "8"
    path.write_text(
        f"seconds,tokens,context,rows,start\n0.01,{tokens},{tokens},{tokens},0\n"
        f"0.01,{tokens},{tokens},{tokens},{start}\n"
    )
    latency = "a=0,b=2e-4,c=6e-6" if case == "zero" else LATENCY_TEXT
    window = ["--pace-window", "1e-300"] if case == "window" else []
    out = fidelity(results, "--latency", latency, "--pace-from", str(path), *window)
    assert out.exit_code == 2, out.output
    assert f"Error: --pace-from {path}: {message}" in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output


# --- the replay in the simulator ---------------------------------------------------------------


def test_a_constant_pace_is_the_model_scaled_and_pace_one_changes_nothing() -> None:
    w = workload()
    base = simulate(w, LIMITS, OPTIONS, MODEL)
    same = simulate(w, LIMITS, OPTIONS, MODEL, pace=EnginePace(1.0, (1.0,)))
    slow = simulate(w, LIMITS, OPTIONS, MODEL, pace=EnginePace(0.25, (1.7,)))
    slow_model = simulate(w, LIMITS, OPTIONS, scaled(MODEL, 1.7))
    assert np.array_equal(same.steps["end_time"], base.steps["end_time"])
    np.testing.assert_allclose(slow.steps["end_time"], slow_model.steps["end_time"], rtol=1e-12)
    paged, _ = simulate_paged(
        w, LIMITS, OPTIONS, MODEL, num_pages=4096, pace=EnginePace(0.25, (1.7,))
    )
    np.testing.assert_allclose(paged.steps["end_time"], slow_model.steps["end_time"], rtol=1e-12)


def test_each_step_is_priced_at_the_pace_of_its_start() -> None:
    w = workload()
    result = simulate(w, LIMITS, OPTIONS, MODEL, pace=PACE)
    st = result.steps
    start = st["end_time"] - st["seconds"]
    modelled = np.array(
        [MODEL.step_seconds(int(t), int(c)) for t, c in zip(st["tokens"], st["context"])]
    )
    rows = st["num_prefill"] + st["num_decode"]
    modelled += MODEL.f * rows
    expected = modelled * np.array([PACE.at(t - w.arrival_time[0]) for t in start])
    np.testing.assert_allclose(st["seconds"], expected, rtol=1e-9)
    assert {PACE.at(t - w.arrival_time[0]) for t in start} == {1.0, 1.8, 0.6}


def test_simulate_refuses_a_pace_that_is_not_one() -> None:
    with pytest.raises(StepPlannerTypeError, match="pace must be an EnginePace or None, got tuple"):
        simulate(workload(5), LIMITS, OPTIONS, MODEL, pace=(1.0, 2.0))


# --- fidelity --pace-from ----------------------------------------------------------------------


def write_run(folder: pathlib.Path, pace: EnginePace) -> tuple[str, str]:
    """A run of an engine whose speed moved as ``pace`` says: its results and its timings file
    (every step's start, the contract columns, measured seconds)."""
    w = workload()
    trace = folder / "trace.csv"
    w.to_csv(trace)
    from stepplanner.sim.traces import read_trace

    served = read_trace(trace)
    doc = simulated_results(served, LIMITS, OPTIONS, MODEL, trace=str(trace), pace=pace)
    results = folder / "results.json"
    results.write_text(json.dumps(doc))
    st = simulate(served, LIMITS, OPTIONS, MODEL, pace=pace).steps
    path = folder / "timings.csv"
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["seconds", "tokens", "context", "rows", "start"])
        for seconds, end, tokens, context, prefill, decode in zip(
            *(
                st[k].tolist()
                for k in ("seconds", "end_time", "tokens", "context", "num_prefill", "num_decode")
            )
        ):
            out.writerow(
                [
                    seconds,
                    tokens,
                    context,
                    prefill + decode,
                    end - seconds - float(served.arrival_time[0]),
                ]
            )
    return str(results), str(path)


def fidelity(*args: str):
    pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
    from click.testing import CliRunner

    from stepplanner.cli import main

    return CliRunner().invoke(
        main, ["fidelity", *args, "--no-progress", "--format", "json"], catch_exceptions=False
    )


def test_replaying_the_runs_own_pace_removes_the_error_the_pace_made(
    tmp_path: pathlib.Path,
) -> None:
    results, timings_path = write_run(tmp_path, PACE)
    stationary = fidelity(results, "--latency", LATENCY_TEXT)
    assert stationary.exit_code == 0, stationary.output
    off = json.loads(stationary.output)["summary"]["all"]
    assert off["max_abs_error"] > 0.05  # a model at one speed misses an engine that changed
    replayed = fidelity(results, "--latency", LATENCY_TEXT, "--pace-from", timings_path)
    assert replayed.exit_code == 0, replayed.output
    report = json.loads(replayed.output)
    assert report["summary"]["all"]["max_abs_error"] == pytest.approx(0.0, abs=1e-9)
    assert report["pace"]["from"] == timings_path and report["pace"]["window"] == 0.5
    assert (report["pace"]["min"], report["pace"]["max"]) == pytest.approx((0.6, 1.8))
    assert report["pace"]["windows"] >= 4
    # a window that does not fit the run's changes leaves part of the error
    coarse = fidelity(
        results, "--latency", LATENCY_TEXT, "--pace-from", timings_path, "--pace-window", "3"
    )
    assert json.loads(coarse.output)["summary"]["all"]["max_abs_error"] > 1e-3


def test_pace_from_a_file_without_start_times_is_one_line_with_status_2(
    tmp_path: pathlib.Path,
) -> None:
    results, _ = write_run(tmp_path, PACE)
    bare = tmp_path / "bare.csv"
    bare.write_text("seconds,tokens,context\n0.01,8,80\n")
    out = fidelity(results, "--latency", LATENCY_TEXT, "--pace-from", str(bare))
    assert out.exit_code == 2
    assert f"--pace-from {bare}: no 'start' column" in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output
