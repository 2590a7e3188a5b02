"""The step-time budget in a running engine: DEADLINE's per-token misses on deep prompts in
transformers' continuous batching, judged by its own clock, without the budget and with it
(docs/scheduling.md, "Step-time budget"; the simulator's figures are its "Measured: DEADLINE's
per-token misses on deep prompts", ``tools/step_budget_experiments.py tpot``).

    python tools/step_budget_engine.py OUT [--repeats 5] [--load 1.2] [--targets 1.2 1.5]
    python tools/step_budget_engine.py OUT --summarize   # the table again, from OUT
    python tools/step_budget_engine.py OUT --smoke       # 16 requests, 1 repeat: does it run

The engine is ``fidelity.harness``'s (a random-weight Llama of 256 hidden units, B = 8, P = 16,
256 tokens a step) made long-context: S_in 1,024 (``--max-input-length``) and a KV pool that
holds B requests at full length. The requests (seeded): prompts of random tokens, uniform in
60..90% of S_in (so every decode runs 600..1,000 tokens deep and a prompt takes 3..4 chunks),
outputs 32..96 tokens, classes -1 / 0 / 1 in shares 10 / 60 / 30%. In order:

1. capacity: the requests all at t=0 under stepplanner FCFS (MIXED, 256 tokens a step: the
   steps the other runs plan), completed requests per second; that run's median step is the
   unit of the objectives (``CLASS_STEPS``) and its step timings the step model's prior,
   fitted as ``stepplanner calibrate`` fits them (``fit_step_latency``);
2. per repeat, the requests at ``--load`` x the capacity (Poisson gaps, seeded per repeat),
   served back to back, the order rotated each repeat: DEADLINE+PAUSE (``max_pause_steps`` 8,
   MIXED, 256 tokens a step) with the classes' objectives, without the budget and with
   ``max_step_seconds`` at each ``--targets`` multiple of the tightest TPOT objective;
3. per run, from the results' own token stamps (``ttfts``, ``itls``): the requests with a token
   after the first past its deadline (token ``i`` due ``arrival + ttft + i * tpot``,
   docs/scheduling.md "Objectives and deadlines") and those tokens, attainment (every token by
   its deadline, served), the requests DEADLINE handed back unserved, TTFT p50/p99 and ITL p99;
   from the step timings, the mean tokens a step and the steps with decode rows that took
   longer than the tightest TPOT; from the scheduler (its ``on_step`` hook), the steps the
   budget planned below 256 tokens, and the online fit's coefficients at the end.

One JSON line per run goes to OUT (the first: the capacity run); the table prints medians over
the repeats and, per repeat, the misses with the budget over those without it.
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
from typing import Any

import numpy as np

from stepplanner import (
    SLO,
    IfbSchedulingMode,
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
)
from stepplanner.sim.goodput import attained_from_gaps
from stepplanner.sim.latency_models import StepTimings, fit_step_latency
from stepplanner.sim.workloads import Workload

STEP_TOKENS = 256  # the harness engine's max_batch_tokens, and the policies' max_num_tokens
# Objectives per class as (TTFT, TPOT) in median steps of the capacity run. That run's steps
# are mostly decode-only (a slot frees every ~8 steps, and its prompt fills ~3 of them), so the
# unit is about a decode step; a full mixed step takes 2-3 of them. Token i is due at arrival +
# ttft + i * tpot, so a first token well ahead of a generous TTFT banks slack that absorbs every
# later long step (a first try with TTFTs of 40 and 200 steps missed nothing, with or without
# the budget): the TTFTs are a few prompts' worth of steps, and the TPOTs from just above a
# decode-only step (missed when mixed steps come often) to three of them.
CLASS_STEPS = {-1: (10.0, 1.2), 0: (10.0, 1.5), 1: (60.0, 3.0)}
CLASS_SHARES = {-1: 0.1, 0: 0.6, 1: 0.3}
PROMPT_SHARE = (0.6, 0.9)  # of S_in: every decode runs deep in KV
OUTPUT_TOKENS = (32, 96)
FIRST_ID = 3  # below it: the model's special tokens
FCFS = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=STEP_TOKENS)
DEADLINE = SchedulingOptions(
    scheduling_policy=SchedulingPolicy.DEADLINE,
    preemption=PreemptionMode.PAUSE,
    max_pause_steps=8,
    ifb_scheduling_mode=IfbSchedulingMode.MIXED,
    max_num_tokens=STEP_TOKENS,
)
# What the scheduler's on_step hook counts per scheduler name, from the first arrival on.
COUNTS: dict[str, dict[str, Any]] = {}


def requests(n: int, seed: int, s_in: int, vocab: int) -> tuple[list[list[int]], Workload]:
    """Prompts (token ids) and a workload at t=0 (no objectives yet) of ``n`` requests."""
    rng = random.Random(seed)
    low, high = (max(1, int(s_in * share)) for share in PROMPT_SHARE)
    prompts, outputs, classes = [], [], []
    for _ in range(n):
        prompts.append([rng.randrange(FIRST_ID, vocab) for _ in range(rng.randint(low, high))])
        outputs.append(rng.randint(*OUTPUT_TOKENS))
        classes.append(rng.choices(list(CLASS_SHARES), weights=list(CLASS_SHARES.values()))[0])
    w = Workload(
        np.zeros(n), np.array([len(p) for p in prompts]), np.array(outputs), np.array(classes)
    )
    return prompts, w


def objectives(step: float) -> dict[int, SLO]:
    return {p: SLO(ttft * step, tpot * step) for p, (ttft, tpot) in CLASS_STEPS.items()}


def at_rate(w: Workload, rate: float, seed: int, slos: dict[int, SLO]) -> Workload:
    """``w`` arriving at ``rate`` requests/s with Poisson gaps (0: all at t=0), each class
    carrying its objectives (the results file lists them, and they are what is judged)."""
    n = len(w)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n) if rate else None
    arrival = np.zeros(n) if gaps is None else np.cumsum(gaps) - gaps[0]
    present = set(w.priority.tolist())
    return Workload(
        arrival,
        w.prompt_tokens,
        w.output_tokens,
        w.priority,
        f"step-budget-engine(rate={rate:g})",
        slo_classes={p: s for p, s in slos.items() if p in present},
    )


def counted(name: str) -> str:
    """Put back into transformers' scheduler table the scheduler ``register`` put there under
    ``name``, with its ``on_step`` hook (the adapter's hook for monitoring) counting the steps
    and those the budget planned below the policy's token budget."""
    from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING

    base = SCHEDULER_MAPPING[name]
    counts = COUNTS.setdefault(name, {})

    def on_step(self: Any, residents: Any, states: Any, plan: Any, batch: Any) -> None:
        counts["steps"] = counts.get("steps", 0) + 1
        budget = self.step_budget
        if budget is not None:
            counts["budget"] = budget  # read once the run is over: the online fit's state
            if budget.last_budget < self.policy.max_num_tokens:
                counts["capped"] = counts.get("capped", 0) + 1

    SCHEDULER_MAPPING[name] = type(base.__name__, (base,), {"on_step": on_step})
    return name


def serve(
    w: Workload, prompts: list[list[int]], scheduler: str, s_in: int, tightest: float | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run: its figures (``tightest``: the tightest TPOT objective, None before there are
    objectives) and its timed steps."""
    from stepplanner.fidelity import harness

    engine = engine_spec(s_in)
    counts = COUNTS.setdefault(scheduler, {})

    def first_arrival(submitted: int, total: int) -> None:
        # The warm-up's steps went through the scheduler too; they are not the run's.
        if submitted == 1:
            counts.clear()

    ids = [f"req_{i}" for i in range(len(w))]
    t0 = time.perf_counter()
    run = harness.serve_trace(
        w,
        harness.ModelSpec(),
        engine,
        scheduler,
        request_ids=ids,
        prompts=prompts,
        progress=first_arrival,
    )
    data = run.results()
    row = {**judged(data), "wall_s": time.perf_counter() - t0}
    steps = run.steps
    seconds = np.array([s["seconds"] for s in steps])
    decodes = np.array([s["decode_rows"] > 0 for s in steps])
    row |= {
        "steps": len(steps),
        "mean_tokens_per_step": float(np.mean([s["tokens"] for s in steps])),
        "median_step_s": float(np.median(seconds)),
        "p99_decode_step_s": float(np.percentile(seconds[decodes], 99)) if decodes.any() else 0,
        "planned_steps": counts.get("steps", 0),
        "capped_steps": counts.get("capped", 0),
    }
    if tightest is not None:
        row["decode_steps_over_tpot"] = int((decodes & (seconds > tightest)).sum())
    budget = counts.get("budget")
    if budget is not None:
        row["fitted_model"] = budget.coefficients
        row["refits"] = budget.refits
    return row, steps


def engine_spec(s_in: int) -> Any:
    from stepplanner.fidelity import harness

    base = harness.EngineSpec()
    # Every slot at full length (prompt + output) fits in the pool: no offload muddles the steps.
    pages = -(-base.max_batch_size * (s_in + OUTPUT_TOKENS[1]) // base.kv_page_size)
    return harness.EngineSpec(
        max_step_tokens=STEP_TOKENS, max_input_length=s_in, num_blocks=max(pages, base.num_blocks)
    )


def judged(data: dict[str, Any]) -> dict[str, Any]:
    """The run's figures from its results' own token stamps, over every request."""
    ok = np.array([not e for e in data["errors"]])
    ttft = np.array([t if o else np.nan for t, o in zip(data["ttfts"], ok)], dtype=np.float64)
    itls = [np.asarray(g, dtype=np.float64) for g in data["itls"]]
    ttft_slo = np.array([np.nan if v is None else v for v in data["ttft_slos"]], dtype=np.float64)
    tpot_slo = np.array([np.nan if v is None else v for v in data["tpot_slos"]], dtype=np.float64)
    missing = late = 0
    for first, gaps, due_first, tpot in zip(ttft, itls, ttft_slo, tpot_slo):
        if np.isnan(first) or np.isnan(tpot) or not gaps.size:
            continue
        # Token i (0 = the first) comes ttft + sum(gaps[:i]) after arrival, due ttft_slo + i x
        # tpot after it: a first token that came early carries its slack forward.
        times = first + np.cumsum(gaps)
        behind = int((times > due_first + np.arange(1, gaps.size + 1) * tpot).sum())
        missing += behind > 0
        late += behind
    attained = attained_from_gaps(ttft, itls, ttft_slo, tpot_slo) & ok
    prios = np.asarray(data["priorities"])
    served = ttft[ok]
    gaps = np.concatenate([g for g in itls if g.size] or [np.zeros(1)])
    return {
        "requests": len(ok),
        "completed": data["completed"],
        "duration_s": data["duration"],
        "unserved": int((~ok).sum()),
        "missing_tpot": missing,
        "late_after_first": late,
        "attainment": float(attained.mean()),
        "attainment_by_class": {
            str(p): float(attained[prios == p].mean()) for p in sorted(set(prios.tolist()))
        },
        "p50_ttft_s": float(np.percentile(served, 50)) if served.size else float("nan"),
        "p99_ttft_s": float(np.percentile(served, 99)) if served.size else float("nan"),
        "p99_itl_s": float(np.percentile(gaps, 99)),
    }


def step_prior(steps: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """The step model fitted to a run's timed steps, as ``stepplanner calibrate`` fits a
    timings file, and the fit's figures."""
    columns = ("seconds", "tokens", "context", "rows", "decode_rows")
    columns += ("prefill_tokens", "prefill_context", "attention")
    timings = StepTimings(**{c: np.array([s[c] for s in steps], dtype=np.float64) for c in columns})
    fit = fit_step_latency(timings, "the capacity run's steps")
    return fit.model, fit.to_dict()


def capacity_run(
    prompts: list[list[int]], w: Workload, s_in: int, rate: float | None
) -> dict[str, Any]:
    from stepplanner.integrations.transformers import register

    name = counted(register(FCFS, name="sp-budget-fcfs", max_input_length=s_in))
    row, steps = serve(at_rate(w, 0.0, 0, {}), prompts, name, s_in, None)
    seconds = np.array([s["seconds"] for s in steps])
    chunks = np.array([s["prefill_tokens"] > 0 for s in steps])
    decodes = np.array([s["decode_rows"] > 0 for s in steps])
    model, fit = step_prior(steps)
    return {
        "kind": "capacity",
        **row,
        "capacity_rps": rate or row["completed"] / row["duration_s"],
        "median_decode_only_step_s": float(np.median(seconds[~chunks])) if (~chunks).any() else 0,
        "median_mixed_step_s": float(np.median(seconds[chunks & decodes]))
        if (chunks & decodes).any()
        else 0,
        "step_model": {k: getattr(model, k) for k in "abcdef"},
        "step_fit": fit,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path, help="JSON lines, one per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--load", type=float, default=1.2, help="x the capacity")
    parser.add_argument(
        "--targets", type=float, nargs="+", default=[1.2, 1.5], help="x the tightest TPOT"
    )
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--max-input-length", type=int, default=1024, help="S_in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capacity", type=float, help="req/s: the burst still runs for its steps")
    parser.add_argument("--summarize", action="store_true", help="reprint the table from OUT")
    parser.add_argument("--smoke", action="store_true", help="16 requests, 1 repeat")
    args = parser.parse_args(argv)
    if args.summarize:
        summarize([json.loads(line) for line in args.out.read_text().splitlines() if line])
        return
    if args.smoke:
        args.requests, args.repeats = 16, 1
    from stepplanner.fidelity import harness
    from stepplanner.integrations.transformers import register

    s_in = args.max_input_length
    prompts, w = requests(args.requests, args.seed, s_in, harness.ModelSpec().vocab_size)
    began = time.perf_counter()
    with args.out.open("w") as out:

        def write(row: dict[str, Any]) -> None:
            out.write(json.dumps(row) + "\n")
            out.flush()

        cap = capacity_run(prompts, w, s_in, args.capacity)
        step = cap["median_step_s"]
        slos = objectives(step)
        tightest = min(s.tpot for s in slos.values() if s.tpot is not None)
        cap |= {
            "load": args.load,
            "max_input_length": s_in,
            "objectives": {str(p): [s.ttft, s.tpot] for p, s in slos.items()},
        }
        write(cap)
        print(
            f"capacity {cap['capacity_rps']:.2f} req/s; median step {step * 1e3:.1f} ms "
            f"(decode-only {cap['median_decode_only_step_s'] * 1e3:.1f} ms, with a chunk "
            f"{cap['median_mixed_step_s'] * 1e3:.1f} ms); tightest TPOT {tightest * 1e3:.1f} "
            f"ms; step model {fmt_model(cap['step_model'])} (R² {cap['step_fit']['r2']:.3f})",
            flush=True,
        )
        priority = {f"req_{i}": int(p) for i, p in enumerate(w.priority.tolist())}
        rules: dict[str, tuple[float | None, str]] = {}
        for target in [None, *args.targets]:
            label = "none" if target is None else f"{target:g}x"
            seconds = None if target is None else target * tightest
            name = register(
                DEADLINE,
                name=f"sp-budget-deadline-{label}",
                priority=priority,
                max_input_length=s_in,
                slo_classes=slos,
                max_step_seconds=seconds,
                step_model=None if seconds is None else cap["step_model"],
            )
            rules[label] = (seconds, counted(name))
        labels = list(rules)
        for repeat in range(args.repeats):
            offered = at_rate(w, args.load * cap["capacity_rps"], args.seed + 1 + repeat, slos)
            # Rotated, so no rule always runs first (or last) on a machine that drifts.
            for label in labels[repeat % len(labels) :] + labels[: repeat % len(labels)]:
                seconds, name = rules[label]
                row, _ = serve(offered, prompts, name, s_in, tightest)
                row = {
                    "kind": "run",
                    "repeat": repeat,
                    "budget": label,
                    "max_step_seconds": seconds,
                    **row,
                }
                write(row)
                print(
                    f"repeat {repeat} budget {label:>5}: {row['missing_tpot']} requests missing "
                    f"a per-token deadline ({row['late_after_first']} tokens), attainment "
                    f"{row['attainment']:.1%}, {row['unserved']} unserved, "
                    f"{row['capped_steps']}/{row['planned_steps']} steps capped, "
                    f"{row['wall_s']:.0f} s",
                    flush=True,
                )
    print(f"\nserved in {(time.perf_counter() - began) / 60:.1f} minutes")
    summarize([json.loads(line) for line in args.out.read_text().splitlines() if line])


def fmt_model(model: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in model.items() if v)


def summarize(rows: list[dict[str, Any]]) -> None:
    cap = next(r for r in rows if r["kind"] == "capacity")
    runs = [r for r in rows if r["kind"] == "run"]
    repeats = sorted({r["repeat"] for r in runs})
    objectives = ", ".join(
        f"{p}: {ttft * 1e3:.0f} ms / {tpot * 1e3:.1f} ms"
        for p, (ttft, tpot) in cap["objectives"].items()
    )
    print(
        f"\ncapacity {cap['capacity_rps']:.2f} req/s (S_in {cap['max_input_length']}, "
        f"{cap['requests']} requests), median step {cap['median_step_s'] * 1e3:.1f} ms; "
        f"objectives (TTFT / TPOT) {objectives}; step model prior "
        f"{fmt_model(cap['step_model'])}; DEADLINE+PAUSE at {cap['load']:g}x, "
        f"{len(repeats)} repeats; medians over the repeats"
    )
    print(
        "\n| step-time budget | requests missing a per-token deadline | tokens late after the"
        " first | attainment | unserved | TTFT p50 | TTFT p99 | ITL p99 | mean tokens/step |"
        " steps with decodes over the tightest TPOT | steps capped |"
        " misses / none's (per repeat) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = {r["repeat"]: r for r in runs if r["budget"] == "none"}
    for label in dict.fromkeys(r["budget"] for r in runs):
        mine = [r for r in runs if r["budget"] == label]

        def med(key: str, rows: list[dict[str, Any]] = mine) -> float:
            return statistics.median(r[key] for r in rows)

        seconds = mine[0]["max_step_seconds"]
        name = "none" if seconds is None else f"{label} ({seconds * 1e3:.1f} ms)"
        ratios = [
            "–"
            if base[r["repeat"]]["missing_tpot"] == 0
            else f"{r['missing_tpot'] / base[r['repeat']]['missing_tpot']:.2f}"
            for r in mine
            if r["repeat"] in base
        ]
        capped = med("capped_steps") / max(med("planned_steps"), 1)
        print(
            f"| {name} | {med('missing_tpot'):g} | {med('late_after_first'):,.0f} |"
            f" {med('attainment'):.1%} | {med('unserved'):g} | {med('p50_ttft_s') * 1e3:.0f} ms |"
            f" {med('p99_ttft_s') * 1e3:.0f} ms | {med('p99_itl_s') * 1e3:.0f} ms |"
            f" {med('mean_tokens_per_step'):.0f} | {med('decode_steps_over_tpot'):g} |"
            f" {capped:.0%} | {', '.join(ratios) if seconds is not None else ''} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
