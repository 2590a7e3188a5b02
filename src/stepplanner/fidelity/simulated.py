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
from ..sim.simulator import DEFAULT_LIMITS, policy_to_dict, resolve_options, simulate
from ..sim.workloads import Workload
from .results import RESULTS_FORMAT

__all__ = ["simulated_results"]


def simulated_results(workload: Workload, limits: StepPlannerLimits = DEFAULT_LIMITS,
                      options: SchedulingOptions | ResolvedSchedulingPolicy | None = None,
                      latency: LatencyModel = DEFAULT_LATENCY,
                      trace: str | None = None, pace: EnginePace | None = None
                      ) -> dict[str, Any]:
    """Simulate ``workload`` and return its results document (rows in the workload's order;
    ``trace`` is the path recorded in the ``"stepplanner"`` object; ``pace`` as ``simulate``
    takes it: an engine whose speed changed during the run)."""
    policy = resolve_options(options, limits)
    emitted: list[np.ndarray] = []

    def record(step: int, start: float, ledger: Any, plan: Any) -> None:
        rows = plan.as_array()
        emitted.append(ledger.request_ids[rows["resident"][rows["select_last_token_logits"]]])

    result = simulate(workload, limits, policy, latency, on_step=record, pace=pace)
    end = result.steps["end_time"]
    times: list[list[float]] = [[] for _ in range(len(workload))]
    for k, ids in enumerate(emitted):
        for i in ids.tolist():
            times[i].append(float(end[k]))
    arrival = workload.arrival_time - workload.arrival_time[0]
    done = [bool(t) for t in times]
    ttfts = [t[0] - a if t else 0.0 for t, a in zip(times, workload.arrival_time.tolist())]
    latencies = [t[-1] - a if t else 0.0 for t, a in zip(times, workload.arrival_time.tolist())]
    output_lens = [len(t) for t in times]
    last = max((t[-1] for t in times if t), default=float(workload.arrival_time[0]))
    duration = max(last - float(workload.arrival_time[0]), 1e-12)
    return {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "stepplanner-simulator", "model_id": latency.name,
        "num_prompts": len(workload), "duration": duration,
        "completed": sum(done), "failed": len(done) - sum(done),
        "total_input_tokens": int(workload.prompt_tokens[done].sum()),
        "total_output_tokens": sum(output_lens),
        "request_throughput": sum(done) / duration,
        "output_throughput": sum(output_lens) / duration,
        "input_lens": workload.prompt_tokens.tolist(), "output_lens": output_lens,
        "ttfts": ttfts, "itls": [np.diff(t).tolist() for t in times],
        "latencies": latencies, "e2els": latencies,
        "start_times": workload.arrival_time.tolist(),
        "errors": ["" if d else "not completed in the simulation" for d in done],
        "generated_texts": [""] * len(workload),
        "request_ids": [f"req_{i}" for i in range(len(workload))],
        "arrival_times": arrival.tolist(), "priorities": workload.priority.tolist(),
        "stepplanner": {
            "format": RESULTS_FORMAT, "trace": trace, "scheduler": "stepplanner",
            "options": policy_to_dict(policy), "limits": dataclasses.asdict(limits),
            "num_blocks": None, "model": None, "timings": None,
            "latency_model": dataclasses.asdict(latency),
        },
    }
