"""Uncached work first (docs/scheduling.md, "Uncached work first"): with
``admission=AdmissionOrder.UNCACHED_FIRST`` a ledger admits waiting requests by the prompt tokens
they still need past their prefix hit (``prompt_length - cached_tokens``), ties by arrival, within
the policy's classes; a request that has waited past the starvation bound goes back to arrival
order, ahead of every request that has not.

Every scenario runs on the compiled ledger and on the pure-Python twin; the Hypothesis test at the
end drives both, and ``Model`` (the rule in a few readable lines), through random sequences.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepplanner as sp
from stepplanner import AdmissionOrder, StepPlannerLimits
from stepplanner.ledger import _ledger_py

try:
    from stepplanner.ledger import _ledger as _compiled
except ImportError:  # a pure-Python install
    _compiled = None

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=1000, kv_page_size=16)
UNCACHED = AdmissionOrder.UNCACHED_FIRST


def policy_of(kind=sp.SchedulingPolicy.FCFS, limits=LIMITS, reserved=0):
    options = sp.SchedulingOptions(scheduling_policy=kind, priority_reserved_slots=reserved)
    return sp.resolve_scheduling_policy(options, limits)


@pytest.fixture
def make(ledger_impl):
    def build(policy=None, limits=LIMITS, **kwargs):
        kwargs.setdefault("admission", UNCACHED)
        if kwargs["admission"] == UNCACHED and "starvation_seconds" not in kwargs:
            kwargs.setdefault("starvation_steps", 100)
        return ledger_impl.Ledger(limits, policy, **kwargs)

    return build


def _state(ledger) -> tuple:
    return (ledger.to_records(), ledger.waiting_ids(), ledger.waiting, ledger.admitted_ids.tolist())


# --- the rule: worked examples -------------------------------------------------------------------


def test_admits_by_uncached_work_then_arrival(make):
    ledger = make()
    ledger.submit(0, 900)  # uncached 900
    ledger.submit(1, 500, cached_tokens=400)  # 100
    ledger.submit(2, 300)  # 300
    ledger.submit(3, 100)  # 100: ties with 1, arrived later
    ledger.submit(4, 600, cached_tokens=600)  # 0: a full hit
    ledger.submit(5, 50)  # 50
    assert ledger.waiting_ids() == [4, 5, 1, 3, 2, 0]
    assert ledger.admit() == [4, 5, 1, 3]
    assert ledger.waiting_ids() == [2, 0]


def test_arrival_order_admits_by_arrival_whatever_the_hit(make):
    ledger = make(admission=AdmissionOrder.ARRIVAL)
    ledger.submit(0, 900)
    ledger.submit(1, 500, cached_tokens=400)
    ledger.submit(2, 50)
    assert ledger.admit() == [0, 1, 2]


def test_residents_are_chunked_in_the_order_they_were_admitted(make, ledger_impl):
    """The row's arrival is a fresh stamp at admission, so the planner's SPEC order (arrival)
    gives the shorter prompt, admitted first, the first chunk."""
    limits = StepPlannerLimits(4, 1000, 16, max_step_tokens=64)  # a step of 64 tokens at most
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits)
    ledger = make(policy, limits=limits)
    ledger.submit(0, 900)
    ledger.submit(1, 40)
    plan = ledger.step(ledger_impl.StepPlanner(policy, limits))
    ids = ledger.request_ids.tolist()
    assert ids == [1, 0]  # admitted shortest first
    arrivals = ledger.residents["arrival"].tolist()
    assert arrivals[0] < arrivals[1]
    first = plan.sequences[0]
    assert ids[first.resident] == 1 and first.query_length == 40  # the whole short prompt
    assert ids[plan.sequences[1].resident] == 0 and plan.sequences[1].query_length == 16


def test_starvation_steps_bound_a_request_passed_over(make):
    """starvation_steps=2: a request passed over in two admission passes goes first in the
    third, and in arrival order among those starved."""
    ledger = make(limits=StepPlannerLimits(1, 1000, 16), starvation_steps=2)
    ledger.submit(0, 800)
    ledger.submit(1, 700)
    admitted = []
    for rid in range(2, 12):
        ledger.submit(rid, 10)  # a short request every pass
        admitted += ledger.admit()
        ledger.retire(ledger.request_ids.tolist())
    # Passes 1 and 2 admit short requests (2, 3); at pass 3 requests 0 and 1 have been passed
    # over twice: 0 goes first, then 1 (pass 4); request 4 (submitted before pass 3) waited
    # through passes 3 and 4 and starves at pass 5, before 5 and 6 (submitted later).
    assert admitted[:5] == [2, 3, 0, 1, 4]
    assert admitted == [2, 3, 0, 1, 4, 5, 6, 7, 8, 9]


def test_starvation_steps_zero_is_arrival_order(make):
    ledger = make(starvation_steps=0)
    for rid, length in enumerate([900, 10, 500, 20, 30]):
        ledger.submit(rid, length)
    assert ledger.admit() == [0, 1, 2, 3]


def test_starvation_seconds_bound_measured_from_arrival_time(make):
    ledger = make(limits=StepPlannerLimits(1, 1000, 16), starvation_seconds=1.0)
    ledger.submit(0, 800, arrival_time=0.0)
    ledger.submit(1, 10, arrival_time=0.2)
    ledger.submit(2, 20, arrival_time=0.3)
    assert ledger.admit(now=0.5) == [1]
    ledger.retire([1])
    assert ledger.admit(now=0.99) == [2]  # 0 has waited 0.99 s < 1 s: still passed over
    ledger.retire([2])
    ledger.submit(3, 5, arrival_time=1.0)
    assert ledger.admit(now=1.0) == [0]  # waited 1 s: starved, before the shorter 3
    ledger.retire([0])
    assert ledger.admit(now=1.1) == [3]


def test_starvation_seconds_needs_now_and_arrival_time(make):
    ledger = make(starvation_seconds=1.0)
    with pytest.raises(ValueError, match="request 7 has no arrival_time .* starvation_seconds"):
        ledger.submit(7, 10)
    assert ledger.waiting == 0
    ledger.submit(7, 10, arrival_time=0.0)
    with pytest.raises(ValueError, match="admit: now is required with starvation_seconds"):
        ledger.admit()
    assert ledger.count == 0 and ledger.waiting == 1


def test_priority_then_uncached_within_a_class(make):
    ledger = make(policy_of(sp.SchedulingPolicy.PRIORITY), limits=StepPlannerLimits(8, 1000, 16))
    ledger.submit(0, 50, priority=1)
    ledger.submit(1, 900, priority=0)
    ledger.submit(2, 100, priority=0)
    ledger.submit(3, 10, priority=2)
    ledger.submit(4, 400, priority=-1)
    ledger.submit(5, 300, priority=-1, cached_tokens=295)
    assert ledger.waiting_ids() == [5, 4, 2, 1, 0, 3]
    assert ledger.admit() == [5, 4, 2, 1, 0, 3]


def test_priority_starved_request_goes_back_to_its_class_arrival_order(make):
    ledger = make(
        policy_of(sp.SchedulingPolicy.PRIORITY, StepPlannerLimits(1, 1000, 16)),
        limits=StepPlannerLimits(1, 1000, 16),
        starvation_steps=1,
    )
    ledger.submit(0, 900, priority=1)
    ledger.submit(1, 10, priority=1)
    ledger.submit(2, 999, priority=0)
    assert ledger.admit() == [2]  # class 0 first whatever its work
    ledger.retire([2])
    ledger.submit(3, 5, priority=1)
    # Pass 2: 0 and 1 waited one pass and starved: class 1 in arrival order, before 3.
    assert ledger.admit() == [0]
    ledger.retire([0])
    assert ledger.admit() == [1]
    ledger.retire([1])
    assert ledger.admit() == [3]


def test_reserved_slots_and_the_order_compose(make):
    limits = StepPlannerLimits(3, 1000, 16)
    ledger = make(policy_of(sp.SchedulingPolicy.PRIORITY, limits, reserved=1), limits=limits)
    ledger.submit(0, 10, priority=0)
    ledger.submit(1, 5, priority=0)
    ledger.submit(2, 900, priority=-1)
    # The urgent class first; then one slot is all the normal class may take: the shorter's.
    assert ledger.admit() == [2, 1]


def test_cancelled_and_admitted_requests_leave_the_bound_behind(make):
    ledger = make(limits=StepPlannerLimits(1, 1000, 16), starvation_steps=1)
    ledger.submit(0, 900)
    ledger.submit(1, 10)
    ledger.cancel(0)
    assert ledger.admit() == [1]
    ledger.retire([1])
    ledger.submit(0, 20)  # the same id again: a new request with a new wait
    ledger.submit(2, 5)
    assert ledger.admit() == [2]  # 0 (new) has not waited a pass yet
    ledger.retire([2])
    assert ledger.admit() == [0]


def test_a_deep_queue_keeps_its_bound_through_many_passes(make):
    """The starvation ring compacts when full (2 x max_waiting entries): many requests come and
    go ahead of one long prompt, and it still starves on time."""
    ledger = make(limits=StepPlannerLimits(1, 1000, 16), max_waiting=4, starvation_steps=30)
    ledger.submit(0, 999)
    admitted = []
    for rid in range(1, 40):
        ledger.submit(rid, 1 + rid % 7)
        admitted += ledger.admit()
        ledger.retire(ledger.request_ids.tolist())
    assert admitted.index(0) == 30  # passed over in 30 passes, admitted in the 31st
    assert len(admitted) == 39


# --- under EDF and DEADLINE: slack first, then uncached work among those with slack to spare ---

ONE = StepPlannerLimits(1, 1000, 16)  # one slot: each pass admits the head; chunk 512
STEP = (0.01, 0.0)  # every step estimated at 10 ms


def deadline_ledger(make, kind=sp.SchedulingPolicy.DEADLINE, **kwargs):
    kwargs.setdefault("slo_classes", {0: sp.SLO(1.0), 1: sp.SLO(1.0)})
    return make(policy_of(kind, ONE), limits=ONE, step_time=STEP, **kwargs)


@pytest.mark.parametrize("kind", [sp.SchedulingPolicy.EDF, sp.SchedulingPolicy.DEADLINE])
def test_with_slack_to_spare_by_uncached_work(make, kind):
    ledger = deadline_ledger(make, kind)
    ledger.submit(0, 900, arrival_time=0.0)  # due 1.0; 2 chunks
    ledger.submit(1, 100, arrival_time=0.1)  # due 1.1
    ledger.submit(2, 600, arrival_time=0.2, cached_tokens=550)  # due 1.2; 50 uncached
    assert ledger.waiting_ids() == [2, 1, 0]
    assert ledger.admit(now=0.5) == [2]  # all three have slack: the least work
    ledger.retire([2])
    # At 0.98 request 0 (2 steps + a step of margin: 1.01 > 1.0) has no slack to spare: the
    # policy's own order (deadline) takes it first; 1 (0.98 + 0.02 <= 1.1) still has slack.
    assert ledger.admit(now=0.98) == [0]
    assert ledger.relegated_ids.tolist() == []
    ledger.retire([0])
    assert ledger.admit(now=0.99) == [1]


def test_slack_to_spare_ends_exactly_a_step_before_the_deadline(make):
    """A request is out of slack once now + ceil(work / chunk) x the estimate + one estimate
    passes its first-token deadline."""
    ledger = deadline_ledger(make)
    ledger.submit(0, 512, arrival_time=0.0)  # one chunk; due 1.0
    ledger.submit(1, 10, arrival_time=0.0)
    assert ledger.admit(now=0.98) == [1]  # 0.98 + 0.01 + 0.01 = 1.0: not past due, slack
    ledger.retire([1])
    ledger.submit(2, 5, arrival_time=0.98)
    assert ledger.waiting_ids() == [2, 0]
    assert ledger.admit(now=0.981) == [0]  # past: out of slack, ahead of the shorter 2


def test_slack_to_spare_is_measured_on_uncached_work(make):
    ledger = deadline_ledger(make)
    ledger.submit(0, 1000, arrival_time=0.0)  # two chunks uncached; due 1.0
    ledger.submit(1, 1000, arrival_time=0.0, cached_tokens=488)  # one chunk; due 1.0
    ledger.submit(2, 10, arrival_time=0.0, slo=sp.SLO(10.0))
    # At 0.975: 0 needs 0.975 + 0.02 + 0.01 > 1.0 (out of slack), 1 needs 0.995 (slack).
    assert ledger.admit(now=0.975) == [0]
    assert ledger.waiting_ids() == [2, 1]
    assert ledger.relegated_ids.tolist() == []


def test_deadline_keeps_its_class_order_around_the_rule(make):
    """DEADLINE admits by class first: an out-of-slack class-1 request waits behind class 0's
    requests with slack; within class 0 the least work comes first."""
    ledger = deadline_ledger(make)
    ledger.submit(0, 900, priority=1, arrival_time=0.0)
    ledger.submit(1, 800, priority=0, arrival_time=0.1)
    ledger.submit(2, 30, priority=0, arrival_time=0.2)
    assert ledger.waiting_ids() == [2, 1, 0]
    assert ledger.admit(now=0.98) == [2]  # class 0 first; 0 is out of slack but class 1
    assert ledger.waiting_ids() == [1, 0]


def test_out_of_slack_requests_among_themselves_by_deadline(make):
    ledger = deadline_ledger(make, sp.SchedulingPolicy.EDF, slo_classes={0: sp.SLO(0.05)})
    ledger.submit(0, 900, arrival_time=0.02)  # due 0.07
    ledger.submit(1, 700, arrival_time=0.0)  # due 0.05
    ledger.submit(2, 10, arrival_time=0.0, slo=sp.SLO(10.0))  # due 10: slack to spare
    assert ledger.waiting_ids() == [2, 1, 0]  # before any pass: by work
    # At 0.045 both are out of slack (0.045 + 0.02 + 0.01 > 0.07 > 0.05): the earlier due first.
    assert ledger.admit(now=0.045) == [1]
    assert ledger.waiting_ids() == [0, 2]


def test_a_request_without_a_deadline_always_has_slack(make):
    ledger = deadline_ledger(make, slo_classes={0: sp.SLO(0.05)})
    ledger.submit(0, 20, priority=5, arrival_time=0.0)  # no objective: work order, forever
    ledger.submit(1, 900, priority=5, arrival_time=0.0)
    assert ledger.admit(now=100.0) == [0]


def test_the_starvation_bound_applies_under_deadline(make):
    """A request with slack that is passed over past the bound goes to the deadline order."""
    ledger = deadline_ledger(make, slo_classes={0: sp.SLO(100.0)}, starvation_steps=1)
    ledger.submit(0, 900, arrival_time=0.0)  # due 100: slack for a long time
    ledger.submit(1, 10, arrival_time=0.0)
    assert ledger.admit(now=0.0) == [1]
    ledger.retire([1])
    ledger.submit(2, 5, arrival_time=0.1)
    assert ledger.admit(now=0.1) == [0]  # waited a pass: starved, ahead of the shorter 2


def test_a_grown_step_estimate_takes_slack_away(make, ledger_impl):
    """The estimate is measured (step_time=None): a request judged with slack at a small
    estimate loses it once the estimate grows, though no clock bound said so at submission."""
    classes = {0: sp.SLO(1.0)}
    ledger = make(policy_of(sp.SchedulingPolicy.DEADLINE, ONE), limits=ONE, slo_classes=classes)
    ledger.submit(0, 900, arrival_time=0.0)  # due 1.0
    ledger.submit(1, 10, arrival_time=0.0)
    assert ledger.admit(now=0.0) == [1]  # no estimate yet: 0 has slack
    ledger.retire([1])
    ledger.submit(2, 5, arrival_time=0.1)
    for t in (0.1, 0.3, 0.5):  # steps of 0.2 s measured
        ledger.measure(t)
    assert ledger.step_time_estimate == pytest.approx(0.2)
    # 0.5 + 2 x 0.2 + 0.2 = 1.1 > 1.0: out of slack (too_late still says it can make it).
    assert ledger.admit(now=0.5) == [0]


# --- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"admission": UNCACHED}, ValueError, "needs exactly one starvation bound, got neither"),
        (
            {"admission": UNCACHED, "starvation_steps": 1, "starvation_seconds": 1.0},
            ValueError,
            "got starvation_steps and starvation_seconds",
        ),
        ({"starvation_steps": 3}, ValueError, "starvation_steps is given but admission is"),
        ({"admission": "uncached"}, TypeError, "admission must be a stepplanner.AdmissionOrder"),
        ({"admission": True}, TypeError, "admission must be"),
        ({"admission": 7}, ValueError, r"admission=7 is out of range"),
        (
            {"admission": UNCACHED, "starvation_steps": -1},
            ValueError,
            r"starvation_steps=-1 is out of range; allowed: 0..2147483647",
        ),
        (
            {"admission": UNCACHED, "starvation_steps": 1.5},
            TypeError,
            "starvation_steps must be an integer",
        ),
        (
            {"admission": UNCACHED, "starvation_seconds": float("nan")},
            ValueError,
            "starvation_seconds=nan is out of range; allowed: a finite number >= 0",
        ),
        (
            {"admission": UNCACHED, "starvation_seconds": -0.5},
            ValueError,
            "starvation_seconds=-0.5 is out of range",
        ),
        (
            {"admission": UNCACHED, "starvation_seconds": "1"},
            TypeError,
            "starvation_seconds must be a number of seconds, got str",
        ),
    ],
)
def test_constructor_arguments_are_checked(ledger_impl, kwargs, error, message):
    with pytest.raises(error, match=message):
        ledger_impl.Ledger(LIMITS, None, **kwargs)


@pytest.mark.parametrize(
    ("cached", "error", "message"),
    [
        (11, ValueError, r"cached_tokens=11 is out of range; allowed: 0..10 \(the request's "),
        (-1, ValueError, r"cached_tokens=-1 is out of range; allowed: 0..10"),
        (2**31, OverflowError, "cached_tokens"),
        (1.0, TypeError, "cached_tokens must be an integer"),
        ("3", TypeError, "cached_tokens must be an integer"),
    ],
)
def test_cached_tokens_is_checked_and_nothing_changes(make, cached, error, message):
    ledger = make()
    ledger.submit(0, 20)
    before = _state(ledger)
    with pytest.raises(error, match=message):
        ledger.submit(1, 10, cached_tokens=cached)
    assert _state(ledger) == before
    ledger.submit(1, 10, cached_tokens=np.int64(10))  # an integer-like value is fine
    assert ledger.waiting_ids() == [1, 0]


def test_cached_tokens_is_checked_under_arrival_order_too(make):
    ledger = make(admission=AdmissionOrder.ARRIVAL)
    with pytest.raises(ValueError, match="cached_tokens=11"):
        ledger.submit(1, 10, cached_tokens=11)


def test_both_ledgers_raise_the_same_messages():
    if _compiled is None:
        pytest.skip("no compiled ledger")
    cases = [
        {"admission": UNCACHED},
        {"admission": UNCACHED, "starvation_steps": 2**31},
        {"admission": 2},
        {"starvation_seconds": 1.0},
    ]
    for kwargs in cases:
        got = []
        for module in (_compiled, _ledger_py):
            try:
                module.Ledger(LIMITS, None, **kwargs)
            except Exception as e:  # noqa: BLE001 - compared by type and message
                got.append((type(e), str(e)))
        assert len(got) == 2 and got[0] == got[1], kwargs


# --- the model --------------------------------------------------------------------------------


@dataclasses.dataclass
class Waiting:
    rid: int
    work: int
    priority: int
    stamp: int
    since: float
    due: float = np.inf
    moved: bool = False  # starved, or (EDF/DEADLINE) out of slack: in the policy's own order


# Model test classes' objectives under EDF/DEADLINE (class 2 has none: it never runs out of slack).
MODEL_CLASSES = {-1: sp.SLO(0.2), 0: sp.SLO(0.5), 1: sp.SLO(1.0)}


class Model:
    """The rule, readably: each admission pass (one step of the bound) first moves every request
    with ``since + bound <= clock`` (starved) and, under EDF/DEADLINE, every one with a deadline
    and no slack to spare (``now + ceil(work / chunk) x est + est > due``) to the policy's own
    order, then admits while slots are free in the order: the class (PRIORITY, DEADLINE); moved
    before not; the moved by arrival (EDF/DEADLINE: by deadline, then arrival), the rest by
    uncached work, then arrival. No reserved slots, pages, adapters or relegation here (their
    tests are their own)."""

    def __init__(
        self,
        capacity: int,
        kind: sp.SchedulingPolicy,
        steps: int | None,
        seconds: float | None,
        est: float = 0.0,
        chunk: int = 1,
    ):
        self.capacity, self.steps, self.seconds = capacity, steps, seconds
        self.by_class = kind in (sp.SchedulingPolicy.PRIORITY, sp.SchedulingPolicy.DEADLINE)
        self.deadlines = kind in (sp.SchedulingPolicy.EDF, sp.SchedulingPolicy.DEADLINE)
        self.est, self.chunk = est, chunk
        self.waiting: dict[int, Waiting] = {}
        self.residents: list[int] = []
        self.passes, self.stamp, self.latest = 0, 0, -np.inf

    def submit(self, rid: int, length: int, cached: int, priority: int, at: float) -> None:
        if self.seconds is not None:
            self.latest = max(self.latest, at)
        since = self.latest if self.seconds is not None else self.passes
        slo = MODEL_CLASSES.get(priority) if self.deadlines else None
        due = at + slo.ttft if slo is not None else np.inf
        self.waiting[rid] = Waiting(rid, length - cached, priority, self.stamp, since, due)
        self.stamp += 1

    def key(self, w: Waiting) -> tuple:
        if w.moved:
            within = (0, w.due, w.stamp) if self.deadlines else (0, w.stamp)
        else:
            within = (1, w.work, w.stamp)
        return ((w.priority,) if self.by_class else ()) + within

    def out_of_slack(self, w: Waiting, now: float) -> bool:
        steps = -(-w.work // self.chunk)
        return self.deadlines and now + steps * self.est + self.est > w.due

    def admit(self, now: float) -> list[int]:
        self.passes += 1
        if self.seconds is not None:
            clock, bound = now, self.seconds
        else:
            clock, bound = self.passes, self.steps + 1
        for w in self.waiting.values():
            w.moved = w.moved or w.since + bound <= clock or self.out_of_slack(w, now)
        order = sorted(self.waiting.values(), key=self.key)
        admitted = [w.rid for w in order[: self.capacity - len(self.residents)]]
        for rid in admitted:
            del self.waiting[rid]
        self.residents += admitted
        self.stamp += len(admitted)  # the ledgers restamp admitted rows from the same counter
        return admitted

    def waiting_ids(self) -> list[int]:
        return [w.rid for w in sorted(self.waiting.values(), key=self.key)]


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.integers(1, 200),  # prompt length
            st.integers(0, 200),  # cached (clipped to the length)
            st.integers(-1, 2),  # priority
            st.floats(0.0, 0.3),  # time since the previous event
        ),
        st.tuples(st.just("admit"), st.floats(0.0, 0.5)),
        st.tuples(st.just("retire"), st.integers(0, 7)),
        st.tuples(st.just("cancel"), st.integers(0, 40)),
    ),
    min_size=20,  # long enough for requests to wait through passes
    max_size=80,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops,
    kind=st.sampled_from(list(sp.SchedulingPolicy)),
    bound=st.one_of(
        st.tuples(st.just("steps"), st.integers(0, 4)),
        st.tuples(st.just("seconds"), st.floats(0.0, 1.0)),
    ),
    capacity=st.integers(1, 4),
    est=st.sampled_from([0.0, 0.01, 0.05, 0.2]),
)
def test_both_ledgers_follow_the_model(ops, kind, bound, capacity, est):
    limits = StepPlannerLimits(capacity, 200, 16, max_step_tokens=128)  # chunks under 200
    policy = policy_of(kind, limits)
    steps, seconds = (bound[1], None) if bound[0] == "steps" else (None, bound[1])
    kwargs: dict = {"admission": UNCACHED, "max_waiting": 100}
    kwargs["starvation_steps" if steps is not None else "starvation_seconds"] = bound[1]
    if kind in (sp.SchedulingPolicy.EDF, sp.SchedulingPolicy.DEADLINE):
        # A fixed estimate, and every class protected from relegation (the model has none).
        kwargs.update(slo_classes=MODEL_CLASSES, step_time=(est, 0.0))
        kwargs.update(never_relegate_below=2**31 - 1)
    ledgers = [m.Ledger(limits, policy, **kwargs) for m in (_compiled, _ledger_py) if m]
    model = Model(capacity, kind, steps, seconds, est, policy.max_chunk_tokens)
    now, next_id = 0.0, 0
    for op in ops:
        if op[0] == "submit":
            _, length, cached, prio, dt = op
            now += dt
            cached = min(cached, length)
            for ledger in ledgers:
                ledger.submit(next_id, length, prio, cached_tokens=cached, arrival_time=now)
            model.submit(next_id, length, cached, prio, now)
            next_id += 1
        elif op[0] == "admit":
            now += op[1]
            got = [ledger.admit(now=now) for ledger in ledgers]
            expected = model.admit(now)
            assert all(g == expected for g in got), (got, expected)
        elif op[0] == "retire":
            if model.residents:
                rid = model.residents.pop(op[1] % len(model.residents))
                for ledger in ledgers:
                    ledger.retire([rid])
        elif op[1] in model.waiting:
            del model.waiting[op[1]]
            for ledger in ledgers:
                ledger.cancel(op[1])
        for ledger in ledgers:
            assert ledger.waiting_ids() == model.waiting_ids()
            rows = ledger.residents
            assert sorted(ledger.request_ids.tolist()) == sorted(model.residents)
            assert len(set(rows["arrival"].tolist())) == len(rows)
    if len(ledgers) == 2:
        assert np.array_equal(ledgers[0].residents, ledgers[1].residents)
        assert ledgers[0].request_ids.tolist() == ledgers[1].request_ids.tolist()
