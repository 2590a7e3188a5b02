"""The ledger's deadline policies (docs/scheduling.md): SLOs on requests, EDF and DEADLINE.

The planner plans both as PRIORITY (SPEC §7); what is tested here is what the ledger writes into
the rows before each plan, its queue order, relegation, and the errors. Every scenario runs on
the compiled ledger and on the twin (``ledger_impl``), and a hypothesis test drives both in
lockstep through random submit/cancel/admit/step/rank sequences with a clock, comparing every
row, plan, view and error message.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import stepplanner as sp
from stepplanner import _core, _core_py
from stepplanner.kv import _kv as sp_kv_compiled
from stepplanner.kv import _kv_py as sp_kv_python
from stepplanner.ledger import _ledger, _ledger_py
from stepplanner.ledger._shared import (
    KEY_NONE,
    KEY_ZERO,
    LEVEL_AT_RISK,
    LEVEL_DUE,
    LEVEL_RELEGATED,
    LEVEL_SLACK,
    LEVEL_STRIDE,
    level_of,
)

LIMITS = sp.StepPlannerLimits(max_batch_size=4, max_input_length=256, kv_page_size=16)
STEP = (0.01, 0.0)  # every step is estimated at 10 ms


def policy(name: str, pause: bool = True, limits: sp.StepPlannerLimits = LIMITS, **options):
    return sp.resolve_scheduling_policy(
        sp.SchedulingOptions(
            scheduling_policy=sp.SchedulingPolicy[name],
            preemption=sp.PreemptionMode.PAUSE if pause else sp.PreemptionMode.NONE,
            **options,
        ),
        limits,
    )


@pytest.fixture(params=["compiled", "python"])
def impl(request):
    """(ledger module, planner module) of one implementation."""
    return (_ledger, _core) if request.param == "compiled" else (_ledger_py, _core_py)


def make(impl, name="DEADLINE", pause=True, step_time=STEP, **kwargs):
    ledger_mod, core_mod = impl
    pol = policy(name, pause)
    return (
        ledger_mod.Ledger(LIMITS, pol, step_time=step_time, max_waiting=64, **kwargs),
        core_mod.StepPlanner(pol, LIMITS),
    )


def row_of(ledger, rid):
    return ledger.residents[int(np.flatnonzero(ledger.request_ids == rid)[0])]


def level(ledger, rid):
    """DEADLINE's level of a resident (its priority is level x LEVEL_STRIDE + its class)."""
    return level_of(row_of(ledger, rid)["priority"])


# --- SLO values ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, -0.5, math.nan, math.inf, -math.inf])
def test_slo_refuses_values_that_are_no_objective(bad):
    with pytest.raises(ValueError, match=r"ttft=.* out of range; allowed: a finite number"):
        sp.SLO(bad)
    with pytest.raises(ValueError, match=r"tpot=.* out of range"):
        sp.SLO(0.25, bad)


@pytest.mark.parametrize("bad", [10**400, -(10**400), 10**5000], ids=["1e400", "-1e400", "1e5000"])
def test_slo_refuses_an_int_beyond_a_float_naming_the_field(bad):
    # float() of it raised a bare OverflowError naming no field (the fourth review).
    shown = "<an int of 16610 bits>" if bad == 10**5000 else str(bad)
    for call, field in ((lambda: sp.SLO(bad), "ttft"), (lambda: sp.SLO(0.25, bad), "tpot")):
        with pytest.raises(ValueError) as info:
            call()
        assert isinstance(info.value, sp.StepPlannerError)
        assert not isinstance(info.value, OverflowError)
        assert str(info.value) == (
            f"{field}={shown} is out of range; allowed: a finite number of seconds > 0"
        )


@pytest.mark.parametrize("bad", ["250ms", True, None, [1]])
def test_slo_refuses_non_numbers(bad):
    with pytest.raises(TypeError, match="ttft must be a number of seconds"):
        sp.SLO(bad)


def test_slo_holds_seconds_as_floats():
    assert sp.SLO(1, 2) == sp.SLO(1.0, 2.0) and sp.SLO(0.25).tpot is None


@pytest.mark.parametrize(
    ("classes", "error", "match"),
    [
        ([sp.SLO(1.0)], TypeError, "slo_classes must be a mapping"),
        ({"0": sp.SLO(1.0)}, ValueError, "slo_classes key '0' is not a priority"),
        ({2**31: sp.SLO(1.0)}, ValueError, "is not a priority; allowed: an int32"),
        ({0: (0.25, 0.1)}, TypeError, r"slo_classes\[0\] must be an SLO"),
    ],
)
def test_bad_slo_classes_are_refused(impl, classes, error, match):
    with pytest.raises(error, match=match):
        make(impl, slo_classes=classes)


