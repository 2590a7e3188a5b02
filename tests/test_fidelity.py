"""``stepplanner fidelity``: reading real runs' results (stepplanner's layout and vLLM's), the
error arithmetic, and the comparison against a "real" run that is itself a simulation (every
error 0)."""

from __future__ import annotations

import copy
import json
import pathlib

import numpy as np
import pytest

from stepplanner.fidelity.compare import (
    Sample,
    check_fidelity,
    compare_samples,
    relative_error,
    summarize,
)
from stepplanner.fidelity.results import read_results, served_workload
from stepplanner.fidelity.simulated import simulated_results
from stepplanner.planner._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.planner._types import IfbSchedulingMode, PreemptionMode, SchedulingPolicy
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.traces import read_trace
from stepplanner.sim.workloads import Workload, synthetic

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402

LIMITS = StepPlannerLimits(
    max_batch_size=8, max_input_length=400, kv_page_size=16, max_step_tokens=256
)
LATENCY = LatencyModel(a=3e-4, b=2e-4, c=6e-6, name="cpu")
LATENCY_TEXT = "a=3e-4,b=2e-4,c=6e-6"
PRIORITY_PAUSE = SchedulingOptions(
    ifb_scheduling_mode=IfbSchedulingMode.MIXED,
    max_num_tokens=256,
    scheduling_policy=SchedulingPolicy.PRIORITY,
    preemption=PreemptionMode.PAUSE,
    max_pause_steps=16,
)
# The keys vllm bench serve --save-result --save-detailed writes (vLLM 0.33.0,
# vllm/benchmarks/serve.py: the BenchmarkMetrics result, then main's additions), ms statistics
# for its default --percentile-metrics plus e2el.
VLLM_KEYS = (
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "queue_times",
    "generated_texts",
    "errors",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "rtfx",
    *(
        f"{stat}_{metric}_ms"
        for metric in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p99")
    ),
)


def small_trace(requests: int = 60, seed: int = 3) -> Workload:
    return synthetic(requests=requests, rate=6.0, seed=seed, max_prompt=400, max_output=64)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("trace") / "trace.csv"
    small_trace().to_csv(path)
    return path


@pytest.fixture(scope="module")
def served(trace_file: pathlib.Path) -> Workload:
    """The trace as the harness serves it: read back from its file (arrivals to the us)."""
    return read_trace(trace_file)


def as_vllm(doc: dict) -> dict:
    """A stepplanner results document cut down to exactly vLLM's keys."""
    out = {key: doc.get(key) for key in VLLM_KEYS}
    out.update(
        backend="vllm",
        endpoint_type="vllm",
        model_id="m",
        num_prompts=len(doc["ttfts"]),
        request_rate=6.0,
        queue_times=[0.0] * len(doc["ttfts"]),
        rtfx=0.0,
        max_concurrent_requests=8,
        max_output_tokens_per_s=1.0,
    )
    return out


def write(path: pathlib.Path, doc: object) -> str:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def simulated_doc(served: Workload) -> dict:
    return simulated_results(served, LIMITS, PRIORITY_PAUSE, LATENCY, trace="trace.csv")


# --- the error arithmetic --------------------------------------------------------------------


def sample(ttft, tpot, e2e, itl, counts=None, requests=10, tokens=100, seconds=5.0) -> Sample:
    values = np.array(itl, dtype=float)
    return Sample(
        np.array(ttft, dtype=float),
        np.array(tpot, dtype=float),
        np.array(e2e, dtype=float),
        (values, np.ones(values.size, dtype=np.int64) if counts is None else np.array(counts)),
        requests,
        tokens,
        seconds,
    )


def test_relative_error_is_simulated_minus_real_over_real() -> None:
    assert relative_error(100.0, 110.0) == pytest.approx(0.1)
    assert relative_error(2.0, 1.0) == pytest.approx(-0.5)
    assert relative_error(0.0, 1.0) is None  # no scale to be relative to
    assert relative_error(None, 1.0) is None and relative_error(1.0, None) is None


