"""The simulator with a finite KV page pool: the ledger owns a ``KVPageTable`` and reserves each
request's worst case at admission, so no step ever runs out of pages, and the run reports page
occupancy.

It runs ``stepplanner.sim.simulator``'s own loop (the fused ``ledger.step``) over
``Ledger(..., page_table=...)``: every rule of the plain simulator holds, and admission
additionally stops at the first request in queue order whose worst case (``prompt_tokens +
max(output_tokens, 1)`` tokens) does not fit the free pool.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import StepPlannerValueError
from ..core import StepPlanner
from ..kv import KVPageTable
from ..planner._policy import ResolvedSchedulingPolicy, SchedulingOptions, StepPlannerLimits
from .engine import DEFAULT_LIMITS, Engine, RunSpec, ServingQueue, Speculation
from .latency import DEFAULT_LATENCY, EnginePace, LatencyModel
from .occupancy import PageOccupancy
from .preemption import simulate_preempting_run
from .simulator import Progress, SimulationResult, SimulationRun
from .workloads import Workload

__all__ = ["PageOccupancy", "row_pages", "simulate_paged", "simulate_paged_run"]


def row_pages(workload: Workload, limits: StepPlannerLimits) -> int:
    """Pages of the workload's largest worst case (a prompt cut at S_in, since a longer one is
    refused before it needs pages): the page-table row width ``simulate_paged`` uses."""
    longest = np.minimum(workload.prompt_tokens, limits.max_input_length).astype(
        np.int64
    ) + np.maximum(workload.output_tokens, 1)
    p = limits.kv_page_size
    return max(int(-(-int(longest.max()) // p)), 1) if len(workload) else 1


def simulate_paged(
    workload: Workload,
    limits: StepPlannerLimits = DEFAULT_LIMITS,
    options: SchedulingOptions | ResolvedSchedulingPolicy | None = None,
    latency: LatencyModel = DEFAULT_LATENCY,
    *,
    num_pages: int,
    max_steps: int | None = None,
    progress: Progress | None = None,
    progress_every: int = 2048,
    pace: EnginePace | None = None,
    detailed: bool = False,
    queue: ServingQueue | None = None,
    speculation: Speculation | None = None,
) -> tuple[SimulationResult, PageOccupancy]:
    """``simulate`` with a pool of ``num_pages`` KV pages of ``limits.kv_page_size`` tokens:
    the keyword form of ``simulate_paged_run(RunSpec(workload, Engine(..., num_pages=N)))``.

    A request whose worst case exceeds the whole pool (or whose prompt exceeds S_in) is refused
    and counted as such, never dropped silently. ``progress``, ``pace`` and ``detailed`` as in
    ``simulate`` (objectives, deadlines and ``queue`` too: the run is ``SimulationRun``'s).
    """
    engine = Engine(
        limits,
        options,
        latency,
        num_pages,
        ServingQueue() if queue is None else queue,
        speculation,
        pace,
    )
    return simulate_paged_run(
        RunSpec(workload, engine, max_steps, detailed),
        progress=progress,
        progress_every=progress_every,
    )


def simulate_paged_run(
    spec: RunSpec, *, progress: Progress | None = None, progress_every: int = 2048
) -> tuple[SimulationResult, PageOccupancy]:
    """The run ``spec`` describes, on its engine's pool of ``num_pages`` KV pages (>= 1)."""
    engine, workload = spec.engine, spec.workload
    limits = engine.limits
    if engine.num_pages < 1:
        raise StepPlannerValueError(
            f"engine.num_pages={engine.num_pages}: a paged run needs a pool; allowed: >= 1 "
            "(0, unlimited pages, is simulate_run's)"
        )
    if engine.kv_preemption is not None:  # pages taken as KV grows, preempting when short
        return simulate_preempting_run(spec, progress=progress, progress_every=progress_every)
    table = KVPageTable(
        limits.max_batch_size, row_pages(workload, limits), engine.num_pages, limits.kv_page_size
    )
    run = SimulationRun(spec, StepPlanner(engine.policy, limits), table)
    reserved: list[int] = []
    in_use: list[int] = []
    held: list[int] = []

    def record(step: int, start: float, ledger: Any, plan: Any) -> None:
        # No per-row ensure: each row's worst case is reserved at admission, and the next
        # ledger.step refuses a plan in which a row would outgrow it.
        reserved.append(ledger.reserved_pages)
        in_use.append(ledger.kv_pages_in_use())
        held.append(ledger.held_back)

    result = run.run(spec.max_steps, record, progress, progress_every)
    fits_s_in = (workload.prompt_tokens >= 1) & (workload.prompt_tokens <= limits.max_input_length)
    occupancy = PageOccupancy(
        table.num_pages,
        np.array(reserved, dtype=np.int64),
        np.array(in_use, dtype=np.int64),
        np.array(held, dtype=np.int64),
        result.refused & fits_s_in,
    )
    return result, occupancy
