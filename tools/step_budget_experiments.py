"""The measurements of docs/scheduling.md, "Step-time budget" and "Preemption by the work it
throws away" (issue 43, items 2 and 3), printed as Markdown tables.

    python tools/step_budget_experiments.py tpot        # (a) DEADLINE's per-token misses
    python tools/step_budget_experiments.py preemption  # (b) recomputed tokens by victim rule
    python tools/step_budget_experiments.py cost        # (c) the host step with the budget

(a) A long-context workload (1,200 requests, prompts uniform in 4,096..24,575 tokens, outputs
128..639; classes -1 / 0 / 1 in shares 10 / 60 / 30% with objectives 3 s / 50 ms, 3 s / 60 ms,
15 s / 100 ms) on B = 64, S_in = 32,768, P = 32, the default latency model, DEADLINE+PAUSE
(max_pause_steps 8) at 1.2x its saturation throughput, two draws (seeds 0 and 1), static
``max_num_tokens`` 4,096 and 8,192 (chunks of at most 2,048 / 4,096), each without a step-time
budget and with one of 70, 60 and 50 ms.

(b) The embedded workload (3,000 requests, its three classes and default objectives), B = 128,
S_in = 8,192 (so every request can be recomputed as one prompt), P = 32, Poisson arrivals at
12 and 16 requests/s on a pool of 1,000 pages and at 24/s on 1,500 (the pool, not the slots,
bounds this engine: 32k-48k tokens of KV for 128 slots), under FCFS, PRIORITY+PAUSE and
DEADLINE+PAUSE, each with vLLM's victim rule and with least-work.

(c) The embedded workload at 1.2x saturation on B = 256 (S_in 4,096, P 32), DEADLINE+PAUSE
with ``max_num_tokens`` 2,048, without and with a 20 ms step-time budget, the two runs taking
turns of 200 steps in one process (as ``python -m stepplanner.bench --deadline-cost``): per
round, each run's median ``ledger.step`` over its busy steps (at least 15/16 of the slots
occupied); the ratio is the median over rounds of the two medians' ratio. ``observe`` (the
online fit, outside the host step: the runtime calls it after the step) is timed apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from stepplanner import (
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlannerLimits,
    _core,
)
from stepplanner.planner._slo import SLO
from stepplanner.sim import simulator, workloads
from stepplanner.sim.engine import Engine, RunSpec
from stepplanner.sim.load import at_load, saturation_throughput
from stepplanner.sim.paged import simulate_paged_run
from stepplanner.sim.simulator import SimulationResult, simulate_run

PAUSE = {"preemption": PreemptionMode.PAUSE, "max_pause_steps": 8}


def long_context(seed: int, n: int = 1200) -> workloads.Workload:
    rng = np.random.default_rng(seed)
    return workloads.Workload(
        np.sort(rng.uniform(0, n, n)),
        rng.integers(4096, 24576, n),
        rng.integers(128, 640, n),
        rng.choice([-1, 0, 1], n, p=[0.1, 0.6, 0.3]),
        f"long-context(seed={seed})",
        slo_classes={-1: SLO(3.0, 0.05), 0: SLO(3.0, 0.06), 1: SLO(15.0, 0.1)},
    )


def tpot_misses(r: SimulationResult) -> tuple[int, int]:
    """Requests with a token after the first past its deadline, and those tokens."""
    ttft, _ = r.workload.objectives()
    first_late = (r.first_token_time > r.workload.arrival_time + ttft).astype(np.int64)
    after_first = np.maximum(r.late_tokens - first_late, 0)
    return int((after_first > 0).sum()), int(after_first.sum())


def tpot() -> None:
    limits = StepPlannerLimits(max_batch_size=64, max_input_length=32768, kv_page_size=32)
    print(
        "| seed | max_num_tokens | step-time budget | requests missing a per-token deadline |"
        " tokens late after the first | attainment | relegated | ITL p99 | mean tokens/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for budget_tokens, chunk in ((4096, 2048), (8192, 4096)):
        options = SchedulingOptions(
            max_num_tokens=budget_tokens,
            max_chunk_tokens=chunk,
            scheduling_policy=SchedulingPolicy.DEADLINE,
            **PAUSE,
        )
        engine = Engine(limits, options)
        for seed in (0, 1):
            w = long_context(seed)
            offered = at_load(w, 1.2, saturation_throughput(w, engine))
            for seconds in (None, 0.07, 0.06, 0.05):
                r = simulate_run(RunSpec(offered, engine.replace(max_step_seconds=seconds)))
                rep = r.report()
                att = rep["slo_attainment"]["classes"]["all"]
                missing, late = tpot_misses(r)
                budget = "none" if seconds is None else f"{seconds * 1e3:g} ms"
                print(
                    f"| {seed} | {budget_tokens} | {budget} | {missing} | {late:,} |"
                    f" {att['attainment']:.1%} | {att['relegated']} |"
                    f" {rep['latency_s']['all']['itl']['p99'] * 1e3:.0f} ms |"
                    f" {rep['steps']['mean_tokens']:.0f} |",
                    flush=True,
                )


def preemption() -> None:
    limits = StepPlannerLimits(max_batch_size=128, max_input_length=8192, kv_page_size=32)
    base = workloads.synthetic(3000, 1.0, seed=0, slo_classes=workloads.DEFAULT_SLO_CLASSES)
    policies = {
        "fcfs": SchedulingOptions(),
        "priority+pause": SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY, **PAUSE),
        "deadline+pause": SchedulingOptions(scheduling_policy=SchedulingPolicy.DEADLINE, **PAUSE),
    }
    print(
        "| pages | rate | policy | rule | preemptions | requests preempted | recomputed tokens |"
        " recomputed vs vllm | urgent preempted | completed req/s | attainment | urgent |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for pages, rate in ((1000, 12.0), (1000, 16.0), (1500, 24.0)):
        w = base.at_rate(rate)
        for name, options in policies.items():
            first = None
            for rule in ("vllm", "least-work"):
                engine = Engine(limits, options, num_pages=pages, kv_preemption=rule)
                r, _ = simulate_paged_run(RunSpec(w, engine))
                rep = r.report()
                p = rep["preemption"]
                urgent = int((r.preempted[w.priority < 0] > 0).sum())
                first = p["recomputed_tokens"] if first is None else first
                att = rep["slo_attainment"]["classes"]
                share = f"{p['recomputed_tokens'] / first:.2f}x" if first else "-"
                print(
                    f"| {pages} | {rate:g}/s | {name} | {rule} | {p['preemptions']:,} |"
                    f" {p['requests_preempted']:,} | {p['recomputed_tokens']:,} |"
                    f" {share} | {urgent} |"
                    f" {rep['throughput']['requests_per_s']:.2f} |"
                    f" {att['all']['attainment']:.1%} | {att['-1']['attainment']:.1%} |",
                    flush=True,
                )


TURN = 200
BUSY = 15 / 16
COUNT, STEP_NS = 7, 9  # the simulator's record columns: residents, host step ns


def cost(repeats: int) -> None:
    limits = StepPlannerLimits(max_batch_size=256, max_input_length=4096, kv_page_size=32)
    options = SchedulingOptions(
        max_num_tokens=2048, scheduling_policy=SchedulingPolicy.DEADLINE, **PAUSE
    )
    base = workloads.synthetic(3000, slo_classes=workloads.DEFAULT_SLO_CLASSES)
    engine = Engine(limits, options)
    offered = at_load(base, 1.2, saturation_throughput(base, engine))
    ratios: list[float] = []
    medians: dict[str, list[float]] = {"static": [], "budget": []}
    observe_ns: list[float] = []
    capped = []
    for _ in range(repeats):
        runs = {}
        for name, seconds in (("static", None), ("budget", 0.02)):
            e = engine.replace(max_step_seconds=seconds)
            runs[name] = simulator.SimulationRun(
                RunSpec(offered, e), _core.StepPlanner(e.policy, limits)
            )
        budget = runs["budget"].budget
        assert budget is not None
        observe = budget.observe
        chosen: list[int] = []

        def timed(seconds: float, observe=observe, budget=budget, chosen=chosen) -> None:
            chosen.append(budget.last_budget)
            t0 = time.perf_counter_ns()
            observe(seconds)
            observe_ns.append(time.perf_counter_ns() - t0)

        budget.observe = timed
        running = dict.fromkeys(runs, True)
        busy_rows = BUSY * limits.max_batch_size
        while any(running.values()):
            turn = {}
            for name, run in runs.items():
                start = len(run.records)
                if running[name]:
                    running[name] = run.loop(start + TURN, None, None, 1 << 30)
                table = np.array(run.records[start:], dtype=np.float64).reshape(-1, 10)
                turn[name] = table[table[:, COUNT] >= busy_rows, STEP_NS]
            if len(turn["static"]) >= 20 and len(turn["budget"]) >= 20:
                ratios.append(float(np.median(turn["budget"]) / np.median(turn["static"])))
        for name, run in runs.items():
            table = np.array(run.records, dtype=np.float64)
            medians[name].append(float(np.median(table[table[:, COUNT] >= busy_rows, STEP_NS])))
        capped.append(float(np.mean(np.array(chosen) < options.max_num_tokens)))
    q = np.percentile(ratios, [25, 50, 75])
    print(
        "| B | static step | with the budget | ratio (quartiles of the rounds) | rounds |"
        " steps capped | observe |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| 256 | {statistics.median(medians['static']) / 1e3:.1f} µs |"
        f" {statistics.median(medians['budget']) / 1e3:.1f} µs |"
        f" **{q[1]:.2f}** ({q[0]:.2f}–{q[2]:.2f}) | {len(ratios)} |"
        f" {statistics.median(capped):.0%} | {statistics.median(observe_ns) / 1e3:.1f} µs"
        f" (p99 {np.percentile(observe_ns, 99) / 1e3:.0f} µs) |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["tpot", "preemption", "cost"])
    ap.add_argument("--repeats", type=int, default=3, help="cost: runs of each side")
    args = ap.parse_args()
    print("$ python tools/step_budget_experiments.py " + " ".join(sys.argv[1:]), flush=True)
    {"tpot": tpot, "preemption": preemption, "cost": lambda: cost(args.repeats)}[args.what]()


if __name__ == "__main__":
    main()