def test_errors_and_figure_of_merit_on_hand_computed_numbers() -> None:
    real = sample(ttft=[1, 2, 3, 4], tpot=[0.02], e2e=[1, 3], itl=[0.01, 0.02, 0.03])
    sim = sample(
        ttft=[1.1, 2.2, 3.3, 4.4],
        tpot=[0.016],
        e2e=[1, 5],
        itl=[0.01, 0.03],
        counts=[1, 2],
        seconds=4.0,
        tokens=90,
    )
    metrics = compare_samples({"all": real}, {"all": sim})["all"]
    # numpy's linear percentiles: [1,2,3,4] -> p50 2.5, p90 3.7; [1,3] -> p50 2, p90 2.8.
    assert metrics["ttft"]["p50"] == {
        "real": 2.5,
        "simulated": pytest.approx(2.75),
        "error": pytest.approx(0.1),
    }
    assert metrics["ttft"]["p90"]["real"] == pytest.approx(3.7)
    assert metrics["ttft"]["p90"]["error"] == pytest.approx(0.1)
    assert metrics["tpot"]["p99"]["error"] == pytest.approx(-0.2)
    assert metrics["e2e"]["p50"]["error"] == pytest.approx(0.5)  # 3 vs 2
    assert metrics["e2e"]["p90"]["error"] == pytest.approx(4.6 / 2.8 - 1)  # 4.6 vs 2.8
    # ITL pools gaps with their counts: [0.01, 0.03, 0.03] has median 0.03, real 0.02.
    assert metrics["itl"]["p50"]["error"] == pytest.approx(0.5)
    assert metrics["throughput"]["requests_per_s"] == {
        "real": 2.0,
        "simulated": 2.5,
        "error": pytest.approx(0.25),
    }
    assert metrics["throughput"]["output_tokens_per_s"]["error"] == pytest.approx(90 / 4 / 20 - 1)
    summary = summarize(metrics)
    # |errors| 0.1, 0.1, 0.2, 0.2, 0.5, 0.643: median 0.2, worst E2E p90.
    assert summary["median_abs_error"] == pytest.approx(0.2)
    assert summary["max_abs_error"] == pytest.approx(4.6 / 2.8 - 1)
    assert summary["worst"] == "e2e p90" and summary["known"] == 6


def test_an_empty_series_has_no_percentiles_and_no_error() -> None:
    real = sample(ttft=[1.0], tpot=[], e2e=[1.0], itl=[])
    metrics = compare_samples({"all": real}, {"all": real})["all"]
    assert metrics["tpot"]["p50"] == {"real": None, "simulated": None, "error": None}
    assert metrics["itl"]["p99"]["real"] is None
    summary = summarize(metrics)
    assert summary["known"] == 4 and summary["median_abs_error"] == 0.0


def test_classes_must_match() -> None:
    one = sample(ttft=[1.0], tpot=[], e2e=[1.0], itl=[])
    with pytest.raises(ValueError, match="classes"):
        compare_samples({"all": one, "0": one}, {"all": one})


# --- reading both layouts ---------------------------------------------------------------------


def stepplanner_doc() -> dict:
    """Three requests by hand: priorities -1, 0, 0; the second failed."""
    return {
        "input_lens": [10, 20, 30],
        "output_lens": [3, 0, 2],
        "ttfts": [0.5, 0.0, 0.25],
        "itls": [[0.1, 0.2], [], [0.05]],
        "latencies": [0.8, 0.0, 0.3],
        "e2els": [0.8, 0.0, 0.3],
        "start_times": [100.0, 100.5, 101.0],
        "errors": ["", "engine error", ""],
        "generated_texts": ["", "", ""],
        "request_ids": ["req_0", "req_1", "req_2"],
        "arrival_times": [0.0, 0.5, 1.0],
        "priorities": [-1, 0, 0],
        "duration": 1.3,
        "stepplanner": {
            "format": "stepplanner-results/1",
            "trace": None,
            "scheduler": "stepplanner",
            "options": {
                "mode": "MIXED",
                "max_num_tokens": 64,
                "max_chunk_tokens": 32,
                "scheduling_policy": "PRIORITY",
                "preemption": "PAUSE",
                "priority_reserved_slots": 0,
                "max_pause_steps": 8,
            },
            "limits": {
                "max_batch_size": 4,
                "max_input_length": 64,
                "kv_page_size": 16,
                "max_step_tokens": 64,
            },
            "num_blocks": 100,
            "model": {"path": "m"},
            "timings": None,
        },
    }


