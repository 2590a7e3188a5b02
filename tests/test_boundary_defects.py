"""The boundary around the kernel: plan buffers Python cannot write, plans and views that are
whole from birth, re-entrant plan(), apply_to's row checks, copying and pickling plans, and real
type checks. Each test runs on both implementations; a defect that crashed the interpreter is
exercised in a subprocess, so that a regression fails the test instead of killing pytest."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from stepplanner import (
    RESIDENT_DTYPE,
    IfbSchedulingMode,
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    SequenceWork,
    StepPlannerLimits,
    ledger,
    resolve_scheduling_policy,
)
from stepplanner.planner import _fields, _types, checks
from stepplanner.testing import as_resident_array, as_resident_states

ROWS = [
    (0, 0, 40, 41, True, 0),
    (0, 1, 60, 0, False, 0),
    (0, 2, 20, 0, False, 0),
    (0, 3, 50, 16, False, 0),
]
OTHER = [(0, 0, 8, 0, False, 0), (0, 1, 5, 5, True, 0)]
# Resident 2 (priority 1) is paused behind the pending prompt of priority 0.
PAUSING_ROWS = [(0, 0, 40, 0, False, 0), (0, 1, 5, 5, True, 0), (1, 2, 7, 7, True, 0)]
PAUSING = dict(
    ifb_scheduling_mode=IfbSchedulingMode.MIXED,
    scheduling_policy=SchedulingPolicy.PRIORITY,
    preemption=PreemptionMode.PAUSE,
)


# Budget 52 and chunk cap 32: ROWS plan to chunks of both kinds and a decode row.
MIXED = dict(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=52, max_chunk_tokens=32)


@pytest.fixture
def planner(make_planner):
    return make_planner(4, 64, 16, **MIXED)


def run_snippet(core, *bodies: str) -> subprocess.CompletedProcess:
    """Run ``bodies`` in a fresh interpreter with ``core`` imported as ``core``; a crash there is
    a negative return code here, not a dead test run."""
    prelude = textwrap.dedent(f"""
        import numpy as np
        import stepplanner as sp
        from stepplanner.testing import as_resident_array, as_resident_states
        import {core.__name__} as core
        LIMITS = sp.StepPlannerLimits(64, 64, 16)
        def make_planner(**options):
            policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(**options), LIMITS)
            return core.StepPlanner(policy, LIMITS)
        PAUSING = dict(ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED,
                       scheduling_policy=sp.SchedulingPolicy.PRIORITY,
                       preemption=sp.PreemptionMode.PAUSE)
        def decoding(n):
            return as_resident_array([(0, i, 4, 4, True, 0) for i in range(n)])
    """)
    code = prelude + "".join(textwrap.dedent(body) for body in bodies)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def objects(core, rows):
    """``rows`` as a list of ``core``'s ResidentState."""
    return as_resident_states(rows, core.ResidentState)


