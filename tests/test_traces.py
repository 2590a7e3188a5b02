"""Every recognised trace layout, the explicit column mapping, and their errors."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from stepplanner.sim.traces import LAYOUTS, parse_columns, read_trace

DATA = pathlib.Path(__file__).parent / "data" / "traces"


@pytest.mark.parametrize(
    "name, layout, requests",
    [
        ("azure_llm_inference.csv", "azure", 40),
        ("burstgpt.csv", "burstgpt", 38),
        ("mooncake.jsonl", "mooncake", 40),
        ("vidur.csv", "vidur", 40),
    ],
)
def test_public_layouts_are_recognised_by_their_columns(
    name: str, layout: str, requests: int
) -> None:
    w = read_trace(DATA / name)
    assert f"({layout})" in w.source
    assert len(w) == requests
    assert w.arrival_time[0] == 0.0  # public logs: relative to the first request
    assert np.all(np.diff(w.arrival_time) >= 0)
    assert w.prompt_tokens.min() >= 1 and w.output_tokens.min() >= 1


def test_azure_datetimes_keep_sub_microsecond_digits() -> None:
    w = read_trace(DATA / "azure_llm_inference.csv")
    # rows 1-2: 18:15:46.0282448 and 18:15:46.3603754
    assert w.arrival_time[1] == pytest.approx(0.3603754 - 0.0282448, abs=2e-8)
    assert w.prompt_tokens[0] == 1031 and w.output_tokens[0] == 139


def test_mooncake_timestamps_are_milliseconds() -> None:
    w = read_trace(DATA / "mooncake.jsonl")
    assert w.arrival_time[1] == pytest.approx(0.003)
    assert w.arrival_time[2] == pytest.approx(0.051)


def test_burstgpt_failed_requests_are_skipped_and_counted() -> None:
    w = read_trace(DATA / "burstgpt.csv")
    assert "2 rows with 0 prompt or output tokens skipped" in w.source


def test_explicit_columns_with_unit_and_priority() -> None:
    w = read_trace(
        DATA / "custom.csv", "arrival=sent_ms,prompt=in_tok,output=out_tok,priority=tier,unit=ms"
    )
    assert len(w) == 40 and set(w.classes) <= {-1, 0, 1}
    assert w.arrival_time[0] == pytest.approx(0.003063)
    assert "(columns)" in w.source


def test_stepplanner_layout_keeps_absolute_times(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens,priority\n2.5,10,3,-1\n4,20,1,\n")
    w = read_trace(path)
    assert w.arrival_time.tolist() == [2.5, 4.0] and w.priority.tolist() == [-1, 0]


def test_every_layout_has_distinct_columns() -> None:
    assert len({layout.required for layout in LAYOUTS}) == len(LAYOUTS)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("arrival=a,prompt=b", "lack output"),
        ("arrival=a,prompt=b,output=c,speed=2", "is not KEY=COLUMN"),
        ("arrival=a,prompt=b,output=c,unit=days", "unit='days' is not known"),
    ],
)
def test_parse_columns_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_columns(text)


@pytest.mark.parametrize(
    "name, body, fragment",
    [
        ("unknown.csv", "when,in,out\n1,2,3\n", "match no known trace layout"),
        (
            "vidur.csv",
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,4\n0.7,ten,4\n",
            "line 3: column 'num_prefill_tokens': 'ten' is not an integer",
        ),
        (
            "vidur.csv",
            "arrived_at,num_prefill_tokens,num_decode_tokens\nsoon,10,4\n",
            "line 2: column 'arrived_at': 'soon' is not a number",
        ),
        (
            "vidur.csv",
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,\n",
            "line 2: column 'num_decode_tokens' is missing",
        ),
        (
            "azure.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-01 00:00:00.1,10,4\n",
            "line 2: column 'TIMESTAMP': '2023-13-01 00:00:00.1' is not a date-time",
        ),
        (
            "burst.csv",
            "Timestamp,Model,Request tokens,Response tokens\n1,m,-5,3\n",
            "line 2: column 'Request tokens': -5 is out of range",
        ),
        (
            "moon.jsonl",
            '{"timestamp": 1, "input_length": 5, "output_length": 2}\n{"timestamp": 2}\n',
            "line 2: column 'input_length' is missing",
        ),
        (
            "moon.jsonl",
            '{"timestamp": 1, "input_length": 5, "output_length": 2}\nnot json\n',
            "line 2: not valid JSON",
        ),
        ("empty.csv", "", "no requests"),
        ("trace.txt", "x", "suffix '.txt' is not known"),
    ],
)
def test_errors_name_the_line_and_column(
    tmp_path: pathlib.Path, name: str, body: str, fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        read_trace(path)


def test_explicit_columns_missing_from_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="line 1: column\\(s\\) 'c' not found"):
        read_trace(path, "arrival=a,prompt=b,output=c")
