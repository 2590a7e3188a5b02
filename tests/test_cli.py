"""Every ``stepplanner`` command through click's CliRunner."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner import StepPlannerError, _errors  # noqa: E402
from stepplanner.cli import main  # noqa: E402
from stepplanner.sim.traces import sample_trace_path  # noqa: E402

SMALL = [
    "--requests",
    "200",
    "--rate",
    "40",
    "-B",
    "32",
    "--max-input-length",
    "4096",
    "--no-progress",
]
SPEC_EXAMPLE_TWO = {
    "limits": {"max_batch_size": 4, "max_input_length": 64, "kv_page_size": 16},
    "options": {
        "mode": "mixed",
        "max_num_tokens": 52,
        "max_chunk_tokens": 32,
        "policy": "priority",
        "preemption": "pause",
    },
    "residents": [
        {
            "priority": 1,
            "arrival": 0,
            "prompt_length": 40,
            "committed": 41,
            "context_committed": True,
        },
        {"priority": 0, "arrival": 5, "prompt_length": 60, "committed": 0},
        {"priority": 2, "arrival": 2, "prompt_length": 20, "committed": 0},
        {
            "priority": 1,
            "arrival": 3,
            "prompt_length": 50,
            "committed": 50,
            "context_committed": True,
        },
    ],
}


def _invoke(*args: str, input: str | None = None):
    # The width reports get when nothing says otherwise (render.console): a COLUMNS exported by
    # the shell running the tests must not rewrap the tables the assertions read.
    return CliRunner(env={"COLUMNS": "160"}).invoke(
        main, list(args), input=input, catch_exceptions=False
    )


def test_simulate_json_report() -> None:
    result = _invoke(
        "simulate",
        *SMALL,
        "--policy",
        "priority",
        "--preemption",
        "pause",
        "--max-pause-steps",
        "8",
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["requests"]["completed"] == 200
    assert report["policy"]["scheduling_policy"] == "PRIORITY"
    assert report["policy"]["max_pause_steps"] == 8
    assert report["steps"]["count"] > 0 and report["planner"]["steps_per_s"] > 0


def test_simulate_text_report_on_the_sample_trace() -> None:
    result = _invoke(
        "simulate", "--trace", str(sample_trace_path()), "--no-progress", "--latency", "a=0.003"
    )
    assert result.exit_code == 0, result.output
    for text in (
        "300/300 completed",
        "latency by priority class",
        "steps/s",
        "a=0.003",
        "1 batch",
        "TTFT p99",
    ):
        assert text in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-num-tokens", "5"], "max_num_tokens=5 is out of range"),
        (["--priority-reserved-slots", "32"], "priority_reserved_slots=32"),
        (["--latency", "q=1"], "latency item 'q=1' is not known"),
    ],
)
def test_simulate_bad_configuration_is_a_one_line_error(args: list[str], message: str) -> None:
    result = _invoke("simulate", *SMALL, *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.limits_address_space
def test_simulate_with_a_batch_too_large_for_memory_is_a_one_line_error() -> None:
    """The planner sizes its buffers for B up front; under a capped address space that fails
    on any machine, and the CLI says so in one line before anything is allocated (exit 2: the
    command line asked for more than the machine holds), rather than a traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import resource, sys; from stepplanner.cli import main; "
                "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY)); "
                "main(sys.argv[1:])"
            ),
            "simulate",
            "--requests",
            "5",
            "-B",
            str(2**26),
            "--max-input-length",
            "16",
            "--kv-page-size",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert line.startswith("Error: max_batch_size=67108864 is out of range; allowed: 1.."), line
    assert line.endswith(" GiB of available memory holds at about 512 bytes each)"), line
    assert "\n" not in line


def test_simulate_plot_without_matplotlib_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = _invoke("simulate", *SMALL, "--plot", "out.png")
    assert result.exit_code == 1
    assert result.output == (
        "Error: --plot needs matplotlib, which is not installed; install it with: "
        "pip install 'matplotlib>=3.7'\n"
    )


def test_compare_configs_side_by_side_as_json() -> None:
    result = _invoke(
        "compare",
        *SMALL,
        "--config",
        "name=base,policy=fcfs",
        "--config",
        "policy=priority,preemption=pause,max_num_tokens=1024",
        "--json",
    )
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)
    assert [r["name"] for r in reports] == [
        "base",
        "policy=priority, preemption=pause, max_num_tokens=1024",
    ]
    assert reports[1]["policy"]["max_num_tokens"] == 1024
    assert reports[0]["workload"] == reports[1]["workload"]  # one workload for all


