"""How fast the whole host step of a serving loop is, against ``plan()`` alone, in one run.

The loop keeps a steady stream of requests through a ledger of B slots: every slot busy, a
queue behind them, prompts of 16..2048 tokens, ``max_new_tokens`` of 16..512, three priority
classes, and a sampler that ends about one request in 256 per emitted token early (EOS). Per B:

- ``plan``: ``plan()`` alone over a snapshot of that ledger, unchanged between calls (the
  reference figure);
- ``plan_in_loop``: ``plan()``'s own share of the loop run with its calls apart, over ledgers
  that change every step (admissions and swap-removals reorder rows, so the planner re-sorts);
- ``fused``: ``ledger.step(planner, finished)``: apply the previous plan with the sampler's mask,
  count tokens, retire, admit, plan: the whole host step in one call (``fused_batch(...,
  paged=True)``: the same with a ``KVPageTable`` attached, every request's worst case reserved
  at admission; ``benchmarks/test_loop.py`` times it);
- stage medians of the same loop taken apart: ``admit``, ``plan``, ``accounting`` (counting
  emitted tokens, finding finished requests), ``apply``, ``retire``; once for the compiled
  ledger and once as a loop written over the pure-Python ledger with NumPy accounting (what a
  runtime did before the ledger did it in C).

Figures are medians of interleaved batches (``planner.interleaved_medians``); the queue is topped
up between batches, outside the timing. ``loop_allocated_bytes`` counts Python allocations over
steady steps with ``tracemalloc``.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core as _planner
from ..kv import _kv
from ..ledger import _ledger
from ..ledger import _ledger_py as _ledger_reference
from ..ledger._shared import AdmissionOrder
from ..planner._policy import SchedulingOptions, StepPlannerLimits, resolve_scheduling_policy
from ..planner._slo import SLO
from ..planner._types import IfbSchedulingMode, PreemptionMode, SchedulingPolicy
from .planner import BATCH_SECONDS, interleaved_medians

__all__ = [
    "DEADLINE_BATCH_SIZES",
    "LOOP_BATCH_SIZES",
    "LoopTiming",
    "Stream",
    "loop_allocated_bytes",
    "measure_loop",
    "render_loop",
]

LOOP_BATCH_SIZES = (64, 256, 1024)
MAX_INPUT_LENGTH = 8192
KV_PAGE_SIZE = 64
EOS_PROBABILITY = 1 / 256
TARGET_FUSED_OVER_PLAN = 2.0
STAGES = ("admit", "plan", "accounting", "apply", "retire")
# The stream under PRIORITY+PAUSE and DEADLINE+PAUSE (benchmarks/test_loop.py, and the
# allocation check of a DEADLINE step): one objective per class, the clock advancing one
# modelled step (STEP_SECONDS) per call. Its queue of 4B meets no objective, so it is no measure
# of what DEADLINE costs: bench/deadline.py is.
DEADLINE_BATCH_SIZES = (256, 1024)
STEP_SECONDS = 0.015
SLO_CLASSES = {0: SLO(0.25, 0.05), 1: SLO(1.0, 0.1), 2: SLO(5.0, 0.3)}
STEP_TIME = (2.4e-3, 1.45e-5)  # the simulator's default latency model's a and b
POLICIES = {
    "mixed": SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED),
    "priority": SchedulingOptions(
        ifb_scheduling_mode=IfbSchedulingMode.MIXED,
        scheduling_policy=SchedulingPolicy.PRIORITY,
        preemption=PreemptionMode.PAUSE,
        max_pause_steps=8,
    ),
    "deadline": SchedulingOptions(
        ifb_scheduling_mode=IfbSchedulingMode.MIXED,
        scheduling_policy=SchedulingPolicy.DEADLINE,
        preemption=PreemptionMode.PAUSE,
        max_pause_steps=8,
    ),
}


class Stream:
    """A seeded stream of requests and sampler masks for one ledger of B slots."""

    def __init__(
        self,
        batch: int,
        seed: int = 0,
        policy: str = "mixed",
        classes: int = 3,
        adapters: int = 0,
        uncached: bool = False,
    ) -> None:
        self.limits = StepPlannerLimits(batch, MAX_INPUT_LENGTH, KV_PAGE_SIZE)
        self.policy = resolve_scheduling_policy(POLICIES[policy], self.limits)
        self.deadlines = policy == "deadline"
        self.classes = classes
        # LoRA: requests draw their adapter from 0 (the base model) .. adapters, and the ledger
        # holds at most LORA_SLOTS of them (docs/performance.md, "LoRA admission").
        self.adapters = adapters
        # Uncached first (docs/scheduling.md): each request brings a prefix hit of 0..its
        # prompt, and the ledger admits by the rest, bounded by UNCACHED_STARVATION_STEPS.
        self.uncached = uncached
        self.rng = np.random.default_rng(seed)
        self.next_id = 0
        self.now = 0.0  # the runtime's clock: one modelled step per step
        # The sampler's mask for a plan of n rows is masks[n], made once per length (as a
        # runtime's sampler writes into a buffer it already has). Chunks come first in a plan and
        # most emit nothing, so the first EOS_FREE_ROWS flags are False; a plan with more chunks
        # than that gets no mask (max_new_tokens still finishes requests).
        self.eos_free_rows = min(64, batch // 2)
        flags = np.zeros(batch + 1, dtype=bool)
        flags[self.eos_free_rows :] = (
            self.rng.random(batch + 1 - self.eos_free_rows) < EOS_PROBABILITY
        )
        self.masks: list[np.ndarray] = [flags[:n] for n in range(batch + 1)]

    def top_up(self, ledger: Any, waiting: int) -> None:
        """Submit requests until ``waiting`` wait (outside any timing)."""
        short = waiting - ledger.waiting
        if short <= 0:
            return
        prompts = self.rng.integers(16, 2049, short)
        outputs = self.rng.integers(16, 513, short)
        priorities = self.rng.integers(0, self.classes, short)
        loras = self.rng.integers(0, self.adapters + 1, short) if self.adapters else None
        # Drawn only for an uncached stream: every other stream's draws stay as they were.
        cached = (
            (self.rng.random(short) * (prompts + 1)).astype(np.int64) if self.uncached else None
        )
        arrival = self.now if self.deadlines else None
        for k in range(short):
            ledger.submit(
                self.next_id,
                int(prompts[k]),
                int(priorities[k]),
                max_new_tokens=int(outputs[k]),
                arrival_time=arrival,
                lora_id=0 if loras is None else int(loras[k]),
                cached_tokens=0 if cached is None else int(cached[k]),
            )
            self.next_id += 1

    def ledger(self, page_table: Any = None) -> Any:
        """A compiled ledger for this stream (objectives per class under ``deadline``)."""
        extra: dict[str, Any] = (
            {"slo_classes": SLO_CLASSES, "step_time": STEP_TIME} if self.deadlines else {}
        )
        if self.adapters:
            extra["max_loras"] = LORA_SLOTS
        if self.uncached:
            extra["admission"] = AdmissionOrder.UNCACHED_FIRST
            extra["starvation_steps"] = UNCACHED_STARVATION_STEPS
        return _ledger.Ledger(
            self.limits,
            self.policy,
            max_waiting=8 * self.limits.max_batch_size,
            page_table=page_table,
            **extra,
        )

    def clock(self, steps: int) -> list[float] | list[None]:
        """The ``now`` of each of the next ``steps`` steps (made before any timing, so the
        timed loop makes no float), and the clock moved past them."""
        if not self.deadlines:
            return [None] * steps
        times = [self.now + STEP_SECONDS * (k + 1) for k in range(steps)]
        self.now = times[-1]
        return times

    def finished_for(self, plan: Any) -> np.ndarray | None:
        chunks: int = plan.num_prefill
        if chunks > self.eos_free_rows:
            return None
        rows: int = chunks + plan.num_decode
        return self.masks[rows]


LORA_SLOTS = 4  # max_loras of a stream with adapters
UNCACHED_STARVATION_STEPS = 64  # the bound of a stream with uncached_first admission
WARM_STEPS = 600  # about twice the mean output: every slot has turned over
# A paged ledger's rows hold the stream's largest worst case (2048 + 512 tokens), and its pool
# every row's at once: pages never hold a request back, so the figure is the bookkeeping's cost.
PAGED_ROW_PAGES = -(-(2048 + 512) // KV_PAGE_SIZE)


def _steady(
    batch: int,
    seed: int = 0,
    paged: bool = False,
    policy: str = "mixed",
    classes: int = 3,
    adapters: int = 0,
    uncached: bool = False,
) -> tuple[Stream, Any, Any, Any]:
    """(stream, compiled planner, compiled ledger in steady state, its pending plan)."""
    stream = Stream(batch, seed, policy, classes, adapters, uncached)
    planner = _planner.StepPlanner(stream.policy, stream.limits)
    table = (
        _kv.KVPageTable(batch, PAGED_ROW_PAGES, batch * PAGED_ROW_PAGES, KV_PAGE_SIZE)
        if paged
        else None
    )
    ledger = stream.ledger(table)
    stream.top_up(ledger, 4 * batch)
    plan = ledger.step(planner, now=stream.clock(1)[0])
    for now in stream.clock(WARM_STEPS):
        stream.top_up(ledger, 4 * batch)
        plan = ledger.step(planner, stream.finished_for(plan), now=now)
    return stream, planner, ledger, plan


# --- timed batches ---------------------------------------------------------------------------


def fused_batch(
    batch: int,
    calls: int,
    paged: bool = False,
    policy: str = "mixed",
    classes: int = 3,
    adapters: int = 0,
    uncached: bool = False,
) -> Callable[[], float]:
    """A timed batch of ``calls`` fused steps, ``ledger.step(planner, finished)`` (with the
    runtime's ``now`` under ``deadline``; with ``adapters``, requests on that many LoRA adapters
    and the base model, ``LORA_SLOTS`` at a time; ``uncached``: admitted uncached work first);
    ns per step."""
    stream, planner, ledger, plan = _steady(
        batch, paged=paged, policy=policy, classes=classes, adapters=adapters, uncached=uncached
    )
    state = [plan]
    finished_for = stream.finished_for
    step = ledger.step

    def run() -> float:
        if ledger.waiting < 2 * batch:  # room for the batch's admissions, untimed (and rare)
            stream.top_up(ledger, 4 * batch)
        times = iter(stream.clock(calls))
        plan = state[0]
        if stream.deadlines:
            t0 = time.perf_counter_ns()
            for now in times:
                plan = step(planner, finished_for(plan), now=now)
        else:
            t0 = time.perf_counter_ns()
            for _ in times:
                plan = step(planner, finished_for(plan))
        elapsed = time.perf_counter_ns() - t0
        state[0] = plan
        return elapsed / calls

    return run


def plan_alone_batch(batch: int, calls: int) -> Callable[[], float]:
    """A timed batch of ``plan()`` calls over a snapshot of the steady loop's ledger."""
    _, planner, ledger, _ = _steady(batch)
    rows = ledger.residents.copy()
    plan = planner.plan
    plan(rows)

    def run() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            plan(rows)
        return (time.perf_counter_ns() - t0) / calls

    return run


