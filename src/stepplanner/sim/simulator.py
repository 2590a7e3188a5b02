"""A discrete-step simulator: workload -> admission -> plan -> step latency -> apply -> retire.

Each step: requests that have arrived are submitted to the ``Ledger`` (with their output length
as ``max_new_tokens``); one ``ledger.step(planner)`` call applies the previous step's plan, counts
the tokens it emitted (the chunk completing a prompt emits the first, each decode row one more;
with speculative decoding, ``Speculation``, one more per draft it accepted),
retires the requests that have produced all their output tokens, admits into the free slots and
plans; the step then takes ``LatencyModel`` seconds of simulated time. With nobody resident the
clock jumps to the next arrival.

The ledger's bookkeeping is C; the simulator's own measurements (token times, gaps, pauses) are
numpy over the plan's and ledger's arrays, with no per-request Python per step; Python only loops
per event (an arrival). The ``ledger.step`` call is timed with ``perf_counter_ns`` (``step_ns``):
those are real microseconds of this machine, unlike the simulated seconds.

Objectives (``Workload.objectives``): each request is submitted with its arrival time and its
own SLO (its class's come from ``Ledger(slo_classes=...)``), and every ``ledger.step`` gets the
simulated ``now`` (the end of the previous step, when its tokens were emitted), so the EDF and
DEADLINE policies rank on the simulated clock. Their step-time estimate (``step_time_of``) is the
latency model at a full batch: the ledger prices a step of ``t`` tokens as ``base + per_token *
t`` at the policy's full budget, and the model's context, attention and row terms are folded in
at B rows of the workload's mean context (docs/simulator.md, "SLOs and goodput", says why).
Every emitted token's lateness against its deadline (``deadline_of``: arrival + ttft + i * tpot)
is measured as it is emitted, and the requests DEADLINE relegates are kept
(``SimulationResult.relegated``); ``sim.goodput`` turns them into attainment and goodput.

The serving front (``ServingQueue``): by default every request may wait (the workload is the
whole demand); ``max_waiting`` bounds the queue, and a request it refuses is counted as a 429
(``SimulationResult.queue_full``) and a miss. ``relegated_wait`` and ``never_relegate_below`` are
the ledger's (docs/scheduling.md, "Overload"): a request the ledger hands back
(``ledger.shed_ids``) is answered then (``SimulationResult.shed_time``) and counts as a miss.

Record/replay: ``StepRecorder`` writes one JSON line per step (the ledger rows the plan was made
over and the plan); ``replay`` re-plans each recorded step and reports the steps whose plan
differs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

import numpy as np

from .. import _errors
from .._errors import QueueFullError, StepPlannerValueError
from ..core import StepPlanner  # the package's choice: compiled unless STEPPLANNER_IMPL=python
from ..ledger import RESIDENT_FIELDS, Ledger
from ..ledger.step_time import StepTimeBudget
from ..planner._fields import enum_fields
from ..planner._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
)
from ..planner._slo import SLO
from ..planner._types import (
    REASON_RELEASED_FROM_PAUSE,
    RESIDENT_DTYPE,
    Reason,
    SequenceWork,
)
from . import goodput
from .engine import DEFAULT_LIMITS, Engine, RunSpec, ServingQueue, Speculation, resolve_options
from .latency import DEFAULT_LATENCY, EnginePace, LatencyModel
from .prefix_front import PrefixFront
from .workloads import Workload, json_lines

__all__ = [
    "DEFAULT_LIMITS",
    "RECORD_FORMAT",
    "ServingQueue",
    "SimulationResult",
    "SimulationRun",
    "Speculation",
    "StepRecorder",
    "policy_from_dict",
    "policy_to_dict",
    "pooled_itl",
    "read_record_header",
    "replay",
    "resolve_options",
    "simulate",
    "simulate_run",
    "step_time_of",
    "weighted_percentile",
]

RECORD_FORMAT = "stepplanner-steps/1"
PERCENTILES = (50, 90, 99)
STEP_FIELDS = (
    "end_time",
    "seconds",
    "tokens",
    "context",
    "num_prefill",
    "num_decode",
    "num_paused",
    "residents",
    "waiting",
    "step_ns",
)

# The per-token gap of a request without a per-token objective: its tokens after the first are
# due after any simulated time.
NO_GAP = 1e300


OnStep = Callable[[int, float, Ledger, Any], None]
Progress = Callable[[int, float, int], None]


@dataclasses.dataclass(eq=False)
class SimulationResult:
    """Everything a run produced: per-request times, per-step records, and the configuration.

    Per-request arrays are indexed like the workload; times are simulated seconds (NaN when the
    event never happened, e.g. a refused request or a run cut short by ``max_steps``).
    """

    workload: Workload
    limits: StepPlannerLimits
    policy: ResolvedSchedulingPolicy
    latency: LatencyModel
    admit_time: np.ndarray
    first_token_time: np.ndarray
    finish_time: np.ndarray
    generated: np.ndarray
    max_gap: np.ndarray
    paused_steps: np.ndarray
    refused: np.ndarray
    steps: dict[str, np.ndarray]
    reason_counts: np.ndarray
    max_consecutive_paused: int
    wall_seconds: float
    truncated: bool
    itl: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)
    """Per priority class (``workload.classes`` order): every gap between two consecutive output
    tokens of its requests, as (seconds, count) pairs."""
    max_lateness: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    """Per request, the largest (emission time - deadline) over its emitted tokens, in seconds
    (> 0: a deadline missed; -inf: no token emitted, or no deadlines)."""
    late_tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    speculation: Speculation | None = None
    draft_tokens: int = 0
    """Speculative decoding: the drafts the decode rows verified, and how many were accepted."""
    accepted_drafts: int = 0
    """Per request, how many of its tokens came after their deadlines."""
    relegated: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Per request, whether the DEADLINE policy relegated it (ledger.relegated_ids)."""
    relegate_time: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    """Per request, when it was relegated (NaN: never)."""
    shed_time: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    """Per request, when the ledger handed it back unserved (ledger.shed_ids; NaN: never)."""
    queue_full: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Per request, whether a full queue refused it (a server's HTTP 429); also ``refused``."""
    queue: ServingQueue = dataclasses.field(default_factory=ServingQueue)
    """The serving front of the run."""
    refused_beside_relegated: int = 0
    """429s given while a request relegated in the queue still waited there."""
    token_requests: np.ndarray | None = None
    """``simulate(detailed=True)``: per emitted token in emission order, its request's row."""
    token_steps: np.ndarray | None = None
    """``simulate(detailed=True)``: per emitted token, the step that emitted it (its time is
    that step's ``end_time``)."""
    kv_preemption: str | None = None
    """A paged run that preempts for KV pages (``sim.preemption``): its victim rule."""
    preempted: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Per request, how many times it was preempted (its KV dropped, recomputed later)."""
    recomputed_tokens: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0, dtype=np.int64)
    )
    """Per request, the computed tokens its preemptions threw away (recomputed when resumed)."""
    preemption_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    """Run-wide preemption counts beside the per-request ones (``sim.preemption``)."""
    cached_tokens: np.ndarray | None = None
    """A run with shared prefixes (``sim.prefix_front``): per request, the tokens of its prompt
    its prefix-cache hit spared it."""
    late_hits: int = 0
    """Admissions whose prefix grew in the cache while they waited (their hit was looked up at
    arrival)."""

    @property
    def num_steps(self) -> int:
        return len(self.steps["tokens"])

    def token_times(self) -> list[np.ndarray]:
        """Per request (workload order), every output token's emission time (simulated
        seconds); needs a run made with ``detailed=True``."""
        if self.token_requests is None or self.token_steps is None:
            raise StepPlannerValueError("token_times needs a run simulated with detailed=True")
        order = np.argsort(self.token_requests, kind="stable")  # emission order kept per request
        times = self.steps["end_time"][self.token_steps[order]]
        bounds = np.cumsum(np.bincount(self.token_requests, minlength=len(self.workload)))
        return np.split(times, bounds[:-1])

    def attainment(self) -> dict[str, Any] | None:
        """The run's SLO attainment and goodput (``report()["slo_attainment"]``; see
        ``sim.goodput``); None when no request has objectives."""
        if not self.workload.has_objectives:
            return None
        p99_itl = {
            name: weighted_percentile(*sample, 99) for name, sample in self.itl_by_class().items()
        }
        return goodput.attainment_report(self.workload, self.outcomes(), run_span(self), p99_itl)

    def itl_by_class(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The pooled ITL sample (seconds, count) of all requests (``"all"``) and of each class."""
        itl = {"all": pooled_itl(self.itl)}
        itl.update(
            {str(p): pooled_itl(self.itl[k : k + 1]) for k, p in enumerate(self.workload.classes)}
        )
        return itl

    def outcomes(self) -> goodput.Outcomes:
        """Per request: objectives, attained, good by vLLM's definition (``sim.goodput``)."""
        return goodput.request_outcomes(
            self.workload,
            self.first_token_time,
            self.finish_time,
            self.max_lateness,
            self.late_tokens,
            self.generated,
            self.relegated,
            self.refused,
        )

    def latencies(self) -> dict[str, np.ndarray]:
        """Per-request seconds: queueing, TTFT, TPOT (NaN for 1-token outputs), end-to-end,
        and the longest gap between two of its output tokens."""
        w = self.workload
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(
                w.output_tokens > 1,
                (self.finish_time - self.first_token_time) / (w.output_tokens - 1),
                np.nan,
            )
        return {
            "queue": self.admit_time - w.arrival_time,
            "ttft": self.first_token_time - w.arrival_time,
            "tpot": tpot,
            "e2e": self.finish_time - w.arrival_time,
            "max_itl": np.where(w.output_tokens > 1, self.max_gap, np.nan),
        }

    def report(self) -> dict[str, Any]:
        """JSON-ready metrics of the run (see docs/simulator.md for each one)."""
        w, st = self.workload, self.steps
        done = ~np.isnan(self.finish_time)
        span = run_span(self)
        step_us = st["step_ns"] / 1e3
        lat = self.latencies()
        classes = {"all": np.ones(len(w), dtype=bool)}
        classes.update({str(p): w.priority == p for p in w.classes})
        itl = self.itl_by_class()
        report = {
            "workload": w.summary(),
            "limits": dataclasses.asdict(self.limits),
            "policy": policy_to_dict(self.policy),
            "latency_model": dataclasses.asdict(self.latency),
            "requests": {
                "submitted": len(w),
                "refused": int(self.refused.sum()),
                "admitted": int((~np.isnan(self.admit_time)).sum()),
                "completed": int(done.sum()),
            },
            "throughput": {
                "simulated_seconds": span,
                "requests_per_s": float(done.sum()) / span,
                "output_tokens_per_s": float(self.generated.sum()) / span,
                "tokens_per_s": float(st["tokens"].sum()) / span,
            },
            "steps": {
                "count": self.num_steps,
                "truncated_by_max_steps": self.truncated,
                "mean_tokens": _mean(st["tokens"]),
                "mean_prefill_rows": _mean(st["num_prefill"]),
                "mean_decode_rows": _mean(st["num_decode"]),
                "mean_residents": _mean(st["residents"]),
                "mean_step_ms": _mean(st["seconds"]) * 1e3,
            },
            "pauses": {
                "paused_resident_steps": int(self.paused_steps.sum()),
                "requests_paused": int((self.paused_steps > 0).sum()),
                "steps_with_pauses": int((st["num_paused"] > 0).sum()),
                "max_consecutive_paused_steps": self.max_consecutive_paused,
                "released_by_max_pause_steps": int(self.reason_counts[-1]),
            },
            "reasons": {r.name: int(self.reason_counts[r]) for r in Reason},
            "latency_s": {
                name: {
                    **{metric: _percentiles(values[mask]) for metric, values in lat.items()},
                    "itl": {f"p{q}": weighted_percentile(*itl[name], q) for q in PERCENTILES},
                }
                for name, mask in classes.items()
            },
            "planner": {
                "mean_step_us": _mean(step_us),
                "p50_step_us": _pct(step_us, 50),
                "p99_step_us": _pct(step_us, 99),
                "wall_seconds": self.wall_seconds,
                "steps_per_s": self.num_steps / self.wall_seconds if self.wall_seconds else None,
            },
        }
        if self.shed_time.size:
            report["queue"] = self.queue_report()
        if self.speculation is not None:
            report["speculation"] = self.speculation_report()
        if self.kv_preemption is not None:
            report["preemption"] = {
                "victim_rule": self.kv_preemption,
                "preemptions": int(self.preempted.sum()),
                "requests_preempted": int((self.preempted > 0).sum()),
                "recomputed_tokens": int(self.recomputed_tokens.sum()),
                **self.preemption_counts,
            }
        if self.cached_tokens is not None:
            report["prefix_cache"] = self.prefix_cache_report()
        attainment = self.attainment()
        if attainment is not None:
            report["slo_attainment"] = attainment
        return report

    def prefix_cache_report(self) -> dict[str, Any]:
        """A run with a prefix cache (``sim.prefix_front``: shared prefixes or a peer's
        order): the prompt tokens its hits spared, their share of every prompt token of the
        workload, and ``late_hits``."""
        assert self.cached_tokens is not None
        cached, prompt = int(self.cached_tokens.sum()), int(self.workload.prompt_tokens.sum())
        return {
            "cached_tokens": cached,
            "prompt_tokens": prompt,
            "cached_share": cached / prompt,
            "late_hits": self.late_hits,
        }

    def speculation_report(self) -> dict[str, Any]:
        """Speculative decoding: the settings, the drafts verified and accepted, and the output
        tokens per decode row (1 + accepted drafts, averaged)."""
        spec = self.speculation
        assert spec is not None
        decode_rows = float(self.steps["num_decode"].sum())
        return {
            "num_spec_tokens": spec.num_spec_tokens,
            "acceptance": spec.acceptance,
            "draft_tokens": self.draft_tokens,
            "accepted_drafts": self.accepted_drafts,
            "accepted_fraction": (
                self.accepted_drafts / self.draft_tokens if self.draft_tokens else None
            ),
            "tokens_per_decode_row": (
                (decode_rows + self.accepted_drafts) / decode_rows if decode_rows else None
            ),
        }

    def queue_report(self) -> dict[str, Any]:
        """The serving front: its options, the 429s, the requests handed back, and the longest
        waits in the queue (to admission, or to being handed back unserved) — overall, and of
        the requests relegated while they waited, from their relegation."""
        w = self.workload
        left = np.where(np.isnan(self.admit_time), self.shed_time, self.admit_time)
        waited = left - w.arrival_time
        queued = ~np.isnan(self.relegate_time) & ~(self.admit_time < self.relegate_time)
        after = left[queued] - self.relegate_time[queued]
        unanswered = queued & np.isnan(left)  # still waiting when the run ended
        return {
            **dataclasses.asdict(self.queue),
            "admission": self.queue.admission.name.lower(),  # as --admission takes it
            "queue_full": int(self.queue_full.sum()),
            "queue_full_beside_relegated": self.refused_beside_relegated,
            "shed": int((~np.isnan(self.shed_time)).sum()),
            "relegated_waiting": int(queued.sum()),
            "unanswered_relegated": int(unanswered.sum()),
            "longest_wait_s": float(np.nanmax(waited)) if np.any(~np.isnan(waited)) else None,
            "longest_relegated_wait_s": (
                float(np.nanmax(after)) if np.any(~np.isnan(after)) else None
            ),
        }