def assert_ran(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    for text in expected:
        assert text in result.stdout, (text, result.stdout, result.stderr[-3000:])


# --- 1. the plan's buffers cannot be written from Python ------------------------------------


def test_plan_arrays_cannot_be_made_writable(core, make_planner):
    plan = make_planner(4, 64, 16, **PAUSING).plan(as_resident_array(PAUSING_ROWS))
    assert len(plan.paused_array()) == 1
    for array in (plan.as_array(), plan.paused_array(), plan.copy().as_array()):
        assert not array.flags.writeable
        owner = array
        while isinstance(owner, np.ndarray):  # nor any array it views
            with pytest.raises(ValueError, match="WRITEABLE"):
                owner.flags.writeable = True
            with pytest.raises(ValueError):
                owner[...] = 0 if owner.dtype.names is None else owner[...]
            owner = owner.base
        if owner is not None:
            with pytest.raises((BufferError, TypeError)):
                memoryview(owner).cast("B")[0] = 1


def test_plan_memory_refuses_a_negative_size(compiled):
    owner = compiled.StepPlan().copy().as_array()
    while isinstance(owner, np.ndarray):
        owner = owner.base
    owner = owner.obj  # numpy keeps the buffer's memoryview; the memory is its exporter
    with pytest.raises(ValueError, match="size=-1 is out of range"):
        type(owner)(-1)
    assert memoryview(type(owner)(8)).readonly


def test_writable_flag_then_huge_resident_does_not_crash(core):
    # The crash this guards against: the flag flipped, resident 50,000,000 written, apply_to.
    result = run_snippet(
        core,
        """
        planner = make_planner()
        rows = decoding(4)
        plan = planner.plan(rows)
        v = plan.as_array()
        try:
            v.flags.writeable = True
            v["resident"][0] = 50_000_000
        except ValueError as e:
            print("refused:", e)
        plan.apply_to(rows)
        print("applied", rows["committed"].tolist())
    """,
    )
    assert_ran(result, "refused: cannot set WRITEABLE flag", "applied [5, 5, 5, 5]")


# Writes a bad value into a plan the way a stray pointer (or ctypes) would.
CORRUPT = """
    import ctypes
    def corrupt(plan, what, index, value):
        if core.IMPLEMENTATION == "python":
            if what == "paused":
                plan._paused[index] = value
            else:
                plan._rows[index] = plan._rows[index]._replace(**{what: value})
            return
        array = plan.paused_array() if what == "paused" else plan.as_array()
        offset = 0 if what == "paused" else array.dtype.fields[what][1]
        address = array.ctypes.data + index * array.itemsize + offset
        ctypes.c_int32.from_address(address).value = value
"""

CORRUPTIONS = [
    (
        "resident",
        0,
        50_000_000,
        "plan.sequences[0].resident=50000000 is out of range; allowed: 0..2",
    ),
    ("resident", 1, -1, "plan.sequences[1].resident=-1 is out of range; allowed: 0..2"),
    ("work", 0, 100_000, "plan.sequences[0].work=100000 is out of range; allowed: 0..1"),
    (
        "query_length",
        1,
        -3,
        "plan.sequences[1].query_length=-3 is out of range; allowed: 0..2147483647",
    ),
    ("paused", 0, 1 << 30, "plan.paused[0]=1073741824 is out of range; allowed: 0..2"),
]


def test_apply_to_checks_every_plan_row(core):
    # Before the check, the compiled apply_to wrote wherever the corrupt row pointed.
    result = run_snippet(
        core,
        CORRUPT,
        f"""
        planner = make_planner(**PAUSING)
        for what, index, value, _ in {CORRUPTIONS!r}:
            for as_array in (True, False):
                rows = as_resident_array({PAUSING_ROWS!r})
                if not as_array:
                    rows = as_resident_states(rows, core.ResidentState)
                plan = planner.plan(rows).copy()
                corrupt(plan, what, index, value)
                try:
                    plan.apply_to(rows)
                    print("applied", what)
                except ValueError as e:
                    print("refused:", e)
                table = rows if as_array else [r._astuple() for r in rows]
                print("unchanged" if as_resident_array(table).tolist()
                      == as_resident_array({PAUSING_ROWS!r}).tolist() else "CHANGED")
    """,
    )
    assert_ran(result, *(f"refused: {message}" for *_, message in CORRUPTIONS))
    assert result.stdout.count("unchanged") == 2 * len(CORRUPTIONS)
    assert "applied" not in result.stdout and "CHANGED" not in result.stdout


def test_apply_to_checks_the_container_before_the_plan(core):
    # The same error in both implementations when both are wrong (parity of the check order).
    result = run_snippet(
        core,
        CORRUPT,
        """
        plan = make_planner().plan(decoding(2)).copy()
        corrupt(plan, "resident", 0, 99)
        for target in ({}, decoding(2)):
            try:
                plan.apply_to(target)
            except (TypeError, ValueError) as e:
                print(type(e).__name__.removeprefix("StepPlanner"), str(e)[:40])
    """,
    )
    assert_ran(
        result,
        "TypeError residents must be a list or tuple",
        "ValueError plan.sequences[0].resident=99 is out o",
    )


def test_corrupt_plan_rows_raise_in_a_subprocess(core):
    # Before the check, apply_to wrote at resident 50,000,000 and read work 100,000's pointer.
    result = run_snippet(
        core,
        CORRUPT,
        """
        rows = decoding(4)
        for field, value in (("resident", 50_000_000), ("work", 100_000)):
            plan = make_planner().plan(rows).copy()
            corrupt(plan, field, 0, value)
            try:
                plan.apply_to(rows)
            except ValueError as e:
                print("refused:", e)
            try:
                plan.sequences[0]
                plan.to_dict()
            except ValueError as e:
                print("view refused:", e)
    """,
    )
    assert_ran(
        result,
        "refused: plan.sequences[0].resident=50000000",
        "refused: plan.sequences[0].work=100000",
    )


# --- 2. plans and views are whole from birth; the kernel loop checks its rows ----------------


def test_reinitialising_the_planners_plan_leaves_it_whole(core):
    result = run_snippet(
        core,
        """
        planner = make_planner()
        rows = decoding(64)
        plan = planner.plan(rows)
        plan.__init__()
        print("reset", plan.num_residents, len(plan.sequences), plan.to_dict()["total_tokens"])
        again = planner.plan(rows)
        print("again", again is plan, len(again.sequences), len(again.as_array()),
              again.as_array()["resident"].tolist() == list(range(64)))
    """,
    )
    assert_ran(result, "reset 0 0 0", "again True 64 64 True")


def test_reinitialised_plan_equals_a_new_one(core):
    result = run_snippet(
        core,
        """
        planner = make_planner()
        plan = planner.plan(decoding(3))
        plan.__init__()
        print("empty", plan == core.StepPlan(), len(plan.as_array()), len(plan.paused_array()))
        print("again", planner.plan(decoding(4)) is plan, len(plan.as_array()))
    """,
    )
    assert_ran(result, "empty True 0 0", "again True 4")


def test_views_need_a_plan(core):
    result = run_snippet(
        core,
        """
        plan = make_planner().plan(decoding(3))
        for view in (plan.sequences, plan.paused):
            kind = type(view)
            for args in ((), (None,), (42,)):
                try:
                    bare = kind.__new__(kind, *args)
                    print("made", len(bare), list(bare))
                except TypeError as e:
                    print("TypeError", type(view).__name__, len(args))
        print("done")
    """,
    )
    assert_ran(result, "done")
    assert "made" not in result.stdout
    assert result.stdout.count("TypeError") == 6


def test_plans_made_with_new_are_empty_plans(core):
    result = run_snippet(
        core,
        """
        plan = core.StepPlan.__new__(core.StepPlan)
        print("views", len(plan.sequences), list(plan.paused), plan.num_residents)
        print("arrays", len(plan.as_array()), len(plan.paused_array()), plan == core.StepPlan())
        plan.apply_to([])
        print("copies", plan.copy() == plan, plan.to_dict()["sequences"])
    """,
    )
    assert_ran(result, "views 0 [] 0", "arrays 0 0 True", "copies True []")


def test_kernel_loop_checks_the_rows_it_reruns(compiled):
    # A planner whose plan() does nothing left the previous call's row count for a shorter
    # array: time_kernel_loop must plan with the real plan() and check the length again.
    result = run_snippet(
        compiled,
        """
        class Lazy(core.StepPlanner):
            def plan(self, residents, count=None, reasons=None):
                return None
        base = make_planner()
        lazy = Lazy(base.policy, base.limits)
        core.StepPlanner.plan(lazy, decoding(64))
        short = decoding(1)
        print("ns", core.time_kernel_loop(lazy, short, iterations=10) > 0,
              lazy.plan(short) is None, core.StepPlanner.plan(lazy, short).num_residents)
        try:
            lazy._run_kernel_loop(decoding(2)[:1], 10)
        except AttributeError:
            print("no python entry")
    """,
    )
    assert_ran(result, "ns True True 1", "no python entry")


# --- 3. plan() is not re-entrant -------------------------------------------------------------


class Reentering(list):
    """A ledger whose __getitem__ calls plan() on the planner that is reading it."""

    def __init__(self, rows, planner, inner, swallow=False):
        super().__init__(rows)
        self.planner, self.inner, self.swallow, self.errors = planner, inner, swallow, []

    def __getitem__(self, index):
        if index == 1 and self.inner is not None:
            inner, self.inner = self.inner, None
            try:
                self.planner.plan(inner)
            except RuntimeError as exc:
                self.errors.append(str(exc))
                if not self.swallow:
                    raise
        return super().__getitem__(index)


def test_reentrant_plan_raises(core, make_planner, planner):
    planner.plan(objects(core, OTHER))
    before = planner.plan(objects(core, OTHER)).to_dict()
    ledger_rows = Reentering(objects(core, ROWS), planner, objects(core, [(0, 0, 64, 0, False, 0)]))
    with pytest.raises(RuntimeError, match="re-entered"):
        planner.plan(ledger_rows)
    assert planner.plan(objects(core, OTHER)).to_dict() == before  # nothing half-planned
    # And the planner works normally afterwards (the guard was released).
    fresh = make_planner(4, 64, 16, **MIXED)
    assert planner.plan(objects(core, ROWS)) == fresh.plan(objects(core, ROWS))


def test_reentry_swallowed_by_the_ledger_still_plans_the_callers_rows(core, make_planner, planner):
    # The case: a decoding resident first, then a prompt; the inner call must not
    # replace the outer call's rows (it once planned a 64-token chunk for the decoding row).
    rows = [(0, 0, 41, 41, True, 0), (0, 1, 60, 0, False, 0)]
    ledger_rows = Reentering(
        objects(core, rows), planner, objects(core, [(0, 0, 64, 0, False, 0)]), swallow=True
    )
    plan = planner.plan(ledger_rows)
    assert len(ledger_rows.errors) == 1 and "re-entered" in ledger_rows.errors[0]
    assert repr(plan).endswith("sequences=[(1,CONTEXT,0,32,F) (0,DECODE,41,1,T)], paused=[])")
    fresh = make_planner(4, 64, 16, **MIXED)
    assert plan == fresh.plan(objects(core, rows))


class Replanning(list):
    """Residents whose __iter__ (run by apply_to's read) calls plan() on the owning planner."""

    def __init__(self, rows, planner, other):
        super().__init__(rows)
        self.planner, self.other = planner, other

    def __iter__(self):
        self.planner.plan(self.other)
        return super().__iter__()


def test_apply_to_refuses_a_plan_replaced_while_it_reads_the_residents(core, planner):
    # A nested plan() once made apply_to apply the other residents' plan to the caller's rows.
    mine = Replanning(
        objects(core, [(0, 0, 10, 10, True, 0), (0, 1, 10, 10, True, 0)]),
        planner,
        objects(core, [(0, 0, 64, 0, False, 0)]),
    )
    plan = planner.plan(list(mine))
    with pytest.raises(RuntimeError, match=r"apply_to\(\) saw its plan replaced"):
        plan.apply_to(mine)
    assert [r.committed for r in list.__iter__(mine)] == [10, 10]  # nothing written
    # A copy is the caller's own: the same list applies it, once, as planned.
    mine.other = objects(core, [(0, 0, 64, 0, False, 0)])
    kept = planner.plan(list(mine)).copy()
    kept.apply_to(mine)
    assert [r.committed for r in list.__iter__(mine)] == [11, 11]


# --- 4. apply_to: a row that went negative since plan() ------------------------------------


@pytest.mark.parametrize("as_array", [True, False])
@pytest.mark.parametrize(
    ("field", "value"),
    [("committed", -5), ("committed", -(2**31)), ("consecutive_paused_steps", -1)],
)
def test_apply_to_rejects_negative_counters_like_plan(core, planner, as_array, field, value):
    rows = as_resident_array(ROWS) if as_array else objects(core, ROWS)
    plan = planner.plan(rows).copy()
    if as_array:
        rows[1][field] = value
        before = rows.copy()
    else:
        setattr(rows[1], field, value)
        before = as_resident_array([r._astuple() for r in rows])
    with pytest.raises(ValueError) as info:
        plan.apply_to(rows)
    assert str(info.value) == f"residents[1].{field}={value} is negative; allowed: >= 0"
    after = rows if as_array else as_resident_array([r._astuple() for r in rows])
    assert after.tolist() == before.tolist()


def test_apply_to_overflow_is_still_an_overflow(core, planner):
    rows = objects(core, ROWS)
    plan = planner.plan(rows).copy()
    rows[1].committed = 2**31 - 10
    rows[1].prompt_length = 2**31 - 1
    with pytest.raises(OverflowError, match=r"residents\[1\]\.committed=2147483638 \+ 32"):
        plan.apply_to(rows)


# --- a resident listed twice: refused by plan() and apply_to(), on both --------------------


NEAR_MAX = (0, 0, 10, 2**31 - 2, True, 0)


def test_plan_refuses_the_same_resident_object_twice(core, planner):
    before = planner.plan(objects(core, OTHER)).copy()
    a, b = objects(core, [NEAR_MAX, (0, 1, 5, 5, True, 0)])
    with pytest.raises(ValueError) as info:
        planner.plan([a, b, a])
    assert str(info.value).startswith("residents[0] and residents[2] are the same ResidentState")
    assert planner.plan(objects(core, OTHER)) == before


def test_apply_to_refuses_the_same_resident_object_twice(core, planner):
    # The compiled core once checked each row alone (2**31-2 + 1 fits), then added twice:
    # committed wrapped to -2**31 (signed overflow) while the reference kept 2**31-1.
    a, b = objects(core, [NEAR_MAX, (0, 1, 10, 2**31 - 2, True, 0)])
    plan = planner.plan([a, b]).copy()
    with pytest.raises(ValueError, match=r"^residents\[0\] and residents\[1\] are the same"):
        plan.apply_to([a, a])
    assert a.committed == 2**31 - 2 and b.committed == 2**31 - 2
    plan.apply_to((a, b))
    assert (a.committed, b.committed) == (2**31 - 1, 2**31 - 1)


@pytest.mark.parametrize("stride", [0, 16, -16])
def test_array_rows_that_overlap_are_refused(core, planner, stride):
    base = as_resident_array([NEAR_MAX, (0, 1, 10, 2**31 - 2, True, 0)])
    overlapping = np.lib.stride_tricks.as_strided(
        base[1:] if stride < 0 else base, shape=(2,), strides=(stride,)
    )
    assert overlapping.flags.writeable
    message = (
        rf"^residents\[0\] and residents\[1\] share memory \(array strides\[0\]"
        rf"={stride}, rows of {RESIDENT_DTYPE.itemsize} bytes\)"
    )
    with pytest.raises(ValueError, match=message):
        planner.plan(overlapping)
    plan = planner.plan(base).copy()
    before = base.copy()
    with pytest.raises(ValueError, match=message):
        plan.apply_to(overlapping)
    assert base.tolist() == before.tolist()
    planner.plan(overlapping, count=1)  # one row cannot overlap another


def test_reversed_arrays_and_fresh_objects_are_not_duplicates(core, planner, make_planner):
    rows = as_resident_array(ROWS)
    fresh = make_planner(4, 64, 16, **MIXED)
    assert planner.plan(rows[::-1]) == fresh.plan(rows[::-1].copy())

    class Fresh(list):
        """A new ResidentState per read: freed before the next, often at the same address."""

        def __getitem__(self, index):
            return core.ResidentState(*super().__getitem__(index))

    assert planner.plan(Fresh(ROWS)) == fresh.plan(objects(core, ROWS))


# --- 5. copy, deepcopy and pickle --------------------------------------------------------------


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle", "method"])
def test_plans_copy_and_pickle_as_independent_snapshots(core, make_planner, how):
    planner = make_planner(4, 64, 16, **PAUSING)
    rows = as_resident_array(PAUSING_ROWS)
    plan = planner.plan(rows)
    snapshot = plan.to_dict()
    take = {
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
        "method": lambda p: p.copy(),
        "pickle": lambda p: pickle.loads(pickle.dumps(p)),
    }[how]
    kept = take(plan)
    assert type(kept) is core.StepPlan and kept is not plan
    assert kept == plan and kept.to_dict() == snapshot
    assert kept.num_residents == 3 and list(kept.paused) == [2]
    assert kept.as_array().tolist() == plan.as_array().tolist()
    planner.plan(as_resident_array(OTHER))
    assert kept.to_dict() == snapshot and kept != plan
    kept.apply_to(rows)
    assert rows["committed"].tolist() == [40, 6, 7]
    assert rows["consecutive_paused_steps"].tolist() == [0, 0, 1]


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, lambda v: pickle.loads(pickle.dumps(v))])
def test_views_copy_and_pickle_as_the_items_they_show(core, make_planner, how):
    plan = make_planner(4, 64, 16, **PAUSING).plan(as_resident_array(PAUSING_ROWS))
    sequences, paused = how(plan.sequences), how(plan.paused)
    assert sequences == list(plan.sequences) and paused == [2]
    assert type(sequences) is list and type(sequences[0]) is core.PlannedSequence


