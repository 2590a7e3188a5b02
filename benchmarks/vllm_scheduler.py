"""vLLM's own Scheduler vs StepPlannerScheduler: cost of schedule() + update_from_output() per step.

The same request stream (a burst of 6 x B requests, prompts 1..700 tokens, 1..128 output tokens,
priorities -1/0/1, 10% of prompts sharing a 256-token prefix) runs to completion through each
scheduler on the CPU with fake model outputs (stepplanner.integrations.vllm_cpu), at
B = max_num_seqs in {8, 64, 256}, FCFS and PRIORITY; max_num_batched_tokens 2048, block 16,
prefix caching on, a KV cache that holds a full batch. Each scheduler runs the stream twice,
alternating with the other, and the per-step wall time is pooled over both passes (garbage
collector off while timing).

Reported: the median over the *saturated* steps (requests still waiting, so the batch is full:
the steady state of a loaded server; the draining tail is a different, smaller step), the
whole stream's total, and for StepPlannerScheduler, from a third instrumented pass, the median
share of a saturated step spent in plan() and in each other part.

    python benchmarks/vllm_scheduler.py [--batch 8 64 256] [--markdown]

Needs the ``vllm`` extra. One run; the machine is shared and noisy, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import gc
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
    for i in range(6 * batch):
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
        num_blocks=batch * 64 + 64, block_size=BLOCK, max_model_len=1024,
        enable_prefix_caching=True, policy=policy,
        stepplanner={} if cls is StepPlannerScheduler else None)


def steps(sched: Any, batch: int) -> Iterator[tuple[bool, int, int]]:
    """Run the stream; per step: saturated?, ns in schedule(), ns in update_from_output() (the
    fake model output between them is not timed)."""
    for req in make_stream(batch)[0]:
        sched.add_request(req)
    clock = time.perf_counter_ns
    while sched.has_requests():
        saturated = bool(sched.waiting)
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        fake = vllm_cpu.fake_output(sched, out)
        t2 = clock()
        sched.update_from_output(out, fake)
        t3 = clock()
        yield saturated, t1 - t0, t3 - t2


def timed_run(sched: Any, batch: int) -> tuple[list[int], int, int]:
    """Saturated steps' ns of schedule() + update_from_output(); all steps' total ns; steps.

    The cyclic garbage collector is off during the pass: its pauses (tens of ms with vLLM's
    object graph loaded) land on random steps of either scheduler and are not scheduling work.
    """
    saturated, total, n = [], 0, 0
    gc.collect()
    gc.disable()
    try:
        for full, a, b in steps(sched, batch):
            total += a + b
            n += 1
            if full:
                saturated.append(a + b)
    finally:
        gc.enable()
    return saturated, total, n


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
    gc.collect()
    gc.disable()
    for full, in_schedule, in_update in steps(sched, batch):
        step = in_schedule + in_update
        if not full:
            totals.clear()
            continue
        for part in PARTS:
            shares[part].append(totals[part] / step)
        shares["update_from_output"].append(in_update / step)
        shares["rest of schedule()"].append(
            (in_schedule - sum(totals[p] for p in PARTS)) / step)
        totals.clear()
    gc.enable()
    return {k: statistics.median(v) for k, v in shares.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    args = parser.parse_args()
    model_dir = vllm_cpu.write_model_dir(tempfile.mkdtemp(prefix="tiny-llama-"))
    rows = []
    for batch in args.batch:
        for policy in ("fcfs", "priority"):
            runs: dict[type, list[tuple[list[int], int, int]]] = defaultdict(list)
            for _ in range(2):
                for cls in (Scheduler, StepPlannerScheduler):
                    runs[cls].append(timed_run(build(cls, model_dir, batch, policy), batch))
            (v_sat, v_total, v_n), (s_sat, s_total, s_n) = (
                ([x for r in runs[c] for x in r[0]], sum(r[1] for r in runs[c]) // 2,
                 runs[c][0][2]) for c in (Scheduler, StepPlannerScheduler))
            shares = breakdown(build(StepPlannerScheduler, model_dir, batch, policy), batch)
            v, s = statistics.median(v_sat), statistics.median(s_sat)
            rows.append((batch, policy, v / 1e3, s / 1e3, v_total / 1e6, s_total / 1e6,
                         v_n, s_n, shares))
            print(f"B={batch} {policy}: saturated step vLLM {v / 1e3:,.1f} us, StepPlanner "
                  f"{s / 1e3:,.1f} us ({s / v:.2f}); stream vLLM {v_total / 1e6:,.0f} ms in "
                  f"{v_n} steps, StepPlanner {s_total / 1e6:,.0f} ms in {s_n} steps "
                  f"({s_total / v_total:.2f})", flush=True)
    print()
    print("| B | policy | vLLM µs/step | StepPlanner µs/step | ratio | stream ms vLLM / SP "
          "(ratio) | steps vLLM / SP | plan() | admission | ledger | allocate_slots | output "
          "| update_from_output | rest |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: |")
    for batch, policy, v, s, vt, st, vn, sn, sh in rows:
        parts = " | ".join(f"{100 * sh[k]:.1f}%" for k in (
            "plan", "admission", "ledger", "allocate", "output", "update_from_output",
            "rest of schedule()"))
        print(f"| {batch} | {policy.upper()} | {v:,.1f} | {s:,.1f} | {s / v:.2f} | "
              f"{vt:,.0f} / {st:,.0f} ({st / vt:.2f}) | {vn} / {sn} | {parts} |")


if __name__ == "__main__":
    main()
