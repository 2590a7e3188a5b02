"""A simulated run written as a real one: the per-request results file of ``results``' layout.

Every token's time is the end of the simulated step that emitted it, so TTFT, each inter-token
gap and E2E are exactly the simulator's. ``stepplanner fidelity`` on such a file, with the same
trace, limits, policy and latency model, must find every error 0: the check of the comparison
itself (the tests and the benchmark use it), and a way to hand a simulation to any tool that
reads ``vllm bench serve --save-result --save-detailed`` files.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import numpy as np

from ..planner._policy import ResolvedSchedulingPolicy, SchedulingOptions, StepPlannerLimits
from ..sim.latency import DEFAULT_LATENCY, EnginePace, LatencyModel
from ..sim.simulator import (
    DEFAULT_LIMITS,
    SimulationResult,
    policy_to_dict,
    resolve_options,
    simulate,
)
from ..sim.workloads import Workload
from .results import RESULTS_FORMAT, objective_lists

__all__ = ["results_document", "simulated_results"]


def simulated_results(
    workload: Workload,
    limits: StepPlannerLimits = DEFAULT_LIMITS,
    options: SchedulingOptions | ResolvedSchedulingPolicy | None = None,
    latency: LatencyModel = DEFAULT_LATENCY,
    trace: str | None = None,
    pace: EnginePace | None = None,
) -> dict[str, Any]:
    """Simulate ``workload`` and return its results document (rows in the workload's order;
    ``trace`` is the path recorded in the ``"stepplanner"`` object; ``pace`` as ``simulate``
    takes it: an engine whose speed changed during the run)."""
    policy = resolve_options(options, limits)
    result = simulate(workload, limits, policy, latency, pace=pace, detailed=True)
    return results_document(result, trace)


def results_document(result: SimulationResult, trace: str | None = None) -> dict[str, Any]:
    """A run made with ``simulate(..., detailed=True)`` as a results document: vLLM's
    ``--save-result --save-detailed`` keys, stepplanner's ``request_ids`` (``req_<row>``),
    ``arrival_times`` and ``priorities``, and each request's objectives ``ttft_slos`` /
    ``tpot_slos`` (seconds, null: none) and whether DEADLINE ``relegated`` it, so that every
    figure of the run, attainment included, can be recomputed from the file. A request that
    did not complete (refused, or cut off by ``max_steps``) is written as vLLM writes a failed
    one: an error, output length 0, no token times."""
    workload, latency = result.workload, result.latency
    arrivals = workload.arrival_time.tolist()
    times = [t.tolist() for t in result.token_times()]
    done = (~np.isnan(result.finish_time)).tolist()
    ttfts = [t[0] - a if d else 0.0 for t, a, d in zip(times, arrivals, done)]
    latencies = [t[-1] - a if d else 0.0 for t, a, d in zip(times, arrivals, done)]
    output_lens = [len(t) if d else 0 for t, d in zip(times, done)]
    last = max((t[-1] for t in times if t), default=arrivals[0])
    duration = max(last - arrivals[0], 1e-12)
    completed = sum(done)
    return {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "stepplanner-simulator",
        "model_id": latency.name,
        "num_prompts": len(workload),
        "duration": duration,
        "completed": completed,
        "failed": len(done) - completed,
        "total_input_tokens": int(workload.prompt_tokens[done].sum()),
        "total_output_tokens": sum(output_lens),
        "request_throughput": completed / duration,
        "output_throughput": sum(output_lens) / duration,
        "input_lens": workload.prompt_tokens.tolist(),
        "output_lens": output_lens,
        "ttfts": ttfts,
        "itls": [np.diff(t).tolist() if d else [] for t, d in zip(times, done)],
        "latencies": latencies,
        "e2els": latencies,
        "start_times": arrivals,
        "errors": ["" if d else _failure(result, i) for i, d in enumerate(done)],
        "generated_texts": [""] * len(workload),
        "request_ids": [f"req_{i}" for i in range(len(workload))],
        "arrival_times": (workload.arrival_time - workload.arrival_time[0]).tolist(),
        "priorities": workload.priority.tolist(),
        **objective_lists(workload),
        "relegated": result.relegated.tolist(),
        "stepplanner": {
            "format": RESULTS_FORMAT,
            "trace": trace,
            "scheduler": "stepplanner",
            "options": policy_to_dict(result.policy),
            "limits": dataclasses.asdict(result.limits),
            "num_blocks": None,
            "model": None,
            "timings": None,
            "latency_model": dataclasses.asdict(latency),
        },
    }


def _failure(result: SimulationResult, i: int) -> str:
    if result.refused[i]:
        return "refused at submission: prompt longer than max_input_length"
    return "not completed in the simulation"
