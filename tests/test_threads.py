"""The thread-safety contract of docs/threading.md, tested under as much overlap as we can make.

- Separate planners (both implementations): each thread always gets exactly its own plan.
- One compiled planner shared by many threads: calls are serialised on the planner's StepPlan (a
  critical section on free-threaded CPython, the GIL elsewhere), so memory is never corrupted and
  every ``copy()``/``to_dict()``/``apply_to()`` sees one whole plan -- but which caller's plan it
  is, is not guaranteed: the threads share the one returned object. Every observation must equal
  the plan of *one* of the ledgers in use, never a mix.

A barrier starts the threads together and a tiny switch interval makes GIL builds interleave
often; on free-threaded builds (CI's 3.14t) the threads truly run at once.
"""

from __future__ import annotations

import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import stepplanner as sp

THREADS = 8
ROUNDS = 300
B, S_IN, P = 16, 256, 16


@pytest.fixture(autouse=True)
def _interleave_often() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_together(target: Callable[[int], None], n: int = THREADS) -> None:
    """Run ``target(k)`` for k in range(n) on n threads released by one barrier; re-raise
    failures."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            barrier.wait()
            target(k)
        except BaseException as exc:  # noqa: BLE001 - reported in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def make_planner(core: Any) -> Any:
    limits = sp.StepPlannerLimits(B, S_IN, P)
    options = sp.SchedulingOptions(
        ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED,
        scheduling_policy=sp.SchedulingPolicy.PRIORITY,
        preemption=sp.PreemptionMode.PAUSE,
        max_pause_steps=2,
    )
    return core.StepPlanner(sp.resolve_scheduling_policy(options, limits), limits)


def make_ledger(seed: int, count: int) -> np.ndarray:
    """A valid ledger of ``count`` rows: mixed priorities, prompts in flight, decoders, pauses."""
    rng = np.random.default_rng(seed)
    rows = np.zeros(count, dtype=sp.RESIDENT_DTYPE)
    for i in range(count):
        decoding = bool(rng.integers(0, 2))
        prompt_length = int(rng.integers(1, S_IN + 1))
        committed = (
            int(rng.integers(prompt_length, prompt_length + 200))
            if decoding
            else int(rng.integers(0, prompt_length))
        )
        rows[i] = (
            int(rng.integers(0, 4)),
            1000 * seed + i,
            prompt_length,
            committed,
            decoding,
            int(rng.integers(0, 4)),
        )
    return rows


def as_objects(core: Any, ledger: np.ndarray) -> list[Any]:
    return [
        core.ResidentState(*(row.item() if hasattr(row, "item") else row))
        for row in ledger.tolist()
    ]


def ledgers_with_distinct_plans(core: Any) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """One ledger per thread (sizes 9..16) and its plan from a planner of its own."""
    ledgers = [make_ledger(seed, 9 + seed % 8) for seed in range(THREADS)]
    expected = [make_planner(core).plan(ledger).to_dict() for ledger in ledgers]
    # A mix of two plans must be distinguishable from both: no two expected plans may be equal.
    assert all(a != b for i, a in enumerate(expected) for b in expected[i + 1 :])
    assert any(plan["paused"] for plan in expected), "the ledgers should exercise pausing"
    return ledgers, expected


# --- separate planners: exactly one's own plan, on both implementations ------------------------


def test_separate_planners_always_get_their_own_plan(core: Any) -> None:
    ledgers, expected = ledgers_with_distinct_plans(core)
    planners = [make_planner(core) for _ in range(THREADS)]

    def work(k: int) -> None:
        residents = ledgers[k] if k % 2 else as_objects(core, ledgers[k])
        for _ in range(ROUNDS // 3):
            plan = planners[k].plan(residents)
            assert plan.to_dict() == expected[k]
            assert [tuple(s) for s in plan.sequences] == [
                (
                    s["resident"],
                    sp.SequenceWork[s["work"]],
                    s["past_length"],
                    s["query_length"],
                    s["select_last_token_logits"],
                )
                for s in expected[k]["sequences"]
            ]

    run_together(work)


def test_separate_planners_serving_loops_match_a_sequential_run(core: Any) -> None:
    """plan -> apply_to for many steps per thread ends where the same loop run alone ends."""
    ledgers, _ = ledgers_with_distinct_plans(core)

    def serve(ledger: np.ndarray, steps: int = 40) -> np.ndarray:
        planner, ledger = make_planner(core), ledger.copy()
        for _ in range(steps):
            planner.plan(ledger).apply_to(ledger)
        return ledger

    alone = [serve(ledger) for ledger in ledgers]
    together: list[np.ndarray | None] = [None] * THREADS

    def work(k: int) -> None:
        together[k] = serve(ledgers[k])

    run_together(work)
    for k in range(THREADS):
        assert together[k] is not None
        assert together[k].tolist() == alone[k].tolist(), f"thread {k} diverged"


# --- one shared compiled planner: serialised, never torn ----------------------------------------


def test_shared_planner_copies_are_always_one_whole_plan(compiled: Any) -> None:
    ledgers, expected = ledgers_with_distinct_plans(compiled)
    planner = make_planner(compiled)
    the_plan = planner.plan(ledgers[0])
    seen_own = [0] * THREADS

    def work(k: int) -> None:
        residents = ledgers[k] if k % 2 else as_objects(compiled, ledgers[k])
        for _ in range(ROUNDS):
            plan = planner.plan(residents)
            assert plan is the_plan  # one plan per planner, shared by every caller
            kept = plan.copy().to_dict()  # copy() is atomic; the copy is then ours alone
            assert kept in expected, f"torn plan from copy(): {kept}"
            seen_own[k] += kept == expected[k]

    run_together(work)
    # Not a guarantee per thread, but across all threads someone must have kept their own plan.
    assert sum(seen_own) > 0


def test_shared_plan_to_dict_is_one_whole_plan(compiled: Any) -> None:
    """to_dict() on the shared plan, concurrently with plan(): one whole plan, never a mix.

    Regression: to_dict() once converted the live buffers with Python code, during which the GIL
    switched threads and another plan() rewrote them (13 sequences with num_prefill=3,
    num_decode=3). It now converts an atomic copy.
    """
    ledgers, expected = ledgers_with_distinct_plans(compiled)
    planner = make_planner(compiled)

    def work(k: int) -> None:
        for _ in range(ROUNDS):
            now = planner.plan(ledgers[k]).to_dict()
            assert now in expected, f"torn plan from to_dict(): {now}"

    run_together(work)


def test_shared_plan_apply_to_during_planning_applies_one_whole_plan(compiled: Any) -> None:
    """apply_to() on the shared plan while another thread re-plans: one plan's step, not a mix."""
    first, second = make_ledger(101, B), make_ledger(202, B)
    planner = make_planner(compiled)
    plan_a, plan_b = planner.plan(first).copy(), planner.plan(second).copy()
    assert plan_a != plan_b
    base = make_ledger(303, B)
    after_a, after_b = base.copy(), base.copy()
    plan_a.apply_to(after_a)
    plan_b.apply_to(after_b)
    allowed = [after_a.tolist(), after_b.tolist()]
    assert allowed[0] != allowed[1]
    shared = planner.plan(first)
    stop = threading.Event()

    def work(k: int) -> None:
        if k == 0:
            while not stop.is_set():
                planner.plan(first)
                planner.plan(second)
            return
        try:
            for _ in range(ROUNDS):
                target = base.copy()
                shared.apply_to(target)
                assert target.tolist() in allowed, "apply_to mixed two plans"
                rows = as_objects(compiled, base)
                shared.apply_to(rows)
                got = [list(r.__reduce__()[1]) for r in rows]
                assert got in [[list(row) for row in a] for a in allowed], "mixed (objects)"
        finally:
            stop.set()

    run_together(work, n=4)


def test_one_kept_plan_applied_by_many_threads_gives_the_same_ledger(compiled: Any) -> None:
    ledger = make_ledger(7, B)
    kept = make_planner(compiled).plan(ledger).copy()
    want = ledger.copy()
    kept.apply_to(want)
    results: list[list[Any]] = [[] for _ in range(THREADS)]

    def work(k: int) -> None:
        for _ in range(ROUNDS // 3):
            mine = ledger.copy()
            kept.apply_to(mine)
            results[k].append(mine.tolist())

    run_together(work)
    assert all(r == want.tolist() for rs in results for r in rs)


# --- free-threaded CPython ---------------------------------------------------------------------


@pytest.mark.skipif(
    not sysconfig.get_config_var("Py_GIL_DISABLED"),
    reason="only a free-threaded CPython (3.14t) can keep the GIL off",
)
def test_importing_stepplanner_keeps_the_gil_disabled() -> None:
    # The compiled module declares Py_mod_gil_not_used (freethreading_compatible in setup.py); a
    # module without it would make CPython re-enable the GIL at import, with a warning.
    import stepplanner._core  # noqa: F401

    assert not sys._is_gil_enabled()  # type: ignore[attr-defined]
