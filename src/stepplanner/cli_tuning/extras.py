"""What ``--slo``, ``--latency-model``, ``--metric-percentiles`` and ``--save-result`` add to
``simulate`` and ``compare``: goodput, the SLO checks, and vLLM's benchmark metrics."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from ..tuning.metrics import (
    DEFAULT_PERCENTILES,
    VLLM_METRICS,
    GapRecorder,
    percentile_word,
)
from ..tuning.slo import SloTarget
from ..tuning.sweep import assess
from .options import (
    check_output_path,
    compose,
    latency_model_option,
    latency_of,
    percentiles_option,
    slo_option,
)
from .render import ms, write_json

__all__ = ["GapRecorder", "check_output_path", "compare_options", "latency_of", "print_section",
           "print_slos", "save", "section", "simulate_options", "vllm_result", "write_json"]

_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}

simulate_options = compose(
    slo_option, latency_model_option, percentiles_option,
    click.option("--save-result", type=click.Path(dir_okay=False), default=None,
                 help="Write the metrics as vLLM's benchmark_serving --save-result does (JSON)."),
)
compare_options = compose(slo_option, latency_model_option)


def section(result: Any, gaps: GapRecorder, slos: Sequence[SloTarget],
            percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """``goodput``, ``meets_slo``, ``slo`` and ``vllm_metrics`` for a report."""
    assessed = assess(result, gaps, slos, percentiles)
    metrics = {k: v for k, v in assessed["metrics"].items()
               if not k.startswith("p") or any(k.startswith(f"p{percentile_word(p)}_")
                                               for p in percentiles)}
    return {"goodput": assessed["goodput"], "meets_slo": assessed["meets_slo"],
            "slo": assessed["slo"], "vllm_metrics": metrics}


def vllm_result(report: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The --save-result document: vLLM's keys, and what was simulated."""
    return {"date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
            "backend": "stepplanner-simulator", "model_id": report["latency_model"]["name"],
            "num_prompts": report["workload"]["requests"],
            "request_rate": report["workload"]["rate_per_s"],
            "policy": report["policy"], "limits": report["limits"],
            "slos": extra["slo"], **extra["vllm_metrics"]}


def save(path: str | None, report: dict[str, Any], extra: dict[str, Any]) -> None:
    if path is not None:
        write_json(path, vllm_result(report, extra))


def print_section(out: Console, extra: dict[str, Any], percentiles: Sequence[float]) -> None:
    m = extra["vllm_metrics"]
    cells = []
    for name in VLLM_METRICS:
        values = [f"mean {ms(m[f'mean_{name}_ms'])}", f"median {ms(m[f'median_{name}_ms'])}"]
        values += [f"p{percentile_word(p)} {ms(m[f'p{percentile_word(p)}_{name}_ms'])}"
                   for p in percentiles]
        cells.append(f"{_NAMES[name]} {', '.join(values)}")
    out.print("[bold]vLLM-style metrics[/] (ms; TPOT excludes the first token, ITL pools every "
              "inter-token gap)")
    for line in cells:
        out.print(f"  {line}")
    print_slos(out, extra)


def print_slos(out: Console, extra: dict[str, Any], label: str = "") -> None:
    if not extra["slo"]:
        return
    checks = ", ".join(
        f"{c['slo']} {ms(None if c['observed_s'] is None else c['observed_s'] * 1e3)}"
        f" {'≤' if c['met'] else '>'} {c['threshold_s'] * 1e3:g} ms" for c in extra["slo"])
    verdict = "met" if extra["meets_slo"] else "MISSED"
    out.print(f"[bold]SLOs {verdict}[/]{escape(label)}: {checks}; goodput "
              f"{extra['goodput']:.2f} req/s")
