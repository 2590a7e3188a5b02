"""Every error of SPEC §3: its type, a message naming field and value, and no state changed."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import RESIDENT_DTYPE, IfbSchedulingMode
from stepplanner.testing import as_resident_array, as_resident_states

B, S_IN, P = 4, 64, 16
GOOD = [(0, 0, 40, 41, True, 0), (0, 1, 60, 0, False, 0), (0, 2, 20, 5, False, 0)]


def matching(*fragments):
    return ".*".join(re.escape(f) for f in fragments)


@pytest.fixture
def planner(make_planner):
    return make_planner(B, S_IN, P, ifb_scheduling_mode=IfbSchedulingMode.MIXED)


@pytest.fixture
def rejects(core, planner):
    """rejects(residents, exc, *fragments, count=None, reasons=None): the call raises ``exc``
    naming every fragment, and the previous plan and a sentinel reasons array are unchanged."""

    def check(residents, exc, *fragments, count=None, reasons=None):
        plan = planner.plan(as_resident_states(GOOD, core.ResidentState))
        before = plan.to_dict()
        assert before["sequences"], "the previous plan must be non-trivial to show it survives"
        sentinel = np.full(8, 0xEE, dtype=np.uint8) if reasons is None else reasons
        snapshot = np.array(sentinel, copy=True) if isinstance(sentinel, np.ndarray) else None
        with pytest.raises(exc, match=matching(*fragments)) as info:
            planner.plan(residents, count, reasons=sentinel)
        # Exactly exc, or the library's subclass of exactly exc (StepPlannerValueError...).
        assert exc in (type(info.value), *type(info.value).__bases__)
        assert plan.to_dict() == before
        assert plan.num_residents == len(GOOD)
        if snapshot is not None:
            assert np.array_equal(sentinel, snapshot), "reasons were written by a failing call"

    return check


def as_kind(core, rows, kind):
    return (
        as_resident_array(rows) if kind == "array" else as_resident_states(rows, core.ResidentState)
    )


# --- count ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["list", "array"])
@pytest.mark.parametrize(
    ("length", "count", "exc", "fragments"),
    [
        (3, -1, ValueError, ("count=-1", "negative", "0 <= count")),
        (6, 5, ValueError, ("count=5", "max_batch_size=4", "0..4")),
        (5, None, ValueError, ("count=5", "max_batch_size=4")),
        (2, 3, ValueError, ("count=3", "len(residents)=2", "0..2")),
        (3, 1.0, TypeError, ("count", "integer", "float", "1.0")),
        (3, "2", TypeError, ("count", "integer", "str", "'2'")),
    ],
)
def test_count(core, rejects, kind, length, count, exc, fragments):
    rows = [(0, i, 10, 10, True, 0) for i in range(length)]
    rejects(as_kind(core, rows, kind), exc, *fragments, count=count)


def test_count_accepts_integer_likes(core, planner):
    residents = as_resident_states(GOOD, core.ResidentState)
    assert planner.plan(residents, np.int64(2)).num_residents == 2
    assert planner.plan(residents, True).num_residents == 1


# --- row values (both input kinds) ----------------------------------------------------------------


ROW_ERRORS = [
    (
        (0, 9, 10, 10, False, 0),
        ValueError,
        ("residents[1]", "prompt-incomplete", "10 - 10 = 0", "> 0"),
    ),
    ((0, 9, 10, 12, False, 0), ValueError, ("residents[1]", "10 - 12 = -2", "> 0")),
    (
        (0, 9, 65, 0, False, 0),
        ValueError,
        ("residents[1].prompt_length=65", "max_input_length=64", "1..64"),
    ),
    ((0, 9, 10, -1, True, 0), ValueError, ("residents[1].committed=-1", "negative", ">= 0")),
    ((0, 9, -1, 5, True, 0), ValueError, ("residents[1].prompt_length=-1", "negative", ">= 0")),
    (
        (0, 9, 10, 10, True, -3),
        ValueError,
        ("residents[1].consecutive_paused_steps=-3", "negative", ">= 0"),
    ),
]


@pytest.mark.parametrize("kind", ["list", "array"])
@pytest.mark.parametrize(("bad", "exc", "fragments"), ROW_ERRORS)
def test_row_values(core, rejects, kind, bad, exc, fragments):
    rows = [GOOD[0], bad, GOOD[1]]
    rejects(as_kind(core, rows, kind), exc, *fragments)


def test_decoding_rows_may_exceed_input_length(core, planner):
    # Only a prompt-incomplete row is bounded by S_in: a decoding row is past its prompt.
    residents = as_resident_states([(0, 0, 10**6, 10**6 + 5, True, 0)], core.ResidentState)
    assert planner.plan(residents).num_decode == 1


# --- containers, element types and dtypes ---------------------------------------------------------


# Fixed ids: repr(iter([])) holds an address, which differs between pytest-xdist workers.
@pytest.mark.parametrize(
    "residents", [None, 5, "abc", {0: 1}, iter([])], ids=["None", "int", "str", "dict", "iterator"]
)
def test_residents_container(rejects, residents):
    rejects(residents, TypeError, "residents must be a list or tuple", type(residents).__name__)


def test_tuple_container_is_accepted(core, planner):
    assert planner.plan(tuple(as_resident_states(GOOD, core.ResidentState))).num_residents == 3


@pytest.mark.parametrize("bad", [(0, 1, 10, 10, True, 0), None, 3], ids=["tuple", "None", "int"])
def test_element_type(core, rejects, bad):
    residents = as_resident_states(GOOD, core.ResidentState)
    residents[1] = bad
    rejects(residents, TypeError, "residents[1] must be a ResidentState", type(bad).__name__)


def test_the_other_implementations_resident_is_rejected(core, rejects, compiled, reference):
    other = reference if core is compiled else compiled
    residents = as_resident_states(GOOD, core.ResidentState)
    residents[2] = other.ResidentState(arrival=5, prompt_length=8)
    rejects(residents, TypeError, "residents[2] must be a ResidentState")


def _swapped():
    return RESIDENT_DTYPE.newbyteorder(">" if np.little_endian else "<")


def _packed():
    return np.dtype([(n, RESIDENT_DTYPE.fields[n][0]) for n in RESIDENT_DTYPE.names], align=False)


def _renamed():
    names = list(RESIDENT_DTYPE.names)
    names[0] = "prio"
    return np.dtype(
        {
            "names": names,
            "formats": [RESIDENT_DTYPE.fields[n][0] for n in RESIDENT_DTYPE.names],
            "offsets": [RESIDENT_DTYPE.fields[n][1] for n in RESIDENT_DTYPE.names],
            "itemsize": RESIDENT_DTYPE.itemsize,
        }
    )


@pytest.mark.parametrize(
    "dtype",
    [np.dtype(np.float64), _swapped(), _packed(), _renamed()],
    ids=["float64", "byteswapped", "packed", "renamed"],
)
def test_array_dtype(rejects, dtype):
    arr = np.zeros(3, dtype=dtype)
    rejects(arr, TypeError, "residents array has dtype", "RESIDENT_DTYPE")


def test_array_two_dimensional(rejects):
    arr = np.zeros((2, 2), dtype=RESIDENT_DTYPE)
    arr["context_committed"] = True
    rejects(arr, ValueError, "ndim=2", "allowed: 1")


def test_array_strided_view_is_read_in_place(planner, core):
    arr = as_resident_array([GOOD[1], GOOD[0]] * 2)[::2]  # non-contiguous rows
    assert [s.resident for s in planner.plan(arr).sequences] == [0, 1]


# --- reasons ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasons", "fragments"),
    [
        ([0, 0, 0], ("reasons is a list",)),
        (np.zeros(3, dtype=np.int8), ("reasons has dtype int8",)),
        (np.zeros((3, 1), dtype=np.uint8), ("ndim=2",)),
        (np.zeros(2, dtype=np.uint8), ("has len 2 < count=3",)),
    ],
)
def test_reasons_array(core, rejects, reasons, fragments):
    rejects(as_resident_states(GOOD, core.ResidentState), ValueError, *fragments, reasons=reasons)


def test_reasons_read_only(core, rejects):
    reasons = np.zeros(3, dtype=np.uint8)
    reasons.flags.writeable = False
    rejects(as_resident_states(GOOD, core.ResidentState), ValueError, "read-only", reasons=reasons)


def test_reasons_strided(core, planner):
    """Both refuse a strided view: the core writes reasons through a raw pointer."""
    reasons = np.zeros(6, dtype=np.uint8)[::2]
    with pytest.raises(ValueError, match="not contiguous"):
        planner.plan(as_resident_states(GOOD, core.ResidentState), reasons=reasons)


# --- ResidentState fields ----------------------------------------------------------------------


INT32_FIELDS = ["priority", "prompt_length", "committed", "consecutive_paused_steps"]


@pytest.mark.parametrize("field", INT32_FIELDS)
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**100])
def test_int32_field_overflow(core, field, value):
    with pytest.raises(
        OverflowError, match=matching(f"{field}={value}", "int32", "[-2147483648, 2147483647]")
    ):
        core.ResidentState(**{field: value})


@pytest.mark.parametrize("value", [-1, 2**64, -(2**70)])
def test_arrival_overflow(core, value):
    with pytest.raises(
        OverflowError, match=matching(f"arrival={value}", "uint64", f"[0, {2**64 - 1}]")
    ):
        core.ResidentState(arrival=value)


@pytest.mark.parametrize("field", INT32_FIELDS + ["arrival"])
@pytest.mark.parametrize("value", [1.0, "3", None, 2.5])
def test_field_type(core, field, value):
    with pytest.raises(TypeError, match=matching(field, "integer", type(value).__name__)):
        core.ResidentState(**{field: value})


@pytest.mark.parametrize("value", [2, -1, 0.5, "yes", None])
def test_context_committed_type(core, value):
    with pytest.raises(
        TypeError, match=matching("context_committed", "bool", type(value).__name__)
    ):
        core.ResidentState(context_committed=value)


@pytest.mark.parametrize(
    ("field", "value", "exc"),
    [
        ("priority", 2**31, OverflowError),
        ("arrival", -1, OverflowError),
        ("committed", 1.5, TypeError),
        ("context_committed", 7, TypeError),
    ],
)
def test_failed_assignment_keeps_the_old_value(core, field, value, exc):
    r = core.ResidentState(
        priority=3,
        arrival=4,
        prompt_length=5,
        committed=6,
        context_committed=True,
        consecutive_paused_steps=7,
    )
    before = repr(r)
    with pytest.raises(exc, match=field):
        setattr(r, field, value)
    assert repr(r) == before


def test_field_extremes_are_accepted(core):
    r = core.ResidentState(
        priority=-(2**31),
        arrival=2**64 - 1,
        prompt_length=2**31 - 1,
        committed=0,
        context_committed=np.bool_(True),
        consecutive_paused_steps=2**31 - 1,
    )
    assert (r.priority, r.arrival, r.context_committed) == (-(2**31), 2**64 - 1, True)
    r.committed = np.int16(9)
    assert r.committed == 9 and type(r.committed) is int


# --- every library validation error is a StepPlannerError that is also the builtin -------------


def _library_refusals(core):
    from stepplanner import LatencyModel, Ledger, StepPlannerLimits, synthetic
    from stepplanner.sim.traces import load_trace

    limits = StepPlannerLimits(4, 64, 16)
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits)
    planner = core.StepPlanner(policy, limits)
    return [
        (ValueError, lambda: StepPlannerLimits(0, 64, 16)),
        (TypeError, lambda: sp.resolve_scheduling_policy("mixed", limits)),
        (
            ValueError,
            lambda: sp.resolve_scheduling_policy(sp.SchedulingOptions(max_num_tokens=5), limits),
        ),
        (TypeError, lambda: planner.plan({})),
        (ValueError, lambda: planner.plan([core.ResidentState(committed=-1)])),
        (OverflowError, lambda: core.ResidentState(committed=2**31)),
        (
            RuntimeError,
            lambda: core.StepPlanner(
                dataclasses.replace(policy, mode=IfbSchedulingMode.AUTO), limits
            ),
        ),
        (ValueError, lambda: Ledger(limits).submit(1, 65)),
        (TypeError, lambda: Ledger("limits")),
        (ValueError, lambda: synthetic(requests=0)),
        (ValueError, lambda: LatencyModel.parse("q=1")),
        (ValueError, lambda: load_trace("trace.xlsx")),
    ]


def test_library_errors_are_step_planner_errors_and_builtins(core):
    for builtin, call in _library_refusals(core):
        with pytest.raises(builtin) as info:
            call()
        assert isinstance(info.value, sp.StepPlannerError), (builtin, info.value)
        assert builtin in type(info.value).__bases__


def test_every_error_builder_returns_a_step_planner_error():
    import inspect

    from stepplanner import _errors

    samples = {
        "int": 1,
        "str": "x",
        "object": 1,
        "type": sp.SequenceWork,
        "tuple[str, ...]": ("x",),
        "tuple[int, ...]": (1,),
        "list[int]": [1],
    }
    # Every builder but the attribute protocol's (an AttributeError is how hasattr() works).
    builders = [
        f
        for name, f in vars(_errors).items()
        if inspect.isfunction(f)
        and not name.startswith("_")
        and f.__annotations__["return"] != "AttributeError"
    ]
    assert len(builders) > 40
    for f in builders:
        params = inspect.signature(f).parameters.values()
        args = [samples.get(p.annotation, 1) for p in params]  # annotations are strings here
        assert isinstance(f(*args), sp.StepPlannerError), f.__name__
