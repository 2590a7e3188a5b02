"""``stepplanner simulate --num-pages``: the paged simulator from the command line."""

from __future__ import annotations

import json

import pytest

import stepplanner as sp

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402

# 200 requests at 40/s on B=32: the largest worst case needs 167 pages of 32 tokens, and 32
# residents' worst cases need far more than 2,000 pages, so that pool holds requests back.
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
LARGEST_REQUEST_PAGES = 167
SHORT_POOL = 2000


def _invoke(*args: str):
    return CliRunner().invoke(main, ["simulate", *SMALL, *args], catch_exceptions=False)


def _json(*args: str) -> dict:
    result = _invoke("--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_short_pool_reports_consistent_occupancy_and_holds_requests_back() -> None:
    report = _json("--num-pages", str(SHORT_POOL))
    pages = report["pages"]
    assert pages["num_pages"] == SHORT_POOL
    for series in ("reserved", "in_use", "held_back"):
        stats = pages[series]
        assert 0 <= stats["p50"] <= stats["p99"] <= stats["max"]
        assert 0 <= stats["mean"] <= stats["max"]
    assert pages["reserved"]["max"] <= SHORT_POOL
    assert pages["in_use"]["max"] <= pages["reserved"]["max"]
    assert pages["in_use"]["mean"] <= pages["reserved"]["mean"]
    assert pages["held_back"]["max"] > 0
    assert 0 < pages["steps_with_requests_held_for_pages"] <= report["steps"]["count"]
    assert pages["reserved_peak"] == pytest.approx(pages["reserved"]["max"] / SHORT_POOL)
    assert pages["refused_for_pages"] == 0
    # Waiting for pages delays requests but loses none.
    assert report["requests"]["completed"] == report["requests"]["submitted"]


def test_a_short_pool_costs_latency_against_unlimited_pages() -> None:
    unlimited = _json()
    paged = _json("--num-pages", str(SHORT_POOL))
    assert "pages" not in unlimited
    assert paged["latency_s"]["all"]["queue"]["p99"] > unlimited["latency_s"]["all"]["queue"]["p99"]


def test_a_pool_for_every_worst_case_holds_nothing_back_and_matches_unlimited() -> None:
    unlimited = _json()
    plentiful = _json("--num-pages", str(MOST_PAGES))
    assert plentiful["pages"]["held_back"]["max"] == 0
    assert plentiful["pages"]["steps_with_requests_held_for_pages"] == 0
    assert plentiful["latency_s"] == unlimited["latency_s"]
    assert plentiful["steps"]["count"] == unlimited["steps"]["count"]


def test_num_pages_0_is_unlimited() -> None:
    assert "pages" not in _json("--num-pages", "0")


def test_the_smallest_pool_holds_the_largest_request() -> None:
    report = _json("--num-pages", str(LARGEST_REQUEST_PAGES))
    assert report["requests"]["completed"] == report["requests"]["submitted"]
    assert report["pages"]["reserved"]["max"] <= LARGEST_REQUEST_PAGES


# B=32 slots of at most LARGEST_REQUEST_PAGES pages each: more can never be in use at once.
MOST_PAGES = 32 * LARGEST_REQUEST_PAGES
POOL_RANGE = (
    f"allowed: 0 (unlimited) or {LARGEST_REQUEST_PAGES}..{MOST_PAGES} (the workload's largest "
    "request, prompt at most S_in=4096 + output tokens, needs "
    f"{LARGEST_REQUEST_PAGES} pages of 32 tokens; B=32 of them at most {MOST_PAGES})"
)


@pytest.mark.parametrize(
    "value",
    ["-1", str(LARGEST_REQUEST_PAGES - 1), str(MOST_PAGES + 1), "2000000000"],
)
def test_a_bad_pool_is_a_one_line_error_with_one_range(value: str) -> None:
    # Below, above, and the billions that took a minute to set up: one message, one range.
    result = _invoke("--num-pages", value)
    assert result.exit_code == 2
    assert result.output == f"Error: --num-pages={value} is out of range; {POOL_RANGE}\n"


def test_the_largest_useful_pool_is_allowed() -> None:
    report = _json("--num-pages", str(MOST_PAGES))
    assert report["requests"]["completed"] == report["requests"]["submitted"]


def test_the_text_and_markdown_reports_show_the_pages() -> None:
    table = _invoke("--num-pages", str(SHORT_POOL))
    assert table.exit_code == 0, table.output
    assert f"KV pages (pool of {SHORT_POOL:,};" in table.output
    for row in ("reserved pages", "pages in use", "requests held back"):
        assert row in table.output
    assert "requests waited for pages in" in table.output
    md = _invoke("--num-pages", str(SHORT_POOL), "--format", "md")
    assert "| per step | mean | p50 | p99 | max | max/pool |" in md.output
    assert "| reserved pages |" in md.output
    plain = _invoke("--format", "md")
    assert "reserved pages" not in plain.output


def test_csv_stays_the_latency_table() -> None:
    paged = _invoke("--num-pages", str(SHORT_POOL), "--format", "csv")
    assert paged.exit_code == 0, paged.output
    assert paged.output.splitlines()[0].startswith("class,queue p50,")


def _compare(*args: str):
    return CliRunner().invoke(main, ["compare", *SMALL, *args], catch_exceptions=False)


def test_compare_runs_each_configuration_on_its_own_pool() -> None:
    result = _compare(
        "--json",
        "--config",
        "name=unlimited",
        "--config",
        f"name=short,num_pages={SHORT_POOL}",
        "--config",
        f"name=plentiful,num-pages={32 * LARGEST_REQUEST_PAGES}",
    )
    assert result.exit_code == 0, result.output
    unlimited, short, plentiful = json.loads(result.output)
    assert "pages" not in unlimited
    assert short["pages"]["num_pages"] == SHORT_POOL
    assert 0 < short["pages"]["steps_with_requests_held_for_pages"]
    assert short["pages"]["reserved"]["max"] <= SHORT_POOL
    assert plentiful["pages"]["steps_with_requests_held_for_pages"] == 0
    assert plentiful["latency_s"] == unlimited["latency_s"]
    # The same pool through simulate gives the same occupancy.
    alone = _json("--num-pages", str(SHORT_POOL))["pages"]
    assert short["pages"] == alone


def test_compare_names_a_configuration_by_its_pool_and_adds_page_columns() -> None:
    result = _compare(
        "--format",
        "csv",
        "--config",
        "policy=fcfs",
        "--config",
        f"policy=fcfs,num_pages={SHORT_POOL}",
    )
    assert result.exit_code == 0, result.output
    header, unlimited, short = result.output.splitlines()
    assert header.endswith(",KV pages,reserved max,in use max,steps held")
    assert unlimited.startswith("policy=fcfs,") and unlimited.endswith(",,,,")
    assert short.startswith(f'"policy=fcfs, num_pages={SHORT_POOL}",')
    pool, reserved, in_use, held = short.split(",")[-4:]
    assert int(pool) == SHORT_POOL and int(in_use) <= int(reserved) <= SHORT_POOL
    assert int(held) > 0
    plain = _compare("--format", "csv", "--config", "policy=fcfs")
    assert "KV pages" not in plain.output


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("num_pages=x", "num_pages='x' is not an integer"),
        ("num_pages=--3", "num_pages='--3' is not an integer"),
        ("num_pages=-3", "config 'num_pages=-3': num_pages=-3 is out of range; allowed: 0 "),
        ("name=tiny,num_pages=20", "config 'tiny': num_pages=20 is out of range; allowed: 0 "),
    ],
)
def test_compare_refuses_a_bad_pool_before_running(
    config: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepplanner.cli import compare as compare_module

    def must_not_run(*args, **kwargs):
        raise AssertionError("a configuration ran before every pool was checked")

    monkeypatch.setattr(compare_module, "run", must_not_run)
    result = _compare("--config", "name=first", "--config", config)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert message in lines[0]


def test_replay_and_ledger_configurations_still_refuse_num_pages() -> None:
    from stepplanner.cli.config import parse_config

    with pytest.raises(ValueError, match="config key 'num_pages' is not known"):
        parse_config({"num_pages": 8}, sp.StepPlannerLimits(4, 64, 16), sp.SchedulingOptions())