def test_stepplanner_layout_is_read_with_its_run(tmp_path: pathlib.Path) -> None:
    results = read_results(write(tmp_path / "r.json", stepplanner_doc()))
    assert results.layout == "stepplanner" and len(results) == 3
    assert results.failed.tolist() == [False, True, False] and results.num_failed == 1
    assert results.e2e[[0, 2]].tolist() == [0.8, 0.3]
    assert results.priority.tolist() == [-1, 0, 0]
    assert results.limits == StepPlannerLimits(4, 64, 16, 64)
    assert results.policy.max_pause_steps == 8 and results.policy.max_chunk_tokens == 32
    workload, matched = served_workload(results)
    # Without a trace the failed request's output length is unknown: it is left out.
    assert len(workload) == 2 and workload.prompt_tokens.tolist() == [10, 30]
    assert workload.arrival_time.tolist() == [0.0, 1.0]
    assert matched.priority.tolist() == [-1, 0] and matched.num_failed == 1


def test_vllm_layout_with_exactly_vllms_keys(tmp_path: pathlib.Path) -> None:
    doc = as_vllm(stepplanner_doc())
    assert set(doc) == set(VLLM_KEYS)
    results = read_results(write(tmp_path / "v.json", doc))
    assert results.layout == "vllm" and results.priority is None and results.limits is None
    assert results.failed.tolist() == [False, True, False]
    # start_times minus their minimum are the arrivals.
    assert results.arrival.tolist() == [0.0, 0.5, 1.0]
    workload, matched = served_workload(results)
    assert workload.classes == [0] and len(matched) == 2


def test_vllm_layout_without_latencies_takes_ttft_plus_the_gaps(tmp_path: pathlib.Path) -> None:
    doc = as_vllm(stepplanner_doc())
    del doc["latencies"]
    results = read_results(write(tmp_path / "v.json", doc))
    assert results.e2e[[0, 2]] == pytest.approx([0.8, 0.3])


def test_a_trace_supplies_arrivals_and_classes_to_a_vllm_file(tmp_path: pathlib.Path) -> None:
    trace = Workload(
        np.array([0.0, 0.4, 0.9]),
        np.array([10, 20, 30]),
        np.array([3, 7, 2]),
        np.array([1, -1, 0]),
        source="t",
    )
    results = read_results(write(tmp_path / "v.json", as_vllm(stepplanner_doc())))
    workload, matched = served_workload(results, trace)
    assert workload is trace and matched.priority.tolist() == [1, -1, 0]
    # The failed row stays (the engine was given it) and is not compared.
    assert matched.failed.tolist() == [False, True, False]


def vllm_with(key: str, value: object) -> dict:
    doc = as_vllm(stepplanner_doc())
    doc[key] = value
    return doc


