"""Run metrics in the dialect of vLLM's serving benchmark (``benchmark_serving.py``).

vLLM reports, over *successful* (here: completed) requests, the mean, median, standard deviation
and chosen percentiles (``--metric-percentiles``, default 99) of

* TTFT: arrival to first output token;
* TPOT: ``(e2e - ttft) / (output_tokens - 1)``, excluding the first token, for outputs of two or
  more tokens;
* ITL: every gap between two consecutive output tokens of a request, all requests pooled;
* E2EL: arrival to last output token;

in milliseconds, under keys ``mean_ttft_ms``, ``median_ttft_ms``, ``std_ttft_ms``,
``p99_ttft_ms`` (``p99.9_itl_ms`` for a fractional percentile), with ``request_throughput``,
``output_throughput``, ``total_token_throughput`` and ``request_goodput`` beside them (good
requests per second by the run's objectives, None without any: ``request_goodput``). Percentiles
are numpy's linear interpolation, as there. Times are simulated seconds.

ITL comes from the simulator's pooled sample (``SimulationResult.itl``: every gap as
(seconds, count) pairs), which covers every request that emitted two tokens; in a run that was
not cut short by ``max_steps`` those are exactly the completed ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import StepPlannerValueError

# The simulator's own pooled-ITL helpers: one way to weigh its (seconds, count) sample.
from ..sim.simulator import pooled_itl, run_span, weighted_percentile

__all__ = ["DEFAULT_PERCENTILES", "parse_percentiles", "request_goodput", "vllm_metrics"]

DEFAULT_PERCENTILES: tuple[float, ...] = (99.0,)
VLLM_METRICS = ("ttft", "tpot", "itl", "e2el")


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99"`` -> (50.0, 90.0, 99.0); each in (0, 100]."""
    return parse_number_list(
        text, "metric percentile", lambda v: 0 < v <= 100, "0 < p <= 100", "50,90,99"
    )


def parse_number_list(
    text: str, what: str, within: Callable[[float], bool], allowed: str, example: str
) -> tuple[float, ...]:
    """``"0.8,1,1.2"`` -> (0.8, 1.0, 1.2): comma-separated finite numbers each ``within`` its
    range; errors name ``what``, say what is ``allowed`` and give an ``example``."""
    out: list[float] = []
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        try:
            value = float(item)
        except ValueError:
            raise StepPlannerValueError(
                f"{what} {item!r} is not a number; allowed: "
                f"comma-separated numbers, {allowed}, e.g. {example}"
            ) from None
        if not (math.isfinite(value) and within(value)):
            raise StepPlannerValueError(f"{what} {item!r} is out of range; allowed: {allowed}")
        out.append(value)
    if not out:
        raise StepPlannerValueError(f"{what}s {text!r} is empty; allowed: e.g. {example}")
    return tuple(out)


def percentile_word(p: float) -> str:
    """vLLM's key spelling: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def series_stats(name: str, seconds: np.ndarray, percentiles: Sequence[float]) -> dict[str, float]:
    """vLLM's mean/median/std/pN keys (ms) of one series of seconds; 0 for an empty one."""
    values = seconds if seconds.size else np.zeros(1)  # vLLM reports 0 for an empty series
    # One selection pass for the median and every percentile (ITL pools millions of gaps).
    ranked = np.percentile(values, [50.0, *percentiles])
    out = {
        f"mean_{name}_ms": float(values.mean()) * 1e3,
        f"median_{name}_ms": float(ranked[0]) * 1e3,
        f"std_{name}_ms": float(values.std()) * 1e3,
    }
    for p, value in zip(percentiles, ranked[1:]):
        out[f"p{percentile_word(p)}_{name}_ms"] = float(value) * 1e3
    return out


def vllm_metrics(
    result: Any, percentiles: Sequence[float] = DEFAULT_PERCENTILES, goodput: float | None = None
) -> dict[str, Any]:
    """The ``benchmark_serving`` result keys for a ``SimulationResult``."""
    w = result.workload
    done = ~np.isnan(result.finish_time)
    lat = result.latencies()
    span = simulated_span(result)
    total_input = int(w.prompt_tokens[done].sum())
    total_output = int(result.generated[done].sum())
    out: dict[str, Any] = {
        "duration": span,
        "completed": int(done.sum()),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": float(done.sum()) / span,
        "request_goodput": goodput,
        "output_throughput": total_output / span,
        "total_token_throughput": (total_input + total_output) / span,
    }
    tpot = lat["tpot"][done]
    series = {"ttft": lat["ttft"][done], "tpot": tpot[~np.isnan(tpot)], "e2el": lat["e2e"][done]}
    for name in VLLM_METRICS:
        if name == "itl":
            out.update(weighted_series_stats(name, *pooled_itl(result.itl), percentiles))
        else:
            out.update(series_stats(name, series[name], percentiles))
    return out


def request_goodput(
    slos: Sequence[Any], slo_goodput: float, attainment: dict[str, Any] | None
) -> float | None:
    """vLLM's ``request_goodput``: good requests per second by the objectives the run was given,
    as ``benchmark_serving --goodput`` counts them, or None (vLLM writes null) without any.

    ``--slo`` thresholds are the benchmark's own ``--goodput`` (``slo_goodput``: a request good
    when its own TTFT, TPOT, E2E... are within them); without them, the requests' objectives
    (``attainment``, ``sim.goodput``): good when its TTFT and mean TPOT are within its own, the
    report's ``vllm_goodput_rps`` over every arrival with objectives. Without either, goodput is
    not defined: never the throughput under another name."""
    if slos:
        return slo_goodput
    if attainment is not None:
        rate: float = attainment["classes"]["all"]["vllm_goodput_rps"]
        return rate
    return None


def weighted_series_stats(
    name: str, values: np.ndarray, counts: np.ndarray, percentiles: Sequence[float]
) -> dict[str, float]:
    """``series_stats`` of ``np.repeat(values, counts)`` without building it (millions of gaps)."""
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    if not values.size:
        return series_stats(name, np.zeros(0), percentiles)
    total = float(counts.sum())
    mean = float((values * counts).sum()) / total
    std = math.sqrt(float((counts * (values - mean) ** 2).sum()) / total)
    out = {
        f"mean_{name}_ms": mean * 1e3,
        f"median_{name}_ms": _ms(weighted_percentile(values, counts, 50.0)),
        f"std_{name}_ms": std * 1e3,
    }
    for p in percentiles:
        out[f"p{percentile_word(p)}_{name}_ms"] = _ms(weighted_percentile(values, counts, p))
    return out


def _ms(seconds: float | None) -> float:
    return 0.0 if seconds is None else seconds * 1e3


def simulated_span(result: Any) -> float:
    """Simulated seconds from the first arrival to the last step, as ``report()`` measures
    (``simulator.run_span``)."""
    return run_span(result)
