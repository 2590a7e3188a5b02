"""vLLM's own Scheduler vs StepPlannerScheduler: cost of schedule() + update_from_output() per step.

The same request stream (a burst of 4 x B requests, prompts 1..700 tokens, 1..128 output tokens,
priorities -1/0/1, 10% of prompts sharing a 256-token prefix) runs to completion through each
scheduler on the CPU with fake model outputs (stepplanner.integrations.vllm_cpu), at
B = max_num_seqs in {8, 64, 256}, FCFS and PRIORITY; max_num_batched_tokens 2048, block 16,
prefix caching on, a KV cache that holds every request. Reported: the median of the per-step
wall time, and for StepPlannerScheduler, from a second instrumented pass, the median share of a
step spent in plan() and in each other part.

    python benchmarks/vllm_scheduler.py [--batch 8 64 256] [--markdown]

Needs the ``vllm`` extra. One run; the machine is shared and noisy, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from stepplanner.integrations import vllm_cpu  # noqa: E402
from stepplanner.integrations.vllm import StepPlannerScheduler  # noqa: E402

BLOCK = 16
BATCHED_TOKENS = 2048
PARTS = ("admission", "ledger", "plan", "allocate", "output")


def make_stream(batch: int, seed: int = 0) -> dict[int, list[Any]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1000) for _ in range(256)]
    reqs = []
    for i in range(4 * batch):
        n = rng.randint(1, 700)
        prompt = [rng.randrange(1000) for _ in range(n)]
        if rng.random() < 0.1 and n > 256:
            prompt[:256] = prefix
        reqs.append(vllm_cpu.make_request(f"r{i}", prompt, rng.randint(1, 128),
                                          priority=rng.choice((-1, 0, 1)),
                                          arrival_time=1000.0 + i, block_size=BLOCK))
    return {0: reqs}


def build(cls: type, model_dir: Any, batch: int, policy: str) -> Any:
    return vllm_cpu.make_scheduler(
        cls, model_dir, max_num_seqs=batch, max_num_batched_tokens=BATCHED_TOKENS,
        num_blocks=batch * 4 * 60 + 64, block_size=BLOCK, max_model_len=1024,
        enable_prefix_caching=True, policy=policy,
        stepplanner={} if cls is StepPlannerScheduler else None)


def steps(sched: Any, batch: int) -> Iterator[tuple[int, int]]:
    """Run the stream; per step, ns in schedule() and in update_from_output() (the fake model
    output between them is not timed)."""
    for req in make_stream(batch)[0]:
        sched.add_request(req)
    clock = time.perf_counter_ns
    while sched.has_requests():
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        fake = vllm_cpu.fake_output(sched, out)
        t2 = clock()
        sched.update_from_output(out, fake)
        t3 = clock()
        yield t1 - t0, t3 - t2


def timed_run(sched: Any, batch: int) -> list[int]:
    """Per-step ns of schedule() + update_from_output()."""
    return [a + b for a, b in steps(sched, batch)]


class _Timer:
    """Wraps a callable and adds its wall time to ``totals[part]``."""

    def __init__(self, fn: Any, totals: dict[str, int], part: str) -> None:
        self.fn, self.totals, self.part = fn, totals, part

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.totals[self.part] += time.perf_counter_ns() - t0


class _PlannerProxy:
    def __init__(self, planner: Any, totals: dict[str, int]) -> None:
        self.plan = _Timer(planner.plan, totals, "plan")


def breakdown(sched: Any, batch: int) -> dict[str, float]:
    """Median share of each part in the instrumented step (update_from_output is its own part)."""
    totals: dict[str, int] = defaultdict(int)
    sched._admission_candidates = _Timer(sched._admission_candidates, totals, "admission")
    sched._resident_rows = _Timer(sched._resident_rows, totals, "ledger")
    sched.planner = _PlannerProxy(sched.planner, totals)
    sched.kv_cache_manager.allocate_slots = _Timer(sched.kv_cache_manager.allocate_slots,
                                                   totals, "allocate")
    sched._make_output = _Timer(sched._make_output, totals, "output")
    shares: dict[str, list[float]] = defaultdict(list)
    for in_schedule, in_update in steps(sched, batch):
        step = in_schedule + in_update
        for part in PARTS:
            shares[part].append(totals[part] / step)
        shares["update_from_output"].append(in_update / step)
        shares["rest of schedule()"].append(
            (in_schedule - sum(totals[p] for p in PARTS)) / step)
        totals.clear()
    return {k: statistics.median(v) for k, v in shares.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    args = parser.parse_args()
    model_dir = vllm_cpu.write_model_dir(tempfile.mkdtemp(prefix="tiny-llama-"))
    rows = []
    for batch in args.batch:
        for policy in ("fcfs", "priority"):
            vllm_steps = timed_run(build(Scheduler, model_dir, batch, policy), batch)
            sp_steps = timed_run(build(StepPlannerScheduler, model_dir, batch, policy), batch)
            vllm_n, sp_n = len(vllm_steps), len(sp_steps)
            shares = breakdown(build(StepPlannerScheduler, model_dir, batch, policy), batch)
            v, s = statistics.median(vllm_steps), statistics.median(sp_steps)
            rows.append((batch, policy, v / 1e3, s / 1e3, s / v, vllm_n, sp_n, shares))
            print(f"B={batch} {policy}: vLLM {v / 1e3:.1f} us/step ({vllm_n} steps), "
                  f"StepPlanner {s / 1e3:.1f} us/step ({sp_n} steps), ratio {s / v:.2f}",
                  flush=True)
    print()
    print("| B | policy | vLLM Scheduler µs/step | StepPlannerScheduler µs/step | ratio | "
          "steps vLLM / SP | plan() | admission | ledger | allocate_slots | output | "
          "update_from_output | rest |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: |")
    for batch, policy, v, s, ratio, vn, sn, sh in rows:
        parts = " | ".join(f"{100 * sh[k]:.1f}%" for k in (
            "plan", "admission", "ledger", "allocate", "output", "update_from_output",
            "rest of schedule()"))
        print(f"| {batch} | {policy.upper()} | {v:,.1f} | {s:,.1f} | {ratio:.2f} | {vn} / {sn} "
              f"| {parts} |")


if __name__ == "__main__":
    main()