def mutated(change) -> dict:
    doc = copy.deepcopy(stepplanner_doc())
    change(doc)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "expected a JSON object (the layout of vllm bench serve --save-result), got list"),
        (mutated(lambda d: d.pop("itls")), "key(s) 'itls' missing; a stepplanner-results/1 result"),
        (
            mutated(lambda d: d.pop("stepplanner") and d.pop("ttfts")),
            "key(s) 'ttfts' missing; a vLLM result "
            "(vllm bench serve --save-result --save-detailed)",
        ),
        (
            mutated(lambda d: d.update(output_lens=[3, 0])),
            "the per-request lists differ in length (input_lens 3, output_lens 2,",
        ),
        (mutated(lambda d: d.update(ttfts={"a": 1})), "ttfts is dict; allowed: a list"),
        (
            mutated(
                lambda d: d.update(
                    input_lens=[],
                    output_lens=[],
                    ttfts=[],
                    itls=[],
                    latencies=[],
                    e2els=[],
                    start_times=[],
                    errors=[],
                    arrival_times=[],
                    priorities=[],
                )
            ),
            "no requests",
        ),
        (
            mutated(lambda d: d["ttfts"].__setitem__(2, -1)),
            "ttfts[2]=-1 is out of range; allowed: a finite number of seconds in [0, 1e+12]",
        ),
        (mutated(lambda d: d["ttfts"].__setitem__(0, "0.5")), "ttfts[0]='0.5' is out of range"),
        (
            mutated(lambda d: d["input_lens"].__setitem__(0, 1.5)),
            "input_lens[0]=1.5 is out of range; allowed: an integer in [0, 2147483647]",
        ),
        (
            mutated(lambda d: d["input_lens"].__setitem__(0, 0)),
            "input_lens[0]=0 for a successful request",
        ),
        (mutated(lambda d: d["output_lens"].__setitem__(0, True)), "output_lens[0]=True"),
        (mutated(lambda d: d["itls"].__setitem__(0, [0.1, "x"])), "itls[0] holds 'x'"),
        (mutated(lambda d: d["itls"].__setitem__(2, 0.05)), "itls[2] is float"),
        (mutated(lambda d: d["errors"].__setitem__(0, 5)), "errors[0]=5 is not text"),
        (
            mutated(lambda d: d["latencies"].__setitem__(0, 0.4)),
            "latencies[0]=0.4 is below ttfts[0]=0.5",
        ),
        (mutated(lambda d: d.update(errors=["x", "y", "z"])), "all 3 requests failed"),
        (mutated(lambda d: d.update(duration=0)), "duration=0 is out of range"),
        (
            mutated(lambda d: d["stepplanner"].update(format="other/2")),
            "stepplanner.format='other/2' is not known; allowed: stepplanner-results/1",
        ),
        (
            mutated(lambda d: d["stepplanner"]["limits"].update(max_batch_size=0)),
            "stepplanner.limits is not valid (max_batch_size=0 is out of range",
        ),
        (
            mutated(lambda d: d["stepplanner"]["options"].update(mode="SIDEWAYS")),
            "stepplanner.options is not valid",
        ),
        (mutated(lambda d: d.update(stepplanner=[])), "stepplanner is list; allowed: an object"),
        # finite values whose sums or millisecond figures overflow float64 (nan% was printed)
        (
            mutated(lambda d: d["itls"].__setitem__(0, [1e308, 1e308])),
            "itls[0] holds 1e+308; allowed: a list of a finite number of seconds in [0, 1e+12]",
        ),
        (mutated(lambda d: d["latencies"].__setitem__(2, 1e307)), "latencies[2]=1e+307 is out of"),
        (
            mutated(lambda d: d["arrival_times"].__setitem__(1, 2e12)),
            "arrival_times[1]=2000000000000.0 is out of range",
        ),
        (
            mutated(lambda d: d.update(duration=1e13)),
            "duration=10000000000000.0 is out of range; allowed: a finite number of seconds in (0, "
            "1e+12]",
        ),
        # a vLLM file's optional lists are counted like every other (an IndexError or TypeError
        # traceback before, or ignored when too long)
        *(
            (vllm_with(key, value), message)
            for key in ("priorities", "arrival_times")
            for value, message in (
                (
                    [0],
                    "the per-request lists differ in length (input_lens 3, output_lens 3, "
                    "ttfts 3, "
                    f"itls 3, latencies 3, errors 3, start_times 3, {key} 1)",
                ),
                ([0, 0, 0, 0], f"{key} 4)"),
                (0, f"{key} is int; allowed: a list with one entry per request"),
            )
        ),
    ],
)
def test_malformed_results_name_the_file_and_the_key(
    tmp_path: pathlib.Path, doc: object, message: str
) -> None:
    path = tmp_path / "bad.json"
    if isinstance(doc, str):
        path.write_text(doc, encoding="utf-8")
    else:
        write(path, doc)
    with pytest.raises(ValueError) as info:
        read_results(path)
    assert str(info.value).startswith(f"results {path}: ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("trace_columns", "message"),
    [
        (
            (np.array([0.0, 0.5]), [10, 20], [3, 7], [-1, 0]),
            "3 requests, but trace t has 2; allowed: the results of a run of this trace",
        ),
        (
            (np.array([0.0, 0.5, 1.0]), [10, 20, 31], [3, 7, 2], [-1, 0, 0]),
            "request 2 has input_lens=30, but trace t row 2 (by arrival) has prompt_tokens=31 "
            "(1 row(s) differ)",
        ),
        (
            (np.array([0.0, 0.5, 1.0]), [10, 20, 30], [4, 7, 5], [-1, 0, 0]),
            "request 0 has output_lens=3, but trace t row 0 (by arrival) has output_tokens=4 "
            "(2 row(s) differ); allowed: the results of a run of this trace, row for row "
            "(a request that stopped early",
        ),
        (
            (np.array([0.0, 0.5, 1.0]), [10, 20, 30], [3, 7, 2], [0, 0, 0]),
            "request 0 has priorities=-1, but trace t row 0 (by arrival) has priority=0",
        ),
    ],
)
def test_a_trace_that_was_not_the_one_served_is_refused(
    tmp_path: pathlib.Path, trace_columns, message: str
) -> None:
    results = read_results(write(tmp_path / "r.json", stepplanner_doc()))
    arrival, prompt, output, priority = trace_columns
    trace = Workload(arrival, np.array(prompt), np.array(output), np.array(priority), source="t")
    with pytest.raises(ValueError, match="^results ") as info:
        served_workload(results, trace)
    assert message in str(info.value)