def plan_in_loop_batch(batch: int, calls: int) -> Callable[[], float]:
    """The same loop with the calls apart (admit, plan, apply with the mask, retire_finished);
    returns the ns per step spent in ``plan()`` alone: the planning work the loop itself needs,
    over ledgers that change every step as the fused step's do."""
    stream, planner, ledger, plan = _steady(batch)
    ledger.apply(plan, stream.finished_for(plan), retire=True)
    admit, apply, plan_call = ledger.admit, ledger.apply, planner.plan
    finished_for, clock = stream.finished_for, time.perf_counter_ns

    def run() -> float:
        if ledger.waiting < 2 * batch:
            stream.top_up(ledger, 4 * batch)
        spent = 0
        for _ in range(calls):
            admit()
            t0 = clock()
            plan = plan_call(ledger.residents)
            spent += clock() - t0
            apply(plan, finished_for(plan), retire=True)
        return spent / calls

    return run


def loop_allocated_bytes(
    batch: int, steps: int = 200, policy: str = "mixed", masks: bool = True
) -> int:
    """Python bytes allocated (tracemalloc peak) over ``steps`` fused steps in steady state.

    ``masks=False`` passes no sampler mask: picking one reads the plan's row counts, and a count
    above 256 is a new Python int (the harness's allocation, not the ledger's), which a policy
    that decodes several hundred rows a step makes every step."""
    stream, planner, ledger, plan = _steady(batch, policy=policy)
    stream.top_up(ledger, 4 * batch)
    step = ledger.step
    finished_for = stream.finished_for if masks else _no_mask
    # Every view length the measured stretch visits is made once here (plan lengths vary more
    # when a policy pauses, hence a stretch several times as long).
    for now in stream.clock(4 * steps):
        plan = step(planner, finished_for(plan), now=now)
    stream.top_up(ledger, 4 * batch)
    times = iter(stream.clock(steps))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for now in times:
            plan = step(planner, finished_for(plan), now=now)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def _no_mask(plan: Any) -> None:
    return None


