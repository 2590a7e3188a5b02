"""The whole host step of a serving loop (``ledger.step``: apply with the sampler's mask, count
tokens, retire, admit, plan) against ``plan()`` alone over the same steady ledger, per B; grouped
side by side. Every round is one step. Cases come from ``stepplanner.bench.loop``.
"""

from __future__ import annotations

import pytest

from stepplanner.bench import loop as bench_loop


@pytest.fixture(params=bench_loop.LOOP_BATCH_SIZES, ids=lambda b: f"B{b}")
def batch(request: pytest.FixtureRequest) -> int:
    return request.param


def test_fused_step(benchmark, batch: int) -> None:
    run = bench_loop.fused_batch(batch, calls=1)
    benchmark.group = f"loop B={batch:>4}"
    benchmark.pedantic(run, rounds=2000, warmup_rounds=20)


def test_fused_step_paged(benchmark, batch: int) -> None:
    """The fused step of a ledger that owns a page table (reservations, pages moved on retire)."""
    run = bench_loop.fused_batch(batch, calls=1, paged=True)
    benchmark.group = f"loop B={batch:>4}"
    benchmark.pedantic(run, rounds=2000, warmup_rounds=20)


def test_plan_alone(benchmark, batch: int) -> None:
    run = bench_loop.plan_alone_batch(batch, calls=1)
    benchmark.group = f"loop B={batch:>4}"
    benchmark.pedantic(run, rounds=2000, warmup_rounds=20)


@pytest.mark.parametrize("policy", ["priority", "deadline"])
@pytest.mark.parametrize("deadline_batch", bench_loop.DEADLINE_BATCH_SIZES, ids=lambda b: f"B{b}")
def test_fused_step_by_policy(benchmark, deadline_batch: int, policy: str) -> None:
    """Static PRIORITY+PAUSE and DEADLINE+PAUSE on the bench's synthetic stream (objectives per
    class, the clock advancing a modelled step per call): a regression guard for each step. No
    objective can be met on this stream, so it is not the policies' comparison: ``python -m
    stepplanner.bench --deadline-cost`` is (the simulator's workload, docs/scheduling.md)."""
    run = bench_loop.fused_batch(deadline_batch, calls=1, policy=policy)
    benchmark.group = f"policy B={deadline_batch:>4}"
    benchmark.pedantic(run, rounds=2000, warmup_rounds=20)


@pytest.mark.parametrize("adapters", [4, 8, 32])
def test_fused_step_lora(benchmark, adapters: int) -> None:
    """LoRA admission (docs/performance.md): requests on ``adapters`` adapters and the base
    model, ``max_loras=4``. With 4 every request can join; with 8 and 32 the requests of the
    adapters without a slot are passed over (parked until a slot drains)."""
    run = bench_loop.fused_batch(256, calls=1, adapters=adapters)
    benchmark.group = "loop B= 256"
    benchmark.pedantic(run, rounds=2000, warmup_rounds=20)
