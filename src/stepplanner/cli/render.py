"""Every report the commands print, in each output format, shared so they look alike.

A report is a list of blocks: labelled text lines (``Line``) and tables (``TableData``, raw
values plus a format per column). ``emit`` writes them as

- ``table``: rich text and tables for a terminal. A table that does not fit the console's width
  is printed vertically (one block of ``column: value`` lines per row) instead of letting rich
  shrink columns, which cuts numbers and configuration names (``17.…``);
- ``md``: the lines as paragraphs and the tables as GitHub Markdown tables;
- ``csv``: the report's main table only (``main=True``), header row first, plain numbers.

JSON is each command's own report dictionary (``--json``), not a rendering of these blocks.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..sim.latency import TERMS
from ..sim.workloads import DEFAULT_CLASSES

FORMATS = ("table", "csv", "md")


def stdout_console() -> Console:
    """The console reports go to: the terminal's width, ``COLUMNS`` when set, else 160."""
    # Off a terminal rich assumes 80 columns; a pipe into a file has no width to honour.
    fixed = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
    return Console(width=None if fixed else 160, highlight=False)


# --- blocks -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Line:
    """``label`` in bold, then ``text``."""

    label: str
    text: str


@dataclasses.dataclass(frozen=True)
class Column:
    """A column: its header (``\\n`` splits it over two lines in the wide layout), the format
    spec of its numbers (``",.1f"``; thousands separators are dropped in CSV), alignment, and
    whether its text may wrap at spaces (prose such as a rule; numbers and names never wrap)."""

    header: str
    spec: str = ""
    left: bool = False
    wrap: bool = False
    drop: int = 0
    """Where a terminal too narrow for the whole grid leaves this column out: rank 1 first, then
    2, ...; 0 never (``print_table``). Formats other than ``table`` keep every column."""

    @property
    def name(self) -> str:
        return " ".join(self.header.split()).replace("/ ", "/")


@dataclasses.dataclass(frozen=True)
class TableData:
    title: str
    columns: Sequence[Column]
    rows: Sequence[Sequence[Any]]
    main: bool = False  # the table ``--format csv`` prints


Block = Line | TableData


def cell(column: Column, value: Any, plain: bool = False) -> str:
    """One value as text: ``None`` is ``-`` (empty in CSV), numbers through ``column.spec``."""
    if value is None:
        return "" if plain else "-"
    if isinstance(value, bool) or not isinstance(value, int | float) or not column.spec:
        return str(value)
    return format(value, column.spec.replace(",", "") if plain else column.spec)


def emit(blocks: Sequence[Block], fmt: str, console: Console | None = None) -> None:
    """Write ``blocks`` to stdout in ``fmt`` (one of ``FORMATS``)."""
    if fmt == "csv":
        table = next(b for b in blocks if isinstance(b, TableData) and b.main)
        click.echo(to_csv(table), nl=False)
    elif fmt == "md":
        click.echo(to_markdown(blocks))
    else:
        console = console or stdout_console()
        for block in blocks:
            if isinstance(block, Line):
                console.print(f"[bold]{escape(block.label)}[/] {escape(block.text)}")
            else:
                print_table(console, block)


def to_csv(table: TableData) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c.name for c in table.columns])
    for row in table.rows:
        writer.writerow([cell(c, v, plain=True) for c, v in zip(table.columns, row)])
    return out.getvalue()


