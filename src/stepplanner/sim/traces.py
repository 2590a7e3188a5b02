"""Request traces in the layouts people have, recognised by their columns.

| layout | file | arrival | prompt | output |
| --- | --- | --- | --- | --- |
| stepplanner | CSV/JSONL | ``arrival_time`` (s) | ``prompt_tokens`` | ``output_tokens`` (+ ``priority``, ``ttft_slo_ms``, ``tpot_slo_ms``) |
| azure (Azure LLM inference traces 2023/2024) | CSV | ``TIMESTAMP`` (date-time) | ``ContextTokens`` | ``GeneratedTokens`` |
| burstgpt (BurstGPT) | CSV | ``Timestamp`` (s) | ``Request tokens`` | ``Response tokens`` |
| mooncake (Mooncake traces) | JSONL | ``timestamp`` (ms) | ``input_length`` | ``output_length`` |
| vidur (Vidur request traces) | CSV | ``arrived_at`` (s) | ``num_prefill_tokens`` | ``num_decode_tokens`` |

Any other CSV or JSONL is read with an explicit mapping,
``arrival=COL,prompt=COL,output=COL[,priority=COL][,unit=s|ms|us|datetime]``.

Per-request objectives are read from the columns ``ttft_slo_ms`` and ``tpot_slo_ms`` in any
layout that has them (milliseconds; an empty cell or a missing key: none): a positive finite
number, and a ``tpot_slo_ms`` only beside a ``ttft_slo_ms``.

Decisions: arrivals of the public layouts are made relative to the first request (their clocks
start anywhere); the stepplanner layout keeps its times. Public production logs record failed or
empty requests with 0 prompt or 0 response tokens (BurstGPT's failures, for one); those rows are
skipped and counted in the workload's ``source``, since no engine step ever serves them.
Anything else that is missing, non-numeric or out of range is an error naming the file, the
line and the column.
"""  # noqa: E501 - a table row does not wrap

from __future__ import annotations

import csv
import dataclasses
import datetime
import math
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np

from .._errors import INT32_MAX, INT32_MIN, StepPlannerValueError
from .workloads import SLO_COLUMNS, TRACE_COLUMNS, Workload, json_lines

__all__ = [
    "LAYOUTS",
    "STEPPLANNER_LAYOUT",
    "Layout",
    "csv_records",
    "detect_layout",
    "load_trace",
    "parse_columns",
    "read_trace",
    "sample_trace_path",
]

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "datetime": None}
# Date-times count from here, not from 1970, so that a double keeps ~15 ns of the 100 ns ticks
# Azure's traces carry (POSIX seconds of today would keep only ~240 ns).
_EPOCH = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """Which columns hold arrival, prompt and output (and priority), and the arrival unit."""

    name: str
    arrival: str
    prompt: str
    output: str
    priority: str | None = None
    unit: str = "s"
    public_log: bool = True  # relative arrivals; rows with 0 tokens are failed requests

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise StepPlannerValueError(
                f"trace columns: unit={self.unit!r} is not known; allowed: {', '.join(UNITS)}"
            )

    @property
    def required(self) -> tuple[str, str, str]:
        return (self.arrival, self.prompt, self.output)


# The project's own layout, which ``load_trace`` reads and ``Workload.to_csv`` writes.
STEPPLANNER_LAYOUT = Layout("stepplanner", *TRACE_COLUMNS, public_log=False)
LAYOUTS: tuple[Layout, ...] = (
    STEPPLANNER_LAYOUT,
    Layout("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", unit="datetime"),
    Layout("burstgpt", "Timestamp", "Request tokens", "Response tokens"),
    Layout("mooncake", "timestamp", "input_length", "output_length", unit="ms"),
    Layout("vidur", "arrived_at", "num_prefill_tokens", "num_decode_tokens"),
)

_COLUMN_KEYS = ("arrival", "prompt", "output", "priority", "unit")


def parse_columns(text: str) -> Layout:
    """``"arrival=ts,prompt=in,output=out,unit=ms"`` -> a custom ``Layout``."""
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in _COLUMN_KEYS or not value.strip():
            raise StepPlannerValueError(
                f"trace columns item {item!r} is not KEY=COLUMN; allowed keys: "
                f"{', '.join(_COLUMN_KEYS)}"
            )
        values[key] = value.strip()
    missing = [k for k in ("arrival", "prompt", "output") if k not in values]
    if missing:
        raise StepPlannerValueError(
            f"trace columns {text!r} lack {', '.join(missing)}; required: "
            "arrival=COL,prompt=COL,output=COL"
        )
    return Layout(
        "columns",
        values["arrival"],
        values["prompt"],
        values["output"],
        values.get("priority"),
        values.get("unit", "s"),
        public_log=False,
    )