def test_compare_defaults_and_config_file(tmp_path: pathlib.Path) -> None:
    result = _invoke("compare", *SMALL)
    assert result.exit_code == 0, result.output
    for name in ("fcfs", "priority", "priority+pause", "TTFT p99"):
        assert name in result.output
    path = tmp_path / "configs.json"
    path.write_text(
        json.dumps([{"name": "a", "mode": "prefill_first"}, {"name": "b", "max_batch_size": 16}])
    )
    result = _invoke("compare", *SMALL, "--config-file", str(path), "--json")
    reports = json.loads(result.stdout)
    assert reports[0]["policy"]["mode"] == "PREFILL_FIRST"
    assert reports[1]["limits"]["max_batch_size"] == 16


def test_compare_rejects_an_unknown_key_before_running() -> None:
    result = _invoke("compare", *SMALL, "--config", "policy=fcfs", "--config", "polcy=x")
    assert result.exit_code == 2
    assert "config key 'polcy' is not known" in result.output


def test_explain_spec_example_json() -> None:
    result = _invoke("explain", "-", "--json", input=json.dumps(SPEC_EXAMPLE_TWO))
    assert result.exit_code == 0, result.output
    e = json.loads(result.stdout)
    assert e["plan"]["paused"] == [0, 2, 3]
    assert e["plan"]["sequences"] == [
        {
            "resident": 1,
            "work": "CONTEXT",
            "past_length": 0,
            "query_length": 60,
            "select_last_token_logits": True,
        }
    ]
    assert [r["reason"] for r in e["residents"]] == ["PAUSED", "CHUNK_FINAL", "PAUSED", "PAUSED"]
    rules = {row["field"]: row["rule"] for row in e["policy"]}
    assert rules["max_num_tokens"].startswith("rule 3: given")


def test_explain_names_the_rule_of_each_default_budget(tmp_path: pathlib.Path) -> None:
    ledger = {
        "limits": {"max_batch_size": 8, "max_input_length": 300, "kv_page_size": 32},
        "residents": [
            {"prompt_length": 300},
            {"prompt_length": 10, "committed": 10, "context_committed": True},
        ],
    }
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
    report = json.loads(result.stdout)
    assert report["limits"]["max_step_tokens"] == 2048
    assert report["requests"]["completed"] == 200
    ledger = {
        "limits": {
            "max_batch_size": 8,
            "max_input_length": 300,
            "kv_page_size": 32,
            "max_step_tokens": 64,
        },
        "options": {"mode": "prefill_first"},
        "residents": [{"prompt_length": 300}],
    }
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(ledger))
    result = _invoke("explain", str(path), "--json")
    assert result.exit_code == 0, result.output
    e = json.loads(result.stdout)
    rules = {row["field"]: row["rule"] for row in e["policy"]}
    assert rules["max_num_tokens"] == (
        "rule 4: PREFILL_FIRST uses T_max = min(B*S_in, max_step_tokens) = min(2400, 64) = 64"
    )
    assert e["plan"]["sequences"][0]["query_length"] == 64


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"residents": 3}', 'expected an object with a "residents" list'),
        ('{"residents": [], "extra": 1}', "unknown key(s) ['extra']"),
        ('{"residents": [{"committed": -1, "prompt_length": 5}]}', "committed=-1 is negative"),
    ],
)
def test_explain_bad_ledgers(doc: str, message: str) -> None:
    result = _invoke("explain", "-", input=doc)
    assert result.exit_code == 2
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
    assert json.loads(result.stdout)["differing_steps"] == 1