@pytest.mark.parametrize(
    "how", [copy.copy, copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p, protocol=2))]
)
def test_empty_plans_copy(core, how):
    empty = core.StepPlan()
    assert how(empty) == empty and how(empty).num_residents == 0


def test_unpickling_checks_the_rows(core):
    plan = core.StepPlan()
    restore, args = plan.__reduce__()[:2]
    assert restore.__module__ == core.__name__  # the twin pickled by its attributes before
    bad = ([(9, 0, 0, 4, True)], [], 2)
    with pytest.raises(ValueError, match=r"plan.sequences\[0\].resident=9 is out of range"):
        restore(*bad)
    with pytest.raises(ValueError, match=r"plan.sequences\[0\].work=7"):
        restore([(0, 7, 0, 4, True)], [], 2)
    with pytest.raises(OverflowError):
        restore([(0, 0, 2**40, 4, True)], [], 2)
    with pytest.raises(
        ValueError,
        match=r"plan.paused\[0\]=0 names the resident "
        r"plan.sequences\[0\].resident names already",
    ):
        restore([(0, 1, 4, 1, False)], [0], 2)
    assert restore(*args) == plan


# Each a (sequences, paused, num_residents) a pickle could hold: both twins restore it or refuse
# it alike.
RESTORED = [
    ([(1, 0, 0, 8, True), (0, 1, 5, 1, True)], [2], 3),
    ([], [], 0),
    ([(0, 1, 5, 1, True)], [], -1),
    ([(0, 1, 5, 1, True), (1, 1, 5, 1, True)], [], 1),
    ([(0, 1, 5, 1, True), (1, 0, 0, 8, True)], [], 2),
    ([(0, 0, 0, 8, 2)], [], 1),
    ([(0, 0, 0, 8, True)], [1.5], 2),
    ([(0, 0, 0, 2**31 - 1, True), (1, 1, 9, 1, True)], [], 2),
    ([(0, 0, 0, -3, True)], [], 1),
    ([(0, 1, 5, 1, True), (0, 1, 6, 1, True)], [], 2),
]


