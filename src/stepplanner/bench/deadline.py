"""What deadline-aware scheduling costs a host step (``python -m stepplanner.bench
--deadline-cost``).

The simulator's embedded workload (three classes with their default objectives) is offered to
one engine twice, once scheduled by static PRIORITY+PAUSE and once by DEADLINE+PAUSE, at a
load past saturation that keeps every slot busy for most of the run (1.2x at B = 256, 2x at
B = 1024: an engine of 1024 slots serves little more than one of 256, so it fills only under
more load). Each run is the simulator's own loop, which times every ``ledger.step`` (apply,
count, retire, admit, rank, plan) with ``perf_counter_ns``; the two runs advance in rounds of
``TURN_STEPS`` steps each, in one process. A step counts when at least ``BUSY`` of the slots
are occupied (the steps a full engine runs). The ratio is the median over rounds of the two
policies' median busy step in that round: each round pairs the same fraction of a second of a
shared machine, whose speed drifts by more than the difference measured. Beside it, what a busy
step did (rows decoded and paused): the policies plan different steps from the same arrivals, as
they would in a runtime.

``ledger.rank(now)`` alone (the pass DEADLINE adds, its Python call included) is timed on the
DEADLINE run's ledger between turns while it is busy; a rank at the step's own ``now`` is what
the next step's pass does again, so it changes no plan.

This replaces an earlier comparison over ``loop.Stream``'s steady queue of 4B requests, where
no objective can be met: after a burst of relegations every DEADLINE row was relegated (the
pass's cheapest case), and in the first steps after warm-up DEADLINE decoded three times the
rows PRIORITY+PAUSE did, so the two steps did different work (docs/scheduling.md, "Cost").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core as _planner
from ..planner._policy import SchedulingOptions, StepPlannerLimits
from ..planner._types import PreemptionMode, SchedulingPolicy
from ..sim import load as sim_load
from ..sim import simulator, workloads
from ..sim.engine import Engine, RunSpec
from ..sim.latency import DEFAULT_LATENCY

__all__ = ["DEADLINE_CASES", "DeadlineCost", "measure_deadline_cost", "render_deadline_cost"]

# (B, load as a multiple of that engine's saturation throughput, requests)
DEADLINE_CASES = ((256, 1.2, 3000), (1024, 2.0, 6000))
TARGET_DEADLINE_OVER_PRIORITY = 1.3
BUSY = 15 / 16  # a step counts when at least this share of the slots is occupied
TURN_STEPS = 200
RANK_CALLS = 50
REPEATS = 3  # runs per engine (the same plans each time: only the timings differ)
MIN_PAIRED = 20  # busy steps each policy needs in a round for the round's ratio to count
POLICIES = {
    "priority": SchedulingPolicy.PRIORITY,
    "deadline": SchedulingPolicy.DEADLINE,
}
# The records' columns (simulator.SimulationRun._step): decode rows, paused rows, residents,
# host step ns.
_DECODE, _PAUSED, _COUNT, _STEP_NS, _COLUMNS = 5, 6, 7, 9, 10


@dataclass
class DeadlineCost:
    """One engine: both policies' median host step over their busy steps, the ratio of the
    rounds that paired them, and what a busy step did."""

    batch: int
    load: float
    saturation_rps: float
    priority_ns: float  # median over busy steps (the median of the repeats')
    deadline_ns: float
    ratio: float  # DEADLINE / PRIORITY: the median over the paired rounds
    ratio_quartiles: tuple[float, float]  # the 25th and 75th percentiles of the rounds' ratios
    rounds: int  # paired rounds, over all repeats
    rank_ns: float  # ledger.rank(now) alone on the busy DEADLINE ledger, its call included
    rank_rows: float  # residents when it was timed (median)
    busy_steps: tuple[int, int]  # (priority, deadline), one repeat
    decode_rows: tuple[float, float]  # mean decode rows per busy step
    paused_rows: tuple[float, float]  # mean paused rows per busy step

    @property
    def rank_ns_per_row(self) -> float:
        return self.rank_ns / self.rank_rows if self.rank_rows else float("nan")


def _run(workload: Any, limits: StepPlannerLimits, policy: SchedulingPolicy) -> Any:
    options = SchedulingOptions(
        scheduling_policy=policy, preemption=PreemptionMode.PAUSE, max_pause_steps=8
    )
    engine = Engine(limits, options, DEFAULT_LATENCY)
    return simulator.SimulationRun(
        RunSpec(workload, engine), _planner.StepPlanner(engine.policy, limits)
    )


def _time_rank(run: Any, calls: int = RANK_CALLS) -> float:
    rank, now = run.ledger.rank, run.now
    rank(now)  # what it relegates, it relegates here (the step's own pass would, at this now)
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        rank(now)
    return (time.perf_counter_ns() - t0) / calls


def _one_run(
    workload: Any, limits: StepPlannerLimits
) -> tuple[dict[str, np.ndarray], list[float], list[float], list[int]]:
    """Both policies over ``workload`` in turns: each one's busy records, the ratio of each
    round in which both ran ``MIN_PAIRED`` busy steps or more (their medians: the same moment
    of the machine for both), and the rank timings."""
    runs = {name: _run(workload, limits, policy) for name, policy in POLICIES.items()}
    running = dict.fromkeys(runs, True)
    paired: list[float] = []
    rank_ns: list[float] = []
    rank_rows: list[int] = []
    busy_count = BUSY * limits.max_batch_size
    while any(running.values()):
        this_round: dict[str, np.ndarray] = {}
        for name, run in runs.items():
            start = len(run.records)
            if running[name]:
                running[name] = run.loop(start + TURN_STEPS, None, None, 1 << 30)
            turn = np.array(run.records[start:], dtype=np.float64).reshape(-1, _COLUMNS)
            this_round[name] = turn[turn[:, _COUNT] >= busy_count, _STEP_NS]
            if name == "deadline" and running[name] and run.ledger.count >= busy_count:
                rank_ns.append(_time_rank(run))
                rank_rows.append(run.ledger.count)
        p, d = this_round["priority"], this_round["deadline"]
        if len(p) >= MIN_PAIRED and len(d) >= MIN_PAIRED:
            paired.append(float(np.median(d) / np.median(p)))
    busy: dict[str, np.ndarray] = {}
    for name, run in runs.items():
        table = np.array(run.records, dtype=np.float64)
        busy[name] = table[table[:, _COUNT] >= busy_count]
    return busy, paired, rank_ns, rank_rows


def measure_case(batch: int, load: float, requests: int, repeats: int = REPEATS) -> DeadlineCost:
    limits = StepPlannerLimits(
        batch,
        simulator.DEFAULT_LIMITS.max_input_length,
        simulator.DEFAULT_LIMITS.kv_page_size,
    )
    base = workloads.synthetic(requests, slo_classes=workloads.DEFAULT_SLO_CLASSES)
    saturation = sim_load.saturation_throughput(base, Engine(limits, latency=DEFAULT_LATENCY))
    workload = sim_load.at_load(base, load, saturation)
    steps: dict[str, list[float]] = {name: [] for name in POLICIES}
    ratios: list[float] = []
    rank_ns: list[float] = []
    rank_rows: list[int] = []
    for _ in range(repeats):  # the same plans every time: only the timings differ
        busy, paired, ranks, rows = _one_run(workload, limits)
        for name in POLICIES:
            steps[name].append(float(np.median(busy[name][:, _STEP_NS])))
        ratios += paired
        rank_ns += ranks
        rank_rows += rows
    p, d = busy["priority"], busy["deadline"]
    quartiles = np.percentile(ratios, [25, 50, 75]) if ratios else [float("nan")] * 3
    return DeadlineCost(
        batch,
        load,
        saturation,
        statistics.median(steps["priority"]),
        statistics.median(steps["deadline"]),
        float(quartiles[1]),
        (float(quartiles[0]), float(quartiles[2])),
        len(ratios),
        statistics.median(rank_ns) if rank_ns else float("nan"),
        statistics.median(rank_rows) if rank_rows else 0.0,
        (len(p), len(d)),
        (float(p[:, _DECODE].mean()), float(d[:, _DECODE].mean())),
        (float(p[:, _PAUSED].mean()), float(d[:, _PAUSED].mean())),
    )


def measure_deadline_cost(
    cases: Sequence[tuple[int, float, int]] = DEADLINE_CASES,
) -> list[DeadlineCost]:
    """One ``DeadlineCost`` per (B, load, requests)."""
    return [measure_case(*case) for case in cases]


def render_deadline_cost(costs: Sequence[DeadlineCost]) -> str:
    lines = [
        "deadline-aware host step: the embedded workload (three classes, default objectives) "
        "past saturation, PRIORITY+PAUSE and DEADLINE+PAUSE in turns (median ns per ledger.step "
        "over the steps with every slot or nearly busy)",
        f"{'B':>6}{'load':>6}{'priority':>10}{'deadline':>10}{'ratio':>7}{'quartiles':>12}{'rank':>8}"
        f"{'ns/row':>8}{'busy steps p/d':>16}{'decodes p/d':>14}{'paused p/d':>13}",
        f"  (target: ratio <= {TARGET_DEADLINE_OVER_PRIORITY:g}; ratio: the median of the "
        f"rounds' ratios over {REPEATS} runs, each round's the two policies' {TURN_STEPS} "
        "steps taken in turn; quartiles: of those; rank: ledger.rank alone on the busy "
        "DEADLINE ledger, its "
        "call included; decodes, paused: rows a busy step)",
    ]
    for c in costs:
        lines.append(
            f"{c.batch:>6}{c.load:>5g}x{c.priority_ns:>10,.0f}{c.deadline_ns:>10,.0f}"
            f"{c.ratio:>7.2f}{c.ratio_quartiles[0]:>7.2f}-{c.ratio_quartiles[1]:<4.2f}"
            f"{c.rank_ns:>8,.0f}{c.rank_ns_per_row:>8.2f}"
            f"{c.busy_steps[0]:>8}/{c.busy_steps[1]:<7}"
            f"{c.decode_rows[0]:>7.0f}/{c.decode_rows[1]:<6.0f}"
            f"{c.paused_rows[0]:>6.0f}/{c.paused_rows[1]:<6.0f}"
        )
    return "\n".join(lines)
