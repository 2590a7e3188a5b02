"""The measurements of docs/scheduling.md, "Measured: uncached work first beside the peers'
rules" (issue 43, item 4), printed as Markdown tables.

    python tools/prefix_experiments.py prefix     # the prefix-heavy workload (sim.prefix_workload)
    python tools/prefix_experiments.py embedded   # the embedded workload, nothing shared

Every row is one run of the same requests at one load (a multiple of the workload's saturation
throughput, ``sim.load``: FCFS with every request at t=0, here counting each prompt less the hit
the workload's structure allows, ``sim.prefixes.nominal_hits``). The prefix-heavy workload is
drawn afresh per load with the same seed at its roots' rate (the same requests, their session
think times kept in seconds); the embedded one is scaled (``at_load``). Rules, all on the same
engine and latency model:

* ``fcfs`` — arrival order: vLLM's default (``cache_aware_admission_window`` 0) and SGLang's;
* ``vllm-window`` — vLLM 0.34's cache-aware admission window, 64 requests (``sim.prefix_front``);
* ``sglang-hrrn`` — SGLang's HRRN (``sim.prefix_front``);
* ``uncached-first`` — the ledger's ``AdmissionOrder.UNCACHED_FIRST``, ``starvation_seconds``
  ``BOUND``;
* ``deadline`` and ``deadline+uncached`` — DEADLINE+PAUSE (``max_pause_steps`` 8), its own
  admission order and with uncached first (slack first, then uncached work), same bound.

Columns: mean and P99 TTFT over the requests that got a first token; the longest wait for
admission; *passed over late*: requests some later arrival was admitted before after they had
waited ``BOUND`` seconds (what the starvation bound rules out); attainment and goodput
(``sim.goodput``: every token by its deadline, attained requests per second); the share of
prompt tokens the prefix cache spared, and admissions whose prefix grew while they waited
(``late_hits``: what looking a hit up at arrival leaves out).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from stepplanner import PreemptionMode, SchedulingOptions, SchedulingPolicy, StepPlannerLimits
from stepplanner.ledger import AdmissionOrder
from stepplanner.sim import workloads
from stepplanner.sim.engine import Engine, RunSpec, ServingQueue
from stepplanner.sim.load import at_load, saturation_throughput
from stepplanner.sim.prefix_workload import prefix_heavy
from stepplanner.sim.prefixes import SharedPrefixes, nominal_hits
from stepplanner.sim.simulator import SimulationResult, simulate_run

BOUND = 10.0  # seconds: the starvation bound of uncached first, and of the "passed over" count
LOADS = (0.6, 0.8, 1.0, 1.1, 1.2, 1.3)
DEADLINE = SchedulingOptions(
    scheduling_policy=SchedulingPolicy.DEADLINE,
    preemption=PreemptionMode.PAUSE,
    max_pause_steps=8,
)
UNCACHED = {"admission": AdmissionOrder.UNCACHED_FIRST, "starvation_seconds": BOUND}
LONG_BOUND = 60.0  # the same order with a bound six times longer: what a bound costs
RULES: dict[str, tuple[SchedulingOptions | None, ServingQueue]] = {
    "fcfs": (None, ServingQueue()),
    "vllm-window": (None, ServingQueue(peer_order="vllm-cache-window", cache_window=64)),
    "sglang-hrrn": (None, ServingQueue(peer_order="sglang-hrrn")),
    "uncached-first": (None, ServingQueue(**UNCACHED)),
    "uncached-first 60 s": (None, ServingQueue(**{**UNCACHED, "starvation_seconds": LONG_BOUND})),
    "deadline": (DEADLINE, ServingQueue()),
    "deadline+uncached": (DEADLINE, ServingQueue(**UNCACHED)),
}


def passed_over_late(
    arrival: np.ndarray, admit: np.ndarray, relegated: np.ndarray, bound: float
) -> int:
    """Requests a later arrival was admitted before, at a time they had waited ``bound``
    (requests DEADLINE relegated aside: its hand-back rule, not the order, holds them)."""
    order = np.argsort(arrival, kind="stable")
    arrival, admit = arrival[order], np.where(np.isnan(admit[order]), np.inf, admit[order])
    relegated = relegated[order]
    count = 0
    for i in np.flatnonzero(~relegated).tolist():
        later = admit[i + 1 :]
        if np.any((later >= arrival[i] + bound) & (later < admit[i])):
            count += 1
    return count


def row(load: float, rule: str, r: SimulationResult) -> str:
    w = r.workload
    ttft = r.first_token_time - w.arrival_time
    ttft = ttft[~np.isnan(ttft)]
    wait = np.nanmax(r.admit_time - w.arrival_time)
    late = passed_over_late(w.arrival_time, r.admit_time, r.relegated, BOUND)
    att = r.attainment()
    assert att is not None
    every = att["classes"]["all"]
    hit = 0.0 if r.cached_tokens is None else r.cached_tokens.sum() / w.prompt_tokens.sum()
    return (
        f"| {load:g}x | {rule} | {ttft.mean():.3f} s | {np.percentile(ttft, 99):.2f} s |"
        f" {wait:.2f} s | {late} | {every['attainment']:.1%} | {every['goodput_rps']:.2f} |"
        f" {hit:.1%} | {r.late_hits} |"
    )


HEADER = (
    "| load | rule | mean TTFT | P99 TTFT | longest wait | passed over late | attainment |"
    " goodput (req/s) | prompt tokens cached | late hits |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def run(
    rule: str, load: float, w: workloads.Workload, limits: StepPlannerLimits, p: SharedPrefixes
) -> str:
    options, queue = RULES[rule]
    return row(
        load, rule, simulate_run(RunSpec(w, Engine(limits, options, queue=queue), prefixes=p))
    )


def prefix(roots: int, seed: int) -> None:
    limits = StepPlannerLimits(max_batch_size=64, max_input_length=8192, kv_page_size=16)
    w, p = prefix_heavy(roots, 1.0, seed)
    spared = nominal_hits(w.prompt_tokens, p, limits.kv_page_size)
    saturation = saturation_throughput(w, Engine(limits), prefixes=p)
    print(
        f"prefix-heavy: {len(w)} requests from {roots} roots (seed {seed}), "
        f"{spared.sum() / w.prompt_tokens.sum():.1%} of prompt tokens cacheable; "
        f"saturation {saturation:.2f} req/s on B={limits.max_batch_size}\n"
    )
    print(HEADER)
    for load in LOADS:
        wl, pl = prefix_heavy(roots, load * saturation * roots / len(w), seed)
        for rule in RULES:
            print(run(rule, load, wl, limits, pl), flush=True)


def embedded(n: int, seed: int) -> None:
    limits = StepPlannerLimits(max_batch_size=256, max_input_length=4096, kv_page_size=32)
    base = workloads.synthetic(n, 1.0, seed=seed, slo_classes=workloads.DEFAULT_SLO_CLASSES)
    saturation = saturation_throughput(base, Engine(limits))
    print(f"embedded: {n} requests (seed {seed}); saturation {saturation:.2f} req/s\n")
    print(HEADER)
    none = SharedPrefixes.none(n)
    for load in LOADS:
        w = at_load(base, load, saturation)
        for rule in RULES:
            print(run(rule, load, w, limits, none), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("prefix", "embedded"))
    parser.add_argument("--roots", type=int, default=3000)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.experiment == "prefix":
        prefix(args.roots, args.seed)
    else:
        embedded(args.requests, args.seed)


if __name__ == "__main__":
    main(sys.argv[1:])
