"""The reports of ``sweep`` and ``capacity`` as ``render`` blocks (so ``--format table|csv|md``
works as for every command), their JSON documents and CSV files, and the Pareto-front plot."""

from __future__ import annotations

import csv
import importlib
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..tuning.slo import SloTarget
from .plot import latency_axis, new_figure
from .plot import save as save_figure
from .render import PREFIX_COLUMNS, Block, Column, Line, TableData, prefix_cache_values
from .slo_render import (
    CAPACITY_COLUMNS,
    SWEEP_COLUMNS,
    SWEEP_DEFINITIONS,
    capacity_attainment,
    sweep_attainment,
)

_MS = ",.1f"


def _budget(record: dict[str, Any]) -> str | None:
    pol = record.get("policy")
    if not pol:
        return None
    return f"{pol['mode'].lower()} {pol['max_num_tokens']}/{pol['max_chunk_tokens']}"


def _observed_ms(record: dict[str, Any], slo: SloTarget) -> str | None:
    return _check_ms(next((c for c in record.get("slo", []) if c["slo"] == slo.key), None))


def _check_ms(row: dict[str, Any] | None) -> str | None:
    """One ``slo_report`` row's observed value in ms, marked ✗ when it missed."""
    if row is None or row["observed_s"] is None:
        return None
    value = row["observed_s"] * 1e3
    text = "inf" if math.isinf(value) else format(value, _MS)
    return text if row["met"] else f"{text} ✗"


def _errors(records: Sequence[dict[str, Any]]) -> list[Block]:
    return [
        Line("did not resolve", f"{r['label']}: {r['error']}")
        for r in records
        if r.get("error") is not None
    ]


def _worst_miss(record: dict[str, Any]) -> float:
    """How far a record is from its SLOs: the largest observed / threshold (inf for a check
    that observed nothing, or a run cut short), what 'closest' ranks by."""
    if record.get("truncated"):
        return math.inf
    ratios = [
        math.inf if c["observed_s"] is None else c["observed_s"] / c["threshold_s"]
        for c in record.get("slo", [])
    ]
    return max(ratios, default=0.0)


def _misses(record: dict[str, Any]) -> str:
    """``ttft_p99 177.5 ms > 100 ms, tpot_p99 12.5 ms > 10 ms``: the checks a record missed."""
    missed = [
        f"{c['slo']} {_check_ms({**c, 'met': True})} ms > {c['threshold_s'] * 1e3:g} ms"
        for c in record.get("slo", [])
        if not c["met"]
    ]
    if record.get("truncated"):
        missed.append("run stopped by --max-steps")
    return ", ".join(missed)


def verdict(records: Sequence[dict[str, Any]], slos: Sequence[SloTarget]) -> Line | None:
    """One line for the top of a sweep: whether any configuration meets every SLO, and which
    to read first (the best by goodput that meets them, else the closest: the smallest worst
    observed / threshold). None without SLOs."""
    ran = [(rank, r) for rank, r in enumerate((r for r in records if r.get("error") is None), 1)]
    if not slos or not ran:
        return None
    meeting = [(rank, r) for rank, r in ran if r["meets_slo"]]
    if meeting:
        rank, best = meeting[0]
        return Line(
            "verdict",
            f"{len(meeting)} of {len(ran)} configurations meet every SLO; the best by goodput: "
            f"#{rank} {best['label']}",
        )
    rank, closest = min(ran, key=lambda item: (_worst_miss(item[1]), item[0]))
    return Line(
        "verdict",
        f"no configuration meets every SLO; closest: #{rank} {closest['label']} "
        f"({_misses(closest)})",
    )


