"""Service-level objectives through the simulator: objectives on workloads and traces, every
token's lateness, attainment and vLLM's goodput, relegations, the detailed results file, and the
CLI (--slo-class, compare's deadline baselines, --load relative to saturation)."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from stepplanner import SLO, LatencyModel, SchedulingOptions, StepPlannerLimits
from stepplanner.planner._slo import deadline_of
from stepplanner.sim import goodput, simulator
from stepplanner.sim.engine import Engine
from stepplanner.sim.load import at_load, saturation_throughput
from stepplanner.sim.simulator import simulate
from stepplanner.sim.traces import load_trace
from stepplanner.sim.workloads import DEFAULT_SLO_CLASSES, Workload, synthetic
from stepplanner.tuning.slo import parse_slo_class, parse_slo_classes

NAN = math.nan
# Every step takes exactly 10 ms: each token's time is a multiple of it.
TEN_MS = LatencyModel(a=0.01, b=0.0, c=0.0, name="10 ms a step")
TINY_LIMITS = StepPlannerLimits(4, 64, 16)
TINY_OPTIONS = SchedulingOptions(max_num_tokens=128, max_chunk_tokens=64)


@pytest.fixture
def impl(ledger_impl, monkeypatch: pytest.MonkeyPatch):
    """The simulator on one implementation's ledger and planner (compiled, then the twin)."""
    monkeypatch.setattr(simulator, "Ledger", ledger_impl.Ledger)
    monkeypatch.setattr(simulator, "StepPlanner", ledger_impl.StepPlanner)
    return ledger_impl


def _tiny() -> Workload:
    """Four 16-token prompts at t=0, one step each (B=4, 128-token budget): every first token at
    10 ms, then one token a step. Objectives: request 0 its own (15 ms, 10 ms), request 1 its own
    (5 ms, 50 ms), request 2 its class's (50 ms, 5 ms), request 3 none."""
    return Workload(
        [0.0, 0.0, 0.0, 0.0],
        [16, 16, 16, 16],
        [3, 2, 3, 1],
        [0, 0, 1, 0],
        ttft_slo=[0.015, 0.005, NAN, NAN],
        tpot_slo=[0.01, 0.05, NAN, NAN],
        slo_classes={1: SLO(0.05, 0.005)},
    )


# --- objectives: parsing and checking ---------------------------------------------------------


def test_slo_class_parses_priority_and_durations_in_any_unit() -> None:
    assert parse_slo_class("0=ttft:250ms,tpot:100ms") == (0, SLO(0.25, 0.1))
    assert parse_slo_class(" -1 = ttft:0.25s , tpot:50000us ") == (-1, SLO(0.25, 0.05))
    assert parse_slo_class("1=ttft:2s") == (1, SLO(2.0, None))
    assert parse_slo_classes(["0=ttft:1s", "1=ttft:2s"]) == {0: SLO(1.0), 1: SLO(2.0)}


INVALID_CLASSES = [
    ("0=ttft:-250ms", "out of range"),
    ("0=ttft:0ms", "out of range"),
    ("0=ttft:250ms,tpot:0s", "out of range"),
    ("0=ttft:nanms", "not a duration"),
    ("0=ttft:nan", "not a duration"),
    ("0=ttft:250", "has no unit"),
    ("0=ttft:250ms,tpot:100", "has no unit"),
    ("0=tpot:100ms", "has no ttft"),
    ("x=ttft:1s", "is not PRIORITY=ttft:VALUE"),
    ("0=ttft:1s,ttft:2s", "given twice"),
    ("0=latency:1s", "is not ttft:VALUE or tpot:VALUE"),
]


@pytest.mark.parametrize(("text", "message"), INVALID_CLASSES)
def test_an_invalid_slo_class_is_a_value_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_slo_class(text)