@pytest.mark.parametrize("args", RESTORED)
def test_unpickling_is_the_same_on_both_twins(compiled, reference, args):
    outcomes = []
    for core in (compiled, reference):
        try:
            outcomes.append(core.StepPlan.__reduce__(_restore(core, args))[1])
        except (TypeError, ValueError, OverflowError) as exc:
            outcomes.append((type(exc).__name__, str(exc)))
    assert outcomes[0] == outcomes[1]


def _restore(core, args):
    return core.StepPlan().__reduce__()[0](*args)


def test_pickles_of_one_plan_are_the_same_on_both_twins(compiled, reference):
    limits = StepPlannerLimits(4, 64, 16)
    policy = resolve_scheduling_policy(SchedulingOptions(**PAUSING), limits)
    rows = as_resident_array(PAUSING_ROWS)
    plans = [core.StepPlanner(policy, limits).plan(rows) for core in (compiled, reference)]
    reduced = [plan.__reduce__() for plan in plans]
    assert reduced[0][1] == reduced[1][1] == (plans[0].as_array().tolist(), [2], 3)
    for core, plan in zip((compiled, reference), plans):
        back = pickle.loads(pickle.dumps(plan))
        assert type(back) is core.StepPlan and back == plan and back.to_dict() == plan.to_dict()