@pytest.mark.parametrize(
    ("step_time", "error", "match"),
    [
        (0.01, TypeError, "step_time must be a"),
        ((0.01,), TypeError, "step_time must be a"),
        (("a", 0), TypeError, "step_time must be a"),
        ((-0.01, 0.0), ValueError, "step_time base=-0.01 is out of range"),
        ((0.01, math.nan), ValueError, "step_time per_token=nan is out of range"),
        ((math.inf, 0.0), ValueError, "step_time base=inf is out of range"),
        ((10**400, 0.0), ValueError, "step_time base=1000+ is out of range"),
        ((0.0, -(10**400)), ValueError, "step_time per_token=-1000+ is out of range"),
        # Each part finite, the estimate at the full budget (528 tokens) not: it relegated every
        # request with an objective for good (the fourth review).
        (
            (0, 1e308),
            ValueError,
            r"^step_time=\(0.0, 1e\+308\) estimates a step of max_num_tokens=528 tokens at "
            r"base \+ per_token x 528 = inf seconds; allowed: parts whose estimate is a finite",
        ),
        ((1.7e308, 1e306), ValueError, r"step_time=\(1.7e\+308, 1e\+306\) estimates a step"),
    ],
)
def test_bad_step_time_is_refused(impl, step_time, error, match):
    with pytest.raises(error, match=match):
        make(impl, step_time=step_time)
    with pytest.raises(error, match=match):
        impl[0].Ranker(LIMITS, policy("DEADLINE"), step_time=step_time)


def test_a_step_time_estimate_just_below_inf_is_accepted(impl):
    per_token = 1.7e308 / 528
    ledger, _ = make(impl, step_time=(0.0, per_token))
    assert ledger.step_time_estimate == per_token * 528 < math.inf


# --- submit -------------------------------------------------------------------------------------


def _state(ledger):
    return (ledger.to_records(), ledger.waiting_ids(), ledger.waiting)


def test_objectives_need_an_arrival_time_and_a_refusal_changes_nothing(impl):
    ledger, _ = make(impl, slo_classes={0: sp.SLO(0.5)})
    ledger.submit(1, 10, 1)  # class 1 has no objectives: no arrival time needed
    before = _state(ledger)
    with pytest.raises(ValueError, match="request 2 has objectives but no arrival_time"):
        ledger.submit(2, 10, 0)  # by its class
    with pytest.raises(ValueError, match="request 3 has objectives but no arrival_time"):
        ledger.submit(3, 10, 1, slo=sp.SLO(1.0))  # its own
    for bad, error in (
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("0", TypeError),
        (True, TypeError),
    ):
        with pytest.raises(error, match="arrival_time"):
            ledger.submit(4, 10, 0, arrival_time=bad)
    with pytest.raises(TypeError, match="slo must be an SLO or None, got tuple"):
        ledger.submit(5, 10, 0, arrival_time=0.0, slo=(0.5, 0.1))
    assert _state(ledger) == before
    ledger.submit(2, 10, 0, arrival_time=0.0)
    assert ledger.waiting == 2


@pytest.mark.parametrize("call", ["step", "admit", "apply"])
def test_now_is_required_where_the_policy_reads_the_clock(impl, call):
    ledger, planner = make(impl)
    ledger.submit(1, 10, arrival_time=0.0, slo=sp.SLO(1.0))
    plan = ledger.step(planner, now=0.0)
    before = _state(ledger)
    with pytest.raises(
        ValueError, match=f"{call}: now is required under SchedulingPolicy.DEADLINE"
    ):
        if call == "step":
            ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool))
        elif call == "admit":
            ledger.admit()
        else:
            ledger.apply(plan)
    assert _state(ledger) == before
    with pytest.raises(ValueError, match="now=nan is not a time"):
        ledger.step(planner, now=math.nan)


HUGE = {"1e400": 10**400, "-1e400": -(10**400), "1e5000": 10**5000}