def test_replay_under_another_policy_shows_what_would_change(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "steps.jsonl"
    _invoke("record", str(path), *SMALL, "--max-steps", "60")
    result = _invoke("replay", str(path), "--config", "max_num_tokens=64", "--json")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
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
    proc = subprocess.run(
        [sys.executable, "-m", "stepplanner", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    for command in ("simulate", "compare", "explain", "record", "replay", "bench"):
        assert command in proc.stdout


# --- errors and exit codes -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--rate", "0"],  # refused by click's own range check
        ["-B", "0"],  # refused by StepPlannerLimits
        ["--max-num-tokens", "5"],  # refused by resolve_scheduling_policy
        ["--latency", "q=1"],  # refused by LatencyModel.parse
    ],
)
def test_a_usage_mistake_exits_2_whoever_catches_it(args: list[str]) -> None:
    result = _invoke("simulate", *SMALL, *args)
    assert result.exit_code == 2, result.output
    assert "Error" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "bug",
    [
        TypeError("internal: a bad operand"),
        ValueError("internal: numpy said no"),
        MemoryError("internal"),
        RuntimeError("internal"),
    ],
)
def test_a_bug_keeps_its_traceback(monkeypatch, bug) -> None:
    """Only the library's own validation errors (a StepPlannerError) become one-line messages;
    a plain builtin exception is a bug and propagates unchanged, whatever file raised it."""
    import stepplanner.cli.simulate as simulate_module

    def broken(*args, **kwargs):
        raise bug

    monkeypatch.setattr(simulate_module, "run", broken)
    with pytest.raises(type(bug), match="internal"):
        _invoke("simulate", *SMALL)


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (_errors.out_of_range("max_batch_size", 0, ">= 1"), 2),
        (_errors.wrong_type("latency", "LatencyModel", 3), 2),
        (_errors.out_of_int32("committed", 2**40), 2),
        (_errors.planner_memory(2**30, 2**40), 1),
    ],
)
def test_a_library_error_is_one_line(monkeypatch, error, exit_code) -> None:
    import stepplanner.cli.simulate as simulate_module

    assert isinstance(error, StepPlannerError)
    assert isinstance(error, (ValueError, TypeError, OverflowError, MemoryError))

    def refused(*args, **kwargs):
        raise error

    monkeypatch.setattr(simulate_module, "run", refused)
    result = _invoke("simulate", *SMALL)
    assert result.exit_code == exit_code
    assert result.output.strip() == f"Error: {error}"


def test_a_runtime_error_of_the_library_keeps_its_traceback(monkeypatch) -> None:
    """A StepPlannerRuntimeError is the API used against its contract: a bug in the caller
    (here the CLI), never something a command line causes."""
    import stepplanner.cli.simulate as simulate_module

    def misused(*args, **kwargs):
        raise _errors.plan_reentered()

    monkeypatch.setattr(simulate_module, "run", misused)
    with pytest.raises(RuntimeError, match="re-entered"):
        _invoke("simulate", *SMALL)


# --- replay --config -------------------------------------------------------------------------


def _record(tmp_path: pathlib.Path, *args: str) -> pathlib.Path:
    path = tmp_path / "steps.jsonl"
    result = _invoke("record", str(path), *SMALL, "--max-steps", "150", *args)
    assert result.exit_code == 0, result.output
    return path


def test_replay_config_keeps_the_recorded_budgets(tmp_path: pathlib.Path) -> None:
    """Changing one field re-plans with every other recorded field, budgets included: a
    priority-free change to max_pause_steps replays identically."""
    path = _record(tmp_path, "--max-num-tokens", "1024", "--max-chunk-tokens", "256")
    result = _invoke("replay", str(path), "--config", "max_pause_steps=3", "--json")
    out = json.loads(result.stdout)
    assert (out["policy"]["max_num_tokens"], out["policy"]["max_chunk_tokens"]) == (1024, 256)
    assert out["differing_steps"] == 0 and result.exit_code == 0


def test_replay_config_keeps_the_recorded_mode(tmp_path: pathlib.Path) -> None:
    path = _record(tmp_path, "--mode", "prefill_first")
    result = _invoke("replay", str(path), "--config", "max_pause_steps=3", "--json")
    out = json.loads(result.stdout)
    assert out["policy"]["mode"] == "PREFILL_FIRST" and out["differing_steps"] == 0


def test_replay_config_naming_the_budget_rederives_the_chunk(tmp_path: pathlib.Path) -> None:
    path = _record(tmp_path, "--max-num-tokens", "1024", "--max-chunk-tokens", "256")
    out = json.loads(_invoke("replay", str(path), "--config", "max_num_tokens=96", "--json").stdout)
    assert (out["policy"]["max_num_tokens"], out["policy"]["max_chunk_tokens"]) == (96, 64)
    out = json.loads(_invoke("replay", str(path), "--config", "mode=mixed", "--json").stdout)
    assert out["policy"]["max_num_tokens"] != 1024  # the SPEC §2 default again


