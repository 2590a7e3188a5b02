"""The ledger's boundary with Python code, on both ledgers: only a real StepPlan is applied and
every row it names is checked against the table; no view of the ledger's state, nor any array it
views, can be made writable; a call that runs caller code (``__array__``, ``__index__``, a
Mapping's ``__getitem__``, an iterator, a planner) refuses a nested call instead of working from
state read before that code ran. Crashes and hangs are reproduced in a subprocess with a timeout.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Mapping

import numpy as np
import pytest

from stepplanner import (
    SEQUENCE_DTYPE,
    SchedulingOptions,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner._core_py import StepPlan as ReferencePlan
from stepplanner._errors import StepPlannerRuntimeError

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16)
POLICY = resolve_scheduling_policy(SchedulingOptions(), LIMITS)
REENTERED = "Ledger re-entered"


@pytest.fixture
def make(ledger_impl):
    def build(**kw):
        return (ledger_impl.Ledger(LIMITS, POLICY, **kw), ledger_impl.StepPlanner(POLICY, LIMITS))

    return build


def _state(ledger) -> tuple:
    return (
        ledger.to_records(),
        ledger.waiting_ids(),
        ledger.waiting,
        ledger.output_tokens.tolist(),
        ledger.finished_ids.tolist(),
    )


def _run(code: str, impl: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STEPPLANNER_IMPL=impl)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- 1. only a real StepPlan, every row in range ------------------------------------------------


class DuckPlan:
    """Everything the ledger once read from a plan, and no StepPlan."""

    num_prefill = 0

    def __init__(self, resident: int, num_residents: int = 1) -> None:
        self.num_residents = num_residents
        self.seq = np.zeros(1, dtype=SEQUENCE_DTYPE)
        self.seq["resident"] = resident
        self.seq["select_last_token_logits"] = True

    def as_array(self):
        return self.seq

    def paused_array(self):
        return np.zeros(0, np.int32)

    def apply_to(self, rows) -> None:
        pass


class ForgedPlan(ReferencePlan):
    """A StepPlan subclass whose rows name a resident the ledger does not have and whose
    apply_to checks nothing."""

    def __init__(self, resident: int, num_residents: int, rows: int = 1) -> None:
        super().__init__()
        self._num_residents = num_residents
        self.seq = np.zeros(rows, dtype=SEQUENCE_DTYPE)
        self.seq["resident"] = resident
        self.seq["select_last_token_logits"] = True

    def as_array(self):
        return self.seq

    def apply_to(self, residents) -> None:
        pass


def test_a_duck_typed_plan_is_refused(make) -> None:
    ledger, _ = make()
    ledger.submit(1, 10)
    ledger.admit()
    before = _state(ledger)
    for resident in (0, 10**8):
        with pytest.raises(TypeError, match="plan must be a StepPlan, got DuckPlan"):
            ledger.apply(DuckPlan(resident))
    assert _state(ledger) == before


@pytest.mark.parametrize("resident", [1, 3])  # rows the table has memory for; far ones below
def test_a_plan_row_outside_the_table_is_refused(make, resident) -> None:
    ledger, _ = make()
    ledger.submit(1, 10)
    ledger.admit()
    before = _state(ledger)
    with pytest.raises(
        ValueError,
        match=rf"plan.sequences\[0\].resident={resident} is out of "
        r"range; allowed: 0..0",
    ):
        ledger.apply(ForgedPlan(resident, num_residents=1))
    assert _state(ledger) == before


def test_a_plan_with_more_rows_than_residents_is_refused(make) -> None:
    ledger, _ = make()
    ledger.submit(1, 10)
    ledger.admit()
    before = _state(ledger)
    with pytest.raises(ValueError, match=r"plan.num_sequences=3 is out of range; allowed: 0..1"):
        ledger.apply(ForgedPlan(0, num_residents=1, rows=3))
    assert _state(ledger) == before


def test_applying_a_reference_plan_still_works(make) -> None:
    # The compiled ledger applies the twin's plans too (a view of their rows as the C struct).
    ledger, planner = make()
    ledger.submit(1, 10, max_new_tokens=1)
    ledger.admit()
    plan = planner.plan(ledger.residents)
    forged = ForgedPlan(0, num_residents=1)
    forged.seq = plan.as_array().copy()
    assert ledger.apply(forged).tolist() == [1]


@pytest.mark.parametrize("impl", ["compiled", "python"])
@pytest.mark.parametrize("resident", [10**8, -1])
@pytest.mark.parametrize("kind", ["duck", "subclass"])
def test_a_far_plan_row_does_not_crash(impl, resident, kind) -> None:
    # Once a segfault (rc=-11): the compiled ledger counted a token at row 10**8 (or -1).
    result = _run(
        f"""
        import numpy as np, stepplanner as sp
        from stepplanner import SEQUENCE_DTYPE
        from stepplanner._core_py import StepPlan
        from stepplanner.ledger import Ledger
        led = Ledger(sp.StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16))
        led.submit(1, 10); led.admit()
        seq = np.zeros(1, dtype=SEQUENCE_DTYPE)
        seq["resident"] = {resident}
        seq["select_last_token_logits"] = True
        class Duck:
            num_residents, num_prefill = 1, 0
            def as_array(self): return seq
            def paused_array(self): return np.zeros(0, np.int32)
            def apply_to(self, rows): pass
        class Forged(StepPlan):
            num_residents = 1
            def as_array(self): return seq
            def apply_to(self, rows): pass
        plan = Duck() if "{kind}" == "duck" else Forged()
        try:
            led.apply(plan)
        except (TypeError, ValueError) as e:
            print("refused", type(e).__name__, e)
        print("tokens", led.output_tokens.tolist())
    """,
        impl,
    )
    assert result.returncode == 0, result.stderr
    expected = (
        "refused StepPlannerTypeError plan must be a StepPlan"
        if kind == "duck"
        else f"refused StepPlannerValueError plan.sequences[0].resident={resident} is out"
    )
    assert expected in result.stdout
    assert "tokens [0]" in result.stdout


# --- 2. no writable view of the ledger's state ---------------------------------------------------


READ_ONLY_VIEWS = (
    "request_ids",
    "output_tokens",
    "finished_ids",
    "admitted_ids",
    "relegated_ids",
    "shed_ids",
)


def _busy_ledger(make):
    ledger, planner = make()
    for rid in range(6):
        ledger.submit(rid, 10, max_new_tokens=1)
    plan = ledger.step(planner)
    ledger.step(planner, np.ones(len(plan.sequences), dtype=bool))  # finishes, retires, admits
    assert ledger.count and len(ledger.finished_ids) and len(ledger.admitted_ids)
    return ledger


@pytest.mark.parametrize("name", READ_ONLY_VIEWS)
def test_no_view_of_the_ledger_state_can_be_made_writable(
    make, ledger_impl, assert_unwritable, name
) -> None:
    ledger = _busy_ledger(make)
    before = _state(ledger), ledger.request_ids.tolist(), ledger.admitted_ids.tolist()
    assert_unwritable(getattr(ledger, name), compiled=ledger_impl.name == "compiled")
    assert (_state(ledger), ledger.request_ids.tolist(), ledger.admitted_ids.tolist()) == before


def test_no_referent_of_the_compiled_ledger_is_writable_memory(compiled, assert_unwritable) -> None:
    """``gc.get_referents`` reaches every object field of the cdef class (and the view caches):
    apart from the residents table, which is writable by design and checked before use, none may
    be memory the C indexes by that Python could write."""
    from stepplanner.ledger._ledger import Ledger

    ledger = Ledger(LIMITS, POLICY)
    for rid in range(6):
        ledger.submit(rid, 10, max_new_tokens=1)
    plan = ledger.step(compiled.StepPlanner(POLICY, LIMITS))
    for name in READ_ONLY_VIEWS:  # fills the view caches
        getattr(ledger, name)
    found = memories = 0
    for ref in gc.get_referents(ledger):
        for item in ref if isinstance(ref, (list, tuple)) else [ref]:
            if isinstance(item, np.ndarray) and item.dtype != ledger.residents.dtype:
                found += 1
                assert_unwritable(item, compiled=True)
            elif not isinstance(item, np.ndarray):
                try:
                    exported = memoryview(item)
                except TypeError:
                    continue
                # The memory itself (ids, output counts, finished, admitted): read-only to
                # Python; only the residents' memory is writable, by design.
                if not exported.readonly:
                    assert item is ledger.residents.base.obj
                memories += exported.readonly
    assert found >= len(READ_ONLY_VIEWS) and memories == len(READ_ONLY_VIEWS)
    assert plan.num_residents == ledger.count


@pytest.mark.parametrize("impl", ["compiled", "python"])
def test_id_churn_after_trying_to_overwrite_an_id_terminates(impl) -> None:
    # Once a hang: an id overwritten through request_ids.base leaked its id-map key at each
    # retire until the map was full and every probe spun.
    result = _run(
        """
        import numpy as np, stepplanner as sp
        from stepplanner.ledger import Ledger
        led = Ledger(sp.StepPlannerLimits(max_batch_size=1, max_input_length=64,
                                          kv_page_size=16), max_waiting=1)
        refused = 0
        for k in range(50):
            led.submit(k, 10); led.admit()
            ids = led.request_ids
            if isinstance(ids.base, np.ndarray):
                ids = ids.base
            try:
                ids.flags.writeable = True
                ids[0] = 10**6 + k
            except ValueError:
                refused += 1
            led.retire_rows([0])
        print("refused", refused, "count", led.count, "waiting", led.waiting)
    """,
        impl,
    )
    assert result.returncode == 0, result.stderr
    assert "refused 50 count 0 waiting 0" in result.stdout


# --- 3. re-entry -----------------------------------------------------------------------------


def _four_residents(make):
    ledger, planner = make()
    for rid in range(4):
        ledger.submit(rid, 10)
    ledger.admit()
    return ledger, planner


def test_retire_rows_refuses_a_nested_call_from_array(make) -> None:
    ledger, _ = _four_residents(make)
    before = _state(ledger)

    class Rows:
        def __array__(self, dtype=None, copy=None):
            ledger.retire_rows([2, 3])  # count 4 -> 2, were it allowed
            return np.array([3])

    with pytest.raises(StepPlannerRuntimeError, match=REENTERED):
        ledger.retire_rows(Rows())
    assert _state(ledger) == before
    # No stale mark is left behind: a later cancel removes exactly the request it names.
    ledger.submit(10, 10)
    ledger.cancel(0)
    assert sorted(ledger.request_ids.tolist()) == [1, 2, 3]
    assert ledger.waiting_ids() == [10]


def test_retire_rows_checks_rows_against_the_count_after_conversion(make) -> None:
    ledger, _ = _four_residents(make)
    seen = []

    class Rows:
        def __array__(self, dtype=None, copy=None):
            seen.append(ledger.count)  # reading is fine; nothing changed it
            return np.array([3])

    ledger.retire_rows(Rows())
    assert seen == [4] and ledger.request_ids.tolist() == [0, 1, 2]


def test_load_refuses_a_nested_submit_from_a_record(make) -> None:
    ledger, _ = make()
    before = _state(ledger)

    class Record(Mapping):
        data = {"request_id": 5, "prompt_length": 10, "arrival": 100}

        def __getitem__(self, key):
            if key == "request_id":
                ledger.submit(5, 10)  # would make id 5 both waiting and resident
            return self.data[key]

        def __iter__(self):
            return iter(self.data)

        def __len__(self):
            return len(self.data)

    with pytest.raises(StepPlannerRuntimeError, match=REENTERED):
        ledger.load([Record()])
    assert _state(ledger) == before
    ledger.submit(5, 10)
    assert ledger.admit() == [5]


class _Index:
    """An int whose ``__index__`` first runs ``hook``."""

    def __init__(self, value: int, hook) -> None:
        self.value, self.hook = value, hook

    def __index__(self) -> int:
        self.hook()
        return self.value


@pytest.mark.parametrize(
    "nested", ["submit", "cancel", "admit", "retire_finished", "retire_rows", "retire", "load"]
)
@pytest.mark.parametrize("outer", ["submit", "cancel", "retire", "retire_rows"])
def test_every_mutating_call_refuses_to_nest(make, outer, nested) -> None:
    ledger, _ = _four_residents(make)
    ledger.submit(20, 10)
    before = _state(ledger)
    nested_call = {
        "submit": lambda: ledger.submit(99, 10),
        "cancel": lambda: ledger.cancel(20),
        "admit": ledger.admit,
        "retire_finished": ledger.retire_finished,
        "retire_rows": lambda: ledger.retire_rows([0]),
        "retire": lambda: ledger.retire([1]),
        "load": lambda: ledger.load([]),
    }[nested]
    errors = []

    def hook():
        try:
            nested_call()
        except StepPlannerRuntimeError as e:  # swallowed: the outer call must still be whole
            errors.append(str(e))

    class Rows:
        def __array__(self, dtype=None, copy=None):
            hook()
            return np.array([3])

    outer_call = {
        "submit": lambda: ledger.submit(30, _Index(10, hook)),
        "cancel": lambda: ledger.cancel(_Index(3, hook)),
        "retire": lambda: ledger.retire([_Index(3, hook)]),
        "retire_rows": lambda: ledger.retire_rows(Rows()),
    }[outer]
    outer_call()
    assert len(errors) == 1 and errors[0].startswith(REENTERED)
    # Exactly the outer call's effect, nothing of the nested one's.
    after = _state(ledger)
    if outer == "submit":
        assert ledger.waiting_ids() == [20, 30] and after[0] == before[0]
    else:
        assert sorted(ledger.request_ids.tolist()) == [0, 1, 2]
        assert ledger.waiting_ids() == [20]
    ledger.admit()  # the ledger is usable afterwards: the busy flag was cleared
    assert ledger.count == 4


def test_step_refuses_a_nested_call_from_the_planner(make) -> None:
    ledger, planner = _four_residents(make)
    before = _state(ledger)

    class Meddling:
        limits = planner.limits

        def plan(self, residents, count=None, reasons=None):
            ledger.retire_rows([0])
            return planner.plan(residents, count, reasons)

    with pytest.raises(StepPlannerRuntimeError, match=REENTERED):
        ledger.step(Meddling())
    assert _state(ledger) == before
    assert ledger.step(planner).num_residents == 4


def _read_inside_plan(ledger, planner, read):
    """``read()`` from the planner's plan() during ``ledger.step``, on the loop thread and on
    another thread: each gives ``("value", v)`` or ``("refused", message)``."""
    seen = {}

    def attempt(where):
        try:
            seen[where] = ("value", read())
        except StepPlannerRuntimeError as exc:
            seen[where] = ("refused", str(exc))

    class Reading:
        limits = planner.limits

        def plan(self, residents, count=None, reasons=None):
            attempt("loop")
            other = threading.Thread(target=attempt, args=("thread",))
            other.start()
            other.join()
            return planner.plan(residents, count, reasons)

    ledger.step(Reading())
    return seen


def test_held_back_without_a_page_table_is_a_view_on_both_ledgers(make) -> None:
    # Nothing waits for pages without a page table: the compiled ledger answered 0 without its
    # lock, the twin raised "Ledger re-entered"; both answer as reserved_pages does now.
    ledger, planner = _four_residents(make)
    ledger.submit(9, 10)
    seen = _read_inside_plan(ledger, planner, lambda: (ledger.held_back, ledger.reserved_pages))
    assert seen == {"loop": ("value", (0, 0)), "thread": ("value", (0, 0))}


def test_held_back_with_a_page_table_is_a_loop_call_on_both_ledgers(paged_impl) -> None:
    table = paged_impl.KVPageTable(LIMITS.max_batch_size, 8, 16, LIMITS.kv_page_size)
    ledger = paged_impl.Ledger(LIMITS, POLICY, page_table=table)
    ledger.submit(1, 10, max_new_tokens=4)
    seen = _read_inside_plan(
        ledger, paged_impl.StepPlanner(POLICY, LIMITS), lambda: ledger.held_back
    )
    assert [kind for kind, _ in seen.values()] == ["refused", "refused"]
    assert all(message.startswith(REENTERED) for _, message in seen.values())


def test_apply_refuses_a_nested_call_from_a_plan_subclass(make) -> None:
    ledger, planner = _four_residents(make)
    plan = planner.plan(ledger.residents)

    class Meddling(ForgedPlan):
        def as_array(self):
            ledger.retire_rows([0, 1, 2])  # would leave rows 1..3 of the plan outside the table
            return self.seq

    forged = Meddling(0, num_residents=4)
    forged.seq = plan.as_array().copy()
    before = _state(ledger)
    with pytest.raises(StepPlannerRuntimeError, match=REENTERED):
        ledger.apply(forged)
    assert _state(ledger) == before