@pytest.mark.parametrize("huge", list(HUGE.values()), ids=list(HUGE))
def test_times_beyond_a_float_are_refused_alike_naming_the_field(huge):
    """An int no float holds as a time was float()'s bare OverflowError, naming no field, from
    every call that takes one (the fourth review): now a ValueError naming the field and the
    value, the same from both ledgers, with nothing changed."""
    shown = "<an int of 16610 bits>" if huge == 10**5000 else str(huge)
    want = {"submit": f"arrival_time={shown} is not a time; allowed: a finite number of seconds"}
    for call in ("step", "rank", "admit", "apply", "measure", "Ranker.rank", "Ranker.measure"):
        want[call] = f"now={shown} is not a time; allowed: a finite number of seconds"
    want["Ranker.admits now"] = want["rank"]
    want["Ranker.admits first_due"] = (
        f"first_due={shown} is not a time; allowed: a number of seconds (inf: none)"
    )
    got = []
    for impl in ((_ledger, _core), (_ledger_py, _core_py)):
        ledger, planner = make(impl, step_time=None)
        ledger.submit(1, 40, arrival_time=0.0, slo=sp.SLO(1.0), max_new_tokens=4)
        plan = ledger.step(planner, now=0.0)
        ranker = impl[0].Ranker(LIMITS, policy("DEADLINE"))
        arrays = (
            np.zeros(2, dtype=sp.RESIDENT_DTYPE),
            np.ones(2),
            np.zeros(2),
            np.zeros(2, dtype=np.int64),
            np.zeros(2, dtype=np.uint64),
            np.zeros(2, dtype=np.uint8),
        )
        calls = {
            "submit": lambda: ledger.submit(2, 10, arrival_time=huge, slo=sp.SLO(1.0)),  # noqa: B023
            "step": lambda: ledger.step(planner, np.zeros(1, dtype=bool), now=huge),  # noqa: B023
            "rank": lambda: ledger.rank(huge),  # noqa: B023
            "admit": lambda: ledger.admit(now=huge),  # noqa: B023
            "apply": lambda: ledger.apply(plan, now=huge),  # noqa: B023
            "measure": lambda: ledger.measure(huge),  # noqa: B023
            "Ranker.rank": lambda: ranker.rank(*arrays, huge),  # noqa: B023
            "Ranker.measure": lambda: ranker.measure(huge),  # noqa: B023
            "Ranker.admits now": lambda: ranker.admits(8, 1.0, huge),  # noqa: B023
            "Ranker.admits first_due": lambda: ranker.admits(8, huge, 0.0),  # noqa: B023
        }

        def state():
            return (
                _state(ledger),  # noqa: B023
                ledger.residents.tolist(),  # noqa: B023
                ledger.output_tokens.tolist(),  # noqa: B023
                ledger.step_time_estimate,  # noqa: B023
                [a.tolist() for a in arrays],  # noqa: B023
                ranker.step_time_estimate,  # noqa: B023
            )

        before = state()
        refusals = {}
        for name, call in calls.items():
            with pytest.raises(ValueError) as info:
                call()
            assert isinstance(info.value, sp.StepPlannerError), name
            assert not isinstance(info.value, OverflowError), name
            refusals[name] = (type(info.value), str(info.value))
            assert state() == before, name
        assert {name: message for name, (_, message) in refusals.items()} == want
        got.append(refusals)
        # Still usable: the pending plan applies and the next step plans.
        ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=0.01)
    assert got[0] == got[1]


def test_edf_needs_now_to_step_but_not_to_admit(impl):
    ledger, planner = make(impl, "EDF")
    ledger.admit()
    with pytest.raises(ValueError, match="step: now is required under SchedulingPolicy.EDF"):
        ledger.step(planner)


def test_fcfs_and_priority_plan_the_same_with_or_without_objectives(impl):
    """Requests without objectives, or under a policy that ignores them: today's behaviour."""
    rng = np.random.default_rng(3)
    requests = [
        (int(rng.integers(1, 200)), int(rng.integers(0, 3)), int(rng.integers(1, 6)))
        for _ in range(30)
    ]
    for name in ("FCFS", "PRIORITY"):
        runs = []
        for objectives in (False, True):
            ledger, planner = make(
                impl, name, slo_classes={0: sp.SLO(0.01, 0.001)} if objectives else None
            )
            for rid, (length, prio, out) in enumerate(requests):
                extra = {"arrival_time": 0.0, "slo": sp.SLO(0.02)} if objectives else {}
                ledger.submit(rid, length, prio, out, **extra)
            plans, now = [], 0.0
            plan = ledger.step(planner, now=now if objectives else None)
            while ledger.count:
                plans.append((plan.to_dict(), ledger.residents.tolist()))
                now += 0.05
                plan = ledger.step(planner, now=now if objectives else None)
            assert not ledger.relegated_ids.size
            runs.append(plans)
        assert runs[0] == runs[1]


# --- what the rank pass writes ---------------------------------------------------------------


def test_edf_writes_milliseconds_to_the_next_deadline(impl):
    ledger, planner = make(impl, "EDF", pause=False)
    ledger.submit(1, 32, arrival_time=0.0, slo=sp.SLO(0.5, 0.125), max_new_tokens=5)
    ledger.submit(2, 32, arrival_time=0.0, slo=sp.SLO(0.25))  # TTFT only
    ledger.submit(3, 32)  # no objectives
    plan = ledger.step(planner, now=0.125)
    assert [row_of(ledger, r)["priority"] for r in (1, 2, 3)] == [375, 125, 2**31 - 1]
    assert [row_of(ledger, r)["arrival"] for r in (1, 2, 3)] == [0, 1, 2]  # the stamps
    ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=0.25)  # first tokens
    # Request 1's token 1 is due at 0.5 + 0.125; request 2 has no deadline left.
    assert row_of(ledger, 1)["priority"] == 375
    assert row_of(ledger, 2)["priority"] == 2**31 - 1