def test_a_vllm_file_without_start_times_needs_the_trace(tmp_path: pathlib.Path) -> None:
    doc = as_vllm(stepplanner_doc())
    del doc["start_times"]
    results = read_results(write(tmp_path / "v.json", doc))
    with pytest.raises(ValueError, match="has no start_times .*give the trace that was served"):
        served_workload(results)


# --- the round trip: a simulated "real" run ----------------------------------------------------


def all_errors(report: dict) -> list[float]:
    return [
        v["error"]
        for metrics in report["metrics"].values()
        for table in metrics.values()
        for v in table.values()
    ]


def test_a_simulated_run_compared_with_its_own_simulation_has_no_error(
    tmp_path: pathlib.Path, simulated_doc: dict, served: Workload
) -> None:
    results = read_results(write(tmp_path / "r.json", simulated_doc))
    workload, matched = served_workload(results, served)
    fidelity = check_fidelity(matched, workload, results.limits, results.policy, LATENCY)
    report = fidelity.report
    assert list(report["metrics"]) == ["all", "-1", "0", "1"]
    errors = all_errors(report)
    assert len(errors) == 4 * (4 * 3) + 2 and None not in errors
    assert errors == pytest.approx([0.0] * len(errors), abs=1e-12)
    assert report["summary"]["all"]["max_abs_error"] == pytest.approx(0.0, abs=1e-12)
    # The comparison is not vacuous: another latency model moves every figure of merit.
    slower = check_fidelity(
        matched, workload, results.limits, results.policy, LatencyModel(a=6e-4, b=2e-4, c=6e-6)
    ).report
    assert slower["summary"]["all"]["median_abs_error"] > 0.01
    assert slower["metrics"]["all"]["tpot"]["p50"]["error"] > 0
    assert not hasattr(fidelity, "result")  # set and read by nobody: the report is the output


def test_a_figure_that_is_not_a_number_is_an_error(
    tmp_path: pathlib.Path, simulated_doc: dict, served: Workload
) -> None:
    # Every real TTFT a subnormal second: each relative error overflows to inf.
    doc = copy.deepcopy(simulated_doc)
    doc["ttfts"] = [5e-324] * len(doc["ttfts"])
    results = read_results(write(tmp_path / "r.json", doc))
    workload, matched = served_workload(results, served)
    with pytest.raises(
        ValueError,
        match=(
            rf"^results {tmp_path / 'r.json'}: the relative error of class all, ttft p50 is not "
            r"a finite number \(real 5e-324 s, simulated .* s\); allowed: figures whose "
            r"relative error is a number"
        ),
    ):
        check_fidelity(matched, workload, results.limits, results.policy, LATENCY)


