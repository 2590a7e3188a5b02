"""Loads relative to an engine's saturation throughput.

The **saturation throughput** of a workload on an engine is what it completes per second with
every request there at once: the workload's requests all arriving at t=0, served FCFS, completed
requests over the run's span. No work-conserving order completes more per second on average,
so a load of 1.0 is the edge past which a queue grows whatever the policy; what a deadline
policy can change there is *who* meets a deadline.

``at_load`` offers the same requests at ``load`` times that rate: their arrival times scaled
about the first one (only the gaps change, so the requests, their order and their objectives
are the same at every load).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .._errors import StepPlannerValueError
from .engine import Engine, RunSpec
from .prefixes import SharedPrefixes, nominal_hits
from .simulator import run_span, simulate_run
from .workloads import Workload

__all__ = ["at_load", "saturation_throughput"]


def saturation_throughput(
    workload: Workload,
    engine: Engine,
    *,
    max_steps: int | None = None,
    progress: Any = None,
    prefixes: SharedPrefixes | None = None,
) -> float:
    """Requests/s completed with every request of ``workload`` at t=0 under FCFS (the default
    ``SchedulingOptions``, so the SPEC §2 default budgets) on ``engine``'s limits, latency
    model and speculative decoding (its options, page pool and serving front aside: the
    measure is of the engine's speed, not of a policy). With ``prefixes``, each prompt counts
    less the hit the workload's structure allows (``nominal_hits``: every earlier request's
    share cached), the work a prefix cache leaves."""
    if prefixes is not None:
        prefixes.check_against(workload.prompt_tokens)
        spared = nominal_hits(workload.prompt_tokens, prefixes, engine.limits.kv_page_size)
        workload = dataclasses.replace(
            workload,
            prompt_tokens=workload.prompt_tokens - spared,
            source=f"{workload.source}, uncached",
        )
    burst = workload.with_arrivals(np.zeros(len(workload)), f"{workload.source} at t=0")
    fcfs = Engine(engine.limits, latency=engine.latency, speculation=engine.speculation)
    result = simulate_run(RunSpec(burst, fcfs, max_steps), progress=progress, progress_every=1024)
    completed = int((~np.isnan(result.finish_time)).sum())
    if completed == 0:
        raise StepPlannerValueError(
            f"saturation: no request of {workload.source} completed (every prompt exceeds "
            "S_in?); allowed: a workload the engine can serve"
        )
    return completed / run_span(result)


def at_load(workload: Workload, load: float, saturation: float) -> Workload:
    """``workload`` offered at ``load`` x ``saturation`` requests/s (``Workload.at_rate``)."""
    if not (isinstance(load, (int, float)) and math.isfinite(load) and load > 0):
        raise StepPlannerValueError(
            f"load={load!r} is out of range; allowed: a multiple of saturation > 0"
        )
    scaled = workload.at_rate(load * saturation)
    return scaled.with_arrivals(
        scaled.arrival_time,
        f"{workload.source} at {load:g}x saturation ({load * saturation:.4g}/s)",
    )
