"""vLLM's own schedulers vs StepPlannerScheduler: cost per engine step, async scheduling on and off.

The same request stream (a burst of 6 x B requests, prompts 1..700 tokens, 1..128 output tokens,
priorities -1/0/1, 10% of prompts sharing a 256-token prefix) runs to completion through each
scheduler on the CPU with fake model outputs (stepplanner.integrations.vllm_cpu), at
B = max_num_seqs in {8, 64, 256}, FCFS and PRIORITY; max_num_batched_tokens 2048, block 16,
prefix caching on, a KV cache that holds a full batch. Two modes, as vLLM runs them:

- sync (``--no-async-scheduling``): vLLM's ``Scheduler`` vs ``StepPlannerScheduler``; an engine
  step is ``schedule()`` then ``update_from_output()`` of that step;
- async (vLLM's default): vLLM's ``AsyncScheduler`` vs ``StepPlannerScheduler``, driven like
  ``EngineCore``'s batch queue; an engine step is ``schedule()`` of step N+1 then
  ``update_from_output()`` of step N.

The four run the stream in lockstep, one engine step each in turn, so the shared machine's load
hits them alike; that is done twice (the second time in reverse turn order) and the per-step wall
time (``schedule()`` + ``update_from_output()`` in that engine step; the fake model output is not
timed) is pooled over both passes, garbage collector off while timing.

Reported: the median and the trimmed mean (the slowest and fastest tenth left out) over the
*saturated* steps (requests still waiting, so the batch is full: the steady state of a loaded
server; the draining tail is a different, smaller step), the whole stream's total, and for
StepPlannerScheduler in each mode, from a third instrumented pass, the median share of a
saturated step spent in plan() and in each other part. Read the trimmed mean where the steps fall
in two groups (at B = 64 saturated steps cost either about 1x or about 3x, for both schedulers,
and the median lands in the gap between them, so it moves by 2x when a few steps change group);
the plain mean is no better on a shared machine, where a few steps stalled by other work (or the
first, importing) weigh more than hundreds of ordinary ones.

    python benchmarks/vllm_scheduler.py [--batch 8 64 256]

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
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # not a CPU-backend tip per scheduler built

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
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
        reqs.append(
            vllm_cpu.make_request(
                f"r{i}",
                prompt,
                rng.randint(1, 128),
                priority=rng.choice((-1, 0, 1)),
                arrival_time=1000.0 + i,
                block_size=BLOCK,
            )
        )
    return {0: reqs}


MODES = {"sync": (False, Scheduler), "async": (True, AsyncScheduler)}


def trimmed_mean(values: list[int], cut: float = 0.1) -> float:
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    return statistics.mean(ordered[k : len(ordered) - k])


def build(cls: type, model_dir: Any, batch: int, policy: str, overlap: bool) -> Any:
    return vllm_cpu.make_scheduler(
        cls,
        model_dir,
        max_num_seqs=batch,
        max_num_batched_tokens=BATCHED_TOKENS,
        num_blocks=batch * 64 + 64,
        block_size=BLOCK,
        max_model_len=1024,
        enable_prefix_caching=True,
        policy=policy,
        async_scheduling=overlap,
        stepplanner={} if cls is StepPlannerScheduler else None,
    )


def lockstep(
    scheds: list[Any], batch: int, observers: list[Any] | None = None
) -> list[tuple[list[int], int, int]]:
    """Run the stream through every scheduler, one engine step each in turn; per scheduler:
    saturated steps' ns of schedule() + update_from_output(), all steps' total ns, steps.
    ``observers[i](engine_step)``, when given, is called after each step of ``scheds[i]``.

    The cyclic garbage collector is off during the pass: its pauses (tens of ms with vLLM's
    object graph loaded) land on random steps of any scheduler and are not scheduling work.
    """
    runs = [vllm_cpu.engine_steps(sched, make_stream(batch)) for sched in scheds]
    results: list[tuple[list[int], int, int]] = [([], 0, 0) for _ in scheds]
    active = list(range(len(scheds)))
    gc.collect()
    gc.disable()
    try:
        while active:
            for i in list(active):
                step = next(runs[i], None)
                if step is None:
                    active.remove(i)
                    continue
                saturated, total, n = results[i]
                ns = step.schedule_ns + step.update_ns
                if step.saturated:
                    saturated.append(ns)
                results[i] = (saturated, total + ns, n + 1)
                if observers is not None:
                    observers[i](step)
    finally:
        gc.enable()
    return results


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


def instrument(sched: Any) -> tuple[Any, dict[str, list[float]]]:
    """Time each part of the scheduler's steps; returns the per-step observer and the shares of
    each part in each saturated step it fills (update_from_output is its own part)."""
    totals: dict[str, int] = defaultdict(int)
    sched._admission_candidates = _Timer(sched._admission_candidates, totals, "admission")
    sched._resident_rows = _Timer(sched._resident_rows, totals, "ledger")
    sched.planner = _PlannerProxy(sched.planner, totals)
    sched.kv_cache_manager.allocate_slots = _Timer(
        sched.kv_cache_manager.allocate_slots, totals, "allocate"
    )
    sched._make_output = _Timer(sched._make_output, totals, "output")
    shares: dict[str, list[float]] = defaultdict(list)

    def observe(step: Any) -> None:
        ns = step.schedule_ns + step.update_ns
        if step.saturated and ns:
            for part in PARTS:
                shares[part].append(totals[part] / ns)
            shares["update_from_output"].append(step.update_ns / ns)
            shares["rest of schedule()"].append(
                (step.schedule_ns - sum(totals[p] for p in PARTS)) / ns
            )
        totals.clear()

    return observe, shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    args = parser.parse_args()
    model_dir = vllm_cpu.write_model_dir(tempfile.mkdtemp(prefix="tiny-llama-"))
    rows = []
    for batch in args.batch:
        for policy in ("fcfs", "priority"):
            kinds = [
                (mode, cls)
                for mode, (_, own) in MODES.items()
                for cls in (own, StepPlannerScheduler)
            ]
            runs: dict[tuple[str, type], list[tuple[list[int], int, int]]] = defaultdict(list)
            for order in (kinds, kinds[::-1]):
                scheds = [
                    build(cls, model_dir, batch, policy, MODES[mode][0]) for mode, cls in order
                ]
                for kind, result in zip(order, lockstep(scheds, batch)):
                    runs[kind].append(result)
            instrumented = [
                build(StepPlannerScheduler, model_dir, batch, policy, overlap)
                for overlap, _ in MODES.values()
            ]
            observers, shares_of = zip(*(instrument(sched) for sched in instrumented))
            lockstep(instrumented, batch, list(observers))
            for (mode, (_, own)), part_shares in zip(MODES.items(), shares_of):
                (v_sat, v_total, v_n), (s_sat, s_total, s_n) = (
                    (
                        [x for r in passes for x in r[0]],
                        sum(r[1] for r in passes) // 2,
                        passes[0][2],
                    )
                    for passes in (runs[mode, own], runs[mode, StepPlannerScheduler])
                )
                shares = {k: statistics.median(v) for k, v in part_shares.items()}
                v, s = statistics.median(v_sat), statistics.median(s_sat)
                vm, sm = trimmed_mean(v_sat), trimmed_mean(s_sat)
                rows.append(
                    (
                        batch,
                        policy,
                        mode,
                        own.__name__,
                        v / 1e3,
                        s / 1e3,
                        vm / 1e3,
                        sm / 1e3,
                        v_total / 1e6,
                        s_total / 1e6,
                        v_n,
                        s_n,
                        shares,
                    )
                )
                print(
                    f"B={batch} {policy} {mode}: saturated step {own.__name__} median "
                    f"{v / 1e3:,.1f} us, trimmed mean {vm / 1e3:,.1f} us; StepPlanner median "
                    f"{s / 1e3:,.1f} us ({s / v:.2f}), trimmed mean {sm / 1e3:,.1f} us "
                    f"({sm / vm:.2f}); "
                    f"stream {v_total / 1e6:,.0f} ms in {v_n} steps, StepPlanner "
                    f"{s_total / 1e6:,.0f} ms in {s_n} steps ({s_total / v_total:.2f})",
                    flush=True,
                )
    print()
    print(
        "| B | policy | mode | vLLM's | median µs vLLM / SP | ratio "
        "| trimmed mean µs vLLM / SP | ratio | stream ms vLLM / SP (ratio) | steps vLLM / SP "
        "| plan() | admission | ledger | allocate_slots | output | update_from_output | rest |"
    )
    print(
        "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: |"
    )
    for batch, policy, mode, own, v, s, vm, sm, vt, st, vn, sn, sh in rows:
        parts = " | ".join(
            f"{100 * sh[k]:.1f}%"
            for k in (
                "plan",
                "admission",
                "ledger",
                "allocate",
                "output",
                "update_from_output",
                "rest of schedule()",
            )
        )
        print(
            f"| {batch} | {policy.upper()} | {mode} | `{own}` | {v:,.1f} / {s:,.1f} | "
            f"{s / v:.2f} | {vm:,.1f} / {sm:,.1f} | {sm / vm:.2f} | {vt:,.0f} / {st:,.0f} "
            f"({st / vt:.2f}) | {vn} / {sn} | {parts} |"
        )


if __name__ == "__main__":
    main()