def to_markdown(blocks: Sequence[Block]) -> str:
    parts = []
    for block in blocks:
        if isinstance(block, Line):
            parts.append(f"**{block.label}** {block.text}")
            continue
        lines = [f"**{block.title}**", ""] if block.title else []
        lines.append("| " + " | ".join(c.name for c in block.columns) + " |")
        lines.append("|" + "|".join("---" if c.left else "---:" for c in block.columns) + "|")
        for row in block.rows:
            texts = (cell(c, v).replace("|", "\\|") for c, v in zip(block.columns, row))
            lines.append("| " + " | ".join(texts) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


_BOX = 3  # per column: one rule and a space of padding each side (rich's default box)


def _widths(
    columns: Sequence[Column], texts: Sequence[Sequence[str]]
) -> tuple[list[int], list[int]]:
    """Each column's natural width and the least it can take with nothing cut: unwrappable
    columns (and every header line) whole, wrappable ones down to their longest word."""
    natural, least = [], []
    for k, column in enumerate(columns):
        cells = [row[k] for row in texts]
        header = column.header.splitlines()
        natural.append(max(cell_len(text) for text in [*header, *cells]))
        pieces = [word for text in cells for word in text.split()] if column.wrap else cells
        least.append(max(cell_len(text) for text in [*header, *pieces]))
    return natural, least


def grid_width(columns: Sequence[Column], texts: Sequence[Sequence[str]]) -> int:
    """The narrowest the grid can be with nothing cut, box included."""
    return sum(_widths(columns, texts)[1]) + _BOX * len(columns) + 1


def fit_widths(
    columns: Sequence[Column], texts: Sequence[Sequence[str]], width: int
) -> list[int] | None:
    """Column widths that fit ``width`` with nothing cut, narrowing the widest wrappable column
    one cell at a time; ``None`` when even the least widths do not fit. Set explicitly, so that
    rich never shrinks a column on its own (its shrinking cuts with an ellipsis)."""
    natural, least = _widths(columns, texts)
    excess = sum(natural) + _BOX * len(columns) + 1 - width
    if excess > sum(natural) - sum(least):
        return None
    widths = list(natural)
    for _ in range(max(excess, 0)):
        k = max(range(len(widths)), key=lambda i: widths[i] - least[i])
        widths[k] -= 1
    return widths


def _narrowed(
    table: TableData, texts: list[list[str]], width: int
) -> tuple[list[int], list[int]] | None:
    """The columns kept (indices) and their widths when the grid fits ``width`` uncut once the
    droppable columns are left out, by rank, as few ranks as it takes; None if it never does."""
    ranks = sorted({c.drop for c in table.columns if c.drop})
    for dropped in [0, *ranks]:
        kept = [k for k, c in enumerate(table.columns) if not 0 < c.drop <= dropped]
        widths = fit_widths(
            [table.columns[k] for k in kept], [[row[k] for k in kept] for row in texts], width
        )
        if widths is not None:
            return kept, widths
    return None


def print_table(console: Console, table: TableData) -> None:
    """The table as a grid when it fits ``console.width`` uncut, leaving out droppable columns
    if it must (a note names them), else row by row."""
    texts = [[cell(c, v) for c, v in zip(table.columns, row)] for row in table.rows]
    fitted = _narrowed(table, texts, console.width)
    if fitted is not None:
        kept, widths = fitted
        columns = [table.columns[k] for k in kept]
        grid = Table(title=escape(table.title) or None, title_justify="left")
        for column, w in zip(columns, widths):
            grid.add_column(
                escape(column.header),
                justify="left" if column.left else "right",
                no_wrap=not column.wrap,
                width=w,
                overflow="fold",
            )
        for row in texts:
            grid.add_row(*(escape(row[k]) for k in kept))
        console.print(grid)
        left_out = [c.name for k, c in enumerate(table.columns) if k not in kept]
        if left_out:
            console.print(
                f"[bold]left out[/] at {console.width} columns: {escape(', '.join(left_out))} "
                "(a wider terminal, or --format md, csv or json, shows them)"
            )
        return
    if table.title:
        console.print(f"[bold]{escape(table.title)}[/]")
    width = max((len(c.name) for c in table.columns[1:]), default=0)
    for row in texts:
        console.print(f"[bold]{escape(row[0])}[/]", overflow="fold")
        for column, text in zip(table.columns[1:], row[1:]):
            console.print(f"  {escape(column.name):<{width}}  {escape(text)}", overflow="fold")


# --- the reports -------------------------------------------------------------------------------


_CLASS_NAMES = {str(c.priority): f"{c.priority} {c.name}" for c in DEFAULT_CLASSES}
_MS = ",.1f"


def class_name(key: str) -> str:
    return _CLASS_NAMES.get(key, key)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def configuration_lines(r: dict[str, Any]) -> list[Block]:
    """What a run simulated: workload, engine limits, policy and latency model."""
    w, pol, lim, lm = r["workload"], r["policy"], r["limits"], r["latency_model"]
    return [
        Line(
            "workload",
            f"{w['source']}: {w['requests']} requests over {w['duration_s']:.1f} s,"
            f" mean prompt {w['prompt_tokens_mean']:.0f} / output "
            f"{w['output_tokens_mean']:.0f} tokens",
        ),
        Line(
            "engine",
            f"B={lim['max_batch_size']} S_in={lim['max_input_length']} P={lim['kv_page_size']}",
        ),
        Line(
            "policy",
            f"{pol['mode']} max_num_tokens={pol['max_num_tokens']} "
            f"max_chunk_tokens={pol['max_chunk_tokens']} {pol['scheduling_policy']} "
            f"preemption={pol['preemption']} reserved={pol['priority_reserved_slots']} "
            f"max_pause_steps={pol['max_pause_steps']}",
        ),
        Line(
            "latency model",
            f"{lm['name']}: a={lm['a']:g} s + b={lm['b']:g} s/token + "
            f"c={lm['c']:g} s/context"
            + "".join(f" + {k}={lm[k]:g}{TERMS[k]}" for k in "def" if lm.get(k)),
        ),
    ]


def report_blocks(r: dict[str, Any]) -> list[Block]:
    """``simulate``: the run's summary lines and its latency table by priority class."""
    t, s, p, pl, req = r["throughput"], r["steps"], r["pauses"], r["planner"], r["requests"]
    refused = f"{req['refused']} refused (prompt > S_in)"
    if s["truncated_by_max_steps"]:
        refused += ", run cut by --max-steps"
    columns = [Column("class", left=True)] + [
        Column(name, _MS)
        for name in (
            "queue p50",
            "queue p99",
            "TTFT p50",
            "TTFT p90",
            "TTFT p99",
            "TPOT p50",
            "TPOT p99",
            "E2E p50",
            "E2E p99",
            "ITL p99",
            "max ITL p99",
        )
    ]
    rows = [
        [
            class_name(key),
            _ms(lat["queue"]["p50"]),
            _ms(lat["queue"]["p99"]),
            _ms(lat["ttft"]["p50"]),
            _ms(lat["ttft"]["p90"]),
            _ms(lat["ttft"]["p99"]),
            _ms(lat["tpot"]["p50"]),
            _ms(lat["tpot"]["p99"]),
            _ms(lat["e2e"]["p50"]),
            _ms(lat["e2e"]["p99"]),
            _ms(lat["itl"]["p99"]),
            _ms(lat["max_itl"]["p99"]),
        ]
        for key, lat in r["latency_s"].items()
    ]
    reasons = ", ".join(f"{k} {v:,}" for k, v in r["reasons"].items() if v)
    return [
        *configuration_lines(r),
        Line("requests", f"{req['completed']}/{req['submitted']} completed, {refused}"),
        *prefix_cache_lines(r),
        Line(
            "throughput",
            f"{t['requests_per_s']:.2f} req/s, {t['output_tokens_per_s']:,.0f} "
            f"output tok/s, {t['tokens_per_s']:,.0f} tok/s over "
            f"{t['simulated_seconds']:.1f} simulated s",
        ),
        Line(
            "steps",
            f"{s['count']:,}: mean {s['mean_tokens']:.0f} tokens, "
            f"{s['mean_prefill_rows']:.2f} chunks + {s['mean_decode_rows']:.1f} decodes,"
            f" {s['mean_residents']:.0f} residents, {s['mean_step_ms']:.2f} ms",
        ),
        Line(
            "pauses",
            f"{p['paused_resident_steps']:,} paused resident-steps, "
            f"{p['requests_paused']} requests paused, longest "
            f"{p['max_consecutive_paused_steps']} steps in a row, "
            f"{p['released_by_max_pause_steps']:,} releases by max_pause_steps",
        ),
        TableData("latency by priority class (ms)", columns, rows, main=True),
        Line("reasons", f"(resident-steps) {reasons}"),
        Line(
            "host step",
            f"ledger.step (apply, retire, admit, plan) {pl['mean_step_us']:.2f} "
            f"us/step mean, p50 {pl['p50_step_us']:.2f}, p99 "
            f"{pl['p99_step_us']:.2f}; {s['count']:,} steps in "
            f"{pl['wall_seconds']:.2f} s = {pl['steps_per_s'] or 0:,.0f} steps/s",
        ),
    ]


_FIDELITY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
_THROUGHPUT_NAMES = {"requests_per_s": "req/s", "output_tokens_per_s": "output tok/s"}


def fidelity_blocks(r: dict[str, Any]) -> list[Block]:
    """``fidelity``: the real run, what was simulated, real beside simulated per class, and the
    figure of merit."""
    res, sim = r["results"], r["simulation"]
    rows = []
    for key, metrics in r["metrics"].items():
        for metric, name in _FIDELITY_NAMES.items():
            for p, v in metrics[metric].items():
                rows.append(
                    [
                        class_name(key),
                        f"{name} {p} (ms)",
                        _ms(v["real"]),
                        _ms(v["simulated"]),
                        v["error"],
                    ]
                )
        for metric, v in metrics.get("throughput", {}).items():
            rows.append(
                [class_name(key), _THROUGHPUT_NAMES[metric], v["real"], v["simulated"], v["error"]]
            )
    columns = [
        Column("class", left=True),
        Column("metric", left=True),
        Column("real", ",.2f"),
        Column("simulated", ",.2f"),
        Column("error", "+.1%"),
    ]
    scheduler = f", scheduler {res['scheduler']}" if res["scheduler"] else ""
    merit = [
        Line(
            "figure of merit" + (f" [{class_name(key)}]" if key != "all" else ""),
            _merit_text(s) + (" over p50 and p90 of TTFT, TPOT and E2E" if key == "all" else ""),
        )
        for key, s in r["summary"].items()
    ]
    return [
        Line(
            "real run",
            f"{res['file']} ({res['layout']} layout{scheduler}): "
            f"{res['requests']} requests, {res['failed']} failed, "
            f"{res['compared']} compared",
        ),
        *configuration_lines(r),
        Line(
            "simulation",
            f"{sim['completed']} completed, {sim['refused']} refused, "
            f"{sim['steps']:,} steps"
            + (", cut by --max-steps" if sim["truncated_by_max_steps"] else ""),
        ),
        TableData(
            "real vs simulated (error = (simulated - real) / real)", columns, rows, main=True
        ),
        *merit,
    ]


def _merit_text(s: dict[str, Any]) -> str:
    if s["median_abs_error"] is None:
        return "no figure has both sides"
    metric, p = s["worst"].split()
    missing = len(s["figures"]) - s["known"]
    return (
        f"median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} "
        f"({_FIDELITY_NAMES[metric]} {p})"
        + (f", {missing} figure(s) without both sides" if missing else "")
    )


def page_blocks(pages: dict[str, Any], steps: int, as_used: bool = False) -> list[Block]:
    """``simulate --num-pages``: page occupancy per step and the requests that waited for it
    (``as_used``: pages taken as KV grows, ``--kv-preemption``, rather than worst cases)."""
    n, held = pages["num_pages"], pages["steps_with_requests_held_for_pages"]
    refused = pages["refused_for_pages"]
    columns = [
        Column("per step", left=True),
        Column("mean", ",.1f"),
        Column("p50", ",.0f"),
        Column("p99", ",.0f"),
        Column("max", ",.0f"),
        Column("max/pool", ".1%"),
    ]
    rows = [
        [
            label,
            *(pages[key][stat] for stat in ("mean", "p50", "p99", "max")),
            pages[key]["max"] / n if pool else None,
        ]
        for label, key, pool in (
            ("reserved pages", "reserved", True),
            ("pages in use", "in_use", True),
            ("requests held back", "held_back", False),
        )
    ]
    return [
        TableData(
            f"KV pages (pool of {n:,}; "
            + ("taken as KV grows)" if as_used else "worst cases reserved)"),
            columns,
            rows,
        ),
        Line(
            "held back",
            f"requests waited for pages in {held:,} of {steps:,} steps"
            + (f"; {refused:,} refused (worst case > pool)" if refused else ""),
        ),
    ]


def comparison_blocks(reports: list[dict[str, Any]]) -> list[Block]:
    """``compare``: one row per configuration."""
    first = reports[0]
    w, lim = first["workload"], first["limits"]
    classes = [k for k in first["latency_s"] if k != "all"]
    columns = [
        Column("configuration", left=True),
        Column("budget/\nchunk"),
        Column("req/s", ".2f"),
        Column("out\ntok/s", ",.0f"),
        Column("tok/\nstep", ".0f"),
        Column("TTFT\np50", _MS),
        Column("TTFT\np99", _MS),
        *(Column(f"TTFT p99\n[{c}]", _MS) for c in classes),
        Column("TPOT\np99", _MS),
        Column("max ITL\np99", _MS),
        Column("E2E\np99", _MS),
        Column("paused\nsteps", ","),
        Column("step\nus", ".2f"),
    ]
    rows = []
    for r in reports:
        lat, pol = r["latency_s"], r["policy"]
        rows.append(
            [
                r["name"],
                f"{pol['max_num_tokens']}/{pol['max_chunk_tokens']}",
                r["throughput"]["requests_per_s"],
                r["throughput"]["output_tokens_per_s"],
                r["steps"]["mean_tokens"],
                _ms(lat["all"]["ttft"]["p50"]),
                _ms(lat["all"]["ttft"]["p99"]),
                *(_ms(lat[c]["ttft"]["p99"]) if c in lat else None for c in classes),
                _ms(lat["all"]["tpot"]["p99"]),
                _ms(lat["all"]["max_itl"]["p99"]),
                _ms(lat["all"]["e2e"]["p99"]),
                r["pauses"]["paused_resident_steps"],
                r["planner"]["mean_step_us"],
            ]
        )
    return [
        Line(
            "workload",
            f"{w['source']}: {w['requests']} requests; engine "
            f"B={lim['max_batch_size']} S_in={lim['max_input_length']} "
            f"P={lim['kv_page_size']}; {first['latency_model']['name']}",
        ),
        TableData("", columns, rows, main=True),
        Line(
            "units",
            "latencies in ms of simulated time; step us = measured microseconds "
            "of the host step (ledger.step) on this machine",
        ),
    ]


def with_page_columns(blocks: list[Block], reports: list[dict[str, Any]]) -> list[Block]:
    """``compare`` with ``num_pages`` in a configuration: its main table gains the pool, the
    peak pages reserved and in use, and the steps in which requests waited for pages (``-`` for
    configurations with unlimited pages)."""
    if not any("pages" in r for r in reports):
        return blocks
    extra = [
        Column("KV\npages", ","),
        Column("reserved\nmax", ",.0f"),
        Column("in use\nmax", ",.0f"),
        Column("steps\nheld", ","),
    ]

    def values(r: dict[str, Any]) -> list[Any]:
        pages = r.get("pages")
        if pages is None:
            return [None] * len(extra)
        return [
            pages["num_pages"],
            pages["reserved"]["max"],
            pages["in_use"]["max"],
            pages["steps_with_requests_held_for_pages"],
        ]

    return with_main_columns(blocks, reports, extra, values)


def prefix_cache_lines(r: dict[str, Any]) -> list[Block]:
    """A run with a prefix cache: the prompt tokens its hits spared and its late hits."""
    c = r.get("prefix_cache")
    if c is None:
        return []
    return [
        Line(
            "prefix cache",
            f"{c['cached_tokens']:,} of {c['prompt_tokens']:,} prompt tokens cached "
            f"({c['cached_share']:.1%}); {c['late_hits']:,} late hits (admissions whose prefix "
            "grew while they waited)",
        )
    ]


PREFIX_COLUMNS = [Column("prompt\ncached", ".1%"), Column("late\nhits", ",")]


def prefix_cache_values(r: dict[str, Any]) -> list[Any]:
    """A report's ``PREFIX_COLUMNS`` (``-`` for a run without a prefix cache)."""
    c = r.get("prefix_cache")
    return [None, None] if c is None else [c["cached_share"], c["late_hits"]]


def with_prefix_columns(blocks: list[Block], reports: list[dict[str, Any]]) -> list[Block]:
    """``compare`` on a run with a prefix cache: its main table gains the share of prompt
    tokens cached and the late hits of each configuration."""
    if not any("prefix_cache" in r for r in reports):
        return blocks
    return with_main_columns(blocks, reports, PREFIX_COLUMNS, prefix_cache_values)


def with_main_columns(
    blocks: list[Block],
    reports: list[dict[str, Any]],
    extra: list[Column],
    values: Callable[[dict[str, Any]], list[Any]],
) -> list[Block]:
    """``blocks`` with the ``extra`` columns added to the main table, one row per report,
    filled by ``values(report)``."""
    return [
        dataclasses.replace(
            b,
            columns=[*b.columns, *extra],
            rows=[[*row, *values(r)] for row, r in zip(b.rows, reports)],
        )
        if isinstance(b, TableData) and b.main
        else b
        for b in blocks
    ]


def explanation_blocks(e: dict[str, Any]) -> list[Block]:
    """``explain``: the resolved policy with its rules, then every resident's outcome."""
    policy = TableData(
        "resolved policy (SPEC §2)",
        [
            Column("field", left=True),
            Column("value", left=True),
            Column("rule", left=True, wrap=True),
        ],
        [[row["field"], row["value"], row["rule"]] for row in e["policy"]],
    )
    rows = []
    for r in e["residents"]:
        reason = (r["reason"] or "-") + (
            " (released from pause)" if r["released_from_pause"] else ""
        )
        planned = r["planned"]
        what = (
            "-"
            if planned is None
            else (f"{planned['work']} past={planned['past_length']} q={planned['query_length']}")
        )
        rows.append(
            [
                r["index"],
                r["request_id"],
                r["priority"],
                r["arrival"],
                r["prompt_length"],
                r["committed"],
                "yes" if r["context_committed"] else "no",
                r["consecutive_paused_steps"],
                reason,
                what,
            ]
        )
    residents = TableData(
        "residents",
        [
            Column("#"),
            Column("request"),
            Column("prio"),
            Column("arrival"),
            Column("prompt"),
            Column("committed"),
            Column("ctx done"),
            Column("paused"),
            Column("reason", left=True, wrap=True),
            Column("planned", left=True, wrap=True),
        ],
        rows,
        main=True,
    )
    p, budget = e["plan"], e["step_budget"]
    return [
        policy,
        residents,
        Line("step budget", f"{budget['tokens']} tokens: {budget['rule']}"),
        Line(
            "plan",
            f"{p['num_prefill']} chunks ({p['prefill_tokens']} tokens) + "
            f"{p['num_decode']} decodes = {p['total_tokens']} tokens; paused "
            f"{p['paused']}",
        ),
    ]


def print_replay(console: Console, result: Any, show: int) -> None:
    if not result.diffs:
        console.print(f"replayed {result.steps} steps: every plan matches the recording")
        return
    console.print(f"[bold red]replayed {result.steps} steps: {len(result.diffs)} differ[/]")
    for diff in result.diffs[:show]:
        console.print(f"[bold]step {diff['step']}[/] (line {diff['line']}):")
        for text in diff["differences"][:12]:
            console.print(f"  {text}", markup=False)
        if len(diff["differences"]) > 12:
            console.print(f"  ... {len(diff['differences']) - 12} more")
