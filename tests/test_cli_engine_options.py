"""``--max-step-time`` and ``--kv-preemption`` on ``simulate``, ``compare`` and ``sweep``: the
step-time budget and KV-pressure preemption from the command line, their report sections and
their refusals (exit status 2, naming the flag and the value)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402

# 200 requests at 40/s on B=32 with a pool of 300 pages: the residents' KV outgrows it.
SMALL = ["--requests", "200", "--rate", "40", "-B", "32", "--max-input-length", "4096"]
POOL = ["--num-pages", "300"]


def invoke(*args: str):
    return CliRunner().invoke(main, [*args, "--no-progress"], catch_exceptions=False)


def as_json(*args: str):
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_simulate_reports_preemption_and_recomputed_tokens():
    vllm = as_json("simulate", *SMALL, *POOL, "--kv-preemption", "vllm")["preemption"]
    least = as_json("simulate", *SMALL, *POOL, "--kv-preemption", "least-work")["preemption"]
    assert vllm["victim_rule"] == "vllm" and least["victim_rule"] == "least-work"
    assert vllm["preemptions"] > 0 and least["preemptions"] > 0
    assert least["recomputed_tokens"] < vllm["recomputed_tokens"]
    table = invoke("simulate", *SMALL, *POOL, "--kv-preemption", "least-work")
    assert table.exit_code == 0
    assert f"{least['recomputed_tokens']:,} computed tokens recomputed" in table.output
    assert "taken as KV grows" in table.output
    plain = as_json("simulate", *SMALL, *POOL)
    assert "preemption" not in plain


def test_simulate_step_time_budget_shortens_mixed_steps():
    base = ["simulate", "--requests", "300", "--rate", "100", "--max-num-tokens", "2048"]
    plain = as_json(*base)["steps"]
    capped = as_json(*base, "--max-step-time", "8ms")["steps"]
    assert capped["mean_tokens"] < plain["mean_tokens"]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--kv-preemption", "vllm"], "--kv-preemption vllm preempts when KV pages run out"),
        (["--max-step-time", "0ms"], "--max-step-time='0ms' is not a step time"),
        (["--max-step-time", "fast"], "--max-step-time='fast' is not a step time"),
        (["--mode", "prefill_first", "--max-step-time", "20ms"], "needs the MIXED mode"),
    ],
)
def test_bad_flags_are_refused_naming_them(args, text):
    result = invoke("simulate", "--requests", "20", *args)
    assert result.exit_code == 2
    assert text in result.output


def test_compare_takes_them_per_configuration():
    reports = as_json(
        "compare",
        *SMALL,
        "--config",
        "name=vllm,num_pages=300,kv_preemption=vllm",
        "--config",
        "name=least,num_pages=300,kv_preemption=least-work",
        "--config",
        "name=capped,max_step_time=10ms",
    )
    by = {r["name"]: r for r in reports}
    assert (
        by["least"]["preemption"]["recomputed_tokens"]
        < (by["vllm"]["preemption"]["recomputed_tokens"])
    )
    assert "preemption" not in by["capped"]
    table = invoke(
        "compare", *SMALL, "--config", "name=least,num_pages=300,kv_preemption=least-work"
    )
    assert table.exit_code == 0 and "recomputed" in table.output
    bad = invoke("compare", *SMALL, "--config", "name=x,kv_preemption=vllm")
    assert bad.exit_code == 2 and "config 'x': kv_preemption=vllm" in bad.output
    bad = invoke("compare", *SMALL, "--config", "name=y,num_pages=300,kv_preemption=lru")
    assert bad.exit_code == 2 and "kv_preemption='lru' is not a victim rule" in bad.output


def test_sweep_runs_every_point_with_them():
    records = as_json(
        "sweep", *SMALL, *POOL, "--kv-preemption", "least-work", "--grid", "policy=fcfs,priority"
    )
    assert len(records["results"]) == 2
    assert all(r["recomputed_tokens"] > 0 for r in records["results"])
    capped = as_json(
        "sweep",
        "--requests",
        "100",
        "--max-step-time",
        "20ms",
        "--grid",
        "mode=mixed,prefill_first",
    )
    errors = [r for r in capped["results"] if r.get("error")]
    assert len(errors) == 1 and "needs the MIXED mode" in errors[0]["error"]