def test_a_class_given_twice_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="given twice"):
        parse_slo_classes(["0=ttft:1s", "0=ttft:2s"])


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"ttft_slo": [-0.1, NAN]}, "ttft_slo=-0.1 is out of range"),
        ({"ttft_slo": [0.0, NAN]}, "ttft_slo=0.0 is out of range"),
        ({"ttft_slo": [math.inf, NAN]}, "ttft_slo=inf is out of range"),
        ({"ttft_slo": [0.1, 0.1], "tpot_slo": [NAN, -1.0]}, "tpot_slo=-1.0 is out of range"),
        ({"tpot_slo": [NAN, 0.05]}, "request 1: tpot_slo=0.05 without a ttft_slo"),
        ({"ttft_slo": [0.1]}, "shape"),
        ({"slo_classes": {7: SLO(1.0)}}, "class 7, which no request"),
        ({"slo_classes": {0: 1.0}}, "must be an SLO"),
    ],
)
def test_invalid_objectives_are_value_errors_and_change_nothing(
    columns: dict, message: str
) -> None:
    base = Workload([0.0, 1.0], [8, 8], [2, 2], [0, 1], slo_classes={0: SLO(0.5)})
    with pytest.raises((ValueError, TypeError), match=message):
        Workload([0.0, 1.0], [8, 8], [2, 2], [0, 1], **columns)
    with pytest.raises((ValueError, TypeError), match=message):
        if "slo_classes" in columns:
            base.with_objectives(columns["slo_classes"])
        else:
            Workload(
                base.arrival_time, base.prompt_tokens, base.output_tokens, base.priority, **columns
            )
    assert dict(base.slo_classes) == {0: SLO(0.5)}  # untouched
    assert np.isnan(base.ttft_slo).all()


def test_own_objectives_replace_the_class_whole() -> None:
    w = Workload(
        [0.0, 1.0, 2.0],
        [8, 8, 8],
        [2, 2, 2],
        [0, 0, 1],
        ttft_slo=[0.1, NAN, NAN],
        slo_classes={0: SLO(1.0, 0.2)},
    )
    ttft, tpot = w.objectives()
    np.testing.assert_array_equal(ttft, [0.1, 1.0, NAN])
    np.testing.assert_array_equal(tpot, [NAN, 0.2, NAN])  # request 0: no per-token objective
    assert w.has_objectives and w.own_objectives
    assert not w.with_objectives(None, own=False).has_objectives