# --- the loop taken apart --------------------------------------------------------------------


def stage_medians(batch: int, steps: int, compiled: bool) -> dict[str, float | None]:
    """Median ns per step of each stage. ``compiled``: the compiled ledger's own calls
    (accounting happens inside ``apply``); else the loop as written over the pure-Python ledger
    with NumPy accounting and ``plan.apply_to``."""
    stream, planner, fast, _ = _steady(batch)
    ledger: Any = fast
    if not compiled:
        ledger = _ledger_reference.Ledger(stream.limits, stream.policy, max_waiting=8 * batch)
        ledger.load(fast.to_records())
    generated = np.zeros(stream.next_id + 64 * steps * batch, dtype=np.int64)
    limit = np.full(len(generated), 1 << 62, dtype=np.int64)
    times: dict[str, list[int]] = {name: [] for name in STAGES}
    clock = time.perf_counter_ns
    for _ in range(steps):
        first = stream.next_id
        stream.top_up(ledger, 4 * batch)
        if not compiled:  # the old loop kept max_new_tokens itself
            limit[first : stream.next_id] = stream.rng.integers(16, 513, stream.next_id - first)
        t0 = clock()
        ledger.admit()
        t1 = clock()
        plan = planner.plan(ledger.residents)
        t2 = clock()
        mask = stream.finished_for(plan)
        if compiled:
            t3 = clock()
            ledger.apply(plan, mask)
            t4 = clock()
            ledger.retire_finished()
            t5 = clock()
        else:
            seq = plan.as_array()
            emits = seq["select_last_token_logits"]
            rows = seq["resident"][emits]
            req = ledger.request_ids[rows]
            generated[req] += 1
            done = generated[req] >= limit[req]
            if mask is not None:
                done |= mask[emits]
            t3 = clock()
            plan.apply_to(ledger.residents)
            t4 = clock()
            ledger.retire_rows(rows[done])
            t5 = clock()
        for name, dt in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            times[name].append(dt)
    out: dict[str, float | None] = {name: float(np.median(v)) for name, v in times.items()}
    if compiled:
        out["accounting"] = None  # inside apply
    return out