def run_span(result: SimulationResult) -> float:
    """Simulated seconds from the first arrival to the end of the last step (the span every
    rate of a report is over)."""
    start = float(result.workload.arrival_time[0])
    end = float(result.steps["end_time"][-1]) if result.num_steps else start
    return max(end - start, 1e-12)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0


def _pct(values: np.ndarray, q: float) -> float | None:
    values = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    return float(np.percentile(values, q)) if values.size else None


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    return {f"p{q}": _pct(values, q) for q in PERCENTILES}


def pooled_itl(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Inter-token gaps of several classes as one (seconds, count) sample."""
    if not parts:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    return np.concatenate([v for v, _ in parts]), np.concatenate([c for _, c in parts])


def weighted_percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float | None:
    """``np.percentile(np.repeat(values, counts), q)`` without building the repeated array."""
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    if not values.size:
        return None
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(counts[order])
    rank = q / 100 * (int(ends[-1]) - 1)  # numpy's default (linear) interpolation
    low, high = np.searchsorted(ends, [np.floor(rank), np.ceil(rank)], side="right")
    return float(values[low] + (values[high] - values[low]) * (rank - np.floor(rank)))


# --- the run -----------------------------------------------------------------------------------


def simulate(
    workload: Workload,
    limits: StepPlannerLimits = DEFAULT_LIMITS,
    options: SchedulingOptions | ResolvedSchedulingPolicy | None = None,
    latency: LatencyModel = DEFAULT_LATENCY,
    *,
    max_steps: int | None = None,
    on_step: OnStep | None = None,
    progress: Progress | None = None,
    progress_every: int = 2048,
    pace: EnginePace | None = None,
    detailed: bool = False,
    queue: ServingQueue | None = None,
    speculation: Speculation | None = None,
) -> SimulationResult:
    """Run ``workload`` through a planner with ``options`` on an engine with ``limits``: the
    keyword form of ``simulate_run(RunSpec(workload, Engine(...)))``.

    ``on_step(step, start_time, ledger, plan)`` runs after each plan, before it is applied
    (``StepPlanner`` is the one ``stepplanner`` selects). ``progress(steps, sim_time,
    completed)`` runs every ``progress_every`` steps. ``max_steps`` cuts the run short.
    ``pace`` replays a real run's measured speed over time on ``latency`` (a diagnostic:
    :class:`~stepplanner.sim.latency.EnginePace`). ``detailed`` keeps every token's time
    (``SimulationResult.token_times``). ``queue``: the serving front (``ServingQueue``).
    ``speculation``: speculative decoding (``Speculation``; None: off).
    """
    engine = Engine(
        limits,
        options,
        latency,
        queue=ServingQueue() if queue is None else queue,
        speculation=speculation,
        pace=pace,
    )
    return simulate_run(
        RunSpec(workload, engine, max_steps, detailed),
        on_step=on_step,
        progress=progress,
        progress_every=progress_every,
    )


def simulate_run(
    spec: RunSpec,
    *,
    on_step: OnStep | None = None,
    progress: Progress | None = None,
    progress_every: int = 2048,
) -> SimulationResult:
    """The run ``spec`` describes, on an engine without a page pool (with one:
    ``stepplanner.sim.paged.simulate_paged_run``); the hooks as in ``simulate``."""
    if spec.engine.num_pages:
        raise StepPlannerValueError(
            f"engine.num_pages={spec.engine.num_pages}: a run with a KV page pool is "
            "simulate_paged_run's; allowed here: 0"
        )
    planner = StepPlanner(spec.engine.policy, spec.engine.limits)
    return SimulationRun(spec, planner).run(spec.max_steps, on_step, progress, progress_every)


def step_time_of(
    latency: LatencyModel, limits: StepPlannerLimits, workload: Workload
) -> tuple[float, float]:
    """The ledger's step-time estimate ``(base, per_token)`` for a run: ``latency`` at a full
    batch, B rows each at the workload's mean context over a request's life (its prompt, cut at
    S_in, and half its output), so that ``base + per_token * t`` is the model's step of ``t``
    tokens then: ``a + c*B*ctx + f*B`` and ``b + d*B*ctx + e*ctx`` (a row's attention pairs
    taken as its tokens x its context). The ledger prices every step at the policy's full token
    budget; this prices its context alike, at the batch's worst case rather than the run's
    mean, which is what the deadline policy must plan for where it matters: at and past
    saturation."""
    rows = limits.max_batch_size
    ctx = float(
        (
            np.minimum(workload.prompt_tokens, limits.max_input_length) + workload.output_tokens / 2
        ).mean()
    )
    return (
        latency.a + latency.c * rows * ctx + latency.f * rows,
        latency.b + latency.d * rows * ctx + latency.e * ctx,
    )


class SimulationRun:
    """The mutable state of one simulation; request ids are workload row indices."""

    def __init__(self, spec: RunSpec, planner: Any, page_table: Any = None) -> None:
        engine = spec.engine
        workload, limits, latency = spec.workload, engine.limits, engine.latency
        detailed, speculation = spec.detailed, engine.speculation
        n = len(workload)
        self.queue = engine.queue
        self.speculation = speculation
        self.spec_rng = np.random.default_rng(speculation.seed if speculation else 0)
        self.accepted: np.ndarray | None = None  # per row of the pending plan
        self.draft_tokens = 0
        self.accepted_drafts = 0
        self.w, self.limits, self.latency = workload, limits, latency
        self.policy = engine.policy
        self.pace = engine.pace  # its windows count from the first arrival
        self.budget = (
            None
            if engine.max_step_seconds is None
            else StepTimeBudget(planner, latency, engine.max_step_seconds)
        )
        self.planner = planner if self.budget is None else self.budget
        # By default every request may wait: the workload is the whole demand.
        self.ledger = Ledger(
            limits,
            self.policy,
            page_table=page_table,
            slo_classes=dict(workload.slo_classes or {}),
            step_time=step_time_of(latency, limits, workload),
            **self.queue.ledger_options(n),
        )
        # Deadlines: first token due at arrival + ttft (inf: none), then one every gap (inf:
        # no per-token objective). The requests' own SLOs go to submit, their classes' are the
        # ledger's.
        ttft, tpot = workload.objectives()
        self.deadlines = workload.has_objectives
        self.first_due = np.where(np.isnan(ttft), np.inf, workload.arrival_time + ttft)
        # No per-token objective: a gap no run reaches (finite, so that the first token's
        # 0 x gap stays 0 and its deadline is the TTFT one).
        self.gap = np.where(np.isnan(tpot), NO_GAP, tpot)
        assert workload.ttft_slo is not None and workload.tpot_slo is not None
        self.own_slo: dict[int, SLO] = {
            i: SLO(
                float(workload.ttft_slo[i]),
                None if np.isnan(workload.tpot_slo[i]) else float(workload.tpot_slo[i]),
            )
            for i in np.flatnonzero(~np.isnan(workload.ttft_slo)).tolist()
        }
        self.max_lateness = np.full(n, -np.inf)
        self.late_tokens = np.zeros(n, dtype=np.int64)
        self.relegated = np.zeros(n, dtype=bool)
        self.relegate_time = np.full(n, np.nan)
        self.shed_time = np.full(n, np.nan)
        self.queue_full = np.zeros(n, dtype=bool)
        # 429s given while a relegated request held a queue place: the ledger gives those only
        # to a request that would be relegated itself (docs/scheduling.md, "Overload").
        self.refused_beside_relegated = 0
        self.token_log: list[np.ndarray] | None = [] if detailed else None
        self.admit_time = np.full(n, np.nan)
        self.first_token_time = np.full(n, np.nan)
        self.finish_time = np.full(n, np.nan)
        self.last_token_time = np.full(n, np.nan)
        self.max_gap = np.zeros(n)
        self.generated = np.zeros(n, dtype=np.int64)
        self.paused_steps = np.zeros(n, dtype=np.int64)
        self.refused = np.zeros(n, dtype=bool)
        self.reasons = np.zeros(limits.max_batch_size, dtype=np.uint8)
        self.reason_counts = np.zeros(REASON_RELEASED_FROM_PAUSE * 2, dtype=np.int64)
        self.max_consecutive_paused = 0
        self.records: list[tuple[float, ...]] = []
        # Gaps between tokens that did not come in consecutive steps (a pause, a skipped chunk):
        # (request ids, their previous token's time, this token's time). Every other gap is one
        # step's duration, so these suffice to rebuild the pooled ITL sample after the run.
        self.apart: list[tuple[np.ndarray, np.ndarray, float]] = []
        self.first_arrival = float(workload.arrival_time[0]) if n else 0.0
        self.now = self.first_arrival
        self.next_request = 0
        self.completed = 0
        # With shared prefixes or a peer's admission order: the prefix cache and the queue in
        # front of the ledger (sim.prefix_front); its hits are context the ledger never counted.
        self.front = (
            PrefixFront(workload, limits, self.queue, spec.prefixes)
            if spec.prefixes is not None or self.queue.peer_order is not None
            else None
        )
        self.cached_context = None if self.front is None else self.front.hit

    def run(
        self,
        max_steps: int | None,
        on_step: OnStep | None,
        progress: Progress | None,
        progress_every: int,
    ) -> SimulationResult:
        """The whole run (``loop``, timed by the wall clock) and its result."""
        t0 = time.perf_counter()
        truncated = self.loop(max_steps, on_step, progress, max(1, progress_every))
        return self.result(time.perf_counter() - t0, truncated)

    def loop(
        self,
        max_steps: int | None,
        on_step: OnStep | None,
        progress: Progress | None,
        progress_every: int,
    ) -> bool:
        n = len(self.w)
        while True:
            self._arrivals()
            t0 = time.perf_counter_ns()
            plan, finished, admitted = self._fused_step()
            step_ns = time.perf_counter_ns() - t0
            if self.deadlines:  # outside the timed host step: the simulator's bookkeeping
                relegated = self.ledger.relegated_ids
                if relegated.size:
                    self.relegated[relegated] = True
                    self.relegate_time[relegated] = self.now
                shed = self.ledger.shed_ids
                if shed.size:  # answered now, unserved
                    self.shed_time[shed] = self.now
            if finished.size:
                self.finish_time[finished] = self.now
                self.completed += finished.size
            if admitted.size:
                self.admit_time[admitted] = self.now
            if self.ledger.count == 0:
                if self.next_request >= n:
                    return False
                self.now = max(self.now, float(self.w.arrival_time[self.next_request]))
                continue
            if max_steps is not None and len(self.records) >= max_steps:
                return True
            self._step(plan, step_ns, on_step)
            if progress is not None and len(self.records) % progress_every == 0:
                progress(len(self.records), self.now, self.completed)

    def _fused_step(self) -> tuple[Any, np.ndarray, np.ndarray]:
        """One call: apply the previous plan, count tokens, retire the finished, admit, plan."""
        ledger = self.ledger
        front = self.front
        if front is not None and front.order is not None:
            # The peer's queue gives the ledger what the step will have room for: the free
            # slots and those of the residents this step's apply retires.
            req = ledger.request_ids
            out = np.maximum(self.w.output_tokens[req], 1)
            retiring = int(np.count_nonzero(self.generated[req] >= out))
            front.release(ledger.free_slots + retiring - ledger.waiting, self._submit_request)
        # now: when the previous plan's tokens were emitted (the end of the previous step).
        spec = self.speculation
        if spec is None:
            plan = ledger.step(self.planner, reasons=self.reasons, now=self.now)
        else:
            accepted, self.accepted = self.accepted, None
            plan = ledger.step(
                self.planner,
                accepted=accepted,
                drafts=spec.num_spec_tokens,
                reasons=self.reasons,
                now=self.now,
            )
        finished, admitted = ledger.finished_ids, ledger.admitted_ids
        if front is not None:
            front.finished(finished)
            front.admitted(admitted)
        return plan, finished, admitted

    def _arrivals(self) -> None:
        w = self.w
        stop = int(np.searchsorted(w.arrival_time, self.now, side="right"))
        front = self.front
        for i in range(self.next_request, stop):
            if front is None:
                self._submit_request(i, int(w.prompt_tokens[i]))
            else:
                front.arrive(i, self._submit_request)
        self.next_request = max(self.next_request, stop)

    def _submit_request(self, i: int, prompt_tokens: int) -> None:
        """Request ``i`` to the ledger with ``prompt_tokens`` to compute; refusals counted."""
        w, ledger = self.w, self.ledger
        try:
            ledger.submit(
                i,
                prompt_tokens,
                int(w.priority[i]),
                max_new_tokens=max(1, int(w.output_tokens[i])),
                arrival_time=float(w.arrival_time[i]),
                slo=self.own_slo.get(i),
            )
        except QueueFullError:
            self.refused[i] = self.queue_full[i] = True  # the server's 429
            if ledger.relegated_waiting:
                self.refused_beside_relegated += 1
        except ValueError:
            self.refused[i] = True  # counted in the report, never silently dropped

    def _step(self, plan: Any, step_ns: int, on_step: OnStep | None) -> None:
        """The step's simulated time and per-request token times; the ledger's own bookkeeping
        (apply, output counts, retirement) happens in the next ``ledger.step``."""
        ledger, reasons = self.ledger, self.reasons
        count = ledger.count
        seq, tokens = self._rows_run(plan)
        rows = seq["resident"]
        past = seq["past_length"]
        if self.cached_context is not None:  # a prefix hit is context the ledger never counted
            past = past + self.cached_context[ledger.request_ids[rows]]
        context = int(past.sum()) + tokens
        latency = self.latency
        attention = 0
        if latency.e:  # the one term that needs a pass over the rows: only when it counts
            query = seq["query_length"].astype(np.int64)
            attention = int(np.dot(query, past + query))
        start = self.now
        seconds = latency.step_seconds(tokens, context, len(seq), attention)
        if self.pace is not None:
            seconds *= self.pace.at(start - self.first_arrival)
        self.now = now = start + seconds
        if self.budget is not None:  # the runtime's measured step: the model's online sample
            self.budget.observe(seconds)
        if on_step is not None:
            on_step(len(self.records), start, ledger, plan)

        ids = ledger.request_ids
        emitting = seq["select_last_token_logits"]
        req = ids[rows[emitting]]  # one row per resident
        emitted = self.generated[req]  # tokens each emitted before this one
        extra = self._accept_drafts(seq)[emitting] if self.speculation is not None else None
        first = emitted == 0
        self.first_token_time[req[first]] = now
        if self.front is not None:
            self.front.prompts_done(req[first])
            chunks = seq["work"] == SequenceWork.CONTEXT
            self.front.computed(int(seq["query_length"][chunks].sum()))
        later = req[~first]
        previous = self.last_token_time[later]
        gaps = now - previous
        self.max_gap[later] = np.maximum(self.max_gap[later], gaps)
        apart = previous != start
        if apart.any():
            self.apart.append((later[apart], previous[apart], now))
        if self.deadlines:
            # Token g (g = tokens before it) is due at arrival + ttft + g * tpot (deadline_of).
            late = now - (self.first_due[req] + emitted * self.gap[req])
            self.max_lateness[req] = np.maximum(self.max_lateness[req], late)
            missed = late > 0
            if extra is not None and extra.any():
                # Tokens g .. g + extra all come now: those due before now are late.
                due_before = np.ceil((now - self.first_due[req]) / self.gap[req]) - emitted
                self.late_tokens[req] += np.clip(due_before, 0, 1 + extra).astype(np.int64)
            elif np.count_nonzero(missed):  # rows are distinct within a step
                self.late_tokens[req[missed]] += 1
        if extra is not None and extra.any():
            # Accepted drafts come with the row's token: gaps of 0 in the ITL sample.
            more = np.repeat(req, extra)
            self.apart.append((more, np.full(len(more), now), now))
        if self.token_log is not None:
            self.token_log.append(req if extra is None else np.repeat(req, 1 + extra))
        self.last_token_time[req] = now
        self.generated[req] += 1 if extra is None else 1 + extra
        paused = plan.paused_array()
        if paused.size:
            self.paused_steps[ids[paused]] += 1
            self.max_consecutive_paused = max(
                self.max_consecutive_paused,
                int(ledger.residents["consecutive_paused_steps"][paused].max()) + 1,
            )
        self.reason_counts += np.bincount(reasons[:count], minlength=len(self.reason_counts))
        self.records.append(
            (
                now,
                now - start,
                tokens,
                context,
                len(seq) - int(seq["work"].sum()),  # the rows run (SequenceWork: DECODE = 1)
                int(seq["work"].sum()),
                paused.size,
                count,
                ledger.waiting,
                step_ns,
            )
        )

    def _rows_run(self, plan: Any) -> tuple[np.ndarray, int]:
        """The plan's rows the engine runs, and their tokens: all of them here (a run that
        preempts for KV pages drops its victims' rows, ``sim.preemption``)."""
        return plan.as_array(), plan.total_tokens

    def _accept_drafts(self, seq: np.ndarray) -> np.ndarray:
        """Draw, per plan row, the drafts accepted of those it verifies (0 for a chunk); kept
        for the ledger's next step, which applies this plan."""
        assert self.speculation is not None
        verified = np.where(seq["work"] == SequenceWork.DECODE, seq["query_length"] - 1, 0)
        accepted = self.speculation.accepted(self.spec_rng, verified)
        self.accepted = accepted
        self.draft_tokens += int(verified.sum())
        self.accepted_drafts += int(accepted.sum())
        return accepted

    def result(self, wall: float, truncated: bool) -> SimulationResult:
        table = (
            np.array(self.records, dtype=np.float64)
            if self.records
            else np.zeros((0, len(STEP_FIELDS)))
        )
        steps = {name: table[:, k] for k, name in enumerate(STEP_FIELDS)}
        counts = np.zeros(len(Reason) + 2, dtype=np.int64)
        codes = np.arange(len(self.reason_counts))
        np.add.at(
            counts, np.minimum(codes & ~REASON_RELEASED_FROM_PAUSE, len(Reason)), self.reason_counts
        )
        counts[-1] = self.reason_counts[codes & REASON_RELEASED_FROM_PAUSE != 0].sum()
        tokens = self._tokens()
        return SimulationResult(
            workload=self.w,
            limits=self.limits,
            policy=self.policy,
            latency=self.latency,
            admit_time=self.admit_time,
            first_token_time=self.first_token_time,
            finish_time=self.finish_time,
            generated=self.generated,
            max_gap=self.max_gap,
            paused_steps=self.paused_steps,
            refused=self.refused,
            steps=steps,
            reason_counts=counts,
            max_consecutive_paused=self.max_consecutive_paused,
            wall_seconds=wall,
            truncated=truncated,
            itl=self._itl(steps["end_time"], steps["seconds"]),
            max_lateness=self.max_lateness,
            late_tokens=self.late_tokens,
            relegated=self.relegated,
            relegate_time=self.relegate_time,
            shed_time=self.shed_time,
            queue_full=self.queue_full,
            queue=self.queue,
            refused_beside_relegated=self.refused_beside_relegated,
            speculation=self.speculation,
            draft_tokens=self.draft_tokens,
            accepted_drafts=self.accepted_drafts,
            token_requests=tokens.get("token_requests"),
            token_steps=tokens.get("token_steps"),
            cached_tokens=None if self.front is None else self.front.hit.copy(),
            late_hits=0 if self.front is None else self.front.late_hits,
        )

    def _tokens(self) -> dict[str, np.ndarray]:
        """``detailed``: every emitted token's request and step, in emission order."""
        if self.token_log is None:
            return {}
        log = self.token_log
        return {
            "token_requests": np.concatenate(log or [np.zeros(0, dtype=np.int64)]),
            "token_steps": np.repeat(np.arange(len(log)), [len(r) for r in log]),
        }

    def _itl(
        self, end_time: np.ndarray, seconds: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per class: (gap seconds, how many gaps had that length), the pooled ITL sample.

        A request's gaps end at the steps after its first token up to its last one. Those that
        follow a step in which it also emitted last exactly that step's duration; the others
        (``self.apart``) each span several steps, in none of which it had a back-to-back gap.
        So each step's back-to-back count per class is a difference array over step indices.
        """
        w, n_steps = self.w, len(end_time)
        classes = np.searchsorted(w.classes, w.priority)
        spoke = np.flatnonzero(self.generated >= 2)
        covered = np.zeros((len(w.classes), n_steps + 1), dtype=np.int64)
        np.add.at(
            covered,
            (classes[spoke], np.searchsorted(end_time, self.first_token_time[spoke]) + 1),
            1,
        )
        np.add.at(
            covered,
            (classes[spoke], np.searchsorted(end_time, self.last_token_time[spoke]) + 1),
            -1,
        )
        ids = np.concatenate([r for r, _, _ in self.apart] or [np.zeros(0, dtype=np.int64)])
        before = np.concatenate([t for _, t, _ in self.apart] or [np.zeros(0)])
        after = np.concatenate([np.full(len(r), t) for r, _, t in self.apart] or [np.zeros(0)])
        np.add.at(covered, (classes[ids], np.searchsorted(end_time, before) + 1), -1)
        np.add.at(covered, (classes[ids], np.searchsorted(end_time, after) + 1), 1)
        back_to_back = np.cumsum(covered, axis=1)[:, :n_steps]
        return [
            (
                np.concatenate([seconds, (after - before)[classes[ids] == k]]),
                np.concatenate(
                    [back_to_back[k], np.ones(int((classes[ids] == k).sum()), dtype=np.int64)]
                ),
            )
            for k in range(len(w.classes))
        ]


# --- configuration as plain data ----------------------------------------------------------


_ENUMS = enum_fields(ResolvedSchedulingPolicy)


def policy_to_dict(policy: ResolvedSchedulingPolicy) -> dict[str, Any]:
    """JSON-ready: enums by name."""
    out = dataclasses.asdict(policy)
    for key, enum in _ENUMS.items():
        out[key] = enum(out[key]).name
    return out


def policy_from_dict(data: dict[str, Any]) -> ResolvedSchedulingPolicy:
    """Inverse of ``policy_to_dict``; enum values by name (any case) or number."""
    if not isinstance(data, dict):
        raise _errors.wrong_type("policy", "object", data)
    fields = {f.name for f in dataclasses.fields(ResolvedSchedulingPolicy)}
    unknown = set(data) - fields
    if unknown:
        raise StepPlannerValueError(
            f"policy has unknown field(s) {sorted(unknown)}; allowed: {', '.join(sorted(fields))}"
        )
    return ResolvedSchedulingPolicy(**data)  # enums by name or number: planner._fields.as_enum


# --- record / replay -------------------------------------------------------------------------


class StepRecorder:
    """An ``on_step`` hook writing one JSON line per step: the rows planned over and the plan."""

    def __init__(
        self, out: IO[str], limits: StepPlannerLimits, policy: ResolvedSchedulingPolicy
    ) -> None:
        self.out = out
        header = {
            "type": "header",
            "format": RECORD_FORMAT,
            "limits": dataclasses.asdict(limits),
            "policy": policy_to_dict(policy),
        }
        out.write(json.dumps(header) + "\n")
        self.steps = 0

    def __call__(self, step: int, start_time: float, ledger: Ledger, plan: Any) -> None:
        residents = ledger.residents
        line = {
            "type": "step",
            "step": step,
            "time": start_time,
            "request_ids": ledger.request_ids.tolist(),
            "residents": {name: residents[name].tolist() for name in RESIDENT_FIELDS},
            "plan": plan.to_dict(),
        }
        self.out.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.steps += 1


@dataclasses.dataclass
class ReplayResult:
    steps: int
    limits: StepPlannerLimits
    policy: ResolvedSchedulingPolicy
    diffs: list[dict[str, Any]]


def read_record_header(lines: Iterable[str]) -> tuple[StepPlannerLimits, ResolvedSchedulingPolicy]:
    """The limits and policy a step record was made with (its first line)."""
    return _record_header(next(json_lines(lines, "record"), None))


def _record_header(
    header: tuple[int, dict[str, Any]] | None,
) -> tuple[StepPlannerLimits, ResolvedSchedulingPolicy]:
    if header is None or header[1].get("type") != "header":
        raise StepPlannerValueError(
            "record line 1: expected the header line "
            f'{{"type": "header", "format": "{RECORD_FORMAT}", ...}}'
        )
    fmt = header[1].get("format")
    if fmt != RECORD_FORMAT:
        raise StepPlannerValueError(
            f"record line 1: format={fmt!r} is not known; allowed: {RECORD_FORMAT}"
        )
    try:
        return StepPlannerLimits(**header[1]["limits"]), policy_from_dict(header[1]["policy"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StepPlannerValueError(f"record line 1: bad limits/policy ({exc})") from None


def replay(
    lines: Iterable[str],
    policy: ResolvedSchedulingPolicy | None = None,
    limits: StepPlannerLimits | None = None,
) -> ReplayResult:
    """Re-plan every recorded step; ``diffs`` lists each step whose plan differs.

    ``policy``/``limits`` default to the recording's header: pass others to see what a
    different configuration would have planned over the same ledgers.
    """
    records = json_lines(lines, "record")
    recorded_limits, recorded_policy = _record_header(next(records, None))
    limits = limits or recorded_limits
    policy = policy or recorded_policy
    planner = StepPlanner(policy, limits)
    diffs: list[dict[str, Any]] = []
    steps = 0
    for line, record in records:
        try:
            rows = _residents_from_columns(record["residents"])
            expected = record["plan"]
            step = record.get("step", steps)
        except (KeyError, TypeError, ValueError) as exc:
            raise StepPlannerValueError(f"record line {line}: not a step record ({exc})") from None
        try:
            got = planner.plan(rows).to_dict()
        except (TypeError, ValueError, OverflowError) as exc:
            raise StepPlannerValueError(f"record line {line} (step {step}): {exc}") from None
        differences = plan_differences(expected, got)
        if differences:
            diffs.append(
                {
                    "step": step,
                    "line": line,
                    "differences": differences,
                    "recorded": expected,
                    "replayed": got,
                }
            )
        steps += 1
    return ReplayResult(steps=steps, limits=limits, policy=policy, diffs=diffs)


def _residents_from_columns(columns: dict[str, list[Any]]) -> np.ndarray:
    lengths = {len(columns[name]) for name in RESIDENT_FIELDS}
    if len(lengths) != 1:
        raise StepPlannerValueError(f"resident columns have different lengths {sorted(lengths)}")
    rows = np.zeros(lengths.pop(), dtype=RESIDENT_DTYPE)
    for name in RESIDENT_FIELDS:
        rows[name] = columns[name]
    return rows


def plan_differences(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Human-readable differences between two ``StepPlan.to_dict()`` forms."""
    out = []
    for key in ("num_prefill", "num_decode", "prefill_tokens", "total_tokens", "paused"):
        if expected.get(key) != got.get(key):
            out.append(f"{key}: recorded {expected.get(key)!r}, replayed {got.get(key)!r}")
    want, have = expected.get("sequences", []), got.get("sequences", [])
    for k in range(max(len(want), len(have))):
        a = want[k] if k < len(want) else None
        b = have[k] if k < len(have) else None
        if a != b:
            out.append(f"sequences[{k}]: recorded {_row_text(a)}, replayed {_row_text(b)}")
    return out


def _row_text(row: dict[str, Any] | None) -> str:
    if row is None:
        return "(none)"
    return (
        f"({row['resident']}, {row['work']}, past={row['past_length']}, "
        f"q={row['query_length']}, last={row['select_last_token_logits']})"
    )