def test_deadline_levels(impl):
    ledger, planner = make(impl, step_time=(0.01, 0.0))
    # Two decodes: one with slack, one that cannot skip a step; then an at-risk prompt.
    ledger.submit(1, 16, arrival_time=0.0, slo=sp.SLO(1.0, 1.0))
    ledger.submit(2, 16, arrival_time=0.0, slo=sp.SLO(1.0, 0.001))
    ledger.step(planner, now=0.0)
    ledger.step(planner, np.zeros(2, dtype=bool), now=0.01)  # both decoding, 1 token each
    # At now=0.99 both emit token 1; request 2's token 2 is due at 1.002: its slack (1.002 -
    # 0.99 - 0.01) is under a step -> LEVEL_DUE; request 1's is due at 3.0 -> LEVEL_SLACK.
    ledger.submit(3, 240, arrival_time=0.0, slo=sp.SLO(1.03))  # 1 step at 256 tokens/step
    ledger.submit(4, 240, arrival_time=0.0, slo=sp.SLO(9.0))  # plenty of time
    plan = ledger.step(planner, np.zeros(2, dtype=bool), now=0.99)
    levels = {r: level(ledger, r) for r in (1, 2, 3, 4)}
    # Request 3: urgent = 1 step (10 ms) <= 40 ms left; at the normal pace, 256 - 2 decodes ->
    # 240 tokens a step: 1 step + a step of margin = 20 ms <= 40 ms: not at risk yet.
    assert levels == {1: LEVEL_SLACK, 2: LEVEL_DUE, 3: LEVEL_SLACK, 4: LEVEL_SLACK}
    assert not plan.to_dict()["paused"]


def test_an_at_risk_prompt_pauses_the_decodes_that_can_wait_but_never_one_that_cannot(impl):
    ledger, planner = make(impl, step_time=(0.01, 0.0))
    ledger.submit(1, 16, arrival_time=0.0, slo=sp.SLO(1.0, 1.0))
    ledger.submit(2, 16, arrival_time=0.0, slo=sp.SLO(1.0, 0.001))
    ledger.step(planner, now=0.0)
    ledger.step(planner, np.zeros(2, dtype=bool), now=0.01)
    # Due at 1.005: served at once (one 10 ms step) it makes it; at the normal pace plus a step
    # of margin (1.01) it does not: at risk.
    ledger.submit(3, 240, arrival_time=0.0, slo=sp.SLO(1.005))
    plan = ledger.step(planner, np.zeros(2, dtype=bool), now=0.99)
    rows = {r: i for i, r in enumerate(ledger.request_ids.tolist())}
    assert level(ledger, 3) == LEVEL_AT_RISK
    assert level(ledger, 2) == LEVEL_DUE
    assert plan.to_dict()["paused"] == [rows[1]]  # the decode with slack waits
    planned = {s["resident"] for s in plan.to_dict()["sequences"]}
    assert planned == {rows[2], rows[3]}  # the one about to miss runs


def test_a_prompt_that_cannot_make_it_is_relegated_once_and_served_after(impl):
    ledger, planner = make(impl, step_time=(0.05, 0.0))
    ledger.submit(1, 240, arrival_time=0.0, slo=sp.SLO(0.2))
    ledger.step(planner, now=0.0)
    assert not ledger.relegated_ids.size
    ledger.submit(2, 240, arrival_time=0.0, slo=sp.SLO(0.21))
    ledger.submit(3, 240, arrival_time=0.1, slo=sp.SLO(5.0))
    ledger.step(planner, np.zeros(1, dtype=bool), now=0.19)
    # Request 2 (0.21 due, one 50 ms step needed at 0.19) cannot make it: relegated at
    # admission; request 1 finished its prompt; request 3 has slack.
    assert ledger.relegated_ids.tolist() == [2]
    assert level(ledger, 2) == LEVEL_RELEGATED
    assert int(row_of(ledger, 2)["arrival"]) == 1  # its stamp: relegated rows go by arrival
    assert level(ledger, 3) == LEVEL_SLACK
    ledger.rank(0.3)
    assert not ledger.relegated_ids.size  # relegated once: later calls do not count it again
    assert level(ledger, 2) == LEVEL_RELEGATED


def test_a_late_token_relegates_its_request(impl):
    ledger, planner = make(impl, step_time=(0.01, 0.0))
    ledger.submit(1, 16, arrival_time=0.0, slo=sp.SLO(0.1, 0.02), max_new_tokens=10)
    ledger.step(planner, now=0.0)
    ledger.step(planner, np.zeros(1, dtype=bool), now=0.05)  # first token at 0.05 <= 0.1
    assert not ledger.relegated_ids.size
    ledger.step(planner, np.zeros(1, dtype=bool), now=0.13)  # token 1 due 0.12: late
    assert ledger.relegated_ids.tolist() == [1]
    assert level(ledger, 1) == LEVEL_RELEGATED
    ledger.step(planner, np.zeros(1, dtype=bool), now=0.14)
    assert not ledger.relegated_ids.size  # once


