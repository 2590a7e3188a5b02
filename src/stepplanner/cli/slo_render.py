"""The SLO attainment of runs as ``render`` blocks: ``simulate``'s table by class, ``compare``'s
metrics with a column per configuration (a row group per load with ``--load``), and the
columns ``sweep`` and ``capacity`` add. The numbers are ``report()["slo_attainment"]``
(``sim.goodput`` defines them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .render import Block, Column, Line, TableData, class_name

DEFINITIONS = Line(
    "SLO attainment",
    "over every arrival with objectives (refused, unfinished and relegated "
    "requests miss): attained = every token by its deadline (arrival + ttft + i * tpot); vLLM "
    "good = TTFT and mean TPOT within the objectives (benchmark_serving --goodput); goodput = "
    "such requests per simulated second; ITL p99 beside it",
)


def _pct(share: float | None) -> str | None:
    return None if share is None else f"{share:.1%}"


def _ms(value: float | None) -> str | None:
    return None if value is None else f"{value:,.1f}"


def _objective(c: dict[str, Any]) -> str | None:
    if c["class_ttft_slo_ms"] is None:
        return None
    tpot = c["class_tpot_slo_ms"]
    return f"{c['class_ttft_slo_ms']:g}" + ("" if tpot is None else f" / {tpot:g}")


def attainment_blocks(report: dict[str, Any]) -> list[Block]:
    """``simulate``: one row per class (``all`` first)."""
    att = report.get("slo_attainment")
    if att is None:
        return []
    columns = [
        Column("class", left=True),
        Column("TTFT / TPOT\nSLO ms"),
        Column("with\nSLO", ","),
        Column("attained"),
        Column("vLLM\ngood"),
        Column("goodput\nreq/s", ".2f"),
        Column("vLLM goodput\nreq/s", ".2f"),
        Column("ITL\np99 ms"),
        Column("late\ntokens"),
        Column("relegated", ","),
        Column("refused /\nunfinished"),
    ]
    rows = [
        [
            class_name(key),
            _objective(c),
            c["with_slo"],
            _pct(c["attainment"]),
            _pct(c["vllm_attainment"]),
            c["goodput_rps"],
            c["vllm_goodput_rps"],
            _ms(c["p99_itl_ms"]),
            _pct(c["late_token_share"]),
            c["relegated"],
            f"{c['missed']['refused']} / {c['missed']['unfinished']}",
        ]
        for key, c in att["classes"].items()
    ]
    return [TableData("SLO attainment by priority class", columns, rows), DEFINITIONS]


# (label, key in a class's numbers, format, per class too)
_COMPARED: tuple[tuple[str, str, Any, bool], ...] = (
    ("attained", "attainment", _pct, True),
    ("vLLM good", "vllm_attainment", _pct, False),
    ("goodput req/s", "goodput_rps", lambda v: f"{v:.2f}", False),
    ("vLLM goodput req/s", "vllm_goodput_rps", lambda v: f"{v:.2f}", False),
    ("ITL p99 ms", "p99_itl_ms", _ms, True),
    ("relegated", "relegated", lambda v: f"{v:,}", False),
)


def attainment_comparison(
    reports: Sequence[dict[str, Any]],
    names: Sequence[str],
    loads: Sequence[tuple[float, float] | None] = (None,),
    main: bool = False,
) -> list[Block]:
    """``compare``: the SLO metrics as rows and a column per configuration. ``reports`` run
    load by load, ``len(names)`` per load; ``loads`` gives each load's (multiple of saturation,
    rate) or None for the workload as given."""
    if not any(r.get("slo_attainment") for r in reports):
        return []
    per_load = len(names)
    columns = ([Column("load", left=True)] if loads != (None,) else []) + [
        Column("metric", left=True),
        *(Column(name) for name in names),
    ]
    rows: list[list[str | None]] = []
    for k, load in enumerate(loads):
        group = reports[k * per_load : (k + 1) * per_load]
        classes = list(group[0]["slo_attainment"]["classes"])
        lead: list[str | None] = [] if load is None else [f"{load[0]:g}x ({load[1]:.2f}/s)"]
        rows.append(
            [*lead, "completed req/s", *(f"{r['throughput']['requests_per_s']:.2f}" for r in group)]
        )
        lead = [] if load is None else [""]  # the load once, on its group's first row
        if load is not None and any("prefix_cache" in r for r in group):
            # Per load (without --load the main table has these columns).
            caches = [r.get("prefix_cache") for r in group]
            rows.append(
                [*lead, "prompt tokens cached"]
                + [None if c is None else f"{c['cached_share']:.1%}" for c in caches]
            )
            rows.append(
                [*lead, "late hits"]
                + [None if c is None else f"{c['late_hits']:,}" for c in caches]
            )
        for label, key, fmt, by_class in _COMPARED:
            for c in classes if by_class else ["all"]:
                where = "" if c == "all" else f" [{class_name(c)}]"
                rows.append(
                    [
                        *lead,
                        label + where,
                        *(
                            fmt(r["slo_attainment"]["classes"][c][key])
                            if r["slo_attainment"]["classes"][c][key] is not None
                            else None
                            for r in group
                        ),
                    ]
                )
    return [
        TableData(
            "SLO attainment" + (" by load (x saturation)" if loads != (None,) else ""),
            columns,
            rows,
            main=main,
        ),
        DEFINITIONS,
    ]


def sweep_attainment(record: dict[str, Any]) -> list[Any]:
    """``sweep``'s two extra cells of a record: attainment and goodput over all arrivals."""
    att = (record.get("attainment") or {}).get("classes", {}).get("all")
    if att is None:
        return [None, None]
    return [_pct(att["attainment"]), att["goodput_rps"]]


# Named apart from sweep's own goodput (requests/s within every --slo threshold), a different
# figure: requests/s that attain every token deadline of their class.
SWEEP_COLUMNS = [
    Column("deadlines\nattained", drop=3),
    Column("attained\nreq/s", ".2f", drop=4),
]
SWEEP_DEFINITIONS = Line(
    DEFINITIONS.label,
    DEFINITIONS.text.replace("goodput = such requests", "attained req/s = such requests"),
)


def capacity_attainment(record: dict[str, Any], max_rate: float) -> list[Any]:
    """``capacity``'s extra cells of a record: the rates at 90% and 99% attainment."""
    found = record.get("attainment_capacity")
    if found is None:
        return [None, None]
    return [f"≥ {max_rate:.2f}" if c["unbounded"] else c["capacity"] for c in found.values()]


CAPACITY_COLUMNS = [
    Column("capacity at\n≥ 90% attained", ".2f"),
    Column("capacity at\n≥ 99% attained", ".2f"),
]
