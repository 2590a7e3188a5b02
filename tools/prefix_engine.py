"""Uncached work first in a running engine: transformers' continuous batching with its prefix
cache on, judged by its own clock (docs/scheduling.md, "Measured: uncached work first in a
running engine").

    python tools/prefix_engine.py OUT [--repeats 5] [--loads 1.0 1.3] [--requests 160]
    python tools/prefix_engine.py OUT --deadline TTFT TPOT ...   # DEADLINE alone and with it

The engine is ``stepplanner serve-trace``'s (``fidelity.harness``: a random-weight Llama of
256 hidden units, B = 8, P = 16, 256 tokens a step, S_in 512) with ``allow_block_sharing`` on.
The requests (seeded): 60% chat on one of four system prompts (96, 160, 224 and 288 tokens of
fixed token ids, so a later request's prompt starts with an earlier one's blocks) and a user
message of 16..64 random tokens; 40% documents of 128..448 random tokens sharing nothing;
outputs 8..32 tokens. In order:

1. the engine's capacity: the requests all at t=0 under transformers' own ``fifo`` scheduler,
   completed requests per second of the run;
2. per repeat, per load (the same requests at that share of the capacity, Poisson gaps), back to
   back: transformers' ``fifo``, stepplanner FCFS, and stepplanner FCFS admitting uncached work
   first (``AdmissionOrder.UNCACHED_FIRST``, ``starvation_seconds`` ``--bound``), the hit
   read from the runtime's own prefix cache at arrival;
3. per run, from the results file's own timestamps (``ttfts``): mean, P50, P99 and largest TTFT;
   from the step timings, the prompt tokens the engine computed (less than the prompts' total
   by what its prefix cache spared).

Nothing else should run on the machine meanwhile: the engine's step times are the measurement.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import time

import numpy as np

from stepplanner import (
    SLO,
    AdmissionOrder,
    IfbSchedulingMode,
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
)
from stepplanner.fidelity import harness
from stepplanner.integrations.transformers import register
from stepplanner.sim.goodput import attained_from_gaps
from stepplanner.sim.workloads import Workload

SYSTEM_PROMPTS = (96, 160, 224, 288)
FIRST_ID = 3  # below it: the model's special tokens
OPTIONS = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=256)
DEADLINE = SchedulingOptions(
    scheduling_policy=SchedulingPolicy.DEADLINE,
    preemption=PreemptionMode.PAUSE,
    max_pause_steps=8,
    ifb_scheduling_mode=IfbSchedulingMode.MIXED,
    max_num_tokens=256,
)
SERVE_RELEGATED = 3600.0  # a relegated request is served last, not handed back: every TTFT counts


def requests(n: int, seed: int, vocab: int) -> tuple[list[list[int]], np.ndarray]:
    """Prompts (token ids) and output lengths of ``n`` requests."""
    rng = random.Random(seed)
    systems = [[rng.randrange(FIRST_ID, vocab) for _ in range(k)] for k in SYSTEM_PROMPTS]
    prompts, outputs = [], []
    for _ in range(n):
        if rng.random() < 0.6:
            tail = rng.randrange(16, 65)
            prompt = systems[rng.randrange(len(systems))] + [
                rng.randrange(FIRST_ID, vocab) for _ in range(tail)
            ]
        else:
            prompt = [rng.randrange(FIRST_ID, vocab) for _ in range(rng.randrange(128, 449))]
        prompts.append(prompt)
        outputs.append(rng.randrange(8, 33))
    return prompts, np.array(outputs)


def workload(prompts: list[list[int]], outputs: np.ndarray, rate: float, seed: int) -> Workload:
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(prompts)) if rate else None
    arrival = np.zeros(len(prompts)) if gaps is None else np.cumsum(gaps) - gaps[0]
    return Workload(
        arrival,
        np.array([len(p) for p in prompts]),
        outputs,
        np.zeros(len(prompts), dtype=np.int64),
        f"prefix-engine(rate={rate:g})",
    )


def serve(
    w: Workload, prompts: list[list[int]], scheduler: str, slo: SLO | None = None
) -> dict[str, float]:
    engine = harness.EngineSpec(prefix_sharing=True)
    t0 = time.perf_counter()
    run = harness.serve_trace(w, harness.ModelSpec(), engine, scheduler, prompts=prompts)
    data = run.results()
    ttft = np.array([t for t in data["ttfts"] if t is not None], dtype=float)
    computed = sum(int(step["prefill_tokens"]) for step in run.steps)
    attained = float("nan")
    if slo is not None:  # every token by its deadline, from the results' own stamps
        first = np.array([np.nan if t is None else t for t in data["ttfts"]], dtype=float)
        n = len(first)
        hit = attained_from_gaps(
            first,
            [np.asarray(g, dtype=float) for g in data["itls"]],
            np.full(n, slo.ttft),
            np.full(n, slo.tpot if slo.tpot is not None else np.nan),
        )
        attained = float(hit.mean())
    return {
        "attainment": attained,
        "completed": data["completed"],
        "duration_s": data["duration"],
        "mean_ttft_s": float(ttft.mean()),
        "p50_ttft_s": float(np.percentile(ttft, 50)),
        "p99_ttft_s": float(np.percentile(ttft, 99)),
        "max_ttft_s": float(ttft.max()),
        "prompt_tokens": int(w.prompt_tokens.sum()),
        "computed_prompt_tokens": computed,
        "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path, help="JSON lines, one per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loads", type=float, nargs="+", default=[1.0, 1.3])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--bound", type=float, default=10.0, help="starvation_seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capacity", type=float, help="skip step 1")
    parser.add_argument(
        "--deadline",
        type=float,
        nargs=2,
        metavar=("TTFT", "TPOT"),
        help="instead: DEADLINE+PAUSE with these objectives (seconds) for every request, alone "
        "and with uncached first (relegated requests served last, not handed back)",
    )
    args = parser.parse_args(argv)
    prompts, outputs = requests(args.requests, args.seed, harness.ModelSpec().vocab_size)
    slo = None if args.deadline is None else SLO(*args.deadline)
    uncached = {"admission": AdmissionOrder.UNCACHED_FIRST, "starvation_seconds": args.bound}
    if slo is None:
        rules = {
            "fifo": "fifo",
            "stepplanner fcfs": register(OPTIONS, name="sp-fcfs"),
            "uncached first": register(OPTIONS, name="sp-uncached", **uncached),
        }
    else:
        deadline = {"slo_classes": {0: slo}, "relegated_wait": SERVE_RELEGATED}
        rules = {
            "deadline": register(DEADLINE, name="sp-deadline", **deadline),
            "deadline + uncached first": register(
                DEADLINE, name="sp-deadline-uncached", **deadline, **uncached
            ),
        }
    base_rule = next(iter(rules))
    capacity = args.capacity
    if capacity is None:
        burst = serve(workload(prompts, outputs, 0.0, args.seed), prompts, "fifo")
        capacity = burst["completed"] / burst["duration_s"]
        print(f"capacity: {capacity:.2f} req/s (burst of {args.requests} under fifo)", flush=True)
    runs = []
    with args.out.open("w") as out:
        for repeat in range(args.repeats):
            for load in args.loads:
                w = workload(prompts, outputs, load * capacity, args.seed + 1)
                for rule, scheduler in rules.items():
                    row = {
                        "repeat": repeat,
                        "load": load,
                        "rule": rule,
                        **serve(w, prompts, scheduler, slo),
                    }
                    runs.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(
                        f"repeat {repeat} load {load:g} {rule:>16}: mean TTFT "
                        f"{row['mean_ttft_s']:.3f} s, p99 {row['p99_ttft_s']:.3f} s, max "
                        f"{row['max_ttft_s']:.3f} s, computed {row['computed_prompt_tokens']}/"
                        f"{row['prompt_tokens']} prompt tokens, attainment "
                        f"{row['attainment']:.1%}, {row['wall_s']:.0f} s",
                        flush=True,
                    )
    print(f"\ncapacity {capacity:.2f} req/s, {args.repeats} repeats; medians over the repeats")
    print(
        "\n| load | rule | mean TTFT | P50 TTFT | P99 TTFT | largest TTFT |"
        f" mean TTFT / {base_rule}'s (per repeat: median, range) | prompt tokens computed |"
        " attainment |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for load in args.loads:
        base = [r for r in runs if r["load"] == load and r["rule"] == base_rule]
        for rule in rules:
            mine = [r for r in runs if r["load"] == load and r["rule"] == rule]
            ratios = [m["mean_ttft_s"] / b["mean_ttft_s"] for m, b in zip(mine, base)]

            def med(key: str, rows: list[dict[str, float]] = mine) -> float:
                return statistics.median(r[key] for r in rows)

            print(
                f"| {load:g}x | {rule} | {med('mean_ttft_s'):.3f} s | {med('p50_ttft_s'):.3f} s |"
                f" {med('p99_ttft_s'):.3f} s | {med('max_ttft_s'):.3f} s |"
                f" {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |"
                f" {med('computed_prompt_tokens') / med('prompt_tokens'):.0%} |"
                f" {med('attainment'):.1%} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