def test_trace_objective_columns_round_trip(tmp_path: pathlib.Path) -> None:
    w = Workload(
        [0.0, 0.5, 1.25],
        [10, 20, 30],
        [1, 2, 3],
        [0, 1, 0],
        ttft_slo=[0.25, NAN, 1.0 / 3.0],
        tpot_slo=[0.1, NAN, NAN],
    )
    path = tmp_path / "trace.csv"
    w.to_csv(path)
    header = path.read_text().splitlines()[0]
    assert header == "arrival_time,prompt_tokens,output_tokens,priority,ttft_slo_ms,tpot_slo_ms"
    back = load_trace(path)
    for column in ("ttft_slo", "tpot_slo"):
        np.testing.assert_allclose(getattr(back, column), getattr(w, column), rtol=1e-15)
    jsonl = tmp_path / "trace.jsonl"
    jsonl.write_text(
        '{"arrival_time": 0, "prompt_tokens": 4, "output_tokens": 2, '
        '"ttft_slo_ms": 250, "tpot_slo_ms": 50}\n'
        '{"arrival_time": 1, "prompt_tokens": 4, "output_tokens": 2}\n'
    )
    got = load_trace(jsonl)
    np.testing.assert_array_equal(got.ttft_slo, [0.25, NAN])
    np.testing.assert_array_equal(got.tpot_slo, [0.05, NAN])
    # Without objectives of their own, the trace keeps its four columns.
    plain = tmp_path / "plain.csv"
    w.with_objectives(None, own=False).to_csv(plain)
    assert plain.read_text().splitlines()[0] == "arrival_time,prompt_tokens,output_tokens,priority"


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("-5,", "line 2: column 'ttft_slo_ms': '-5' is out of range"),
        ("0,", "'0' is out of range"),
        ("nan,", "'nan' is out of range"),
        ("fast,", "'fast' is not a number of milliseconds"),
        (",50", "line 2: column 'tpot_slo_ms' without 'ttft_slo_ms'"),
    ],
)
def test_invalid_trace_objectives_name_the_line_and_column(
    tmp_path: pathlib.Path, cells: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(
        f"arrival_time,prompt_tokens,output_tokens,ttft_slo_ms,tpot_slo_ms\n0,4,2,{cells}\n"
    )
    with pytest.raises(ValueError, match=message):
        load_trace(path)


# --- lateness, attainment and vLLM's goodput on a hand-computed run -----------------------------


def test_every_tokens_lateness_on_a_hand_computed_run(impl) -> None:
    r = simulate(_tiny(), TINY_LIMITS, TINY_OPTIONS, TEN_MS, detailed=True)
    times = [t.tolist() for t in r.token_times()]
    expected = [[0.01, 0.02, 0.03], [0.01, 0.02], [0.01, 0.02, 0.03], [0.01]]
    assert [len(t) for t in times] == [len(t) for t in expected]
    for got, want in zip(times, expected):
        assert got == pytest.approx(want)
    # Request 0: due 15, 25, 35 ms, emitted 10, 20, 30 ms: 5 ms early each time.
    # Request 1: due 5 ms, first token at 10 ms: 5 ms late (its next, due 55 ms, is early).
    # Request 2 (its class's 50 ms, 5 ms): due 50, 55, 60 ms: 30 ms early at the latest.
    # Request 3: no deadline.
    np.testing.assert_allclose(r.max_lateness, [-0.005, 0.005, -0.03, -np.inf])
    np.testing.assert_array_equal(r.late_tokens, [0, 1, 0, 0])
    for i, slo in ((0, SLO(0.015, 0.01)), (1, SLO(0.005, 0.05)), (2, SLO(0.05, 0.005))):
        late = [times[i][g] - deadline_of(0.0, slo, g) for g in range(len(times[i]))]
        assert max(late) == pytest.approx(r.max_lateness[i])


def test_attainment_and_vllm_goodput_on_the_hand_computed_run(impl) -> None:
    r = simulate(_tiny(), TINY_LIMITS, TINY_OPTIONS, TEN_MS)
    outcomes = r.outcomes()
    # attained: request 0 (every token early) and 2 (slack carried forward);
    # vLLM-good: request 0 only: request 2's mean TPOT is (30 - 10) / 2 = 10 ms > 5 ms, and
    # request 1's TTFT is 10 ms > 5 ms.
    np.testing.assert_array_equal(outcomes.attained, [True, False, True, False])
    np.testing.assert_array_equal(outcomes.vllm_good, [True, False, False, False])
    report = r.report()["slo_attainment"]
    assert report["span_s"] == pytest.approx(0.03)
    every = report["classes"]["all"]
    assert (every["requests"], every["with_slo"], every["without_slo"]) == (4, 3, 1)
    assert (every["attained"], every["vllm_good"]) == (2, 1)
    assert every["attainment"] == pytest.approx(2 / 3)
    assert every["vllm_attainment"] == pytest.approx(1 / 3)
    assert every["goodput_rps"] == pytest.approx(2 / 0.03)
    assert every["vllm_goodput_rps"] == pytest.approx(1 / 0.03)
    assert every["p99_itl_ms"] == pytest.approx(10.0)
    assert every["late_token_share"] == pytest.approx(1 / 8)  # 1 of requests 0-2's 8 tokens
    assert every["missed"] == {"refused": 0, "unfinished": 0, "relegated": 0, "late": 1}
    batch = report["classes"]["1"]
    assert (batch["class_ttft_slo_ms"], batch["class_tpot_slo_ms"]) == (50.0, 5.0)
    assert (batch["attainment"], batch["vllm_attainment"]) == (1.0, 0.0)


def test_a_one_token_output_has_tpot_zero_for_vllm_goodput(impl) -> None:
    w = Workload([0.0], [16], [1], [0], ttft_slo=[0.02], tpot_slo=[1e-6])
    r = simulate(w, TINY_LIMITS, TINY_OPTIONS, TEN_MS)
    assert r.outcomes().vllm_good.tolist() == [True] and r.outcomes().attained.tolist() == [True]


def test_refused_unfinished_and_relegated_requests_are_misses(impl) -> None:
    # Request 0's prompt exceeds S_in (refused); the run stops after 2 steps, so request 1
    # (40 tokens to emit) is unfinished although on time so far.
    w = Workload([0.0, 0.0], [100, 16], [1, 40], [0, 0], slo_classes={0: SLO(1.0, 1.0)})
    r = simulate(w, TINY_LIMITS, TINY_OPTIONS, TEN_MS, max_steps=2)
    c = r.report()["slo_attainment"]["classes"]["all"]
    assert c["attained"] == 0 and c["with_slo"] == 2
    assert c["missed"] == {"refused": 1, "unfinished": 1, "relegated": 0, "late": 0}
    # A relegated request misses even when its every token came in time: relegation is the
    # policy giving up on it.
    on_time = goodput.request_outcomes(
        w,
        np.array([0.01, 0.01]),
        np.array([0.01, 0.4]),
        np.array([-0.5, -0.5]),
        np.zeros(2, dtype=np.int64),
        np.array([1, 40]),
        np.array([False, True]),
        np.zeros(2, dtype=bool),
    )
    assert on_time.attained.tolist() == [True, False]
    assert on_time.vllm_good.tolist() == [True, False]


def test_deadline_relegates_a_hopeless_request_and_it_counts_as_a_miss(impl) -> None:
    # Request 1's first token is due 1 ms after it arrives, less than a 10 ms step: DEADLINE
    # relegates it; it is still served (never dropped) and is a miss.
    from stepplanner import PreemptionMode, SchedulingPolicy

    w = Workload(
        [0.0, 0.0, 0.0],
        [16, 16, 16],
        [3, 3, 3],
        [0, 0, 0],
        ttft_slo=[0.5, 0.001, 0.5],
        tpot_slo=[0.5, 0.5, 0.5],
    )
    options = SchedulingOptions(
        max_num_tokens=128,
        max_chunk_tokens=64,
        scheduling_policy=SchedulingPolicy.DEADLINE,
        preemption=PreemptionMode.PAUSE,
    )
    r = simulate(w, TINY_LIMITS, options, TEN_MS)
    assert r.relegated.tolist() == [False, True, False]
    assert not np.isnan(r.finish_time).any()  # served all the same
    c = r.report()["slo_attainment"]["classes"]["all"]
    assert (c["attained"], c["relegated"], c["missed"]["relegated"]) == (2, 1, 1)


def test_objectives_change_nothing_under_fcfs(impl) -> None:
    """Deadlines are measured, never acted on, under FCFS: the run is the same without them."""
    w = synthetic(requests=150, rate=30, seed=3, slo_classes=DEFAULT_SLO_CLASSES)
    with_slo = simulate(w, StepPlannerLimits(32, 4096, 32))
    without = simulate(w.with_objectives(None), StepPlannerLimits(32, 4096, 32))
    np.testing.assert_array_equal(with_slo.finish_time, without.finish_time)
    np.testing.assert_array_equal(with_slo.steps["tokens"], without.steps["tokens"])
    assert "slo_attainment" in with_slo.report() and "slo_attainment" not in without.report()


# --- the detailed results file ------------------------------------------------------------------


def _recomputed_attainment(doc: dict) -> float:
    """Attainment over every arrival with objectives, from the file's own lists only."""
    attained = with_slo = 0
    for k, ttft_slo in enumerate(doc["ttft_slos"]):
        if ttft_slo is None:
            continue
        with_slo += 1
        if doc["errors"][k] or doc["relegated"][k]:
            continue
        tpot_slo = doc["tpot_slos"][k]
        t, ok = doc["ttfts"][k], doc["ttfts"][k] <= ttft_slo
        for i, gap in enumerate(doc["itls"][k], start=1):
            t += gap
            ok = ok and (tpot_slo is None or t <= ttft_slo + i * tpot_slo)
        attained += ok
    return attained / with_slo


def test_save_detailed_lets_anyone_recompute_attainment(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
    from click.testing import CliRunner

    from stepplanner.cli import main
    from stepplanner.fidelity.results import read_results

    path = tmp_path / "run.json"
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            "--requests",
            "300",
            "--rate",
            "45",
            "-B",
            "32",
            "--no-progress",
            "--policy",
            "deadline",
            "--preemption",
            "pause",
            "--slo-class",
            "-1=ttft:100ms,tpot:20ms",
            "--slo-class",
            "0=ttft:250ms,tpot:30ms",
            "--slo-class",
            "1=ttft:1s,tpot:100ms",
            "--save-result",
            str(path),
            "--save-detailed",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)["slo_attainment"]["classes"]["all"]
    assert 0 < report["attainment"] < 1 and report["relegated"] > 0  # a run worth checking
    doc = json.loads(path.read_text())
    assert doc["request_ids"][:2] == ["req_0", "req_1"]
    for key in (
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "latencies",
        "arrival_times",
        "priorities",
        "ttft_slos",
        "tpot_slos",
        "relegated",
    ):
        assert len(doc[key]) == 300, key
    assert _recomputed_attainment(doc) == report["attainment"]
    # The library's reading of the same lists agrees.
    slo = [np.array([NAN if v is None else v for v in doc[k]]) for k in ("ttft_slos", "tpot_slos")]
    counted = ~np.array([bool(e) for e in doc["errors"]]) & ~np.array(doc["relegated"])
    attained = goodput.attained_from_gaps(np.array(doc["ttfts"]), doc["itls"], *slo) & counted
    assert attained.sum() / (~np.isnan(slo[0])).sum() == report["attainment"]
    assert doc["slo_attainment"]["classes"]["all"]["attainment"] == report["attainment"]
    assert len(read_results(path)) == 300  # the layout fidelity reads


def _saved(tmp_path: pathlib.Path, *args: str) -> tuple[dict, dict]:
    """(--json report, --save-result document) of a small simulate run."""
    pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
    from click.testing import CliRunner

    from stepplanner.cli import main

    path = tmp_path / "run.json"
    result = CliRunner().invoke(
        main,
        ["simulate", "--requests", "200", "--rate", "45", "-B", "16", "--no-progress"]
        + [*args, "--save-result", str(path), "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output), json.loads(path.read_text())


def test_request_goodput_is_the_goodput_the_objectives_define(tmp_path: pathlib.Path) -> None:
    # It was the throughput under vLLM's goodput key (23.47 req/s beside a vLLM-good goodput of
    # 20.42 in the same file: the fourth review).
    classes = ["--slo-class", "0=ttft:250ms,tpot:30ms", "--slo-class", "1=ttft:1s,tpot:100ms"]
    _, doc = _saved(tmp_path, "--policy", "deadline", *classes, "--save-detailed")
    everyone = doc["slo_attainment"]["classes"]["all"]
    assert 0 < everyone["vllm_good"] < doc["completed"]  # a run where goodput is not throughput
    assert doc["request_goodput"] == everyone["vllm_goodput_rps"] < doc["request_throughput"]
    # vLLM's --goodput verdict recomputed from the file's own per-request lists.
    ttft, e2e = np.array(doc["ttfts"]), np.array(doc["latencies"])
    out = np.array(doc["output_lens"])
    slo = [np.array([NAN if v is None else v for v in doc[k]]) for k in ("ttft_slos", "tpot_slos")]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), 0.0)
    good = (
        ~np.array([bool(e) for e in doc["errors"]])
        & ~np.array(doc["relegated"])
        & (ttft <= slo[0])
        & (np.isnan(slo[1]) | (tpot <= slo[1]))
    )
    assert doc["request_goodput"] == pytest.approx(good.sum() / doc["duration"], rel=1e-12)
    # --slo thresholds are the benchmark's own --goodput: they define it when given.
    report, doc = _saved(tmp_path, "--policy", "deadline", *classes, "--slo", "ttft_p99=20ms")
    assert doc["request_goodput"] == report["goodput"] < doc["request_throughput"]
    assert doc["request_goodput"] != doc["slo_attainment"]["classes"]["all"]["vllm_goodput_rps"]
    # No objectives at all: vLLM writes null, not the throughput.
    _, doc = _saved(tmp_path, "--no-slo")
    assert doc["request_goodput"] is None and doc["request_throughput"] > 0


# --- saturation and loads ------------------------------------------------------------------------


def test_loads_keep_the_requests_and_hit_the_target_rate() -> None:
    w = synthetic(requests=400, rate=20, seed=5, slo_classes=DEFAULT_SLO_CLASSES)
    limits = StepPlannerLimits(32, 4096, 32)
    saturation = saturation_throughput(w, Engine(limits, latency=LatencyModel()))
    burst = simulate(w.with_arrivals(np.zeros(len(w)), "burst"), limits)
    assert saturation == pytest.approx(400 / burst.report()["throughput"]["simulated_seconds"])
    for load in (0.5, 1.0, 1.3):
        scaled = at_load(w, load, saturation)
        assert scaled.rate == pytest.approx(load * saturation)
        for column in ("prompt_tokens", "output_tokens", "priority"):
            np.testing.assert_array_equal(getattr(scaled, column), getattr(w, column))
        assert dict(scaled.slo_classes) == dict(w.slo_classes)
        np.testing.assert_allclose(
            np.diff(scaled.arrival_time) * scaled.rate, np.diff(w.arrival_time) * w.rate
        )


def test_burstiness_changes_only_the_gaps() -> None:
    poisson, bursty = synthetic(2000, 10, seed=1), synthetic(2000, 10, seed=1, burstiness=0.25)
    assert synthetic(50, 10, seed=1, burstiness=1.0).source == synthetic(50, 10, seed=1).source
    for column in ("prompt_tokens", "output_tokens", "priority"):
        np.testing.assert_array_equal(getattr(poisson, column), getattr(bursty, column))
    gaps = np.diff(bursty.arrival_time)
    # gamma(shape k, mean 1/rate): coefficient of variation 1/sqrt(k) = 2 (Poisson's is 1)
    assert gaps.mean() == pytest.approx(0.1, rel=0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.15)
    np.testing.assert_allclose(np.diff(synthetic(20, 10, burstiness=math.inf).arrival_time), 0.1)
    with pytest.raises(ValueError, match="burstiness"):
        synthetic(10, 10, burstiness=0)


# --- the CLI -------------------------------------------------------------------------------------

SMALL = ["--requests", "150", "--rate", "40", "-B", "32", "--no-progress"]


def _cli(*args: str):
    pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
    from click.testing import CliRunner

    from stepplanner.cli import main

    return CliRunner(env={"COLUMNS": "160"}).invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize(
    ("text", "message"), [*INVALID_CLASSES, ("7=ttft:1s", "class 7, which no request")]
)
def test_an_invalid_slo_class_is_a_one_line_cli_error(text: str, message: str) -> None:
    result = _cli("simulate", *SMALL, "--slo-class", text)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command", ["simulate", "compare", "record", "sweep", "capacity", "fidelity", "serve-trace"]
)
def test_every_simulating_command_checks_slo_classes(command: str, tmp_path: pathlib.Path) -> None:
    from stepplanner.fidelity.simulated import simulated_results
    from stepplanner.sim.traces import sample_trace_path

    trace = str(sample_trace_path())
    if command == "record":
        args = [str(tmp_path / "r.jsonl"), *SMALL]
    elif command == "fidelity":  # a results file of the sample trace, the trace beside it
        results = tmp_path / "results.json"
        results.write_text(
            json.dumps(
                simulated_results(load_trace(trace), StepPlannerLimits(8, 4096, 16), trace=trace)
            )
        )
        args = [str(results), "--no-progress"]
    elif command == "serve-trace":  # refused before the runtime is imported
        args = [trace, "--results", str(tmp_path / "r.json"), "--timings", str(tmp_path / "t.csv")]
    else:
        args = SMALL
    result = _cli(command, *args, "--slo-class", "0=ttft:250")
    assert result.exit_code == 2 and "has no unit" in result.output
    assert not (tmp_path / "r.json").exists()