def run_cli(*args: str):
    return CliRunner().invoke(main, ["fidelity", *args, "--no-progress"], catch_exceptions=False)


@pytest.fixture()
def run_files(
    tmp_path: pathlib.Path, simulated_doc: dict, trace_file: pathlib.Path
) -> tuple[str, str]:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(trace_file.read_bytes())
    return write(tmp_path / "results.json", simulated_doc), str(trace)


def test_cli_table_takes_trace_limits_and_policy_from_the_results(run_files) -> None:
    results_path, _ = run_files
    out = run_cli(results_path, "--latency", LATENCY_TEXT)
    assert out.exit_code == 0, out.output
    # The trace the results name is found beside them; limits and policy are the run's.
    assert "trace.csv (stepplanner)" in out.output
    assert "engine B=8 S_in=400 P=16" in out.output
    assert "PRIORITY preemption=PAUSE" in out.output and "max_pause_steps=16" in out.output
    assert "│ -1 urgent     │ TTFT p50 (ms)" in out.output
    assert "figure of merit median |error| 0.0%, max 0.0%" in out.output


def test_cli_json_file_beside_the_table_and_flags_override_the_run(
    run_files, tmp_path: pathlib.Path
) -> None:
    results_path, trace = run_files
    out_path = tmp_path / "report.json"
    out = run_cli(
        results_path,
        "--trace",
        trace,
        "--latency",
        LATENCY_TEXT,
        "-B",
        "4",
        "--max-pause-steps",
        "2",
        "--json",
        str(out_path),
    )
    assert out.exit_code == 0, out.output
    assert "real vs simulated" in out.output and f"report written to {out_path}" in out.output
    report = json.loads(out_path.read_text())
    assert report["limits"] == {
        "max_batch_size": 4,
        "max_input_length": 400,
        "kv_page_size": 16,
        "max_step_tokens": 256,
    }
    assert report["policy"]["max_pause_steps"] == 2
    assert report["policy"]["scheduling_policy"] == "PRIORITY"
    assert report["latency_model"]["a"] == 3e-4
    # Half the slots: the simulation no longer matches the run.
    assert report["summary"]["all"]["median_abs_error"] > 0.01


def test_cli_format_json_on_stdout(run_files) -> None:
    results_path, trace = run_files
    out = run_cli(results_path, "--trace", trace, "--latency", LATENCY_TEXT, "--format", "json")
    report = json.loads(out.stdout)
    assert out.exit_code == 0
    assert report["results"] == {
        "file": results_path,
        "layout": "stepplanner",
        "scheduler": "stepplanner",
        "requests": 60,
        "failed": 0,
        "compared": 60,
    }
    assert all(e == pytest.approx(0.0, abs=1e-12) for e in all_errors(report))


def test_cli_vllm_file_with_and_without_the_trace(
    run_files, tmp_path: pathlib.Path, simulated_doc: dict, served: Workload
) -> None:
    _, trace = run_files
    vllm_path = write(tmp_path / "vllm.json", as_vllm(simulated_doc))
    flags = [
        "--latency",
        LATENCY_TEXT,
        "-B",
        "8",
        "--max-input-length",
        "400",
        "--kv-page-size",
        "16",
        "--max-step-tokens",
        "256",
        "--format",
        "json",
    ]
    policy = [
        "--mode",
        "mixed",
        "--max-num-tokens",
        "256",
        "--policy",
        "priority",
        "--preemption",
        "pause",
        "--max-pause-steps",
        "16",
    ]
    with_trace = json.loads(run_cli(vllm_path, "--trace", trace, *flags, *policy).stdout)
    assert with_trace["results"]["layout"] == "vllm"
    assert list(with_trace["metrics"]) == ["all", "-1", "0", "1"]
    assert all(e == pytest.approx(0.0, abs=1e-12) for e in all_errors(with_trace))
    # Without the trace every request is one class, so PRIORITY + PAUSE has nothing to tell
    # apart: the same run under FCFS matches, the priority run does not.
    fcfs_doc = simulated_results(
        served,
        LIMITS,
        SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=256),
        LATENCY,
    )
    fcfs_path = write(tmp_path / "fcfs.json", as_vllm(fcfs_doc))
    alone = json.loads(
        run_cli(fcfs_path, *flags, "--mode", "mixed", "--max-num-tokens", "256").stdout
    )
    assert list(alone["metrics"]) == ["all"]
    assert all(e == pytest.approx(0.0, abs=1e-12) for e in all_errors(alone))