def test_within_a_level_the_request_class_goes_first(impl):
    ledger, planner = make(impl, step_time=(0.001, 0.0))
    ledger.submit(1, 64, 3, arrival_time=0.0, slo=sp.SLO(50.0))  # less slack, lower class
    ledger.submit(2, 64, -2, arrival_time=0.0, slo=sp.SLO(90.0))
    plan = ledger.step(planner, now=0.0)
    assert level(ledger, 1) == level(ledger, 2) == LEVEL_SLACK
    assert int(row_of(ledger, 2)["priority"]) == LEVEL_SLACK * LEVEL_STRIDE - 2
    assert int(row_of(ledger, 1)["priority"]) == LEVEL_SLACK * LEVEL_STRIDE + 3
    rows = {r: i for i, r in enumerate(ledger.request_ids.tolist())}
    assert plan.to_dict()["sequences"][0]["resident"] == rows[2]  # its chunk comes first


def test_a_decode_whose_next_deadline_has_passed_is_relegated_when_ranked(impl):
    """Its next token is late whenever it comes: the rank pass relegates it at once (what a
    runtime without ``apply``, ranking through ``Ranker``, relies on)."""
    ledger, planner = make(impl, step_time=(0.01, 0.0))
    ledger.submit(1, 16, arrival_time=0.0, slo=sp.SLO(0.1, 0.02), max_new_tokens=10)
    plan = ledger.step(planner, now=0.0)
    ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=0.05)  # token 0 on time
    assert not ledger.relegated_ids.size
    ledger.rank(0.125)  # token 1 was due at 0.12
    assert ledger.relegated_ids.tolist() == [1]
    assert level(ledger, 1) == LEVEL_RELEGATED


def test_rows_without_deadlines_come_after_every_keyed_row(impl):
    ledger, planner = make(impl)
    ledger.submit(1, 32)
    ledger.submit(2, 32, arrival_time=0.0, slo=sp.SLO(100.0))
    ledger.step(planner, now=0.0)
    assert int(row_of(ledger, 1)["arrival"]) == KEY_NONE + 0
    assert KEY_ZERO < int(row_of(ledger, 2)["arrival"]) < KEY_NONE
    assert ledger.to_records()  # the records still read (ranks are what the rows hold)


def test_the_queue_is_in_first_token_deadline_order(impl):
    ledger, planner = make(impl, "EDF")
    ledger.submit(1, 16, arrival_time=0.0, slo=sp.SLO(5.0))
    ledger.submit(2, 16)  # no objectives: last
    ledger.submit(3, 16, arrival_time=0.5, slo=sp.SLO(1.0))  # due 1.5
    ledger.submit(4, 16, arrival_time=1.0, slo=sp.SLO(0.2))  # due 1.2
    assert ledger.waiting_ids() == [4, 3, 1, 2]


def test_deadline_admits_by_class_then_deadline(impl):
    ledger, _ = make(impl, "DEADLINE")
    ledger.submit(1, 16, 1, arrival_time=0.0, slo=sp.SLO(0.5))  # due 0.5, class 1
    ledger.submit(2, 16, 0, arrival_time=0.0, slo=sp.SLO(9.0))  # due 9.0, class 0
    ledger.submit(3, 16, 0, arrival_time=1.0, slo=sp.SLO(1.0))  # due 2.0, class 0
    assert ledger.waiting_ids() == [3, 2, 1]


def test_admission_takes_requests_that_can_still_make_it_first(impl):
    ledger_mod, core_mod = impl
    limits = sp.StepPlannerLimits(max_batch_size=1, max_input_length=256, kv_page_size=16)
    pol = policy("DEADLINE", limits=limits, max_num_tokens=32)
    ledger = ledger_mod.Ledger(limits, pol, step_time=(0.01, 0.0))
    planner = core_mod.StepPlanner(pol, limits)
    ledger.submit(1, 200, arrival_time=0.0, slo=sp.SLO(0.05))  # needs 13 steps: hopeless
    ledger.submit(2, 200, arrival_time=0.0, slo=sp.SLO(1.0))
    ledger.step(planner, now=0.0)
    assert ledger.request_ids.tolist() == [2] and ledger.relegated_ids.tolist() == [1]
    assert ledger.waiting_ids() == [1]  # still waiting, never dropped


def test_the_measured_step_time_follows_the_clock(impl):
    ledger, planner = make(impl, step_time=None)
    assert ledger.step_time_estimate == 0.0
    ledger.submit(1, 16, arrival_time=0.0, slo=sp.SLO(10.0, 1.0), max_new_tokens=50)
    ledger.step(planner, now=1.0)
    ledger.step(planner, np.zeros(1, dtype=bool), now=1.1)  # the first sample: 0.1
    assert ledger.step_time_estimate == pytest.approx(0.1)
    ledger.step(planner, np.zeros(1, dtype=bool), now=1.3)  # moves a quarter towards 0.2
    assert ledger.step_time_estimate == pytest.approx(0.125)


