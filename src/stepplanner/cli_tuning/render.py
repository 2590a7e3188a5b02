"""Tables, CSV files, JSON documents and plots of sweep and capacity records."""

from __future__ import annotations

import csv
import importlib
import json
import math
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from ..tuning.slo import SloTarget


def console() -> Console:
    # Off a terminal rich assumes 80 columns and would fold the tables.
    return Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "inf"
    return f"{value:,.1f}"


def _budget(record: dict[str, Any]) -> str:
    pol = record.get("policy")
    if not pol:
        return "-"
    return f"{pol['mode'].lower()} {pol['max_num_tokens']}/{pol['max_chunk_tokens']}"


def _slo_cells(record: dict[str, Any], slos: Sequence[SloTarget]) -> list[str]:
    by_key = {row["slo"]: row for row in record.get("slo", [])}
    cells = []
    for slo in slos:
        row = by_key.get(slo.key)
        if row is None:
            cells.append("-")
            continue
        observed = None if row["observed_s"] is None else row["observed_s"] * 1e3
        cells.append(f"{ms(observed)}{'' if row['met'] else ' ✗'}")
    return cells


def sweep_table(records: Sequence[dict[str, Any]], slos: Sequence[SloTarget],
                out: Console) -> None:
    table = Table(title="configurations by goodput (* = Pareto front on TTFT p99, TPOT p99, "
                        "throughput)", title_justify="left")
    for col in ("#", "configuration", "mode budget/chunk", "goodput", "req/s", "TTFT p99",
                "TPOT p99", "ITL p99", "E2E p99", *(f"{s.key}\n≤ {s.seconds * 1e3:g}" for s in
                                                     slos), "SLOs", "front"):
        table.add_column(col, justify="left" if col in ("configuration", "mode budget/chunk")
                         else "right", no_wrap=col != "configuration")
    rank = 0
    for r in records:
        if r.get("error") is not None:
            continue
        rank += 1
        m = r["metrics"]
        table.add_row(str(rank), r["label"], _budget(r), f"{r['goodput']:.2f}",
                      f"{r['throughput']:.2f}", ms(m["p99_ttft_ms"]), ms(m["p99_tpot_ms"]),
                      ms(m["p99_itl_ms"]), ms(m["p99_e2el_ms"]), *_slo_cells(r, slos),
                      "met" if r["meets_slo"] else "missed", "*" if r["pareto"] else "")
    out.print(table)
    errors(records, out)
    out.print("latencies in ms of simulated time; goodput = requests/s within every SLO")


def capacity_table(records: Sequence[dict[str, Any]], out: Console) -> None:
    table = Table(title="capacity: highest arrival rate meeting every SLO", title_justify="left")
    for col in ("configuration", "mode budget/chunk", "capacity req/s", "fails at",
                "probes", "TTFT p99", "TPOT p99"):
        table.add_column(col, justify="left" if col in ("configuration", "mode budget/chunk")
                         else "right", no_wrap=col != "configuration")
    for r in records:
        if r.get("error") is not None:
            continue
        at = r["at_capacity"] or {}
        table.add_row(r["label"], _budget(r), f"{r['capacity']:.2f}",
                      "-" if r["upper"] is None else f"{r['upper']:.2f}", str(len(r["probes"])),
                      ms(at.get("p99_ttft_ms")), ms(at.get("p99_tpot_ms")))
    out.print(table)
    errors(records, out)
    out.print("TTFT/TPOT p99 in ms at the capacity rate; 'fails at' is the lowest probed rate "
              "that missed an SLO")


def errors(records: Sequence[dict[str, Any]], out: Console) -> None:
    bad = [r for r in records if r.get("error") is not None]
    if bad:
        out.print(f"[bold]{len(bad)} configuration(s) did not resolve:[/]")
        for r in bad:
            out.print(f"  {r['label']}: {r['error']}", markup=False)