def test_cli_plot(run_files, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    results_path, _ = run_files
    image = tmp_path / "cdf.png"
    out = run_cli(results_path, "--latency", LATENCY_TEXT, "--format", "csv", "--plot", str(image))
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("class,metric,real,simulated,error\nall,TTFT p50 (ms),")
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--json", "{results}"], "--json {results}: is an input of this command"),
        (["--trace", "{other}"], "60 requests, but trace {other} has 5"),
        (["-B", "0"], "max_batch_size=0 is out of range"),
        (["--latency", "z=1"], "latency item 'z=1' is not known"),
        (["--plot", "{dir}/x.txt"], ".txt is not an image format"),
    ],
)
def test_cli_errors_are_one_line_with_status_2(
    run_files, tmp_path: pathlib.Path, extra, message: str
) -> None:
    results_path, _ = run_files
    other = tmp_path / "other.csv"
    small_trace(requests=5).to_csv(other)
    names = {"results": results_path, "other": str(other), "dir": str(tmp_path)}
    out = run_cli(results_path, "--latency", LATENCY_TEXT, *(e.format(**names) for e in extra))
    assert out.exit_code == 2
    assert message.format(**names) in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output


def test_cli_refuses_itls_whose_millisecond_figures_overflow(
    run_files, simulated_doc: dict, tmp_path: pathlib.Path
) -> None:
    doc = copy.deepcopy(simulated_doc)
    doc["itls"][0] = [1e308] * len(doc["itls"][0])
    out = run_cli(
        write(tmp_path / "huge.json", doc), "--trace", run_files[1], "--latency", LATENCY_TEXT
    )
    assert out.exit_code == 2, out.output
    assert "itls[0] holds 1e+308" in out.output and "nan" not in out.output
    assert len(out.output.strip().splitlines()) == 1, out.output


def test_cli_warns_about_the_default_latency_model_and_failed_requests(
    tmp_path: pathlib.Path,
) -> None:
    out = run_cli(write(tmp_path / "r.json", stepplanner_doc()))
    assert out.exit_code == 0, out.output
    assert "warning: 1 of the real run's requests failed" in out.stderr
    assert "warning: no --latency-model or --latency given" in out.stderr
    assert "3 requests, 1 failed, 2 compared" in out.stdout


def test_a_runtime_scheduled_run_and_a_missing_trace_are_said(tmp_path: pathlib.Path) -> None:
    doc = stepplanner_doc()
    doc["stepplanner"].update(options=None, scheduler="fifo", trace="gone.csv")
    out = run_cli(write(tmp_path / "r.json", doc), "--latency", LATENCY_TEXT, "--format", "json")
    assert out.exit_code == 0, out.output
    assert "warning: the trace the results name (gone.csv) was not found" in out.stderr
    assert (
        "warning: the run was scheduled by 'fifo', which is not a stepplanner policy; the "
        "simulation runs MIXED + FCFS from the flags"
    ) in out.stderr
    report = json.loads(out.stdout)
    assert report["results"]["scheduler"] == "fifo" and report["policy"]["mode"] == "MIXED"
    assert report["limits"]["max_batch_size"] == 4  # the run's limits still apply
