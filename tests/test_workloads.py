"""Synthetic workloads and the trace loader (CSV/JSONL, errors naming line and column)."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from stepplanner._errors import StepPlannerValueError
from stepplanner.sim.traces import load_trace, sample_trace_path
from stepplanner.sim.workloads import Workload, synthetic


def test_synthetic_is_seeded_sorted_and_has_three_classes() -> None:
    a, b = synthetic(requests=3000, rate=20.0, seed=3), synthetic(requests=3000, rate=20.0, seed=3)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(
        a.prompt_tokens, synthetic(requests=3000, rate=20.0, seed=4).prompt_tokens
    )
    assert np.all(np.diff(a.arrival_time) >= 0) and a.arrival_time[0] == 0
    assert a.classes == [-1, 0, 1]
    gaps = np.diff(a.arrival_time)
    assert abs(gaps.mean() * 20.0 - 1) < 0.1  # Poisson: mean gap 1/rate
    assert abs(gaps.std() / gaps.mean() - 1) < 0.1  # exponential gaps: CV 1
    # Long tails: the largest prompt is far above the median.
    assert a.prompt_tokens.max() > 5 * np.median(a.prompt_tokens)
    assert a.prompt_tokens.min() >= 1 and a.prompt_tokens.max() <= 4096
    assert a.output_tokens.min() >= 1


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"requests": 0}, "requests=0"),
        ({"rate": 0.0}, "rate=0.0"),
        ({"max_prompt": 0}, "max_prompt=0"),
    ],
)
def test_synthetic_rejects_bad_arguments(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        synthetic(**kw)


def test_workload_validates_and_sorts_stably() -> None:
    w = Workload(
        np.array([2.0, 1.0, 1.0]), np.array([5, 6, 7]), np.array([1, 2, 3]), np.array([0, 0, 0])
    )
    assert w.prompt_tokens.tolist() == [6, 7, 5]
    with pytest.raises(ValueError, match="output_tokens=0 is out of range"):
        Workload(np.array([0.0]), np.array([5]), np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="arrival_time=-1.0"):
        Workload(np.array([-1.0]), np.array([5]), np.array([1]), np.array([0]))
    with pytest.raises(TypeError, match="prompt_tokens must hold integers"):
        Workload(np.array([0.0]), np.array([5.5]), np.array([1]), np.array([0]))
    with pytest.raises(ValueError, match="one length"):
        Workload(np.array([0.0, 1.0]), np.array([5]), np.array([1]), np.array([0]))


def test_sample_trace_ships_with_the_package() -> None:
    w = load_trace(sample_trace_path())
    assert len(w) == 300 and w.classes == [-1, 0, 1]


def test_csv_and_jsonl_round_trip(tmp_path: pathlib.Path) -> None:
    w = synthetic(requests=50, seed=2)
    w.to_csv(tmp_path / "t.csv")
    back = load_trace(tmp_path / "t.csv")
    assert np.allclose(back.arrival_time, w.arrival_time, atol=1e-6)
    assert back.output_tokens.tolist() == w.output_tokens.tolist()
    lines = [
        json.dumps(
            {
                "arrival_time": float(t),
                "prompt_tokens": int(p),
                "output_tokens": int(o),
                "extra": "ignored",
            }
        )
        for t, p, o in zip(w.arrival_time, w.prompt_tokens, w.output_tokens)
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n\n")
    j = load_trace(tmp_path / "t.jsonl")
    assert j.prompt_tokens.tolist() == w.prompt_tokens.tolist()
    assert set(j.priority.tolist()) == {0}  # priority is optional


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        (
            "a.csv",
            "arrival_time,prompt_tokens,output_tokens\n0,5,1\n1,x,2\n",
            r"line 3: column 'prompt_tokens': 'x' is not an integer",
        ),
        (
            "a.csv",
            "arrival_time,prompt_tokens\n0,5\n",
            r"line 1: column\(s\) 'output_tokens' not found",
        ),
        (
            "a.csv",
            "arrival_time,prompt_tokens,output_tokens\n-2,5,1\n",
            r"line 2: column 'arrival_time'",
        ),
        (
            "a.csv",
            "arrival_time,prompt_tokens,output_tokens,priority\n0,5,0,1\n",
            r"line 2: column 'output_tokens': 0 is out of range",
        ),
        (
            "a.csv",
            "arrival_time,prompt_tokens,output_tokens\n0,5,\n",
            r"line 2: column 'output_tokens' is missing",
        ),
        (
            "a.jsonl",
            '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 1}\n{oops\n',
            r"line 2: not valid JSON",
        ),
        ("a.jsonl", "[1, 2]\n", r"line 1: expected a JSON object"),
        (
            "a.jsonl",
            '{"arrival_time": 0, "prompt_tokens": 5.5, "output_tokens": 1}\n',
            r"line 1: column 'prompt_tokens': 5.5 is not an integer",
        ),
        (
            "a.jsonl",
            '{"arrival_time": true, "prompt_tokens": 5, "output_tokens": 1}\n',
            r"line 1: column 'arrival_time'",
        ),
        ("a.txt", "", r"suffix '.txt' is not known"),
        ("a.csv", "arrival_time,prompt_tokens,output_tokens\n", "no requests"),
    ],
)
def test_trace_errors_name_line_and_column(
    tmp_path: pathlib.Path, name: str, text: str, match: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=match):
        load_trace(tmp_path / name)


def test_a_trace_that_is_not_utf8_is_a_library_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"arrival_time,prompt_tokens,output_tokens\n0,\xff\xfe,3\n")
    with pytest.raises(StepPlannerValueError, match=r"bad\.csv: cannot be read .*utf-8"):
        load_trace(path)


def test_load_trace_reads_the_stepplanner_layout_only(tmp_path: pathlib.Path) -> None:
    # read_trace would recognise this as BurstGPT; load_trace promises its own columns.
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Request tokens,Response tokens\n0,5,1\n")
    with pytest.raises(
        StepPlannerValueError,
        match=r"'arrival_time', 'prompt_tokens', "
        r"'output_tokens' not found",
    ):
        load_trace(path)


def test_an_empty_workload_is_an_error_at_construction() -> None:
    with pytest.raises(ValueError, match="workload has no requests; allowed: at least one"):
        Workload(
            np.zeros(0),
            np.zeros(0, dtype=np.int32),
            np.zeros(0, dtype=np.int32),
            np.zeros(0, dtype=np.int32),
        )
    with pytest.raises(ValueError, match="no requests"):
        Workload(
            np.array([]), np.array([], dtype=int), np.array([], dtype=int), np.array([], dtype=int)
        )


def test_the_default_synthetic_workload_is_the_one_the_cli_runs() -> None:
    """``simulate(synthetic())`` and ``stepplanner simulate`` run the same requests; the CLI
    gives them the default classes' objectives (``--no-slo``: none, as the API's default)."""
    pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
    from click.testing import CliRunner

    from stepplanner.cli import main
    from stepplanner.sim.workloads import DEFAULT_SLO_CLASSES

    def cli(*extra: str) -> dict:
        result = CliRunner().invoke(
            main,
            ["simulate", "--json", "--max-steps", "1", "--no-progress", *extra],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["workload"]

    assert cli() == synthetic(slo_classes=DEFAULT_SLO_CLASSES).summary()
    assert cli("--no-slo") == synthetic().summary()
    assert synthetic().source == "synthetic(requests=6000, rate=28/s, seed=0)"


def test_repr_summarises_instead_of_dumping_the_columns() -> None:
    from stepplanner.sim.workloads import synthetic

    text = repr(synthetic(requests=5000, seed=1))
    assert text.startswith("Workload(source=") and "requests=5000" in text
    assert "array" not in text and len(text) < 300


def test_a_rate_that_overflows_is_none_like_a_span_of_zero() -> None:
    # Arrivals a subnormal second apart: (n - 1) / span was inf in fidelity's report.
    one = np.ones(2, dtype=np.int64)
    assert Workload(np.array([0.0, 5e-324]), one, one, one).summary()["rate_per_s"] is None
    assert Workload(np.array([0.0, 0.0]), one, one, one).summary()["rate_per_s"] is None
    assert Workload(np.array([0.0, 0.5]), one, one, one).summary()["rate_per_s"] == 2.0


# --- issue 44: a rate's ceiling and the seed's range, in the API as on the command line -------


@pytest.mark.parametrize("rate", [0, -1.0, math.inf, 1e308, math.nan, 1e6 + 1, True])
def test_synthetic_refuses_a_rate_past_its_ceiling(rate) -> None:
    from stepplanner.sim.workloads import synthetic

    with pytest.raises(ValueError) as info:
        synthetic(requests=10, rate=rate)
    assert str(info.value) == (
        f"rate={rate!r} is out of range; allowed: 0 < rate <= 1,000,000 requests/s"
    )


def test_synthetic_runs_at_the_ceiling_rate() -> None:
    from stepplanner.sim.workloads import MAX_RATE, synthetic

    assert len(synthetic(requests=10, rate=MAX_RATE)) == 10


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_synthetic_refuses_a_seed_numpy_refuses(seed) -> None:
    from stepplanner.sim.workloads import synthetic

    with pytest.raises(ValueError, match=r"allowed: an integer >= 0 \(numpy's seeds\)"):
        synthetic(requests=10, seed=seed)
