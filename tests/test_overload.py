"""Overload (docs/scheduling.md, "Overload"): what becomes of a request DEADLINE gives up on.

A relegated request waits behind every request that can still make it for at most its wait
(``relegated_wait``; by default its own TTFT objective), then is handed back (``shed_ids``); it
gives its queue place up to a request that can still make it; and the classes below
``never_relegate_below`` (by default the urgent ones, priority < 0) are never relegated. Every
scenario runs on the compiled ledger and on the twin; ``test_deadlines.py`` drives both in
lockstep through random sequences with these options.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import _core, _core_py
from stepplanner.ledger import _ledger, _ledger_py
from stepplanner.ledger._shared import LEVEL_AT_RISK, LEVEL_DUE, LEVEL_RELEGATED, level_of

LIMITS = sp.StepPlannerLimits(max_batch_size=1, max_input_length=256, kv_page_size=16)


def _policy(limits=LIMITS):
    return sp.resolve_scheduling_policy(
        sp.SchedulingOptions(
            scheduling_policy=sp.SchedulingPolicy.DEADLINE,
            preemption=sp.PreemptionMode.PAUSE,
            max_num_tokens=32,
        ),
        limits,
    )


@pytest.fixture(params=["compiled", "python"])
def impl(request):
    return (_ledger, _core) if request.param == "compiled" else (_ledger_py, _core_py)


def make(impl, limits=LIMITS, **kwargs):
    ledger_mod, core_mod = impl
    pol = _policy(limits)
    kwargs.setdefault("max_waiting", 8)
    return (
        ledger_mod.Ledger(limits, pol, step_time=(0.01, 0.0), **kwargs),
        core_mod.StepPlanner(pol, limits),
    )


def busy(ledger, planner, now=0.0):
    """The one row taken by a request with no objectives that never finishes by itself."""
    ledger.submit(100, 16, 5)
    return ledger.step(planner, now=now)


def step(ledger, planner, plan, now):
    return ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=now)


def test_a_relegated_request_waits_its_own_ttft_then_is_handed_back(impl):
    ledger, planner = make(impl)
    plan = busy(ledger, planner)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.05))
    plan = step(ledger, planner, plan, 0.04)
    assert not ledger.relegated_ids.size  # the row is taken, but it can still make it
    plan = step(ledger, planner, plan, 0.06)
    # Past its deadline, though never at the head of an admission: relegated by the sweep.
    assert ledger.relegated_ids.tolist() == [1] and ledger.waiting == 1
    assert ledger.relegated_waiting == 1
    plan = step(ledger, planner, plan, 0.10)
    assert not ledger.shed_ids.size and ledger.waiting_ids() == [1]
    plan = step(ledger, planner, plan, 0.11)  # relegated at 0.06 + its 50 ms objective
    assert ledger.shed_ids.tolist() == [1] and ledger.waiting == 0
    assert ledger.relegated_waiting == 0
    step(ledger, planner, plan, 0.12)
    assert not ledger.shed_ids.size  # reported once
    with pytest.raises(ValueError, match="is not waiting or resident"):
        ledger.cancel(1)  # it left: the id is free


def test_relegated_wait_zero_hands_a_relegated_request_back_in_the_same_call(impl):
    ledger, planner = make(impl, relegated_wait=0)
    plan = busy(ledger, planner)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.05))
    step(ledger, planner, plan, 0.06)
    assert ledger.relegated_ids.tolist() == [1] and ledger.shed_ids.tolist() == [1]
    assert ledger.waiting == 0


def test_a_fixed_relegated_wait_counts_from_relegation(impl):
    ledger, planner = make(impl, relegated_wait=1.0)
    plan = busy(ledger, planner)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.05))
    plan = step(ledger, planner, plan, 0.5)
    assert ledger.relegated_ids.tolist() == [1]
    plan = step(ledger, planner, plan, 1.49)
    assert not ledger.shed_ids.size
    step(ledger, planner, plan, 1.5)
    assert ledger.shed_ids.tolist() == [1]


def test_relegated_requests_are_served_by_when_they_would_be_shed(impl):
    ledger, planner = make(impl, relegated_wait=None)
    plan = busy(ledger, planner)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.05))  # shed at 0.06 + 0.05
    ledger.submit(2, 16, 0, arrival_time=0.0, slo=sp.SLO(0.02))  # shed at 0.06 + 0.02
    plan = step(ledger, planner, plan, 0.06)
    assert ledger.relegated_ids.tolist() == [1, 2]  # in arrival order
    assert ledger.waiting_ids() == [2, 1]
    ledger.cancel(100)  # the row frees: the one closest to being shed is served
    ledger.step(planner, now=0.07)
    assert ledger.request_ids.tolist() == [2]


def test_a_full_queue_sheds_a_relegated_request_for_one_that_can_still_make_it(impl):
    ledger, planner = make(impl, max_waiting=2)
    plan = busy(ledger, planner)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.05))
    ledger.submit(2, 16, 0, arrival_time=0.0, slo=sp.SLO(0.5))
    plan = step(ledger, planner, plan, 0.06)
    assert ledger.relegated_ids.tolist() == [1]
    # A request that would be relegated itself takes no place: refused, nothing changed.
    with pytest.raises(sp.QueueFullError, match="max_waiting=2"):
        ledger.submit(3, 200, 0, arrival_time=0.06, slo=sp.SLO(0.01))
    assert ledger.waiting_ids() == [2, 1]
    ledger.submit(4, 16, 0, arrival_time=0.06, slo=sp.SLO(0.5))  # takes request 1's place
    assert ledger.waiting_ids() == [2, 4] and not ledger.shed_ids.size
    with pytest.raises(sp.QueueFullError):  # no relegated request is left to shed
        ledger.submit(5, 16)
    step(ledger, planner, plan, 0.07)
    assert ledger.shed_ids.tolist() == [1]  # reported by the loop's next call


def test_a_full_queue_of_viable_requests_still_refuses(impl):
    ledger, planner = make(impl, max_waiting=1)
    busy(ledger, planner)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.5))
    with pytest.raises(sp.QueueFullError):
        ledger.submit(2, 16, 0, arrival_time=0.0, slo=sp.SLO(0.5))
    assert ledger.waiting_ids() == [1]


def test_the_urgent_classes_are_never_relegated_by_default(impl):
    limits = sp.StepPlannerLimits(max_batch_size=2, max_input_length=256, kv_page_size=16)
    ledger, planner = make(impl, limits=limits)
    # 200 tokens at 32 a step: 7 steps of 10 ms, 20 ms objective: hopeless, but urgent.
    ledger.submit(1, 200, -1, arrival_time=0.0, slo=sp.SLO(0.02, 0.01))
    ledger.submit(2, 200, 0, arrival_time=0.0, slo=sp.SLO(0.02, 0.01))
    ledger.step(planner, now=0.0)
    assert ledger.relegated_ids.tolist() == [2]
    rows = ledger.request_ids.tolist()
    urgent = ledger.residents[rows.index(1)]
    assert level_of(urgent["priority"]) == LEVEL_AT_RISK  # first among prompts: least slack
    assert level_of(ledger.residents[rows.index(2)]["priority"]) == LEVEL_RELEGATED


def test_a_late_urgent_decode_stays_due(impl):
    ledger, planner = make(impl)
    ledger.submit(1, 16, -1, arrival_time=0.0, slo=sp.SLO(0.1, 0.02), max_new_tokens=10)
    plan = ledger.step(planner, now=0.0)
    plan = step(ledger, planner, plan, 0.05)
    plan = step(ledger, planner, plan, 0.2)  # token 1 was due at 0.12: late
    assert not ledger.relegated_ids.size
    assert level_of(ledger.residents[0]["priority"]) == LEVEL_DUE


def test_never_relegate_below_moves_the_floor(impl):
    ledger, planner = make(impl, never_relegate_below=-100)  # nothing is protected
    plan = busy(ledger, planner)
    ledger.submit(1, 16, -1, arrival_time=0.0, slo=sp.SLO(0.05))
    step(ledger, planner, plan, 0.06)
    assert ledger.relegated_ids.tolist() == [1]
    ledger, planner = make(impl, never_relegate_below=1)  # class 0 is protected too
    plan = busy(ledger, planner)
    ledger.submit(1, 16, 0, arrival_time=0.0, slo=sp.SLO(0.05))
    step(ledger, planner, plan, 0.06)
    assert not ledger.relegated_ids.size and ledger.waiting_ids() == [1]


def test_a_lower_class_behind_a_busier_one_is_relegated_by_its_deadline(impl):
    """Admission takes class 0 before class 1 and tests only its head: the sweep finds the
    class-1 request whose deadline passed while class 0 kept the rows."""
    limits = sp.StepPlannerLimits(max_batch_size=1, max_input_length=256, kv_page_size=16)
    ledger, planner = make(impl, limits=limits, max_waiting=64)
    ledger.submit(1, 16, 1, arrival_time=0.0, slo=sp.SLO(0.3))
    plan = None
    rid, now = 10, 0.0
    for _ in range(40):  # a class-0 request of one token finishes every step
        ledger.submit(rid, 16, 0, arrival_time=now, slo=sp.SLO(5.0), max_new_tokens=1)
        rid += 1
        plan = ledger.step(planner, now=now) if plan is None else step(ledger, planner, plan, now)
        if 1 in ledger.relegated_ids.tolist():
            break
        now += 0.01
    assert 1 in ledger.relegated_ids.tolist() and 0.3 <= now <= 0.31


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"relegated_wait": -1.0}, ValueError, r"relegated_wait=-1.0 is out of range"),
        ({"relegated_wait": math.nan}, ValueError, r"relegated_wait=nan is out of range"),
        ({"relegated_wait": math.inf}, ValueError, r"relegated_wait=inf is out of range"),
        ({"relegated_wait": 10**400}, ValueError, r"relegated_wait=1000.* is out of range"),
        ({"relegated_wait": "1"}, TypeError, r"relegated_wait must be a number of seconds"),
        ({"relegated_wait": True}, TypeError, r"relegated_wait must be a number of seconds"),
        ({"never_relegate_below": 2**40}, OverflowError, r"never_relegate_below"),
        ({"never_relegate_below": "0"}, TypeError, r"never_relegate_below"),
    ],
)
def test_bad_relegation_options_are_refused_alike(kwargs, error, match):
    messages = []
    for ledger_mod in (_ledger, _ledger_py):
        for cls in (ledger_mod.Ledger, ledger_mod.Ranker):
            with pytest.raises(error, match=match) as info:
                cls(LIMITS, _policy(), **kwargs)
            messages.append((type(info.value), str(info.value)))
    assert len(set(messages)) == 1


def test_the_ranker_applies_the_same_floor_and_wait(impl):
    ledger_mod, _ = impl
    limits = sp.StepPlannerLimits(max_batch_size=2, max_input_length=256, kv_page_size=16)
    ranker = ledger_mod.Ranker(limits, _policy(limits), step_time=(0.01, 0.0))
    assert not ranker.admits(200, 0.02, 0.0)
    assert not ranker.admits(200, 0.02, 0.0, priority=0)
    assert ranker.admits(200, 0.02, 0.0, priority=-1)  # urgent: never relegated
    assert ranker.relegated_wait(0.25) == 0.25
    fixed = ledger_mod.Ranker(
        limits, _policy(limits), step_time=(0.01, 0.0), relegated_wait=2.0, never_relegate_below=-9
    )
    assert fixed.relegated_wait(0.25) == 2.0
    assert not fixed.admits(200, 0.02, 0.0, priority=-1)
    with pytest.raises(TypeError, match="ttft must be a number of seconds"):
        ranker.relegated_wait("x")
    rows = np.zeros(2, dtype=sp.RESIDENT_DTYPE)
    rows["prompt_length"] = 200
    lost = ranker.rank(
        rows,
        np.array([0.02, 0.02]),
        np.zeros(2),
        np.zeros(2, dtype=np.int64),
        np.arange(2, dtype=np.uint64),
        np.zeros(2, dtype=np.uint8),
        0.0,
        classes=np.array([-1, 0], dtype=np.int32),
    )
    assert lost.tolist() == [1]
    assert level_of(rows["priority"][0]) == LEVEL_AT_RISK


# --- the simulator's serving front ------------------------------------------------------------

SMALL = sp.StepPlannerLimits(
    max_batch_size=8, max_input_length=4096, kv_page_size=16, max_step_tokens=256
)
SMALL_STEP = sp.LatencyModel(a=0.008, b=0.000025)
SMALL_CLASSES = {
    -1: sp.SLO(0.2, 0.05),
    0: sp.SLO(0.25, 0.1),
    1: sp.SLO(2.0, 0.25),
}


def _deadline_run(rate, requests=600, max_prompt=4096, **queue):
    from stepplanner.sim.simulator import ServingQueue, simulate
    from stepplanner.sim.workloads import synthetic

    workload = synthetic(requests, rate, max_prompt=max_prompt, slo_classes=SMALL_CLASSES)
    options = sp.SchedulingOptions(
        scheduling_policy=sp.SchedulingPolicy.DEADLINE,
        preemption=sp.PreemptionMode.PAUSE,
        max_pause_steps=64,
    )
    return simulate(workload, SMALL, options, SMALL_STEP, queue=ServingQueue(**queue))


def test_an_open_ended_overload_keeps_every_wait_bounded_and_places_for_viable_requests():
    """Arrivals well past what the engine serves, a bounded queue: every request relegated in
    the queue is served or handed back within its own TTFT objective, none is left waiting,
    and no 429 is given while a relegated request holds a place (the prompts are short
    enough that every arrival could make its first token)."""
    result = _deadline_run(12.0, max_prompt=512, max_waiting=8)
    q = result.report()["queue"]
    assert q["shed"] > 50 and q["relegated_waiting"] >= q["shed"]
    assert q["queue_full"] > 50
    assert q["longest_relegated_wait_s"] <= 2.0 + 0.05  # the batch class's 2 s, and a step
    assert q["unanswered_relegated"] == 0
    assert q["queue_full"] > 0 and q["queue_full_beside_relegated"] == 0
    assert result.refused.sum() == q["queue_full"]
    shed = ~np.isnan(result.shed_time)
    assert not np.any(shed & ~result.relegated)  # only relegated requests are handed back
    assert np.all(np.isnan(result.finish_time[shed]))  # and they are not served
    attainment = result.attainment()["classes"]["all"]
    assert attainment["missed"]["refused"] == q["queue_full"]  # each 429 a miss


def test_handing_back_at_once_leaves_no_relegated_request_waiting():
    result = _deadline_run(8.0, max_prompt=512, max_waiting=32, relegated_wait=0)
    q = result.report()["queue"]
    assert q["shed"] > 50 and q["longest_relegated_wait_s"] == 0.0


@pytest.mark.parametrize(
    ("queue", "error", "match"),
    [
        ({"max_waiting": 0}, ValueError, r"max_waiting=0 is out of range"),
        ({"max_waiting": True}, ValueError, r"max_waiting=True is out of range"),
        ({"relegated_wait": -1}, ValueError, r"relegated_wait=-1 is out of range"),
        ({"never_relegate_below": "x"}, TypeError, r"never_relegate_below"),
    ],
)
def test_bad_serving_queues_are_refused(queue, error, match):
    from stepplanner.sim.simulator import ServingQueue

    with pytest.raises(error, match=match):
        ServingQueue(**queue)