def test_a_clock_jump_past_a_float_is_no_sample_and_the_estimate_stays_finite(impl):
    # Two finite nows 2e308 apart made an inf sample, then a NaN estimate; the twin's rank then
    # raised float NaN's bare ValueError and the compiled one cast NaN to an integer.
    ledger, planner = make(impl, step_time=None)
    ledger.submit(1, 16, arrival_time=0.0, slo=sp.SLO(10.0, 1.0), max_new_tokens=50)
    ledger.submit(2, 200, arrival_time=0.0, slo=sp.SLO(1e300))
    plan = ledger.step(planner, now=0.0)
    plan = ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=0.1)
    assert ledger.step_time_estimate == pytest.approx(0.1)  # the first sample
    for now in (-1.7e308, 1.7e308, 1.7e308):  # back, a jump of 3.4e308 (inf), none
        plan = ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=now)
        assert ledger.step_time_estimate == pytest.approx(0.1)
    ledger.rank(1.7e308)
    assert ledger.step_time_estimate == pytest.approx(0.1)
    ranker = impl[0].Ranker(LIMITS, policy("DEADLINE"))
    for now in (-1e308, 1e308, 1.5e308):  # inf, then a finite sample of 5e307
        ranker.measure(now)
    assert ranker.step_time_estimate == 5e307
    ranker.measure(1.7e308)
    assert math.isfinite(ranker.step_time_estimate)


def test_load_is_refused_under_a_deadline_policy(impl):
    ledger, _ = make(impl, "EDF")
    with pytest.raises(ValueError, match="load\\(\\) is refused under SchedulingPolicy.EDF"):
        ledger.load([])


def test_the_planner_plans_deadline_policies_as_priority(core):
    rows = [
        core.ResidentState(1, 0, 40, 41, True),
        core.ResidentState(0, 5, 60, 0, False),
        core.ResidentState(2, 2, 20, 0, False),
        core.ResidentState(1, 3, 50, 50, True),
    ]
    limits = sp.StepPlannerLimits(4, 64, 16)
    plans = []
    for name in ("PRIORITY", "EDF", "DEADLINE"):
        pol = policy(name, limits=limits, max_num_tokens=52, max_chunk_tokens=32)
        plans.append(core.StepPlanner(pol, limits).plan(rows).to_dict())
    assert plans[0] == plans[1] == plans[2]
    assert plans[0]["paused"] == [0, 2, 3]  # SPEC §5's second example


# --- the constructor: one order of checks for both ledgers ---------------------------------------

# In the order both ledgers check them; the first value of each is good. Each bad value: what
# its refusal's message starts with.
_CONSTRUCTOR_ARGS = {
    "limits": {LIMITS: None, "B=4": "limits must be a StepPlannerLimits"},
    "policy": {
        "DEADLINE": None,
        "options": "policy must be a ResolvedSchedulingPolicy",
        "reserved": "priority_reserved_slots=5 is out of range",
    },
    "max_waiting": {64: None, -1: "max_waiting=-1 is out of range", "8": "max_waiting must be"},
    "slo_classes": {
        None: None,
        "list": "slo_classes must be a mapping",
        "tuple": "slo_classes[0] must be an SLO",
    },
    "step_time": {
        None: None,
        (0.01, 0.0): None,
        (-1, 0.0): "step_time base=-1.0 is out of range",
        (0, 1e308): "step_time=(0.0, 1e+308) estimates",
        0.01: "step_time must be a (base_seconds, seconds_per_token) pair",
    },
    "page_table": {
        None: None,
        "pages of 8": "page_table.kv_page_size=8 differs",
        "in use": "page_table holds 1 of its",
    },
}


def _constructor_outcome(impl_name, args):
    ledger_mod, kv = (
        (_ledger, sp_kv_compiled) if impl_name == "compiled" else (_ledger_py, sp_kv_python)
    )
    kwargs = dict(args)
    kwargs["policy"] = {
        "DEADLINE": policy("DEADLINE"),
        "options": sp.SchedulingOptions(),  # not resolved
        "reserved": dataclasses.replace(policy("DEADLINE"), priority_reserved_slots=5),
    }[args["policy"]]
    kwargs["slo_classes"] = {None: None, "list": [sp.SLO(1.0)], "tuple": {0: (0.25, 0.1)}}[
        args["slo_classes"]
    ]
    if args["page_table"] is not None:  # each ledger's own module's table
        kwargs["page_table"] = kv.KVPageTable(
            4, 16, 64, 8 if args["page_table"] == "pages of 8" else 16
        )
        if args["page_table"] == "in use":
            kwargs["page_table"].ensure(0, 16)
    try:
        ledger = ledger_mod.Ledger(kwargs.pop("limits"), kwargs.pop("policy"), **kwargs)
    except Exception as exc:  # noqa: BLE001 - the refusal itself is the result compared
        return type(exc).__name__, str(exc)
    return "built", repr(ledger), ledger.step_time_estimate