def flat(record: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: grid values, resolved budgets, scalars and metrics."""
    row: dict[str, Any] = {"index": record["index"], "label": record["label"]}
    row.update({f"option.{k}": v for k, v in record["options"].items()})
    for key in ("mode", "max_num_tokens", "max_chunk_tokens"):
        row[key] = (record.get("policy") or {}).get(key)
    for key in ("goodput", "throughput", "meets_slo", "pareto", "capacity", "upper", "error"):
        if key in record:
            row[key] = record[key]
    for check in record.get("slo", []):
        row[f"{check['slo']}_ms"] = (None if check["observed_s"] is None
                                     else check["observed_s"] * 1e3)
    row.update(record.get("metrics", {}))
    return row


def write_csv(path: str, records: Sequence[dict[str, Any]]) -> None:
    rows = [flat(r) for r in records]
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def document(workload: dict[str, Any], latency: Any, slos: Sequence[SloTarget],
             grid: dict[str, list[str]], outcome: Any, records: list[dict[str, Any]],
             **extra: Any) -> dict[str, Any]:
    """The --json document of a command over configurations."""
    return {"workload": workload,
            "latency_model": {"name": latency.name, "a": latency.a, "b": latency.b,
                              "c": latency.c},
            "slos": [str(s) for s in slos], "grid": grid, **extra,
            "backend": outcome.backend, "workers": outcome.workers,
            "interrupted": outcome.interrupted, "results": records}


def save(doc: dict[str, Any], json_path: str | None, csv_path: str | None) -> str:
    """Write the document (JSON) and its records (CSV) where asked; the JSON text."""
    if csv_path:
        write_csv(csv_path, doc["results"])
    return write_json(json_path, doc)


def write_json(path: str | None, document: dict[str, Any]) -> str:
    """Strict JSON (an infinite or NaN latency becomes null); written to ``path`` if given."""
    text = json.dumps(_finite(document), indent=2, allow_nan=False)
    if path is not None:
        pathlib.Path(path).write_text(text + "\n", encoding="utf-8")
    return text


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def require_matplotlib() -> Any:
    try:
        mpl = importlib.import_module("matplotlib")
    except ImportError:
        raise ValueError("--plot needs matplotlib, which is not installed; install it with: "
                         "pip install 'stepplanner[plot]'") from None
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plot_front(path: str, records: Sequence[dict[str, Any]], slos: Sequence[SloTarget],
               title: str) -> None:
    """TTFT p99 against TPOT p99, coloured by throughput; the front joined and labelled; the
    TTFT/TPOT p99 objectives drawn as the corner of the feasible region."""
    plt = require_matplotlib()
    ok = [r for r in records if r.get("error") is None]
    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [r["metrics"]["p99_tpot_ms"] for r in ok]
    ys = [r["metrics"]["p99_ttft_ms"] for r in ok]
    sc = ax.scatter(xs, ys, c=[r["throughput"] for r in ok], cmap="viridis", s=36,
                    edgecolors=["red" if r["pareto"] else "none" for r in ok], linewidths=1.2)
    fig.colorbar(sc, ax=ax, label="throughput (req/s)")
    front = sorted((r for r in ok if r["pareto"]), key=lambda r: r["metrics"]["p99_tpot_ms"])
    for r in front:
        ax.annotate(_short(r), (r["metrics"]["p99_tpot_ms"], r["metrics"]["p99_ttft_ms"]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    for slo in slos:
        if slo.priority is None and slo.percentile == 99:
            if slo.metric == "tpot":
                ax.axvline(slo.seconds * 1e3, color="grey", ls="--", lw=1)
            elif slo.metric == "ttft":
                ax.axhline(slo.seconds * 1e3, color="grey", ls="--", lw=1)
    ax.set(xlabel="TPOT p99 (ms, simulated)", ylabel="TTFT p99 (ms, simulated)", yscale="log",
           title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short(record: dict[str, Any]) -> str:
    pol = record["policy"]
    if pol["mode"] == "PREFILL_FIRST":
        return "prefill_first"
    return f"{pol['max_num_tokens']}/{pol['max_chunk_tokens']}"
