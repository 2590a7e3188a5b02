"""``sweep``, ``capacity``, ``calibrate``, and what --slo, --latency-model, vLLM metrics and
aliases add to ``simulate`` and ``compare``."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402

TRACES = pathlib.Path(__file__).parent / "data" / "traces"
SMALL = ["--requests", "150", "--rate", "30", "-B", "32", "--no-progress"]


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _json(*args: str) -> dict:
    result = _invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_sweep_json_results(tmp_path: pathlib.Path) -> None:
    doc = _json(
        "sweep",
        *SMALL,
        "--grid",
        "mode=mixed,prefill_first",
        "--grid",
        "max_num_tokens=50,320",
        "--slo",
        "ttft_p99=400ms",
        "--slo",
        "tpot_p99=30ms",
        "--backend",
        "serial",
        "--metric-percentiles",
        "50,90",
    )
    results = doc["results"]
    assert len(results) == 4
    bad = [r for r in results if r["error"]]
    assert [r["options"] for r in bad] == [
        {"ifb_scheduling_mode": "mixed", "max_num_tokens": "50"},
        {"ifb_scheduling_mode": "prefill_first", "max_num_tokens": "50"},
    ]
    for r in results:
        if r["error"]:
            continue
        assert {"options", "goodput", "throughput", "meets_slo", "pareto"} <= set(r)
        assert {"p50_ttft_ms", "p90_tpot_ms", "p99_tpot_ms", "mean_itl_ms"} <= set(r["metrics"])
    assert doc["slos"] == ["ttft_p99=400ms", "tpot_p99=30ms"]


def test_sweep_writes_csv_plot_and_result(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    csv_path, plot, saved = tmp_path / "s.csv", tmp_path / "s.png", tmp_path / "s.json"
    result = _invoke(
        "sweep",
        *SMALL,
        "--grid",
        "max_chunk_tokens=64,128",
        "--slo",
        "ttft_p99=1s",
        "--csv",
        str(csv_path),
        "--plot",
        str(plot),
        "--save-result",
        str(saved),
        "--workers",
        "2",
    )
    assert result.exit_code == 0, result.output
    assert "configurations by goodput" in result.output
    header = csv_path.read_text().splitlines()[0].split(",")
    assert {"option.max_chunk_tokens", "goodput", "p99_ttft_ms", "ttft_p99_ms"} <= set(header)
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert len(json.loads(saved.read_text())["results"]) == 2


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--csv", "missing-dir/x.csv"], "directory 'missing-dir' does not exist"),
        (["--plot", "x.txt"], ".txt is not an image format matplotlib writes"),
        (["--grid", "colour=red"], "not a SchedulingOptions or limits field"),
        (["--slo", "ttft_p99=3"], "ms, s or us"),
        (["--latency-model", "gpt-9-on-abacus"], "neither a preset nor a file"),
    ],
)
def test_sweep_refuses_bad_input_before_running(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(main, ["sweep", *SMALL, *args])
    assert result.exit_code != 0
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_capacity_json() -> None:
    doc = _json(
        "capacity",
        *SMALL,
        "--grid",
        "mode=mixed,prefill_first",
        "--slo",
        "tpot_p99=20ms",
        "--slo",
        "ttft_p99=1s",
        "--tolerance",
        "1",
        "--backend",
        "serial",
    )
    results = doc["results"]
    assert sorted(r["options"]["ifb_scheduling_mode"] for r in results) == [
        "mixed",
        "prefill_first",
    ]
    for r in results:
        assert r["capacity"] > 0 and r["upper"] - r["capacity"] <= 1.0
        assert r["probes"][-1]["rate"] in (r["capacity"], r["upper"])
    assert doc["tolerance"] == 1.0


def test_capacity_needs_an_slo_or_the_stability_condition() -> None:
    result = CliRunner().invoke(main, ["capacity", *SMALL, "--no-stability"])
    assert result.exit_code == 2 and "at least one --slo when --no-stability" in result.output


def test_capacity_bounds_a_tpot_only_objective_by_queueing_delay() -> None:
    """TPOT alone holds at any rate (the queue absorbs the load), so capacity used to report its
    10,000 req/s ceiling; the default stability condition (median queueing delay <= 2 s)
    bounds it, is stated beside the SLOs, and can be changed or dropped."""
    doc = _json(
        "capacity", *SMALL, "--slo", "tpot_p99=50ms", "--tolerance", "1", "--backend", "serial"
    )
    assert doc["stability"] == "queue_p50=2000ms" and doc["max_rate"] == 10_000.0
    (r,) = doc["results"]
    assert not r["unbounded"] and 0 < r["capacity"] < 1000 and r["upper"] is not None
    assert r["at_capacity"]["stability"]["slo"] == "queue_p50"
    assert r["at_capacity"]["stability"]["observed_s"] <= 2.0

    table = _invoke(
        "capacity",
        *SMALL,
        "--slo",
        "tpot_p99=50ms",
        "--tolerance",
        "1",
        "--backend",
        "serial",
        "--format",
        "md",
    ).output
    assert "SLOs tpot_p99=50ms; stability queue_p50=2000ms" in " ".join(table.split())
    assert "queue_p50 ≤ 2000 ms" in " ".join(table.split())

    vidur = _json(
        "capacity",
        *SMALL,
        "--slo",
        "tpot_p99=50ms",
        "--tolerance",
        "1",
        "--backend",
        "serial",
        "--max-queue-delay",
        "p99=5s",
    )
    assert vidur["stability"] == "queue_p99=5000ms"
    assert vidur["results"][0]["at_capacity"]["stability"]["slo"] == "queue_p99"

    dropped = _json(
        "capacity",
        *SMALL,
        "--slo",
        "tpot_p99=50ms",
        "--backend",
        "serial",
        "--no-stability",
        "--max-rate",
        "500",
    )
    assert dropped["stability"] is None
    (r,) = dropped["results"]
    assert r["unbounded"] is True and r["capacity"] is None and r["upper"] is None


def test_capacity_at_max_rate_is_a_bound_not_a_number() -> None:
    args = [
        *SMALL,
        "--slo",
        "tpot_p99=50ms",
        "--backend",
        "serial",
        "--max-rate",
        "20",
        "--grid",
        "mode=mixed,prefill_first",
    ]
    for r in _json("capacity", *args)["results"]:
        assert r["unbounded"] is True and r["capacity"] is None and r["max_rate"] == 20.0
    rows = [
        line
        for line in _invoke("capacity", *args, "--format", "md").output.splitlines()
        if line.startswith("| ifb_scheduling_mode=")
    ]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "≥ 20.00" and cells[3] == "-"
    csv_text = _invoke("capacity", *args, "--format", "csv").output
    assert "≥ 20.00" in csv_text and ",20.00," not in csv_text


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--max-queue-delay", "p50=2"], "value '2' is not a duration"),
        (["--max-queue-delay", "median=2s"], "is not pN=VALUE; e.g. p50=2s"),
        (
            ["--max-queue-delay", "p99=5s", "--no-stability"],
            "--no-stability drops the condition --max-queue-delay sets",
        ),
    ],
)
def test_capacity_refuses_a_bad_stability_option(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(main, ["capacity", *SMALL, "--slo", "ttft_p99=1s", *args])
    assert result.exit_code == 2
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_capacity_refuses_columns_without_a_trace() -> None:
    # As every command with the workload flags does (they share options.trace_from).
    result = CliRunner().invoke(
        main,
        ["capacity", *SMALL, "--slo", "ttft_p99=1s", "--columns", "arrival=a,prompt=b,output=c"],
    )
    assert result.exit_code == 2
    assert "--columns describes a --trace file, and none was given" in result.output


def test_calibrate_round_trip(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(5)
    tokens = rng.integers(1, 2048, 50)
    context = tokens + rng.integers(0, 200_000, 50)
    seconds = 2e-3 + 1.1e-5 * tokens + 3e-8 * context
    timings = tmp_path / "timings.csv"
    timings.write_text(
        "tokens,context,seconds\n"
        + "\n".join(
            f"{t},{c},{s!r}" for t, c, s in zip(tokens.tolist(), context.tolist(), seconds.tolist())
        )
        + "\n"
    )
    model = tmp_path / "model.json"
    result = _invoke("calibrate", str(timings), "--out", str(model), "--name", "my-engine")
    assert result.exit_code == 0, result.output
    assert "R² 1.00000" in result.output and "worst relative error 0.00%" in result.output
    data = json.loads(model.read_text())
    assert data["a"] == pytest.approx(2e-3) and data["c"] == pytest.approx(3e-8)
    report = _json("simulate", *SMALL, "--latency-model", str(model))
    assert report["latency_model"]["name"] == "my-engine"


def test_calibrate_bad_file_is_one_line(tmp_path: pathlib.Path) -> None:
    timings = tmp_path / "timings.csv"
    timings.write_text("tokens,context,seconds\n10,100,0.01\n20,abc,0.02\n")
    result = CliRunner().invoke(
        main, ["calibrate", str(timings), "--out", str(tmp_path / "m.json")]
    )
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert "line 3: column 'context': 'abc' is not a number" in line


@pytest.mark.parametrize(
    ("rows", "terms", "message"),
    [
        ("0.5,1,10\n0.5,2,30\n0.5,3,20\n0.5,4,50\n", "b", "R² 0.00000"),
        (
            "0.1,1e155,1e155\n0.2,2e155,6e155\n0.3,3e155,6e155\n",
            "bd",
            "Error: timings data row 1: tokens (the column of b) is 1e+155; "
            "allowed: at most 1e+150",
        ),
        (
            "0.1,1e100,1e100\n0.2,2e100,6e100\n0.3,3e100,6e100\n",
            "d",
            "Error: timings data row 1: tokens x context (the column of d) is 1e+200; allowed:",
        ),
    ],
)
def test_calibrate_reports_numbers_or_one_line(
    tmp_path: pathlib.Path, rows: str, terms: str, message: str
) -> None:
    timings = tmp_path / "timings.csv"
    timings.write_text("seconds,tokens,context\n" + rows)
    model = tmp_path / "m.json"
    result = CliRunner().invoke(
        main, ["calibrate", str(timings), "--out", str(model), "--terms", terms]
    )
    assert message in result.output, result.output
    if message.startswith("Error"):
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
        assert not model.exists()
    else:
        assert result.exit_code == 0 and json.loads(model.read_text())["fit"]["r2"] == 0.0


def test_simulate_slo_goodput_and_vllm_result(tmp_path: pathlib.Path) -> None:
    saved = tmp_path / "result.json"
    report = _json(
        "simulate",
        *SMALL,
        "--slo",
        "ttft_p99=400ms",
        "--slo",
        "e2e_p50@1=10s",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        str(saved),
    )
    assert [c["slo"] for c in report["slo"]] == ["ttft_p99", "e2e_p50@1"]
    assert report["goodput"] <= report["throughput"]["requests_per_s"] + 1e-9
    assert report["meets_slo"] == all(c["met"] for c in report["slo"])
    vllm = json.loads(saved.read_text())
    for key in (
        "mean_ttft_ms",
        "median_tpot_ms",
        "p50_itl_ms",
        "p99_e2el_ms",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "num_prompts",
    ):
        assert key in vllm
    assert vllm["num_prompts"] == 150


def test_simulate_table_shows_vllm_metrics_and_slos() -> None:
    result = _invoke("simulate", *SMALL, "--slo", "tpot_p99=1ms")
    assert result.exit_code == 0
    assert "vLLM-style metrics" in result.output and "ITL (every gap)" in result.output
    assert "SLOs MISSED" in result.output


def test_compare_with_slo() -> None:
    reports = _json("compare", *SMALL, "--slo", "ttft_p99@-1=200ms")
    assert all(r["slo"][0]["slo"] == "ttft_p99@-1" for r in reports)
    text = _invoke("compare", *SMALL, "--slo", "ttft_p99@-1=200ms").output
    assert "for priority+pause ttft_p99@-1" in text and "goodput" in text


def test_vllm_flag_aliases_mean_the_same() -> None:
    ours = _json(
        "simulate",
        "--requests",
        "80",
        "--rate",
        "20",
        "-B",
        "16",
        "--kv-page-size",
        "16",
        "--max-step-tokens",
        "2048",
        "--no-progress",
    )
    theirs = _json(
        "simulate",
        "--num-prompts",
        "80",
        "--request-rate",
        "20",
        "--max-num-seqs",
        "16",
        "--block-size",
        "16",
        "--max-num-batched-tokens",
        "2048",
        "--no-progress",
    )
    assert (
        ours["limits"]
        == theirs["limits"]
        == {
            "max_batch_size": 16,
            "max_input_length": 4096,
            "kv_page_size": 16,
            "max_step_tokens": 2048,
        }
    )
    assert ours["workload"] == theirs["workload"]
    assert ours["latency_s"] == theirs["latency_s"]


@pytest.mark.parametrize(
    "name", ["azure_llm_inference.csv", "burstgpt.csv", "mooncake.jsonl", "vidur.csv"]
)
def test_simulate_reads_public_trace_layouts(name: str) -> None:
    report = _json("simulate", "--trace", str(TRACES / name), "--no-progress")
    assert report["requests"]["completed"] == report["requests"]["submitted"] > 30


def test_trace_columns_option() -> None:
    report = _json(
        "simulate",
        "--trace",
        str(TRACES / "custom.csv"),
        "--columns",
        "arrival=sent_ms,prompt=in_tok,output=out_tok,priority=tier,unit=ms",
        "--no-progress",
    )
    assert report["workload"]["requests"] == 40
    bad = CliRunner().invoke(
        main, ["simulate", "--trace", str(TRACES / "custom.csv"), "--no-progress"]
    )
    assert bad.exit_code == 2 and "match no known trace layout" in bad.output


def test_latency_model_preset() -> None:
    edge = _json("simulate", *SMALL, "--latency-model", "llama-3.2-3b-int4-jetson-agx-orin")
    assert "Jetson" in edge["latency_model"]["name"]


def test_ctrl_c_keeps_the_finished_configurations() -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it: exit status 130,
    the JSON document says interrupted, and no worker process is left behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    command = [
        sys.executable,
        "-m",
        "stepplanner",
        "sweep",
        "--no-progress",
        "--json",
        "--grid",
        "max_num_tokens=512,640,768,1024,1536,2048",
        "--grid",
        "max_chunk_tokens=128,256",
        "--grid",
        "policy=fcfs,priority",
    ]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["interrupted"] is True and len(doc["results"]) < 24
    assert "interrupted:" in err
    # The group empties: workers, fork server and resource tracker end once the parent has.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail("processes of the interrupted sweep were still running 10 s later")