@pytest.mark.parametrize(
    "values",
    list(itertools.product(*(list(options) for options in _CONSTRUCTOR_ARGS.values()))),
    ids=lambda values: "".join(
        str(list(options).index(v)) for options, v in zip(_CONSTRUCTOR_ARGS.values(), values)
    ),
)
def test_both_ledgers_refuse_any_mix_of_bad_constructor_arguments_alike(values):
    # The twin checked step_time before slo_classes, the compiled ledger after: a bad pair of
    # them raised different errors (the fourth review). One shared check, in one order, now.
    args = dict(zip(_CONSTRUCTOR_ARGS, values))
    compiled = _constructor_outcome("compiled", args)
    assert compiled == _constructor_outcome("python", args)
    refusals = [_CONSTRUCTOR_ARGS[name][value] for name, value in args.items()]
    first = next((message for message in refusals if message is not None), None)
    if first is None:
        assert compiled[0] == "built"
    else:  # the first bad argument in that order is the one refused
        assert compiled[1].startswith(first), (first, compiled)


# --- the Ranker: the same pass over a runtime's own rows ---------------------------------------


def test_ranker_writes_what_the_ledger_writes(impl):
    ledger_mod, _ = impl
    ledger, planner = make(impl, step_time=(0.01, 0.0001))
    for rid in range(4):
        ledger.submit(
            rid, 40 * (rid + 1), rid % 2, arrival_time=0.0, slo=sp.SLO(0.05 * (rid + 1), 0.01)
        )
    plan = ledger.step(planner, now=0.0)
    lost_before = ledger.relegated_ids.tolist()
    ledger.step(planner, np.zeros(len(plan.sequences), dtype=bool), now=0.02)
    lost_before += ledger.relegated_ids.tolist()
    rows = ledger.residents.copy()
    original = rows.copy()
    ranker = ledger_mod.Ranker(LIMITS, policy("DEADLINE"), step_time=(0.01, 0.0001))
    order = ledger.request_ids.tolist()
    first_due = np.array([0.05 * (r + 1) for r in order])
    gap = np.full(len(order), 0.01)
    generated = ledger.output_tokens.astype(np.int64).copy()
    stamp = np.array(order, dtype=np.uint64)
    relegated = np.isin(order, lost_before).astype(np.uint8)  # the runtime keeps it per request
    rows["priority"], rows["arrival"] = 7, 7  # the ranker overwrites both
    classes = np.array([r % 2 for r in order], dtype=np.int32)
    lost = ranker.rank(rows, first_due, gap, generated, stamp, relegated, 0.03, classes=classes)
    ledger.rank(0.03)
    assert rows.tolist() == ledger.residents.tolist()
    assert sorted(np.asarray(order)[lost].tolist()) == sorted(ledger.relegated_ids.tolist())
    assert (
        rows[["prompt_length", "committed"]].tolist()
        == original[["prompt_length", "committed"]].tolist()
    )


@pytest.mark.parametrize(
    ("argument", "value", "error", "match"),
    [
        ("rows", np.zeros(2, dtype=np.int64), TypeError, "rows must be a writable"),
        ("first_due", np.zeros(2, dtype=np.float32), TypeError, "first_due must be a"),
        ("gap", np.zeros(3), ValueError, "gap has 3 entries for 2 rows"),
        ("relegated", np.zeros(2, dtype=bool), TypeError, "relegated must be a writable"),
    ],
)
def test_ranker_checks_its_arrays(impl, argument, value, error, match):
    ledger_mod, _ = impl
    ranker = ledger_mod.Ranker(LIMITS, policy("EDF"))
    args = {
        "rows": np.zeros(2, dtype=sp.RESIDENT_DTYPE),
        "first_due": np.zeros(2),
        "gap": np.zeros(2),
        "generated": np.zeros(2, dtype=np.int64),
        "stamp": np.zeros(2, dtype=np.uint64),
        "relegated": np.zeros(2, dtype=np.uint8),
    }
    args[argument] = value
    with pytest.raises(error, match=match):
        ranker.rank(now=0.0, **args)


def test_ranker_admits_counts_steps_exactly():
    """A prompt of n tokens takes ceil(n / max_chunk_tokens) steps: the compiled pass gets it by
    a multiplication and a remainder, not a division, and must agree with the twin's exact
    integers at every chunk boundary (one below, on, one above) and with the direct rule."""
    limits = sp.StepPlannerLimits(max_batch_size=4, max_input_length=8192, kv_page_size=16)
    pol = policy("DEADLINE", limits=limits, max_num_tokens=4 + 48, max_chunk_tokens=48)
    rankers = [m.Ranker(limits, pol, step_time=(0.01, 0.0)) for m in (_ledger, _ledger_py)]
    est = rankers[0].step_time_estimate
    for tokens in sorted({0, 1} | {k * 48 + d for k in range(1, 171) for d in (-1, 0, 1)}):
        steps = -(-tokens // 48)
        for due in (steps * est, steps * est + 1e-9, steps * est - 1e-9):
            answers = [r.admits(tokens, due, 0.0) for r in rankers]
            assert answers == [not steps * est > due] * 2, (tokens, due)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1, 1.0, 0.0), ValueError, "prompt_tokens=-1 is negative"),
        ((2**31, 1.0, 0.0), OverflowError, "prompt_tokens=2147483648 does not fit int32"),
        ((1.5, 1.0, 0.0), TypeError, "prompt_tokens must be an integer"),
        ((8, float("nan"), 0.0), ValueError, "first_due=nan is not a time"),
        ((8, "1.0", 0.0), TypeError, "first_due must be a number of seconds, got str"),
        ((8, 1.0, float("inf")), ValueError, "now=inf is not a time"),
    ],
)
def test_ranker_admits_checks_its_arguments(impl, args, error, match):
    ledger_mod, _ = impl
    ranker = ledger_mod.Ranker(LIMITS, policy("DEADLINE"), step_time=STEP)
    with pytest.raises(error, match=match):
        ranker.admits(*args)
    assert ranker.admits(8, float("inf"), 0.0)  # no objectives: always


