"""Every ``stepplanner`` command through click's CliRunner."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402
from stepplanner.workloads import sample_trace_path  # noqa: E402

SMALL = ["--requests", "200", "--rate", "40", "-B", "32", "--max-input-length", "4096",
         "--no-progress"]
SPEC_EXAMPLE_TWO = {
    "limits": {"max_batch_size": 4, "max_input_length": 64, "kv_page_size": 16},
    "options": {"mode": "mixed", "max_num_tokens": 52, "max_chunk_tokens": 32,
                "policy": "priority", "preemption": "pause"},
    "residents": [
        {"priority": 1, "arrival": 0, "prompt_length": 40, "committed": 41,
         "context_committed": True},
        {"priority": 0, "arrival": 5, "prompt_length": 60, "committed": 0},
        {"priority": 2, "arrival": 2, "prompt_length": 20, "committed": 0},
        {"priority": 1, "arrival": 3, "prompt_length": 50, "committed": 50,
         "context_committed": True},
    ],
}


def _invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_simulate_json_report() -> None:
    result = _invoke("simulate", *SMALL, "--policy", "priority", "--preemption", "pause",
                     "--max-pause-steps", "8", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["requests"]["completed"] == 200
    assert report["policy"]["scheduling_policy"] == "PRIORITY"
    assert report["policy"]["max_pause_steps"] == 8
    assert report["steps"]["count"] > 0 and report["planner"]["steps_per_s"] > 0


def test_simulate_text_report_on_the_sample_trace() -> None:
    result = _invoke("simulate", "--trace", str(sample_trace_path()), "--no-progress",
                     "--latency", "a=0.003")
    assert result.exit_code == 0, result.output
    for text in ("300/300 completed", "latency by priority class", "steps/s", "a=0.003",
                 "1 batch", "TTFT p99"):
        assert text in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--max-num-tokens", "5"], "max_num_tokens=5 is out of range"),
    (["--priority-reserved-slots", "32"], "priority_reserved_slots=32"),
    (["--latency", "q=1"], "latency item 'q=1' is not known"),
])
def test_simulate_bad_configuration_is_a_one_line_error(args: list[str], message: str) -> None:
    result = _invoke("simulate", *SMALL, *args)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.limits_address_space
def test_simulate_with_a_batch_too_large_for_memory_is_a_one_line_error() -> None:
    """The planner sizes its buffers for B up front; under a capped address space that fails
    on any machine, and the CLI says so in one line rather than a traceback."""
    proc = subprocess.run([sys.executable, "-c", (
        "import resource, sys; from stepplanner.cli import main; "
        "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY)); "
        "main(sys.argv[1:])"), "simulate", "--requests", "5", "-B", str(2**26),
        "--max-input-length", "16", "--kv-page-size", "16"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Error: max_batch_size=67108864 needs" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_simulate_plot_without_matplotlib_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = _invoke("simulate", *SMALL, "--plot", "out.png")
    assert result.exit_code == 1
    assert "pip install 'stepplanner[plot]'" in result.output


def test_compare_configs_side_by_side_as_json() -> None:
    result = _invoke("compare", *SMALL, "--config", "name=base,policy=fcfs",
                     "--config", "policy=priority,preemption=pause,max_num_tokens=1024", "--json")
    assert result.exit_code == 0, result.output
    reports = json.loads(result.output)
    assert [r["name"] for r in reports] == [
        "base", "policy=priority, preemption=pause, max_num_tokens=1024"]
    assert reports[1]["policy"]["max_num_tokens"] == 1024
    assert reports[0]["workload"] == reports[1]["workload"]  # one workload for all


def test_compare_defaults_and_config_file(tmp_path: pathlib.Path) -> None:
    result = _invoke("compare", *SMALL)
    assert result.exit_code == 0, result.output
    for name in ("fcfs", "priority", "priority+pause", "TTFT p99"):
        assert name in result.output
    path = tmp_path / "configs.json"
    path.write_text(json.dumps([{"name": "a", "mode": "prefill_first"},
                                {"name": "b", "max_batch_size": 16}]))
    result = _invoke("compare", *SMALL, "--config-file", str(path), "--json")
    reports = json.loads(result.output)
    assert reports[0]["policy"]["mode"] == "PREFILL_FIRST"
    assert reports[1]["limits"]["max_batch_size"] == 16


def test_compare_rejects_an_unknown_key_before_running() -> None:
    result = _invoke("compare", *SMALL, "--config", "policy=fcfs", "--config", "polcy=x")
    assert result.exit_code == 1
    assert "config key 'polcy' is not known" in result.output


def test_explain_spec_example_json() -> None:
    result = _invoke("explain", "-", "--json", input=json.dumps(SPEC_EXAMPLE_TWO))
    assert result.exit_code == 0, result.output
    e = json.loads(result.output)
    assert e["plan"]["paused"] == [0, 2, 3]
    assert e["plan"]["sequences"] == [{"resident": 1, "work": "CONTEXT", "past_length": 0,
                                       "query_length": 60, "select_last_token_logits": True}]
    assert [r["reason"] for r in e["residents"]] == ["PAUSED", "CHUNK_FINAL", "PAUSED", "PAUSED"]
    rules = {row["field"]: row["rule"] for row in e["policy"]}
    assert rules["max_num_tokens"].startswith("rule 3: given")


def test_explain_names_the_rule_of_each_default_budget(tmp_path: pathlib.Path) -> None:
    ledger = {"limits": {"max_batch_size": 8, "max_input_length": 300, "kv_page_size": 32},
              "residents": [{"prompt_length": 300}, {"prompt_length": 10, "committed": 10,
                                                     "context_committed": True}]}
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(ledger))
    result = _invoke("explain", str(path))
    assert result.exit_code == 0, result.output
    assert "rule 2: AUTO -> MIXED because rd(T_max)=2400 >= B+P=40" in result.output
    assert "rule 3: default min(ru(512+B), rd(T_max)) = min(544, 2400)" in result.output
    assert "capped at max(P, rd(S_in)) = 288" in result.output
    assert "CHUNK" in result.output and "DECODE" in result.output


def test_max_step_tokens_bounds_every_step_and_explain_says_so(tmp_path: pathlib.Path) -> None:
    result = _invoke("simulate", *SMALL, "--max-step-tokens", "2048", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["limits"]["max_step_tokens"] == 2048
    assert report["requests"]["completed"] == 200
    ledger = {"limits": {"max_batch_size": 8, "max_input_length": 300, "kv_page_size": 32,
                         "max_step_tokens": 64},
              "options": {"mode": "prefill_first"},
              "residents": [{"prompt_length": 300}]}
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(ledger))
    result = _invoke("explain", str(path), "--json")
    assert result.exit_code == 0, result.output
    e = json.loads(result.output)
    rules = {row["field"]: row["rule"] for row in e["policy"]}
    assert rules["max_num_tokens"] == ("rule 4: PREFILL_FIRST uses T_max = min(B*S_in, "
                                       "max_step_tokens) = min(2400, 64) = 64")
    assert e["plan"]["sequences"][0]["query_length"] == 64


@pytest.mark.parametrize(("doc", "message"), [
    ("{not json", "not valid JSON"),
    ('{"residents": 3}', 'expected an object with a "residents" list'),
    ('{"residents": [], "extra": 1}', "unknown key(s) ['extra']"),
    ('{"residents": [{"committed": -1, "prompt_length": 5}]}', "committed=-1 is negative"),
])
def test_explain_bad_ledgers(doc: str, message: str) -> None:
    result = _invoke("explain", "-", input=doc)
    assert result.exit_code == 1
    assert message in result.output


def test_record_replay_round_trip_and_tampering(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "steps.jsonl"
    result = _invoke("record", str(path), *SMALL, "--policy", "priority", "--max-steps", "120")
    assert result.exit_code == 0, result.output
    assert "recorded 120 steps" in result.output
    result = _invoke("replay", str(path))
    assert result.exit_code == 0 and "every plan matches" in result.output
    lines = path.read_text().splitlines()
    record = json.loads(lines[40])
    record["plan"]["paused"] = [0]
    lines[40] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    result = _invoke("replay", str(path))
    assert result.exit_code == 1
    assert "1 differ" in result.output and "paused: recorded [0], replayed []" in result.output
    result = _invoke("replay", str(path), "--json")
    assert json.loads(result.output)["differing_steps"] == 1


def test_replay_under_another_policy_shows_what_would_change(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "steps.jsonl"
    _invoke("record", str(path), *SMALL, "--max-steps", "60")
    result = _invoke("replay", str(path), "--config", "max_num_tokens=64", "--json")
    assert result.exit_code == 1
    out = json.loads(result.output)
    assert out["policy"]["max_num_tokens"] == 64 and out["differing_steps"] > 0


def test_bench_forwards_its_arguments() -> None:
    result = _invoke("bench", "--help")
    assert result.exit_code == 0
    assert "--batch-sizes" in result.output


def test_bench_missing_module_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "stepplanner.bench", None)
    result = _invoke("bench", "--batch-sizes", "8")
    assert result.exit_code == 1
    assert "stepplanner.bench is missing" in result.output


def test_python_dash_m_runs_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "stepplanner", "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0
    for command in ("simulate", "compare", "explain", "record", "replay", "bench"):
        assert command in proc.stdout
