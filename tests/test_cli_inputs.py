"""Issue 44: every count and rate of the command line is refused in one line, exit 2, before
anything is allocated; enum options take the names a person types; one range per option."""

from __future__ import annotations

import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import counts, main  # noqa: E402
from stepplanner.cli import options as options_module  # noqa: E402

GIB = 2**30
# With 10 GiB available: 10 GiB / 2,560 bytes a request, / 512 bytes a slot.
REQUESTS_RANGE = (
    "allowed: 1..4,194,304 (what 10.0 GiB of available memory holds at about 2,560 bytes each)"
)
SLOTS_RANGE = (
    "allowed: 1..20,971,520 (what 10.0 GiB of available memory holds at about 512 bytes each)"
)


def _invoke(*args: str):
    return CliRunner(env={"COLUMNS": "160"}).invoke(
        main, list(args), prog_name="stepplanner", catch_exceptions=False
    )


@pytest.fixture
def ten_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 10 GiB available, and no synthetic workload drawn: a refusal must come
    before the allocation."""
    monkeypatch.setattr(counts, "available_memory", lambda: 10 * GIB)

    def must_not_draw(*args, **kwargs):
        raise AssertionError("the workload was drawn before --requests was checked")

    monkeypatch.setattr(options_module, "synthetic", must_not_draw)


def _refused(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {message}\n"


@pytest.mark.parametrize("requests", ["0", "-3", "4194305", "2000000000", "99999999999"])
def test_requests_past_what_memory_holds_is_one_line(ten_gib, requests: str) -> None:
    _refused(
        _invoke("simulate", "--requests", requests),
        f"requests={requests} is out of range; {REQUESTS_RANGE}",
    )


def test_sweep_counts_the_runs_it_holds_at_once(ten_gib) -> None:
    # Two configurations on two workers: two simulations in memory at once.
    result = _invoke(
        "sweep", "--requests", "3000000", "--workers", "2", "--grid", "policy=fcfs,priority"
    )
    _refused(
        result,
        "requests=3000000 is out of range; allowed: 1..2,097,152 (what 10.0 GiB of available "
        "memory holds at about 2,560 bytes each x 2 runs at once)",
    )


def test_capacity_checks_requests_too(ten_gib) -> None:
    result = _invoke("capacity", "--requests", "99999999999", "--workers", "1")
    _refused(result, f"requests=99999999999 is out of range; {REQUESTS_RANGE}")


@pytest.mark.parametrize("slots", ["0", "20971521", "99999999999999"])
def test_batch_size_has_one_range(ten_gib, slots: str) -> None:
    result = _invoke("simulate", "-B", slots, "--max-step-tokens", "2147483647")
    _refused(result, f"max_batch_size={slots} is out of range; {SLOTS_RANGE}")


def test_without_memory_figures_int32_is_the_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counts, "available_memory", lambda: None)
    _refused(
        _invoke("simulate", "--requests", "2147483648"),
        "requests=2147483648 is out of range; allowed: 1..2,147,483,647 (int32; this "
        "machine's available memory could not be read)",
    )


def test_available_memory_reads_this_machine() -> None:
    memory = counts.available_memory()
    assert memory is None or memory > 0


RATE_RANGE = "allowed: 0 < rate <= 1,000,000 requests/s"


@pytest.mark.parametrize(
    ("rate", "shown"),
    [("0", "0.0"), ("-1", "-1.0"), ("inf", "inf"), ("1e308", "1e+308"), ("nan", "nan")],
)
def test_rate_has_one_range_and_a_ceiling(rate: str, shown: str) -> None:
    _refused(_invoke("simulate", "--rate", rate), f"rate={shown} is out of range; {RATE_RANGE}")


def test_the_ceiling_rate_itself_runs() -> None:
    result = _invoke("simulate", "--requests", "20", "--rate", "1000000", "--json")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("rate", "shown"), [("1e308", "1e+308"), ("0", "0.0")])
def test_capacity_max_rate_has_the_same_ceiling(rate: str, shown: str) -> None:
    result = _invoke("capacity", "--requests", "50", "--max-rate", rate, "--workers", "1")
    _refused(
        result,
        f"max_rate={shown} is out of range; allowed: 0 < max_rate <= 1,000,000 requests/s",
    )


def test_a_negative_seed_is_one_line() -> None:
    _refused(
        _invoke("simulate", "--seed", "-1"),
        "seed=-1 is out of range; allowed: an integer >= 0 (numpy's seeds)",
    )


@pytest.mark.parametrize("value", ["0", "99999999999999"])
def test_max_waiting_has_one_range(value: str) -> None:
    _refused(
        _invoke("simulate", "--max-waiting", value),
        f"max_waiting={value} is out of range; allowed: 1..2147483647, or None (every request "
        "may wait)",
    )


@pytest.mark.parametrize(
    ("value", "verb"),
    [("-1", "is out of range"), ("256", "is out of range"), ("99999999999", "does not fit int32")],
)
def test_reserved_slots_have_one_range(value: str, verb: str) -> None:
    _refused(
        _invoke("simulate", "--priority-reserved-slots", value),
        f"priority_reserved_slots={value} {verb}; allowed: 0..255 (fewer than max_batch_size=256)",
    )


@pytest.mark.parametrize(
    ("flag", "value", "verb", "allowed"),
    [
        ("--max-input-length", "0", "is out of range", "1..2147483647"),
        ("--max-input-length", "99999999999", "does not fit int32", "1..2147483647"),
        ("--max-num-tokens", "-1", "is out of range", "0..2147483647"),
        ("--max-pause-steps", "99999999999", "does not fit int32", "0..2147483647"),
    ],
)
def test_limits_and_options_have_one_range(flag: str, value: str, verb: str, allowed: str) -> None:
    field = flag.lstrip("-").replace("-", "_")
    _refused(_invoke("simulate", flag, value), f"{field}={value} {verb}; allowed: {allowed}")


# --- enum options: one spelling everywhere -------------------------------------------------------

POLICIES = "allowed: fcfs, priority, edf, deadline (any case) or 0..3"


@pytest.mark.parametrize(
    "args",
    [
        ("simulate", "--policy", "prio"),
        ("compare", "--config", "policy=prio"),
        ("sweep", "--grid", "policy=fcfs,prio"),
    ],
)
def test_an_unknown_policy_lists_one_spelling_everywhere(args: tuple[str, ...]) -> None:
    _refused(
        _invoke(*args, "--requests", "20"),
        f"scheduling_policy='prio' is not a SchedulingPolicy; {POLICIES}",
    )


def test_enum_options_take_any_case_and_numbers() -> None:
    result = _invoke(
        "simulate",
        "--requests",
        "20",
        "--policy",
        "PRIORITY",
        "--mode",
        "Mixed",
        "--preemption",
        "1",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert '"scheduling_policy": "PRIORITY"' in result.output
    assert '"preemption": "PAUSE"' in result.output


def test_help_still_lists_the_choices() -> None:
    result = _invoke("simulate", "--help")
    assert "--policy [fcfs|priority|edf|deadline]" in result.output
    assert "--mode [auto|mixed|prefill_first]" in result.output


# --- sweep: a verdict on top, one name per figure, a table at 80 columns ------------------------


def _record(label: str, checks: list[tuple[str, float | None, float]], **extra):
    slo = [
        {
            "slo": key,
            "observed_s": seen,
            "threshold_s": limit,
            "met": seen is not None and seen <= limit,
        }
        for key, seen, limit in checks
    ]
    return {"label": label, "slo": slo, "meets_slo": all(c["met"] for c in slo), **extra}


def test_the_verdict_names_the_closest_when_none_meets() -> None:
    from stepplanner.cli.tuning_render import verdict
    from stepplanner.tuning.slo import parse_slos

    slos = parse_slos(["ttft_p99=500ms", "tpot_p99=15ms"])
    records = [
        # First by goodput, but 2x over on TTFT; the second is 1.04x over on TPOT alone.
        _record("768/512", [("ttft_p99", 1.0, 0.5), ("tpot_p99", 0.0150, 0.015)]),
        _record("640/256", [("ttft_p99", 0.48, 0.5), ("tpot_p99", 0.0156, 0.015)]),
        _record("broken", [("ttft_p99", None, 0.5), ("tpot_p99", None, 0.015)]),
        {"label": "unresolved", "error": "max_chunk_tokens=512 is out of range"},
    ]
    found = verdict(records, slos)
    assert found is not None
    assert f"{found.label} {found.text}" == (
        "verdict no configuration meets every SLO; closest: #2 640/256 (tpot_p99 15.6 ms > 15 ms)"
    )
    records[2] = _record("640/320", [("ttft_p99", 0.47, 0.5), ("tpot_p99", 0.0145, 0.015)])
    found = verdict(records, slos)
    assert found is not None
    assert found.text == "1 of 3 configurations meet every SLO; the best by goodput: #3 640/320"
    assert verdict(records, []) is None


def _sweep(*args: str, columns: str = "160"):
    return CliRunner(env={"COLUMNS": columns}).invoke(
        main,
        ["sweep", "--requests", "200", "--rate", "40", "-B", "32", "--no-progress", *args],
        catch_exceptions=False,
    )


def test_sweep_says_on_top_when_nothing_meets_the_slos(tmp_path) -> None:
    import json

    saved = tmp_path / "sweep.json"
    result = _sweep(
        "--grid", "max_num_tokens=256,512", "--slo", "ttft_p99=1ms", "--save-result", str(saved)
    )
    assert result.exit_code == 0, result.output
    ran = json.loads(saved.read_text())["results"]
    closest = min(range(2), key=lambda k: ran[k]["slo"][0]["observed_s"])
    seen = ran[closest]["slo"][0]["observed_s"] * 1e3
    lines = result.output.splitlines()
    assert lines[1] == (
        f"verdict no configuration meets every SLO; closest: #{closest + 1} "
        f"{ran[closest]['label']} (ttft_p99 {seen:,.1f} ms > 1 ms)"
    )


def test_sweep_names_its_two_goodputs_apart() -> None:
    result = _sweep("--grid", "max_num_tokens=256,512", "--slo", "ttft_p99=1s", "--format", "csv")
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split(",")
    assert header[:6] == [
        "#",
        "configuration",
        "mode budget/chunk",
        "goodput req/s",
        "deadlines attained",
        "attained req/s",
    ]
    assert not [h for h in header if h.startswith("SLO goodput")]


def test_sweep_stays_a_table_at_80_columns() -> None:
    result = _sweep(
        "--grid",
        "max_num_tokens=256,512",
        "--slo",
        "ttft_p99=1s",
        "--slo",
        "tpot_p99=50ms",
        columns="80",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    grid = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert len(grid) >= 7 and all(len(line) <= 80 for line in grid), result.output
    assert any("goodput" in line for line in grid) and any("SLOs" in line for line in grid)
    assert (
        "left out at 80 columns: mode budget/chunk, deadlines attained, attained req/s, TTFT "
        "p99, TPOT p99, ITL p99, E2E p99"
    ) in " ".join(result.output.split())


# --- bench: a click command like the others ----------------------------------------------------


def test_bench_help_reads_like_the_other_commands() -> None:
    bench_help = _invoke("bench", "--help").output
    simulate_help = _invoke("simulate", "--help").output
    assert bench_help.startswith("Usage: stepplanner bench [OPTIONS]\n")
    assert simulate_help.startswith("Usage: stepplanner simulate [OPTIONS]\n")
    for text in (bench_help, simulate_help):
        assert "\nOptions:\n" in text and "-h, --help  " in text
    assert "--scenario [mixed|prefill_first|priority_pause]" in bench_help
    assert "[default: 8,64,256,1024]" in " ".join(bench_help.split())


def test_bench_choices_and_defaults_are_stepplanner_benchs() -> None:
    from stepplanner import bench
    from stepplanner.bench import planner
    from stepplanner.cli import bench as bench_command

    assert bench_command.SCENARIOS == tuple(sorted(planner.SCENARIOS))
    assert bench_command.BATCH_SIZES == ",".join(map(str, planner.BATCH_SIZES))
    defaults = vars(bench._parser("x").parse_args([]))
    assert defaults["reference_max_batch"] == 1024 and defaults["loop"] == "on"
    assert defaults["scenario"] == "priority_pause"


def test_bench_hands_its_values_to_stepplanner_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepplanner import bench

    seen = {}

    def fake_main(argv, prog):
        seen.update(argv=argv, prog=prog)
        return 0

    monkeypatch.setattr(bench, "main", fake_main)
    result = _invoke("bench", "--batch-sizes", "8, 64", "--loop", "off", "--json")
    assert result.exit_code == 0, result.output
    assert seen == {
        "argv": [
            "--batch-sizes",
            "8,64",
            "--scenario",
            "priority_pause",
            "--loop",
            "off",
            "--reference-max-batch",
            "1024",
            "--json",
        ],
        "prog": "stepplanner bench",
    }


@pytest.mark.parametrize("sizes", ["0", "8,20971521"])
def test_bench_batch_sizes_are_counts_too(ten_gib, sizes: str) -> None:
    _refused(
        _invoke("bench", "--batch-sizes", sizes),
        f"--batch-sizes={sizes.split(',')[-1]} is out of range; {SLOTS_RANGE}",
    )
