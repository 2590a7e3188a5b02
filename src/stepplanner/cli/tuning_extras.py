"""What ``--slo``, ``--latency-model``, ``--metric-percentiles`` and ``--save-result`` add to
``simulate`` and ``compare``: goodput, the SLO checks, and vLLM's benchmark metrics."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from typing import Any

import click

from ..tuning.metrics import DEFAULT_PERCENTILES, VLLM_METRICS, percentile_word
from ..tuning.slo import SloTarget
from ..tuning.sweep import assess
from .options import compose
from .render import Block, Column, Line, TableData
from .tuning_options import latency_model_option, percentiles_option, slo_option
from .tuning_render import write_json

_NAMES = {
    "ttft": "TTFT",
    "tpot": "TPOT (excl. 1st token)",
    "itl": "ITL (every gap)",
    "e2el": "E2EL",
}

simulate_options = compose(
    slo_option,
    latency_model_option,
    percentiles_option,
    click.option(
        "--save-result",
        type=click.Path(dir_okay=False),
        default=None,
        help="Write the metrics as vLLM's benchmark_serving --save-result does (JSON).",
    ),
    click.option(
        "--save-detailed",
        is_flag=True,
        default=False,
        help="With --save-result: add the per-request results in the layout "
        "serve-trace writes (vLLM's input_lens, output_lens, ttfts, itls, ... "
        "plus request_ids, arrival_times, priorities, ttft_slos, tpot_slos, "
        "relegated), from which every figure can be recomputed.",
    ),
)
compare_options = compose(slo_option, latency_model_option)


def section(
    result: Any, slos: Sequence[SloTarget], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, Any]:
    """``goodput``, ``meets_slo``, ``slo`` and ``vllm_metrics`` for a report."""
    assessed = assess(result, slos, percentiles)
    chosen = {f"p{percentile_word(p)}_" for p in percentiles}
    metrics = {
        k: v
        for k, v in assessed["metrics"].items()
        if not k.startswith("p") or any(k.startswith(c) for c in chosen)
    }
    return {
        "goodput": assessed["goodput"],
        "meets_slo": assessed["meets_slo"],
        "slo": assessed["slo"],
        "vllm_metrics": metrics,
    }


def save(path: str | None, report: dict[str, Any], detailed: dict[str, Any] | None = None) -> None:
    """--save-result: vLLM's keys, and what was simulated; with --save-detailed the
    per-request results document (``fidelity.simulated.results_document``) underneath."""
    if path is None:
        return
    write_json(
        path,
        {
            **(detailed or {}),
            "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
            "backend": "stepplanner-simulator",
            "model_id": report["latency_model"]["name"],
            "num_prompts": report["workload"]["requests"],
            "request_rate": report["workload"]["rate_per_s"],
            "policy": report["policy"],
            "limits": report["limits"],
            "slos": report["slo"],
            **({"slo_attainment": report["slo_attainment"]} if "slo_attainment" in report else {}),
            **report["vllm_metrics"],
        },
    )


def vllm_blocks(report: dict[str, Any], percentiles: Sequence[float]) -> list[Block]:
    """The metrics as vLLM's benchmark prints them, then the SLO verdict."""
    m = report["vllm_metrics"]
    words = [percentile_word(p) for p in percentiles]
    columns = [
        Column("metric (ms)", left=True),
        Column("mean", ",.1f"),
        Column("median", ",.1f"),
        *(Column(f"p{w}", ",.1f") for w in words),
    ]
    rows = [
        [
            _NAMES[name],
            m[f"mean_{name}_ms"],
            m[f"median_{name}_ms"],
            *(m[f"p{w}_{name}_ms"] for w in words),
        ]
        for name in VLLM_METRICS
    ]
    return [
        TableData("vLLM-style metrics (completed requests, simulated time)", columns, rows),
        *slo_blocks(report),
    ]


def slo_blocks(report: dict[str, Any], name: str = "") -> list[Block]:
    if not report["slo"]:
        return []
    checks = ", ".join(
        f"{c['slo']} {_ms(c['observed_s'])} {'≤' if c['met'] else '>'} "
        f"{c['threshold_s'] * 1e3:g} ms"
        for c in report["slo"]
    )
    verdict = "met" if report["meets_slo"] else "MISSED"
    label = f"SLOs {verdict}" + (f" for {name}" if name else "")
    return [Line(label, f"{checks}; goodput {report['goodput']:.2f} req/s")]


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "inf" if math.isinf(seconds) else f"{seconds * 1e3:,.1f}"