def sweep_blocks(
    records: Sequence[dict[str, Any]], slos: Sequence[SloTarget], header: str
) -> list[Block]:
    """The verdict, then configurations by goodput with the Pareto front marked, then those
    that did not resolve. At 80 columns the grid leaves out what the SLO columns repeat and the
    tail latencies (``Column.drop``) rather than turning into rows of ``name value`` lines."""
    on_slo = {s.metric for s in slos if s.priority is None and s.percentile == 99}
    columns = [
        Column("#"),
        Column("configuration", left=True, wrap=True),
        Column("mode budget/\nchunk", left=True, drop=5),
        Column("goodput\nreq/s", ".2f"),
        Column("req/s", ".2f"),
        Column("TTFT\np99", _MS, drop=6 if "ttft" in on_slo else 9),
        Column("TPOT\np99", _MS, drop=7 if "tpot" in on_slo else 10),
        Column("ITL\np99", _MS, drop=2),
        Column("E2E\np99", _MS, drop=1),
        *(Column(f"{s.key}\n≤ {s.seconds * 1e3:g} ms") for s in slos),
        Column("SLOs", left=True),
        Column("front", left=True, drop=8),
    ]
    deadlines = any(r.get("attainment") for r in records)
    if deadlines:
        columns[4:4] = SWEEP_COLUMNS
    ok = [r for r in records if r.get("error") is None]
    rows = []
    for rank, r in enumerate(ok, start=1):
        m = r["metrics"]
        rows.append(
            [
                rank,
                r["label"],
                _budget(r),
                r["goodput"],
                *(sweep_attainment(r) if deadlines else []),
                r["throughput"],
                m["p99_ttft_ms"],
                m["p99_tpot_ms"],
                m["p99_itl_ms"],
                m["p99_e2el_ms"],
                *(_observed_ms(r, s) for s in slos),
                "met" if r["meets_slo"] else "missed",
                "*" if r["pareto"] else "",
            ]
        )
    if any("recomputed_tokens" in r for r in records):  # --kv-preemption
        columns.append(Column("recomputed\ntokens", ","))
        rows = [[*row, r.get("recomputed_tokens")] for row, r in zip(rows, ok)]
    if any("prefix_cache" in r for r in records):  # --workload prefix-heavy
        columns.extend(PREFIX_COLUMNS)
        rows = [[*row, *prefix_cache_values(r)] for row, r in zip(rows, ok)]
    found = verdict(records, slos)
    return [
        Line("sweep", header),
        *([found] if found is not None else []),
        TableData(
            "configurations by goodput (* = Pareto front on TTFT p99, TPOT p99, throughput)",
            columns,
            rows,
            main=True,
        ),
        *_errors(records),
        Line(
            "units",
            "latencies in ms of simulated time; goodput = requests/s within every "
            "SLO (✗ = an SLO missed)",
        ),
        *([SWEEP_DEFINITIONS] if deadlines else []),
    ]


def conditions(slos: Sequence[SloTarget], stability: SloTarget | None) -> str:
    """What a capacity must meet, for the header: the SLOs and the stability condition."""
    text = f"SLOs {', '.join(str(s) for s in slos)}" if slos else "no SLO"
    if stability is None:
        return f"{text}; no stability condition (--no-stability)"
    return f"{text}; stability {stability} (queueing delay, arrival to admission)"


def capacity_blocks(
    records: Sequence[dict[str, Any]],
    slos: Sequence[SloTarget],
    stability: SloTarget | None,
    max_rate: float,
    header: str,
) -> list[Block]:
    columns = [
        Column("configuration", left=True),
        Column("mode budget/\nchunk", left=True),
        Column("capacity\nreq/s", ".2f"),
        Column("fails at\nreq/s", ".2f"),
        Column("probes"),
        Column("TTFT p99\nat capacity", _MS),
        Column("TPOT p99\nat capacity", _MS),
        *(
            []
            if stability is None
            else [Column(f"{stability.key}\n≤ {stability.seconds * 1e3:g} ms")]
        ),
    ]
    deadlines = any(r.get("attainment_capacity") for r in records)
    if deadlines:
        columns[4:4] = CAPACITY_COLUMNS
    rows = []
    for r in records:
        if r.get("error") is not None:
            continue
        at = r["at_capacity"] or {}
        # Unbounded: met everything at the search's ceiling, which is a bound, not a capacity.
        found = f"≥ {max_rate:.2f}" if r["unbounded"] else r["capacity"]
        rows.append(
            [
                r["label"],
                _budget(r),
                found,
                r["upper"],
                *(capacity_attainment(r, max_rate) if deadlines else []),
                len(r["probes"]),
                at.get("p99_ttft_ms"),
                at.get("p99_tpot_ms"),
                *([] if stability is None else [_check_ms(at.get("stability"))]),
            ]
        )
    return [
        Line("capacity", header),
        TableData(
            f"highest arrival rate meeting every SLO"
            f"{'' if stability is None else ' and the stability condition'}",
            columns,
            rows,
            main=True,
        ),
        *_errors(records),
        Line(
            "units",
            "'fails at' is the lowest probed rate that missed a condition; a "
            "capacity '≥ R' met every condition at --max-rate R (no capacity was "
            "found below it); latencies in ms of simulated time",
        ),
        *(
            [
                Line(
                    "capacity at attainment",
                    "the highest rate at which that share of all "
                    "arrivals attains every deadline (DistServe), under the stability "
                    "condition",
                )
            ]
            if deadlines
            else []
        ),
    ]


# --- files ---------------------------------------------------------------------------------------