def test_no_slo_and_slo_class_together_are_a_usage_error() -> None:
    result = _cli("simulate", *SMALL, "--no-slo", "--slo-class", "0=ttft:1s")
    assert result.exit_code == 2 and "give one of them" in result.output


def test_the_embedded_workload_has_the_default_classes_unless_told_otherwise() -> None:
    report = json.loads(_cli("simulate", *SMALL, "--json").output)
    assert report["workload"]["slo_classes"] == {
        str(p): {"ttft_s": s.ttft, "tpot_s": s.tpot} for p, s in DEFAULT_SLO_CLASSES.items()
    }
    assert set(report["slo_attainment"]["classes"]) == {"all", "-1", "0", "1"}
    given = json.loads(_cli("simulate", *SMALL, "--slo-class", "0=ttft:1s", "--json").output)
    assert given["workload"]["slo_classes"] == {"0": {"ttft_s": 1.0, "tpot_s": None}}
    assert "slo_attainment" not in json.loads(_cli("simulate", *SMALL, "--no-slo", "--json").output)


def test_compare_runs_the_deadline_baselines_by_default_when_slos_are_given() -> None:
    reports = json.loads(_cli("compare", *SMALL, "--json").output)
    assert [r["name"] for r in reports] == ["fcfs", "priority+pause", "edf+pause", "deadline+pause"]
    assert [r["policy"]["scheduling_policy"] for r in reports] == [
        "FCFS",
        "PRIORITY",
        "EDF",
        "DEADLINE",
    ]
    assert all(r["policy"]["preemption"] == "PAUSE" for r in reports[1:])
    text = _cli("compare", *SMALL).output
    assert "SLO attainment" in text and "deadline+pause" in text
    plain = json.loads(_cli("compare", *SMALL, "--no-slo", "--json").output)
    assert [r["name"] for r in plain] == ["fcfs", "priority", "priority+pause"]
    one = json.loads(_cli("compare", *SMALL, "--config", "name=x,policy=edf", "--json").output)
    assert [r["name"] for r in one] == ["x"]  # --config still overrides


def test_compare_at_loads_relative_to_saturation() -> None:
    doc = json.loads(
        _cli(
            "compare",
            *SMALL,
            "--load",
            "0.5,1.2",
            "--config",
            "name=f",
            "--config",
            "name=d,policy=deadline,preemption=pause",
            "--json",
        ).output
    )
    saturation = doc["saturation_rps"]
    assert [g["load"] for g in doc["loads"]] == [0.5, 1.2]
    for group in doc["loads"]:
        assert group["rate"] == pytest.approx(group["load"] * saturation)
        assert [r["name"] for r in group["reports"]] == ["f", "d"]
        for r in group["reports"]:
            assert r["workload"]["rate_per_s"] == pytest.approx(group["rate"])
            assert r["workload"]["requests"] == 150
    text = _cli("compare", *SMALL, "--load", "0.5,1.2").output
    assert "saturation" in text and "1.2x" in text and "deadline+pause" in text
    bad = _cli("compare", *SMALL, "--load", "0,1")
    assert bad.exit_code == 2 and "load '0' is out of range" in bad.output
    none = _cli("compare", *SMALL, "--load", "1", "--no-slo")
    assert none.exit_code == 2 and "no request carries objectives" in none.output