def detect_layout(names: Sequence[str], where: str) -> Layout:
    """The first known layout whose required columns are all in ``names``."""
    present = set(names)
    for layout in LAYOUTS:
        if present.issuperset(layout.required):
            return layout
    known = "; ".join(f"{layout.name}: {', '.join(layout.required)}" for layout in LAYOUTS)
    raise StepPlannerValueError(
        f"{where}: columns {sorted(present)} match no known trace layout ({known});"
        " give --columns arrival=COL,prompt=COL,output=COL"
    )


def read_trace(path: str | pathlib.Path, columns: Layout | str | None = None) -> Workload:
    """A ``Workload`` from a CSV (``.csv``) or JSON Lines (``.jsonl``, ``.ndjson``) trace."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".ndjson"):
        raise StepPlannerValueError(
            f"trace {path}: suffix {suffix!r} is not known; allowed: .csv, .jsonl, .ndjson"
        )
    layout = parse_columns(columns) if isinstance(columns, str) else columns
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StepPlannerValueError(f"trace {path}: cannot be read ({exc})") from None
    where = f"trace {path}"
    records = csv_records(text, where) if suffix == ".csv" else _jsonl(text, where)
    first = next(records, None)
    if first is None:
        raise StepPlannerValueError(f"{where}: no requests")
    names = list(first[2])
    if layout is None:
        layout = detect_layout(names, f"{where} line {first[0] if suffix != '.csv' else 1}")
    else:
        missing = [c for c in layout.required if c not in names]
        if missing:
            raise StepPlannerValueError(
                f"{where} line {first[0] if suffix != '.csv' else 1}: column(s) "
                f"{', '.join(repr(c) for c in missing)} not found; columns: "
                f"{', '.join(names)}"
            )
    return _build(path, layout, _chain(first, records), where)


def _chain(
    first: tuple[int, Mapping[str, Any], Sequence[str]],
    rest: Iterator[tuple[int, Mapping[str, Any], Sequence[str]]],
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    yield first[0], first[1]
    for line, record, _ in rest:
        yield line, record


def csv_records(
    text: str, where: str, required: Sequence[str] = ()
) -> Iterator[tuple[int, Mapping[str, Any], Sequence[str]]]:
    """(line number, row, header) for each non-blank CSV row, cells stripped; a header that
    lacks a ``required`` column is an error naming them. Shared by traces and timings."""
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in required if c not in header]
    if missing:
        raise StepPlannerValueError(
            f"{where} line 1: header {header} lacks column(s) "
            f"{', '.join(missing)}; required: {', '.join(required)}"
        )
    reader.fieldnames = header
    for row in reader:
        if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
            continue
        yield (
            reader.line_num,
            {k: (v.strip() if isinstance(v, str) else v) for k, v in row.items()},
            header,
        )


def _jsonl(text: str, where: str) -> Iterator[tuple[int, Mapping[str, Any], Sequence[str]]]:
    for line, record in json_lines(text.splitlines(), where):
        yield line, record, list(record)


def _build(
    path: pathlib.Path, layout: Layout, records: Iterator[tuple[int, Mapping[str, Any]]], where: str
) -> Workload:
    arrival: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    priority: list[int] = []
    objectives: list[tuple[float, float]] = []
    skipped = 0
    low = 0 if layout.public_log else 1
    for line, record in records:
        for column in layout.required:
            if record.get(column) in (None, ""):
                raise StepPlannerValueError(f"{where} line {line}: column {column!r} is missing")
        p = _integer(path, line, layout.prompt, record[layout.prompt], low)
        o = _integer(path, line, layout.output, record[layout.output], low)
        at = f"{where} line {line}: column {layout.arrival!r}"
        t = _arrival(at, record[layout.arrival], layout.unit)
        if t < 0 and not layout.public_log:
            raise StepPlannerValueError(
                f"{at}: {record[layout.arrival]!r} is out of range; "
                "allowed: a finite number of seconds >= 0"
            )
        if p == 0 or o == 0:
            skipped += 1
            continue
        raw = record.get(layout.priority) if layout.priority else None
        priority.append(
            0 if raw in (None, "") else _integer(path, line, str(layout.priority), raw, INT32_MIN)
        )
        objectives.append(_objectives(where, line, record))
        arrival.append(t)
        prompt.append(p)
        output.append(o)
    if not arrival:
        raise StepPlannerValueError(f"{where}: no requests with prompt and output tokens >= 1")
    times = np.array(arrival, dtype=np.float64)
    if layout.public_log:
        times -= times.min()
    source = f"{path} ({layout.name})"
    if skipped:
        source += f", {skipped} rows with 0 prompt or output tokens skipped"
    slo = np.array(objectives, dtype=np.float64).reshape(-1, 2)
    return Workload(
        times,
        np.array(prompt, dtype=np.int32),
        np.array(output, dtype=np.int32),
        np.array(priority, dtype=np.int32),
        source=source,
        ttft_slo=slo[:, 0],
        tpot_slo=slo[:, 1],
    )


def _objectives(where: str, line: int, record: Mapping[str, Any]) -> tuple[float, float]:
    """A row's own (TTFT, TPOT) objectives in seconds from ``ttft_slo_ms``/``tpot_slo_ms``;
    NaN for an empty cell or a missing column."""
    out = []
    for column in SLO_COLUMNS:
        raw = record.get(column)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            out.append(math.nan)
            continue
        at = f"{where} line {line}: column {column!r}"
        try:
            value = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            raise StepPlannerValueError(
                f"{at}: {raw!r} is not a number of milliseconds; "
                "allowed: a number > 0, or empty for none"
            ) from None
        if not (math.isfinite(value) and value > 0):
            raise StepPlannerValueError(
                f"{at}: {raw!r} is out of range; allowed: a finite "
                "number of milliseconds > 0, or empty for none"
            )
        out.append(value / 1e3)
    if math.isnan(out[0]) and not math.isnan(out[1]):
        raise StepPlannerValueError(
            f"{where} line {line}: column {SLO_COLUMNS[1]!r} without {SLO_COLUMNS[0]!r}; "
            "allowed: a per-token objective beside a TTFT one"
        )
    return out[0], out[1]


def _arrival(at: str, raw: Any, unit: str) -> float:
    if unit == "datetime":
        return _datetime_seconds(at, raw)
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        raise StepPlannerValueError(f"{at}: {raw!r} is not a number ({unit})") from None
    if not math.isfinite(value):
        raise StepPlannerValueError(f"{at}: {raw!r} is not a finite number ({unit})")
    scale = UNITS[unit]
    assert scale is not None
    return value * scale


def _datetime_seconds(at: str, raw: Any) -> float:
    """``2023-11-16 18:15:46.6805900`` (Azure writes 7 fractional digits) -> seconds since
    ``_EPOCH``."""
    text = str(raw).strip()
    head, dot, fraction = text.partition(".")
    try:
        moment = datetime.datetime.fromisoformat(head)
        extra = float(f"0.{fraction}") if dot and fraction.isdigit() else 0.0
        if dot and not fraction.isdigit():
            raise ValueError
    except ValueError:
        raise StepPlannerValueError(
            f"{at}: {raw!r} is not a date-time (YYYY-MM-DD HH:MM:SS[.fraction])"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    whole = (moment - _EPOCH) // datetime.timedelta(seconds=1)
    return whole + extra


def _integer(path: pathlib.Path, line: int, column: str, raw: Any, low: int) -> int:
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str):
        try:
            value = int(raw)
        except ValueError:
            value = None
    if value is None:
        raise StepPlannerValueError(
            f"trace {path} line {line}: column {column!r}: {raw!r} is not an integer"
        )
    if not low <= value <= INT32_MAX:
        raise StepPlannerValueError(
            f"trace {path} line {line}: column {column!r}: {value} is out of range;"
            f" allowed: {low}..{INT32_MAX}"
        )
    return value


def sample_trace_path() -> pathlib.Path:
    """The small trace shipped with the package (synthetic, 300 requests; see docs)."""
    return pathlib.Path(str(resources.files("stepplanner") / "data" / "sample_trace.csv"))


def load_trace(path: str | pathlib.Path) -> Workload:
    """Read a CSV (``.csv``) or JSON Lines (``.jsonl``/``.ndjson``) trace; see the module doc.

    The stepplanner layout of ``traces.read_trace``, which reads every layout."""
    return read_trace(path, STEPPLANNER_LAYOUT)