@pytest.mark.parametrize("key", ["max-pause-steps", "max_pause_steps", "Max-Pause-Steps"])
def test_config_keys_take_dashes_as_the_flags_do(key: str) -> None:
    result = _invoke("compare", *SMALL, "--config", f"policy=priority,{key}=4", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["policy"]["max_pause_steps"] == 4


def test_bench_usage_names_the_command_it_was_run_as() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stepplanner.bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: python -m stepplanner.bench")
    result = CliRunner().invoke(main, ["bench", "--help"], prog_name="stepplanner")
    assert result.output.startswith("Usage: stepplanner bench [OPTIONS]")


# --- output formats and widths ---------------------------------------------------------------


LONG_NAME = "priority+pause with a long descriptive name"


def _invoke_at(width: int, *args: str) -> str:
    result = CliRunner(env={"COLUMNS": str(width)}).invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _ms_texts(report: dict) -> list[str]:
    """Every latency of a report as the table writes it (ms, one decimal)."""
    return [
        f"{lat[metric][q] * 1e3:,.1f}"
        for lat in report["latency_s"].values()
        for metric, q in (("ttft", "p99"), ("e2e", "p99"), ("tpot", "p99"))
    ]


@pytest.mark.parametrize("width", [80, 120])
def test_simulate_table_never_cuts_a_number(width: int) -> None:
    report = json.loads(_invoke("simulate", *SMALL, "--json").stdout)
    out = _invoke_at(width, "simulate", *SMALL)
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width
    for text in _ms_texts(report):
        assert text in out


@pytest.mark.parametrize("width", [80, 120])
def test_compare_table_never_cuts_a_number_or_a_name(width: int) -> None:
    configs = [
        "--config",
        f"name={LONG_NAME},policy=priority,preemption=pause",
        "--config",
        "name=fcfs",
    ]
    reports = json.loads(_invoke("compare", *SMALL, *configs, "--json").stdout)
    out = _invoke_at(width, "compare", *SMALL, *configs)
    assert "…" not in out and LONG_NAME in out.splitlines()
    for report in reports:
        assert f"{report['latency_s']['all']['ttft']['p99'] * 1e3:,.1f}" in out


def test_a_wide_console_keeps_the_grid() -> None:
    out = _invoke_at(200, "simulate", *SMALL)
    assert "┃ class" in out and "TTFT p99" in out


def test_compare_as_csv_and_markdown() -> None:
    import csv
    import io

    configs = ["--config", f"name={LONG_NAME},policy=priority", "--config", "name=fcfs"]
    reports = json.loads(_invoke("compare", *SMALL, *configs, "--json").stdout)
    rows = list(
        csv.DictReader(io.StringIO(_invoke("compare", *SMALL, *configs, "--format", "csv").output))
    )
    assert [r["configuration"] for r in rows] == [LONG_NAME, "fcfs"]
    for row, report in zip(rows, reports):
        assert float(row["TTFT p99"]) == pytest.approx(
            report["latency_s"]["all"]["ttft"]["p99"] * 1e3, abs=0.05
        )
        assert row["budget/chunk"] == "{max_num_tokens}/{max_chunk_tokens}".format(
            **report["policy"]
        )
    md = _invoke("compare", *SMALL, *configs, "--format", "md").output
    assert f"| {LONG_NAME} |" in md and "|---|---:|" in md


def test_explain_as_csv_lists_the_residents() -> None:
    out = _invoke("explain", "-", "--format", "csv", input=json.dumps(SPEC_EXAMPLE_TWO)).output
    lines = out.splitlines()
    assert lines[0].startswith("#,request,prio") and len(lines) == 1 + 4
    assert "CHUNK_FINAL" in lines[2]


# --- warnings ----------------------------------------------------------------------------------


def _stderr_of(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_pause_under_fcfs_warns_once_on_stderr() -> None:
    code, out, err = _stderr_of("simulate", *SMALL, "--preemption", "pause", "--json")
    assert code == 0 and json.loads(out)  # stdout stays the report
    assert err.count("warning: preemption=PAUSE pauses nothing under MIXED + FCFS") == 1


def test_prefill_first_budget_replacement_warns() -> None:
    code, _, err = _stderr_of(
        "simulate", *SMALL, "--mode", "prefill_first", "--max-num-tokens", "1024"
    )
    assert code == 0
    assert "max_num_tokens=1024 is replaced by T_max=131072 under PREFILL_FIRST" in err


def test_a_useful_configuration_warns_nothing() -> None:
    _, _, err = _stderr_of(
        "simulate",
        *SMALL,
        "--policy",
        "priority",
        "--preemption",
        "pause",
        "--max-pause-steps",
        "8",
    )
    assert "warning" not in err


def test_compare_names_the_configuration_a_warning_is_about() -> None:
    _, _, err = _stderr_of(
        "compare", *SMALL, "--config", "name=odd,preemption=pause", "--config", "name=fine"
    )
    assert "warning: odd: preemption=PAUSE" in err and "fine:" not in err


def test_refused_requests_are_named_with_the_rule() -> None:
    code, _, err = _stderr_of(
        "simulate", "--requests", "50", "--max-input-length", "100", "--no-progress"
    )
    assert code == 0
    assert (
        "of 50 requests refused at submission: a prompt longer than max_input_length "
        "(S_in=100)" in err
    )
    assert "#0 (" in err and "more" in err
    assert err.count("warning:") == 1


def test_record_says_when_its_default_step_limit_stopped_it(tmp_path: pathlib.Path) -> None:
    result = CliRunner().invoke(
        main,
        ["record", str(tmp_path / "r.jsonl"), "--requests", "3000", "--no-progress"],
        catch_exceptions=False,
    )
    assert "warning: stopped at the default limit of 2,000 steps" in result.stderr
    result = CliRunner().invoke(
        main,
        ["record", str(tmp_path / "r.jsonl"), *SMALL, "--max-steps", "50"],
        catch_exceptions=False,
    )
    assert "warning" not in result.stderr  # a limit the user gave is no surprise
    help_text = " ".join(_invoke("record", "--help").output.split())
    assert "default: 2000" in help_text


@pytest.mark.parametrize(
    ("residents", "tokens", "rule"),
    [
        (
            [
                {"prompt_length": 300},
                {"prompt_length": 10, "committed": 10, "context_committed": True},
            ],
            544,
            "max_num_tokens: a MIXED step with decode rows (1)",
        ),
        ([{"prompt_length": 300}], 2400, "T_max = B*S_in = 2400: a MIXED step without decode rows"),
    ],
)
def test_explain_shows_the_step_budget_that_applied(residents, tokens, rule) -> None:
    ledger = {
        "limits": {"max_batch_size": 8, "max_input_length": 300, "kv_page_size": 32},
        "residents": residents,
    }
    e = json.loads(_invoke("explain", "-", "--json", input=json.dumps(ledger)).stdout)
    assert e["step_budget"]["tokens"] == tokens and e["step_budget"]["rule"].startswith(rule)
    out = _invoke("explain", "-", input=json.dumps(ledger)).stdout
    assert f"step budget {tokens} tokens" in " ".join(out.split())


def test_help_says_what_the_step_budget_really_is() -> None:
    text = " ".join(_invoke("simulate", "--help").output.split())
    assert "Token budget per step" not in text
    assert "Token budget of a MIXED step that has decode rows" in text
    assert "A step without decode rows may take T_max" in text and "--max-step-tokens" in text


def test_record_to_a_missing_directory_fails_before_the_run(
    monkeypatch, tmp_path: pathlib.Path
) -> None:
    import stepplanner.cli.record as record_module

    def must_not_run(*args, **kwargs):
        raise AssertionError("the simulation ran before the output path was checked")

    monkeypatch.setattr(record_module, "run", must_not_run)
    result = _invoke("record", str(tmp_path / "missing" / "r.jsonl"), *SMALL)
    assert result.exit_code == 2
    assert "directory" in result.output and "does not exist" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_prose_columns_wrap_at_spaces_instead_of_turning_the_table_vertical() -> None:
    out = (
        CliRunner(env={"COLUMNS": "80"})
        .invoke(main, ["explain", "-"], input=json.dumps(SPEC_EXAMPLE_TWO), catch_exceptions=False)
        .output
    )
    assert "┃ field" in out and "…" not in out  # the policy table kept its grid
    assert max(len(line) for line in out.splitlines()) <= 80


def test_replay_config_warns_about_an_option_that_changes_nothing(tmp_path: pathlib.Path) -> None:
    path = _record(tmp_path)
    result = CliRunner().invoke(
        main, ["replay", str(path), "--config", "preemption=pause"], catch_exceptions=False
    )
    assert result.exit_code == 0  # FCFS: pausing changes no plan
    assert "warning: preemption=PAUSE pauses nothing under MIXED + FCFS" in result.stderr
