"""A ledger fed from other threads (docs/threading.md): ``submit`` and ``cancel`` from any thread
while the serving loop steps, on both ledgers.

A runtime takes requests on HTTP handler threads and steps on its loop thread. ``submit`` and
``cancel`` wait for the call under way (never refused for it, never lost, never reported twice)
and raise their own errors (duplicate id, ``QueueFullError``) to the thread that called them; the
loop's calls are never refused because of them; every other call stays the loop's alone, and
re-entry from code the ledger runs is refused rather than deadlocking.

The switch interval is shrunk to 1 us so GIL builds interleave as often as they can.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import numpy as np
import pytest

from stepplanner import SchedulingOptions, StepPlannerLimits, resolve_scheduling_policy
from stepplanner._errors import QueueFullError, StepPlannerRuntimeError

LIMITS = StepPlannerLimits(max_batch_size=8, max_input_length=64, kv_page_size=16)
REENTERED = "Ledger re-entered"
GONE = "is not waiting or resident"


@pytest.fixture(autouse=True)
def _switch_often():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.fixture
def make(ledger_impl):
    """(ledger, planner) of one implementation, FCFS over ``limits``."""

    def build(limits=LIMITS, **kw):
        policy = resolve_scheduling_policy(SchedulingOptions(), limits)
        return ledger_impl.Ledger(limits, policy, **kw), ledger_impl.StepPlanner(policy, limits)

    return build


def _emitting(plan) -> np.ndarray:
    return np.asarray(plan.as_array()["select_last_token_logits"], dtype=bool)


def _run(target, *args) -> tuple[threading.Thread, dict]:
    """Start ``target(*args)`` on a thread; its value or exception lands in the dict."""
    out: dict = {}

    def body() -> None:
        try:
            out["value"] = target(*args)
        except BaseException as exc:  # noqa: BLE001 - asserted by the caller
            out["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    return thread, out


def test_submitters_and_a_canceller_beside_the_loop_lose_nothing(make) -> None:
    # Three submitters (some ids as numpy ints: the conversion path that runs caller code), a
    # canceller and the loop, all at once, with a queue small enough to push back. Every request
    # must end exactly once: finished (reported by one step) or cancelled, never both.
    ledger, planner = make(max_waiting=12)
    submitters, per_thread = 3, 120
    submitted: list[int] = []
    cancelled: list[int] = []
    refused: list[int] = []  # cancels that came after the request had finished
    errors: list[BaseException] = []
    pushed_back = [0]
    start = threading.Barrier(submitters + 2)
    stop = threading.Event()  # the loop failed: nobody drains the queue any more
    submitting = [submitters]
    count_lock = threading.Lock()

    def submitter(t: int) -> None:
        rng = random.Random(t)
        try:
            start.wait()
            for k in range(per_thread):
                rid = 1000 * t + k
                arg = np.int64(rid) if k % 4 == 0 else rid
                while True:
                    try:
                        ledger.submit(
                            arg,
                            rng.randint(1, 64),
                            rng.randint(-1, 2),
                            max_new_tokens=rng.randint(1, 4),
                        )
                        break
                    except QueueFullError:  # backpressure: the HTTP 429 path; try again
                        pushed_back[0] += 1
                        if stop.is_set():
                            return
                submitted.append(rid)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            with count_lock:
                submitting[0] -= 1

    def canceller() -> None:
        rng = random.Random(7)
        seen = 0
        try:
            start.wait()
            while (submitting[0] or seen < len(submitted)) and not stop.is_set():
                if seen == len(submitted):
                    time.sleep(0)
                    continue
                rid = submitted[seen]
                seen += 1
                if rng.random() < 0.7:
                    continue
                for _ in range(rng.randint(0, 50)):  # let it reach the queue, a row or its end
                    pass
                try:
                    ledger.cancel(rid)
                    cancelled.append(rid)
                except ValueError as exc:
                    assert GONE in str(exc)
                    refused.append(rid)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(submitters)]
    threads.append(threading.Thread(target=canceller))
    for thread in threads:
        thread.start()
    rng = np.random.default_rng(0)
    finished: list[int] = []
    start.wait()
    try:
        plan = ledger.step(planner)
        while any(t.is_alive() for t in threads) or ledger.count or ledger.waiting:
            mask = _emitting(plan) & (rng.random(len(plan.sequences)) < 0.2)
            plan = ledger.step(planner, mask)
            finished.extend(ledger.finished_ids.tolist())
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    assert not errors
    assert len(submitted) == len(set(submitted)) == submitters * per_thread
    assert len(finished) == len(set(finished))  # none finished twice
    assert not set(finished) & set(cancelled)  # none both cancelled and finished
    assert set(finished) | set(cancelled) == set(submitted)  # none lost
    assert set(refused) <= set(finished)  # refused only once it had finished
    assert plan.num_residents == 0


def test_a_submit_from_another_thread_waits_for_the_step_under_way(make) -> None:
    ledger, planner = make(max_waiting=2)
    ledger.submit(1, 8)
    seen: dict = {}

    class Watched:
        """The loop's planner, doing what other threads would do while it plans."""

        limits = planner.limits

        def plan(self, residents, count=None, reasons=None):
            if not seen:
                guest, seen["guest"] = _run(ledger.submit, 2, 8)
                guest.join(0.2)
                seen["waited"] = guest.is_alive()  # it waits for this step
                seen["guest_thread"] = guest
                for name, call in (
                    ("duplicate", lambda: ledger.submit(1, 8)),
                    ("admit", ledger.admit),
                ):
                    thread, seen[name] = _run(call)
                    if name == "duplicate":
                        thread.join(0.2)
                        seen["duplicate_thread"] = thread
                    else:
                        thread.join()
                try:  # a submit from this thread re-enters the step: refused, not a deadlock
                    ledger.submit(3, 8)
                except StepPlannerRuntimeError as exc:
                    seen["same_thread"] = str(exc)
            return planner.plan(residents, count, reasons)

    plan = ledger.step(Watched())
    seen["guest_thread"].join()
    seen["duplicate_thread"].join()
    assert seen["waited"] and seen["guest"] == {"value": 1}  # arrival stamp 1, after the step
    assert isinstance(seen["duplicate"]["error"], ValueError)  # to the submitting thread
    assert "request_id=1" in str(seen["duplicate"]["error"])
    assert str(seen["admit"]["error"]).startswith(REENTERED)  # the loop's calls are its own
    assert seen["same_thread"].startswith(REENTERED)
    assert plan.num_residents == 1 and ledger.waiting_ids() == [2]


