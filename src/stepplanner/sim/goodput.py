"""SLO attainment and goodput of a run: who met their deadlines, measured the ways the field does.

A request's objectives (``Workload.objectives``: its own, else its class's) give it deadlines:
its first token by ``arrival + ttft``, its token ``i`` (0 = the first) by ``arrival + ttft + i *
tpot`` (``planner._slo.deadline_of``; Etalon's fluidity deadlines, slack carried forward). Per
request with objectives, two verdicts:

* **attained**: it completed and every one of its tokens came by its deadline (the strict,
  per-token definition the deadline policies aim at);
* **good** by vLLM's ``benchmark_serving --goodput`` definition: it completed, its TTFT <=
  ``ttft`` and, when it has a per-token objective, its mean TPOT ``(e2e - ttft) / (output - 1)``
  <= ``tpot`` (0 for a one-token output, as vLLM counts it).

Both are taken over *every arrival* with objectives: a request refused at submission, one left
unfinished (a run cut by ``max_steps``) and one the DEADLINE policy relegated count as misses
(relegation is the policy giving up on a request; it is served, but not counted as a success).
``missed`` splits the misses by cause, each counted once: refused, relegated, unfinished, late.
Requests without objectives are in no share; they are counted (``without_slo``).

Per class and overall (``"all"``): the shares (``attainment``, ``vllm_attainment``), goodput in
requests/s (attained, or good, requests over the run's span: first arrival to the end of the
last step), P99 inter-token latency beside it (so that pausing cannot buy goodput with stalls
unseen), the share of tokens that came late, and the misses by cause.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from .workloads import Workload

__all__ = [
    "Outcomes",
    "attained_from_gaps",
    "attainment_report",
    "good_by_vllm",
    "request_outcomes",
]


@dataclasses.dataclass(frozen=True, eq=False)
class Outcomes:
    """Per request (workload order): whether it has objectives, completed, attained them, is
    good by vLLM's definition, was relegated or refused; its emitted and late tokens."""

    has_slo: np.ndarray
    completed: np.ndarray
    attained: np.ndarray
    vllm_good: np.ndarray
    relegated: np.ndarray
    refused: np.ndarray
    generated: np.ndarray
    late_tokens: np.ndarray


def request_outcomes(
    workload: Workload,
    first_token_time: np.ndarray,
    finish_time: np.ndarray,
    max_lateness: np.ndarray,
    late_tokens: np.ndarray,
    generated: np.ndarray,
    relegated: np.ndarray,
    refused: np.ndarray,
) -> Outcomes:
    """Each request's verdicts from a run's per-request times (simulated seconds, NaN: never)
    and its largest token lateness (``SimulationResult.max_lateness``)."""
    ttft_slo, tpot_slo = workload.objectives()
    has = ~np.isnan(ttft_slo)
    completed = ~np.isnan(finish_time)
    counted = has & completed & ~relegated
    ttft = first_token_time - workload.arrival_time
    good = good_by_vllm(
        ttft, finish_time - first_token_time, workload.output_tokens, ttft_slo, tpot_slo
    )
    return Outcomes(
        has_slo=has,
        completed=completed,
        attained=counted & (max_lateness <= 0),
        vllm_good=counted & good,
        relegated=relegated.copy(),
        refused=refused.copy(),
        generated=generated,
        late_tokens=late_tokens,
    )


def good_by_vllm(
    ttft: np.ndarray,
    decode_seconds: np.ndarray,
    output_tokens: np.ndarray,
    ttft_slo: np.ndarray,
    tpot_slo: np.ndarray,
) -> np.ndarray:
    """vLLM's ``--goodput`` verdict per request: TTFT <= ``ttft_slo`` and, with a per-token
    objective, mean TPOT ``decode_seconds / (output - 1)`` <= ``tpot_slo`` (0 for a one-token
    output). NaN objectives: none; completion and relegation are the caller's to add."""
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output_tokens > 1, decode_seconds / (output_tokens - 1), 0.0)
        good: np.ndarray = (ttft <= ttft_slo) & (np.isnan(tpot_slo) | (tpot <= tpot_slo))
    return good


def attained_from_gaps(
    ttft: np.ndarray,
    itls: list[np.ndarray] | tuple[np.ndarray, ...],
    ttft_slo: np.ndarray,
    tpot_slo: np.ndarray,
) -> np.ndarray:
    """Per request, whether every token met its deadline, from a results file's own numbers:
    its TTFT and inter-token gaps (seconds, vLLM's ``ttfts`` and ``itls``) against its
    objectives (NaN: none; a request without a TTFT objective is never attained). Token ``i``
    comes ``ttft + sum(itls[:i])`` after arrival and is due ``ttft_slo + i * tpot_slo`` after
    it. Completion and relegation are the caller's to add."""
    out = np.zeros(len(ttft), dtype=bool)
    for k, (first, gaps) in enumerate(zip(ttft, itls)):
        if np.isnan(ttft_slo[k]) or np.isnan(first):
            continue
        ok = first <= ttft_slo[k]
        if ok and len(gaps) and not np.isnan(tpot_slo[k]):
            times = first + np.cumsum(np.asarray(gaps, dtype=np.float64))
            due = ttft_slo[k] + np.arange(1, len(gaps) + 1) * tpot_slo[k]
            ok = bool(np.all(times <= due))
        out[k] = ok
    return out


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def attainment_report(
    workload: Workload, outcomes: Outcomes, span: float, p99_itl_s: Mapping[str, float | None]
) -> dict[str, Any]:
    """The report's ``slo_attainment`` section: per class (and ``"all"``) the counts, shares
    and rates of the module doc; ``p99_itl_s`` holds each class's P99 inter-token gap."""
    o = outcomes
    slo_classes = workload.slo_classes or {}
    groups = {"all": np.ones(len(workload), dtype=bool)}
    groups.update({str(p): workload.priority == p for p in workload.classes})
    classes: dict[str, Any] = {}
    for name, rows in groups.items():
        has = rows & o.has_slo
        with_slo = int(has.sum())
        attained, good = int((has & o.attained).sum()), int((has & o.vllm_good).sum())
        emitted = int(o.generated[has].sum())
        slo = slo_classes.get(int(name)) if name != "all" else None
        itl = p99_itl_s.get(name)
        classes[name] = {
            "requests": int(rows.sum()),
            "with_slo": with_slo,
            "without_slo": int(rows.sum()) - with_slo,
            "class_ttft_slo_ms": None if slo is None else slo.ttft * 1e3,
            "class_tpot_slo_ms": None if slo is None or slo.tpot is None else slo.tpot * 1e3,
            "attained": attained,
            "attainment": _share(attained, with_slo),
            "vllm_good": good,
            "vllm_attainment": _share(good, with_slo),
            "goodput_rps": attained / span,
            "vllm_goodput_rps": good / span,
            "p99_itl_ms": None if itl is None else itl * 1e3,
            "late_token_share": _share(int(o.late_tokens[has].sum()), emitted),
            "relegated": int((has & o.relegated).sum()),
            "missed": {
                "refused": int((has & o.refused).sum()),
                "unfinished": int((has & ~o.completed & ~o.refused & ~o.relegated).sum()),
                "relegated": int((has & o.relegated).sum()),
                "late": int((has & o.completed & ~o.relegated & ~o.attained).sum()),
            },
        }
    return {"span_s": span, "classes": classes}
