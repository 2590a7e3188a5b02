"""plan() per scenario and batch size: compiled array path, compiled list path, pure-Python
reference, and the kernel alone in a C loop, grouped side by side per scenario and B.

Setup (ledger, planner, first plan) happens outside the timed call. The reference is slow, so
it runs few rounds. Every row is one plan: ``test_c_loop`` times its kernel calls looped in C
and reports their mean per round through ``KernelClock``; ``table.py`` turns the saved JSON into
the docs' table and ratios.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepplanner import _core
from stepplanner import _core_py as _reference
from stepplanner.bench import planner as bench
from stepplanner.testing import as_resident_array, as_resident_states

BATCHES = bench.BATCH_SIZES
SCENARIOS = sorted(bench.SCENARIOS)
C_LOOP_ITERATIONS = 100

# Rounds for the reference: enough for a median, few enough to keep the run to minutes.
REFERENCE_ROUNDS = {8: 20, 64: 10, 256: 5, 1024: 3}


def _group(scenario: str, batch: int) -> str:
    return f"{scenario} B={batch:>4}"


@pytest.fixture(params=BATCHES, ids=lambda b: f"B{b}")
def batch(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture(params=SCENARIOS)
def scenario(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("impl", ["array", "list"])
def test_compiled(benchmark, scenario: str, batch: int, impl: str) -> None:
    rows = bench.steady_ledger(batch)
    planner = bench.make_planner(_core, scenario, batch)
    ledger = (
        as_resident_array(rows)
        if impl == "array"
        else as_resident_states(rows, _core.ResidentState)
    )
    planner.plan(ledger)
    benchmark.group = _group(scenario, batch)
    plan = benchmark(planner.plan, ledger)
    assert plan.num_residents == batch


def test_drafts(benchmark, scenario: str, batch: int) -> None:
    """The array path with speculative decoding's input: 3 drafts proposed per decoding row
    (SPEC §8), beside test_compiled's rows without any."""
    rows = bench.steady_ledger(batch)
    planner = bench.make_planner(_core, scenario, batch)
    ledger = as_resident_array(rows)
    drafts = np.array([3 if r[4] else 0 for r in rows], dtype=np.int32)
    planner.plan(ledger, drafts=drafts)
    benchmark.group = _group(scenario, batch)
    plan = benchmark(planner.plan, ledger, None, None, drafts)
    assert plan.num_residents == batch


def test_reference(benchmark, scenario: str, batch: int) -> None:
    rows = bench.steady_ledger(batch)
    planner = bench.make_planner(_reference, scenario, batch)
    ledger = as_resident_states(rows, _reference.ResidentState)
    benchmark.group = _group(scenario, batch)
    plan = benchmark.pedantic(
        planner.plan, (ledger,), rounds=REFERENCE_ROUNDS[batch], iterations=1, warmup_rounds=1
    )
    assert plan.num_residents == batch


# apply_to advances the rows it is timed on: a chunk row commits up to 512 tokens a call, so a
# fixed count of calls keeps committed far from int32's end (pytest-benchmark's own calibration
# could reach millions of calls on B=8).
APPLY_ROUNDS, APPLY_ITERATIONS = 200, 50


@pytest.mark.parametrize("impl", ["array", "list"])
def test_apply_to(benchmark, batch: int, impl: str) -> None:
    """StepPlan.apply_to of the mixed plan over the rows it was made from (compiled): its rows
    are range-checked, never searched for a repeated resident (no compiled plan holds one)."""
    rows = bench.steady_ledger(batch)
    ledger = (
        as_resident_array(rows)
        if impl == "array"
        else as_resident_states(rows, _core.ResidentState)
    )
    plan = bench.make_planner(_core, "mixed", batch).plan(ledger).copy()
    benchmark.group = f"apply_to B={batch:>4}"
    benchmark.pedantic(
        plan.apply_to, (ledger,), rounds=APPLY_ROUNDS, iterations=APPLY_ITERATIONS, warmup_rounds=2
    )
    assert plan.num_residents == batch


class KernelClock:
    """The C loop's own clock as a pytest-benchmark timer, so that its row is one plan.

    ``run`` times ``C_LOOP_ITERATIONS`` kernel calls looped in C (short enough to fit in one
    scheduler time slice of a busy machine) and advances this clock by their mean; read around
    a round, the clock gives the round one plan's duration, measured in C with no Python call in
    it. (With the wall clock the row would be the whole batch of calls, 100 times a plan.)
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.per_call_ns: list[float] = []

    def __call__(self) -> float:
        return self.now

    def run(self, planner: object, ledger: object) -> None:
        ns = _core.time_kernel_loop(planner, ledger, None, C_LOOP_ITERATIONS)
        self.per_call_ns.append(ns)
        self.now += ns * 1e-9


KERNEL_CLOCK = KernelClock()
C_LOOP_ROUNDS = 200


@pytest.mark.benchmark(timer=KERNEL_CLOCK)
def test_c_loop(benchmark, scenario: str, batch: int) -> None:
    rows = bench.steady_ledger(batch)
    planner = bench.make_planner(_core, scenario, batch)
    ledger = as_resident_array(rows)
    benchmark.group = _group(scenario, batch)
    benchmark.extra_info["kernel_calls_per_round"] = C_LOOP_ITERATIONS
    KERNEL_CLOCK.per_call_ns.clear()
    benchmark.pedantic(KERNEL_CLOCK.run, (planner, ledger), rounds=C_LOOP_ROUNDS, warmup_rounds=5)
    benchmark.extra_info["per_call_ns"] = KERNEL_CLOCK.per_call_ns[-C_LOOP_ROUNDS:]
    assert min(KERNEL_CLOCK.per_call_ns) > 0


def test_shuffled(benchmark, batch: int) -> None:
    """priority_pause over a ledger whose rows come in a new order every call (a full sort)."""
    rows = bench.steady_ledger(batch)
    planner = bench.make_planner(_core, "priority_pause", batch)
    ledgers = iter(bench.shuffled_ledgers(rows, variants=64) * 40)
    planner.plan(next(ledgers))

    def setup():
        return (next(ledgers),), {}

    benchmark.group = f"shuffled B={batch:>4}"
    benchmark.pedantic(planner.plan, setup=setup, rounds=2000, warmup_rounds=10)