def test_queue_full_reaches_the_submitting_thread(make) -> None:
    ledger, planner = make(StepPlannerLimits(1, 64, 16), max_waiting=1)
    ledger.submit(1, 8)
    plan = ledger.step(planner)  # 1 holds the one row
    ledger.submit(2, 8)  # and 2 the one place in the queue
    out: dict = {}

    class Watched:
        limits = planner.limits

        def plan(self, residents, count=None, reasons=None):
            out["thread"], out["submit"] = _run(ledger.submit, 3, 8)
            return planner.plan(residents, count, reasons)

    ledger.step(Watched(), np.zeros(len(plan.sequences), dtype=bool))
    out["thread"].join()
    assert isinstance(out["submit"]["error"], QueueFullError)
    assert ledger.waiting_ids() == [2] and ledger.request_ids.tolist() == [1]


def test_the_loop_waits_for_a_submit_that_runs_caller_code(make) -> None:
    # A submit converting an argument (numpy ints, or any __index__) holds the lock meanwhile;
    # the loop's step must wait for it, not be refused because of it.
    ledger, planner = make()
    inside, go = threading.Event(), threading.Event()

    class SlowLength:
        def __index__(self) -> int:
            inside.set()
            go.wait(10)
            return 8

    guest, out = _run(ledger.submit, 5, SlowLength())
    assert inside.wait(10)
    threading.Timer(0.1, go.set).start()
    ledger.step(planner)
    guest.join()
    assert out == {"value": 0} and ledger.admitted_ids.tolist() == [5]


def test_a_resident_cancelled_between_steps_leaves_with_the_pending_plan(make) -> None:
    ledger, planner = make()
    for rid in (1, 2, 3):
        ledger.submit(rid, 8, max_new_tokens=2)
    plan = ledger.step(planner)  # the engine now runs it; another thread cancels 2
    thread, out = _run(ledger.cancel, 2)
    thread.join()
    assert out == {"value": None}
    assert ledger.request_ids.tolist() == [1, 2, 3]  # rows stay as the running plan has them
    with pytest.raises(ValueError, match=f"request_id=2 {GONE}"):
        ledger.cancel(2)  # cancelled once
    with pytest.raises(ValueError, match="request_id=2"):
        ledger.submit(2, 8)  # its id is taken until it has left
    ledger.submit(4, 8, max_new_tokens=1)
    everyone = _emitting(plan)
    plan = ledger.step(planner, everyone)  # the sampler ended every row: 2 included
    assert ledger.finished_ids.tolist() == [1, 3]  # 2 was cancelled, not finished
    assert sorted(ledger.request_ids.tolist()) == [4]
    with pytest.raises(ValueError, match=f"request_id=1 {GONE}"):
        ledger.cancel(1)  # finished: refused as before
    ledger.submit(2, 8)  # the id is free again


@pytest.mark.parametrize("then", ["apply", "admit", "retire_finished", "retire", "retire_rows"])
def test_a_deferred_cancel_leaves_at_the_loops_next_call(make, then) -> None:
    ledger, planner = make()
    for rid in (1, 2, 3, 4):
        ledger.submit(rid, 8, max_new_tokens=1)
    plan = ledger.step(planner)
    ledger.cancel(2)
    assert ledger.count == 4
    {
        "apply": lambda: ledger.apply(plan, retire=False),
        "admit": ledger.admit,
        "retire_finished": ledger.retire_finished,
        "retire": lambda: ledger.retire([4]),
        "retire_rows": lambda: ledger.retire_rows([3]),  # row 3 as the caller saw it: 4
    }[then]()
    left = sorted(ledger.request_ids.tolist())
    assert 2 not in left
    assert (
        left
        == {
            "apply": [1, 3, 4],
            "admit": [1, 3, 4],
            "retire_finished": [1, 3, 4],
            "retire": [1, 3],
            "retire_rows": [1, 3],
        }[then]
    )
    if then == "apply":
        assert ledger.finished_ids.tolist() == [1, 3, 4]  # finished, kept until retired
    assert len(ledger.residents) == ledger.count