# --- design: one definition of the resident fields; real type checks -------------------------


def test_resident_fields_have_one_definition(core):
    names = (
        "priority",
        "arrival",
        "prompt_length",
        "committed",
        "context_committed",
        "consecutive_paused_steps",
    )
    assert _types.RESIDENT_FIELDS == names == RESIDENT_DTYPE.names
    assert ledger.RESIDENT_FIELDS is _types.RESIDENT_FIELDS
    assert checks._Row._fields == names
    assert tuple(core.ResidentState(*range(1, 5), True, 6)._astuple()) == (1, 2, 3, 4, True, 6)


def test_equality_is_by_type_not_by_class_name(core, planner):
    plan = planner.plan(objects(core, ROWS))
    resident = core.ResidentState(*ROWS[0])

    class StepPlan:
        def to_dict(self):
            return plan.to_dict()

    class ResidentState:
        def _astuple(self):
            return resident._astuple()

    assert plan != StepPlan() and resident != ResidentState()
    other = pytest.importorskip(
        "stepplanner._core_py" if core.IMPLEMENTATION == "compiled" else "stepplanner._core"
    )
    assert resident == other.ResidentState(*ROWS[0])  # the two implementations still agree
    assert plan == other.StepPlanner(planner.policy, planner.limits).plan(as_resident_array(ROWS))


def test_as_bool_checks_the_type_not_its_name():
    class bool_:  # noqa: N801 - the impostor's point is its name
        def item(self):
            return True

    assert _fields.as_bool("flag", np.bool_(True)) is True
    with pytest.raises(TypeError, match="flag must be a bool"):
        _fields.as_bool("flag", bool_())


def test_sequence_work_is_an_enum_in_views(core, planner):
    plan = planner.plan(objects(core, ROWS))
    assert all(type(s.work) is SequenceWork for s in plan.sequences)
