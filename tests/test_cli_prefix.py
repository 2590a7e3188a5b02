"""`--workload prefix-heavy` on `simulate`, `compare` and `sweep`: the prefix-heavy workload
(sim.prefix_workload) run with its prefix cache, so that uncached-first and the peers' orders
have hits to order by; the report shows what the cache spared. Without the option the embedded
workload runs as before."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402

# 300 requests at 100 req/s on 8 slots: a queue forms while the roots arrive.
PREFIX = ["--workload", "prefix-heavy", "--requests", "300", "--rate", "100", "-B", "8"]
PREFIX += ["--max-input-length", "8192"]
UNCACHED = ["--admission", "uncached-first", "--starvation-seconds", "10"]


def _invoke(*args: str):
    return CliRunner(env={"COLUMNS": "160"}).invoke(
        main, list(args), prog_name="stepplanner", catch_exceptions=False
    )


def _json(*args: str):
    result = _invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _refused(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {message}\n"


def test_the_option_selects_the_prefix_heavy_workload_and_its_cache() -> None:
    report = _json("simulate", *PREFIX)
    assert (
        report["workload"]["source"] == "prefix-heavy(requests=300, rate=100/s, seed=0; 150 roots)"
    )
    cache = report["prefix_cache"]
    assert 0 < cache["cached_tokens"] < cache["prompt_tokens"]
    assert cache["cached_share"] == pytest.approx(cache["cached_tokens"] / cache["prompt_tokens"])
    assert cache["late_hits"] >= 0
    text = _invoke("simulate", *PREFIX, "--no-progress").output
    assert "prefix-heavy(requests=300" in text
    assert f"prefix cache {cache['cached_tokens']:,} of {cache['prompt_tokens']:,} prompt" in text


def _mean_ttft(*args: str) -> float:
    return float(_json("simulate", *PREFIX, *args)["vllm_metrics"]["mean_ttft_ms"])


def test_uncached_first_orders_by_the_work_the_cache_leaves() -> None:
    """Chat on a cached system prompt leaves little to compute: admitted first, the mean TTFT
    falls below arrival order's, and the 10 s bound still caps the longest wait."""
    arrival = _mean_ttft()
    report = _json("simulate", *PREFIX, *UNCACHED)
    assert report["queue"]["admission"] == "uncached_first"
    assert report["vllm_metrics"]["mean_ttft_ms"] < 0.9 * arrival
    assert report["queue"]["longest_wait_s"] < 10.5


def test_the_peers_orders_run_on_it_and_order_by_hits() -> None:
    """vLLM's window (deepest cached prefix first) is no longer arrival order once there are
    hits; SGLang's HRRN lowers the mean TTFT."""
    arrival = _mean_ttft()
    window = _json("simulate", *PREFIX, "--peer-order", "vllm-cache-window")
    hrrn = _json("simulate", *PREFIX, "--peer-order", "sglang-hrrn")
    assert window["queue"]["peer_order"] == "vllm-cache-window"
    assert window["prefix_cache"]["cached_tokens"] > 0
    assert window["vllm_metrics"]["mean_ttft_ms"] != pytest.approx(arrival)
    assert hrrn["vllm_metrics"]["mean_ttft_ms"] < arrival


def test_compare_shows_the_cache_in_its_table_and_json() -> None:
    csv = _invoke("compare", *PREFIX, "--config", "name=fcfs", "--format", "csv", "--no-progress")
    header, row = csv.output.splitlines()
    assert header.endswith(",prompt cached,late hits")
    assert row.startswith("fcfs,") and "%," in row
    (report,) = _json("compare", *PREFIX, "--config", "name=fcfs", *UNCACHED)
    assert report["prefix_cache"]["cached_tokens"] > 0
    assert report["queue"]["admission"] == "uncached_first"


def test_compare_load_draws_the_workload_at_each_rate() -> None:
    """--load: the same requests drawn at each rate (a session's turns still seconds apart),
    saturation counting each prompt less its hit."""
    args = ["--workload", "prefix-heavy", "--requests", "120", "--max-input-length", "8192"]
    doc = _json("compare", *args, "--config", "name=fcfs", "--load", "0.5,1")
    assert [g["load"] for g in doc["loads"]] == [0.5, 1.0]
    sources = [g["reports"][0]["workload"]["source"] for g in doc["loads"]]
    rate = doc["saturation_rps"]
    assert sources[0].startswith(f"prefix-heavy(requests=120, rate={0.5 * rate:g}/s")
    assert sources[1].endswith("at 1x saturation")
    assert all(g["reports"][0]["prefix_cache"]["cached_tokens"] > 0 for g in doc["loads"])
    text = _invoke("compare", *args, "--config", "name=fcfs", "--load", "1", "--no-progress")
    assert "prompt tokens cached" in text.output


def test_sweep_runs_every_point_with_the_cache() -> None:
    doc = _json("sweep", *PREFIX, "--grid", "max_num_tokens=256,512", "--workers", "1")
    assert len(doc["results"]) == 2
    assert all(r["prefix_cache"]["cached_tokens"] > 0 for r in doc["results"])
    text = _invoke("sweep", *PREFIX, "--grid", "max_num_tokens=256", "--workers", "1")
    assert "prompt" in text.output and "late" in text.output


@pytest.mark.parametrize("command", ["simulate", "compare", "sweep"])
@pytest.mark.parametrize("name", ["prefix-heavy", "embedded"])
def test_a_workload_and_a_trace_are_refused_together(command: str, name: str, tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,10,5\n")
    _refused(
        _invoke(command, "--workload", name, "--trace", str(trace)),
        f"--workload {name} draws a synthetic workload and --trace {trace} reads one from a "
        "file; give one of them",
    )


@pytest.mark.parametrize("command", ["simulate", "compare", "sweep"])
def test_burstiness_is_refused_with_the_prefix_heavy_workload(command: str) -> None:
    _refused(
        _invoke(command, "--workload", "prefix-heavy", "--requests", "20", "--burstiness", "0.5"),
        "--burstiness 0.5 shapes the embedded workload's gaps; --workload prefix-heavy draws "
        "Poisson roots and sessions' turns seconds apart; allowed: --burstiness 1",
    )


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_a_page_pool_is_refused_beside_the_prefix_cache(command: str) -> None:
    _refused(
        _invoke(command, *PREFIX[:4], "--max-input-length", "8192", "--num-pages", "5000"),
        "--num-pages=5000 with --workload prefix-heavy: a prefix cache beside a KV page pool is "
        "not simulated; allowed: --num-pages=0 (unlimited pages)",
    )
    _refused(
        _invoke("compare", *PREFIX[:4], "--max-input-length", "8192", "--config", "num_pages=5000"),
        "config 'num_pages=5000': num_pages=5000 with --workload prefix-heavy: a prefix cache "
        "beside a KV page pool is not simulated; allowed: num_pages=0 (unlimited pages)",
    )


def _without_timings(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "planner"}


def test_the_embedded_workload_is_unchanged_without_the_option() -> None:
    """No --workload is --workload embedded: the same run, and no prefix cache in the report."""
    args = ["simulate", "--requests", "300", "--rate", "40"]
    default, embedded = _json(*args), _json(*args, "--workload", "embedded")
    assert _without_timings(default) == _without_timings(embedded)
    assert default["workload"]["source"] == "synthetic(requests=300, rate=40/s, seed=0)"
    assert "prefix_cache" not in default
    assert "prefix cache" not in _invoke(*args, "--no-progress").output