def document(
    workload: dict[str, Any],
    latency: Any,
    slos: Sequence[SloTarget],
    grid: dict[str, list[str]],
    outcome: Any,
    records: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """The --json document of a command over configurations."""
    return {
        "workload": workload,
        "latency_model": {"name": latency.name, **latency.coefficients()},
        "slos": [str(s) for s in slos],
        "grid": grid,
        **extra,
        "backend": outcome.backend,
        "workers": outcome.workers,
        "interrupted": outcome.interrupted,
        "results": records,
    }


def save(doc: dict[str, Any], json_path: str | None, csv_path: str | None) -> str:
    """Write the document (JSON) and its records (CSV) where asked; the JSON text."""
    if csv_path:
        write_csv(csv_path, doc["results"])
    return write_json(json_path, doc)


def flat(record: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: grid values, resolved budgets, scalars and every metric."""
    row: dict[str, Any] = {"index": record["index"], "label": record["label"]}
    row.update({f"option.{k}": v for k, v in record["options"].items()})
    for key in ("mode", "max_num_tokens", "max_chunk_tokens"):
        row[key] = (record.get("policy") or {}).get(key)
    for key in (
        "goodput",
        "throughput",
        "meets_slo",
        "pareto",
        "capacity",
        "unbounded",
        "upper",
        "error",
    ):
        if key in record:
            row[key] = record[key]
    overall = ((record.get("attainment") or {}).get("classes") or {}).get("all")
    if overall is not None:
        row["deadlines_attained"] = overall["attainment"]
        row["attained_rps"] = overall["goodput_rps"]
    for target, found in (record.get("attainment_capacity") or {}).items():
        row[f"capacity_attainment_{target}"] = found["capacity"]
    for check in record.get("slo", []):
        row[f"{check['slo']}_ms"] = (
            None if check["observed_s"] is None else check["observed_s"] * 1e3
        )
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


def write_json(path: str | None, doc: Any) -> str:
    """Strict JSON (an infinite or NaN latency becomes null); written to ``path`` if given."""
    text = json.dumps(_finite(doc), indent=2, allow_nan=False)
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


# --- the plot ------------------------------------------------------------------------------------


def plot_front(
    path: str, records: Sequence[dict[str, Any]], slos: Sequence[SloTarget], title: str
) -> None:
    save_figure(front_figure(records, slos, title), path)


def front_figure(records: Sequence[dict[str, Any]], slos: Sequence[SloTarget], title: str) -> Any:
    """TTFT p99 against TPOT p99, coloured by goodput, the figure the table ranks by; the front
    ringed and labelled; the TTFT/TPOT p99 objectives drawn as the corner of the region that
    meets them. Axes in plain milliseconds (``latency_axis``). The colours are binned at the
    goodputs' quantiles, so that each band holds as many configurations and a few far below the
    rest (a budget too small to keep up) do not leave the others one colour."""
    colors = importlib.import_module("matplotlib.colors")
    ok = [r for r in records if r.get("error") is None]
    tpot = np.array([r["metrics"]["p99_tpot_ms"] for r in ok], dtype=np.float64)
    ttft = np.array([r["metrics"]["p99_ttft_ms"] for r in ok], dtype=np.float64)
    good = np.array([r["goodput"] for r in ok], dtype=np.float64)
    fig = new_figure(figsize=(9, 6), layout="tight")
    ax = fig.subplots()
    bounds = np.unique(np.quantile(good, np.linspace(0, 1, 9))) if good.size else good
    norm = (
        colors.BoundaryNorm(bounds, 256)
        if bounds.size > 1
        else colors.Normalize(good.min() - 0.5, good.max() + 0.5)
        if good.size
        else None
    )
    sc = ax.scatter(
        tpot,
        ttft,
        c=good,
        cmap="viridis",
        norm=norm,
        s=36,
        edgecolors=["red" if r["pareto"] else "none" for r in ok],
        linewidths=1.2,
    )
    bar = fig.colorbar(sc, ax=ax, label="goodput (req/s within every SLO)")
    if bounds.size > 1:
        bar.set_ticks(bounds)
        bar.set_ticklabels([f"{b:,.2f}" for b in bounds])
    labelled: set[tuple[float, float]] = set()
    for r, point in zip(ok, zip(tpot.tolist(), ttft.tolist())):
        if r["pareto"] and point not in labelled:
            labelled.add(point)
            ax.annotate(_short(r), point, fontsize=7, xytext=(4, 4), textcoords="offset points")
    drawn = {"tpot": [tpot], "ttft": [ttft]}
    for slo in slos:
        if slo.priority is None and slo.percentile == 99 and slo.metric in drawn:
            draw = ax.axvline if slo.metric == "tpot" else ax.axhline
            draw(slo.seconds * 1e3, color="grey", ls="--", lw=1)
            drawn[slo.metric].append(np.array([slo.seconds * 1e3]))
    latency_axis(ax, np.concatenate(drawn["tpot"]), "TPOT p99 (ms, simulated)")
    latency_axis(ax, np.concatenate(drawn["ttft"]), "TTFT p99 (ms, simulated)", which="y")
    ax.set_title(f"{title}: {len(ok)} configurations")
    return fig


def _short(record: dict[str, Any]) -> str:
    pol = record["policy"]
    if pol["mode"] == "PREFILL_FIRST":
        return "prefill_first"
    return f"{pol['max_num_tokens']}/{pol['max_chunk_tokens']}"