# --- compiled and twin in lockstep -------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["submit", "submit", "submit", "step", "step", "step", "cancel", "admit", "rank"]
        ),
        st.integers(0, 2**16),
        st.floats(0.0, 0.03),
    ),
    min_size=1,
    max_size=80,
)


def _apply_op(op, ledger, planner, plans, k, rng, now, next_id):
    """One random operation on one ledger; ``plans[k]`` is its pending plan."""
    if op == "submit":
        prio = int(rng.integers(-1, 3))
        own = (
            sp.SLO(float(rng.uniform(0.02, 0.8)), float(rng.uniform(0.01, 0.1)))
            if rng.random() < 0.3
            else None
        )
        timed = prio != 2 or own is not None or rng.random() < 0.5
        length, max_new = int(rng.integers(1, 80)), int(rng.integers(1, 30))
        lora = int(rng.integers(0, 4))  # the ledgers' max_loras decides whether it matters
        return ledger.submit(
            next_id,
            length,
            prio,
            max_new,
            arrival_time=now if timed else None,
            slo=own,
            lora_id=lora,
        )
    if op == "step":
        plan = plans[k]
        mask = (
            None
            if plan is None or rng.random() < 0.5
            else plan.as_array()["select_last_token_logits"]
            & (rng.random(len(plan.sequences)) < 0.3)
        )
        plans[k] = ledger.step(planner, mask, now=now)
        return plans[k].to_dict()
    if op == "cancel":
        return ledger.cancel(int(rng.integers(0, max(next_id, 1))))
    if op == "admit":
        plans[k] = None
        return ledger.admit(now=now)
    return ledger.rank(now)


def _outcome(call):
    try:
        return ("ok", call())
    except (TypeError, ValueError, OverflowError, sp.QueueFullError) as exc:
        return (type(exc).__name__, str(exc))


@given(
    ops=OPS,
    name=st.sampled_from(["EDF", "DEADLINE"]),
    pause=st.booleans(),
    measured=st.booleans(),
    page=st.sampled_from([1, 16]),
    wait=st.sampled_from([None, 0.0, 0.05]),
    floor=st.sampled_from([0, 1, -5]),
    loras=st.sampled_from([None, 1, 2]),
)
def test_compiled_and_twin_agree_under_deadline_policies(
    ops, name, pause, measured, page, wait, floor, loras
):
    limits = sp.StepPlannerLimits(max_batch_size=3, max_input_length=64, kv_page_size=page)
    pol = policy(name, pause, limits=limits, max_pause_steps=2)
    # Objectives a few steps long, so rows move between every level over a run.
    classes = {-1: sp.SLO(0.1, 0.03), 0: sp.SLO(0.15, 0.06), 1: sp.SLO(0.6)}
    step_time = None if measured else (0.005, 0.0001)
    pairs = [
        (
            m.Ledger(
                limits,
                pol,
                max_waiting=6,
                slo_classes=classes,
                step_time=step_time,
                relegated_wait=wait,
                never_relegate_below=floor,
                max_loras=loras,
            ),
            c.StepPlanner(pol, limits),
        )
        for m, c in ((_ledger, _core), (_ledger_py, _core_py))
    ]
    now, next_id, plans = 0.0, 0, [None, None]
    for op, seed, dt in ops:
        results = []
        for k, (ledger, planner) in enumerate(pairs):
            rng = np.random.default_rng(seed)  # the same draws for both implementations
            outcome = _outcome(lambda: _apply_op(op, ledger, planner, plans, k, rng, now, next_id))  # noqa: B023
            results.append(
                (
                    outcome,
                    ledger.residents.tolist(),
                    ledger.request_ids.tolist(),
                    ledger.output_tokens.tolist(),
                    ledger.relegated_ids.tolist(),
                    ledger.shed_ids.tolist(),
                    ledger.waiting,
                    ledger.relegated_waiting,
                    ledger.waiting_ids(),
                    ledger.step_time_estimate,
                )
            )
        assert results[0] == results[1], op
        if op == "submit" and results[0][0][0] == "ok":
            next_id += 1
        now += dt
