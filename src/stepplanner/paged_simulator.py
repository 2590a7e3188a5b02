"""The simulator with a finite KV page pool: admission reserves each request's worst case
(``PagedLedger``), so no step ever runs out of pages, and the run reports page occupancy.

It runs ``stepplanner.simulator``'s own loop with the ledger swapped for a ``PagedLedger``: every
rule of the plain simulator holds, and requests additionally wait while their worst case
(``prompt_tokens + output_tokens`` tokens) does not fit the free pool.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, cast

import numpy as np

from . import _errors
from ._errors import StepPlannerTypeError
from ._policy import ResolvedSchedulingPolicy, SchedulingOptions, StepPlannerLimits
from .latency import DEFAULT_LATENCY, LatencyModel
from .ledger import Ledger
from .paging import PagedLedger
from .simulator import DEFAULT_LIMITS, SimulationResult, _resolve, _Run
from .workloads import Workload

__all__ = ["PageOccupancy", "simulate_paged"]


@dataclasses.dataclass(frozen=True)
class PageOccupancy:
    """Per step (when the plan was made): pages reserved (held by residents' worst cases and
    promised to queued requests) and pages holding committed KV, out of ``num_pages``."""

    num_pages: int
    reserved: np.ndarray
    in_use: np.ndarray
    held_back: np.ndarray     # requests waiting for pages (not yet in the ledger's queue)

    def report(self) -> dict[str, Any]:
        n = max(self.num_pages, 1)
        empty = self.reserved.size == 0
        return {
            "num_pages": self.num_pages,
            "reserved_mean": 0.0 if empty else float(self.reserved.mean() / n),
            "reserved_peak": 0.0 if empty else float(self.reserved.max() / n),
            "in_use_mean": 0.0 if empty else float(self.in_use.mean() / n),
            "in_use_peak": 0.0 if empty else float(self.in_use.max() / n),
            "steps_with_requests_held_for_pages": int((self.held_back > 0).sum()),
        }


class _SimulatedPagedLedger(PagedLedger):
    """The simulator submits (id, prompt, priority); a request's worst case adds its outputs."""

    def __init__(self, ledger: Any, page_table: Any, output_tokens: np.ndarray) -> None:
        super().__init__(ledger, page_table)
        self._outputs = output_tokens

    def submit(self, request_id: int, prompt_length: int, priority: int = 0,
               max_new_tokens: int | None = None) -> None:
        new = int(self._outputs[request_id]) if max_new_tokens is None else max_new_tokens
        super().submit(request_id, prompt_length, priority, new)


def simulate_paged(workload: Workload, limits: StepPlannerLimits = DEFAULT_LIMITS,
                   options: SchedulingOptions | ResolvedSchedulingPolicy | None = None,
                   latency: LatencyModel = DEFAULT_LATENCY, *, num_pages: int,
                   max_steps: int | None = None) -> tuple[SimulationResult, PageOccupancy]:
    """``simulate`` with a pool of ``num_pages`` KV pages of ``limits.kv_page_size`` tokens.

    A request whose worst case exceeds the whole pool (or whose prompt exceeds S_in) is refused
    and counted as such, never dropped silently.
    """
    from . import KVPageTable, StepPlanner

    if not isinstance(workload, Workload):
        raise _errors.wrong_type("workload", "Workload", workload)
    policy = _resolve(options, limits)
    p = limits.kv_page_size
    longest = (np.minimum(workload.prompt_tokens, limits.max_input_length).astype(np.int64)
               + workload.output_tokens)
    row_pages = int(-(-int(longest.max()) // p)) if len(workload) else 1
    table = KVPageTable(limits.max_batch_size, max(row_pages, 1), num_pages, p)
    run = _Run(workload, limits, policy, latency, StepPlanner(policy, limits))
    ledger = _SimulatedPagedLedger(run.ledger, table, workload.output_tokens)
    run.ledger = cast(Ledger, ledger)   # the loop uses only what PagedLedger provides
    reserved: list[int] = []
    in_use: list[int] = []
    held: list[int] = []

    def record(step: int, start: float, _ledger: Any, plan: Any) -> None:
        for row in plan.as_array():   # the reservation covers every row: nothing can grow
            if not table.ensure(int(row["resident"]),
                                int(row["past_length"] + row["query_length"])):
                raise RuntimeError("a planned row outgrew its reserved pages")
        reserved.append(ledger.reserved_pages)
        in_use.append(ledger.kv_pages_in_use())
        held.append(ledger.held_back)

    t0 = time.perf_counter()
    truncated = run.loop(max_steps, record, None, 1 << 30)
    result = run.result(time.perf_counter() - t0, truncated)
    occupancy = PageOccupancy(table.num_pages, np.array(reserved, dtype=np.int64),
                              np.array(in_use, dtype=np.int64), np.array(held, dtype=np.int64))
    return result, occupancy