@dataclass
class LoopTiming:
    """Median ns per step at one B."""

    batch: int
    plan_ns: float  # plan() over a snapshot of the steady ledger, unchanged
    plan_in_loop_ns: float  # plan() inside the loop, over ledgers that change every step
    fused_ns: float
    stages_compiled: dict[str, float | None]
    stages_python: dict[str, float | None]
    alloc_bytes: int

    @property
    def fused_over_plan(self) -> float:
        return self.fused_ns / self.plan_ns

    @property
    def fused_over_plan_in_loop(self) -> float:
        return self.fused_ns / self.plan_in_loop_ns


def measure_loop(
    batch_sizes: Sequence[int] = LOOP_BATCH_SIZES,
    stage_steps: int = 400,
    interleave: Callable[[dict[Any, Callable[[], float]]], dict[Any, float]] | None = None,
) -> list[LoopTiming]:
    """One LoopTiming per B; the fused step and plan() alone take turns in one run."""
    interleave = interleave or interleaved_medians
    batches: dict[Any, Callable[[], float]] = {}
    for b in sorted(set(batch_sizes)):
        calls = max(1, int(BATCH_SECONDS * 1e9 / (40.0 * b)))
        batches[b, "plan"] = plan_alone_batch(b, calls)
        batches[b, "plan_in_loop"] = plan_in_loop_batch(b, calls)
        batches[b, "fused"] = fused_batch(b, calls)
    ns = interleave(batches)
    return [
        LoopTiming(
            b,
            ns[b, "plan"],
            ns[b, "plan_in_loop"],
            ns[b, "fused"],
            stage_medians(b, stage_steps, True),
            stage_medians(b, stage_steps, False),
            loop_allocated_bytes(b),
        )
        for b in sorted(set(batch_sizes))
    ]


def _cell(value: float | None) -> str:
    return "in apply" if value is None else f"{value:,.0f}"


def render_loop(timings: Sequence[LoopTiming]) -> str:
    lines = [
        f"whole host step: steady stream, MIXED, S_in={MAX_INPUT_LENGTH} P={KV_PAGE_SIZE} "
        "(median ns per step)",
        f"{'B':>6}{'plan()':>10}{'in loop':>10}{'fused step':>12}{'step/plan':>11}"
        f"{'step/in loop':>14}{'alloc B':>9}",
        f"  (plan(): over an unchanging snapshot; in loop: plan() over the loop's changing "
        f"ledgers; target step/plan <= {TARGET_FUSED_OVER_PLAN:g} at B=256, alloc 0)",
    ]
    for t in timings:
        lines.append(
            f"{t.batch:>6}{t.plan_ns:>10,.0f}{t.plan_in_loop_ns:>10,.0f}"
            f"{t.fused_ns:>12,.0f}{t.fused_over_plan:>11.2f}"
            f"{t.fused_over_plan_in_loop:>14.2f}{t.alloc_bytes:>9}"
        )
    lines.append("")
    lines.append(
        "the same loop taken apart (median ns per stage; python = pure-Python ledger "
        "with NumPy accounting, as a runtime wrote it before)"
    )
    lines.append(f"{'B':>6}{'ledger':>10}" + "".join(f"{s:>12}" for s in STAGES) + f"{'sum':>10}")
    for t in timings:
        for name, stages in (("compiled", t.stages_compiled), ("python", t.stages_python)):
            total = sum(v for v in stages.values() if v is not None)
            lines.append(
                f"{t.batch:>6}{name:>10}"
                + "".join(f"{_cell(stages[s]):>12}" for s in STAGES)
                + f"{total:>10,.0f}"
            )
    return "\n".join(lines)
