"""Hostile input at every public entry point: it works correctly, or it is refused cleanly.

"Correctly" means the same plan as the plainest equivalent input (a contiguous RESIDENT_DTYPE
copy, a plain list); "refused cleanly" means TypeError/ValueError/OverflowError naming the field
and the value, with every piece of state as it was: the previous plan (``to_dict``), the reasons
array, the ledger rows, and the planner's internal order cache (the next valid call must equal a
fresh planner's). A wrong dtype is refused, never reinterpreted. The basic message checks of
SPEC §3 live in test_errors.py; this file is about shapes, strides, offsets, subclasses and types
a serving process may be handed by mistake.
"""

from __future__ import annotations

import array
import collections
import decimal
import fractions
import re

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import RESIDENT_DTYPE

B, S_IN, P = 6, 64, 16
LIMITS = sp.StepPlannerLimits(B, S_IN, P)
ROWS = [  # a mixed ledger: decoders, prompts, two priorities (arrivals unique)
    (1, 0, 40, 41, True, 0),
    (0, 5, 60, 0, False, 0),
    (2, 2, 20, 0, False, 1),
    (1, 3, 50, 50, True, 2),
    (0, 4, 30, 16, False, 0),
]
POLICIES = {
    "mixed_fcfs": sp.SchedulingOptions(ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED),
    "priority_pause": sp.SchedulingOptions(
        ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED,
        scheduling_policy=sp.SchedulingPolicy.PRIORITY,
        preemption=sp.PreemptionMode.PAUSE,
        max_pause_steps=2,
    ),
    "prefill_first": sp.SchedulingOptions(
        ifb_scheduling_mode=sp.IfbSchedulingMode.PREFILL_FIRST,
        scheduling_policy=sp.SchedulingPolicy.PRIORITY,
    ),
}
ALLOWED = (TypeError, ValueError, OverflowError)


def matching(*fragments: str) -> str:
    return ".*".join(re.escape(f) for f in fragments)


def arr(rows=ROWS) -> np.ndarray:
    return np.array(rows, dtype=RESIDENT_DTYPE)


def new_planner(core, policy="priority_pause"):
    return core.StepPlanner(sp.resolve_scheduling_policy(POLICIES[policy], LIMITS), LIMITS)


@pytest.fixture(params=sorted(POLICIES))
def policy(request):
    return request.param


@pytest.fixture
def refuses(core):
    """refuses(exc, fragments, residents, count, reasons): the call raises exactly ``exc``
    naming every fragment; the previous plan, the reasons and the residents are unchanged, and
    the planner's next call equals a fresh planner's."""

    def check(exc, fragments, residents, count=None, reasons=None, planner=None):
        planner = planner or new_planner(core)
        plan = planner.plan(arr())
        before = plan.to_dict()
        residents_before = _snapshot(residents)
        reasons_before = None if not isinstance(reasons, np.ndarray) else reasons.copy()
        with pytest.raises(exc, match=matching(*fragments)) as info:
            planner.plan(residents, count, reasons)
        # Exactly exc, or the library's subclass of exactly exc (StepPlannerValueError...).
        assert exc in (type(info.value), *type(info.value).__bases__)
        assert plan.to_dict() == before, "a refused call changed the previous plan"
        assert _snapshot(residents) == residents_before, "a refused call changed the residents"
        if reasons_before is not None:
            assert np.array_equal(reasons, reasons_before), "a refused call wrote reasons"
        assert_next_call_is_fresh(core, planner)

    return check


def _snapshot(residents):
    if isinstance(residents, np.ndarray):
        return residents.tobytes()
    if isinstance(residents, (list, tuple)):
        return [r._astuple() if hasattr(r, "_astuple") else r for r in residents]
    return None


def assert_next_call_is_fresh(core, planner):
    """The order cache of the compiled core must not remember a refused call."""
    shuffled = arr([ROWS[i] for i in (4, 2, 0, 3, 1)])
    assert (
        planner.plan(shuffled).to_dict()
        == core.StepPlanner(planner.policy, planner.limits).plan(shuffled).to_dict()
    )


def assert_same_plan(core, policy, residents, count=None):
    """``residents`` plans exactly like a contiguous RESIDENT_DTYPE copy of its rows."""
    got = new_planner(core, policy).plan(residents, count).to_dict()
    want = new_planner(core, policy).plan(np.ascontiguousarray(residents), count).to_dict()
    assert got == want
    assert got["sequences"], "the case must plan something to show anything"


def foreign(core):
    from stepplanner import _core
    from stepplanner import _core_py as _reference

    return _reference if core is _core else _core


# --- configuration objects -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "exc", "fragments"),
    [
        ({"max_batch_size": 0}, ValueError, ("max_batch_size=0", "1..2147483647")),
        ({"max_batch_size": -5}, ValueError, ("max_batch_size=-5", "1..2147483647")),
        ({"max_input_length": 1.0}, TypeError, ("max_input_length", "integer", "float")),
        ({"kv_page_size": "16"}, TypeError, ("kv_page_size", "integer", "str")),
        ({"kv_page_size": None}, TypeError, ("kv_page_size", "integer", "NoneType")),
        ({"max_batch_size": 2**31}, OverflowError, ("max_batch_size=2147483648", "int32")),
        ({"max_batch_size": np.float32(4)}, TypeError, ("max_batch_size", "float32")),
        (
            {"max_batch_size": 65536, "max_input_length": 65536},
            ValueError,
            ("T_max", "4294967296", "2147483647"),
        ),
    ],
)
def test_limits_refuse(kwargs, exc, fragments):
    args = {"max_batch_size": 4, "max_input_length": 64, "kv_page_size": 16, **kwargs}
    with pytest.raises(exc, match=matching(*fragments)):
        sp.StepPlannerLimits(**args)


def test_limits_accept_integer_likes_and_store_ints():
    lim = sp.StepPlannerLimits(np.int64(4), np.uint16(64), True)
    assert (lim.max_batch_size, lim.max_input_length, lim.kv_page_size) == (4, 64, 1)
    assert all(type(v) is int for v in (lim.max_batch_size, lim.max_input_length, lim.kv_page_size))


@pytest.mark.parametrize("cls", [sp.SchedulingOptions, sp.ResolvedSchedulingPolicy])
@pytest.mark.parametrize(
    ("field", "value", "exc", "fragments"),
    [
        ("max_num_tokens", -1, ValueError, ("max_num_tokens=-1", "0..2147483647")),
        ("max_chunk_tokens", 2**40, OverflowError, ("max_chunk_tokens=1099511627776", "int32")),
        ("max_pause_steps", 0.5, TypeError, ("max_pause_steps", "integer", "float")),
        ("priority_reserved_slots", "1", TypeError, ("priority_reserved_slots", "str")),
        ("scheduling_policy", 5, ValueError, ("scheduling_policy=5", "fcfs, priority", "0..3")),
        ("preemption", "sometimes", ValueError, ("preemption='sometimes'", "none, pause")),
        ("preemption", 1.0, TypeError, ("preemption", "integer", "float")),
        ("preemption", None, TypeError, ("preemption", "NoneType")),
    ],
)
def test_option_fields_refuse(cls, field, value, exc, fragments):
    base = (
        {"mode": sp.IfbSchedulingMode.MIXED, "max_num_tokens": 32, "max_chunk_tokens": 16}
        if cls is sp.ResolvedSchedulingPolicy
        else {}
    )
    with pytest.raises(exc, match=matching(*fragments)):
        cls(**{**base, field: value})


@pytest.mark.parametrize(
    ("mode", "exc"),
    [
        (7, ValueError),
        (-1, ValueError),
        (1.0, TypeError),
        ("sideways", ValueError),
        ("", ValueError),
    ],
)
def test_mode_refuses(mode, exc):
    with pytest.raises(exc, match="ifb_scheduling_mode"):
        sp.SchedulingOptions(ifb_scheduling_mode=mode)
    with pytest.raises(exc, match="mode"):
        sp.ResolvedSchedulingPolicy(mode=mode, max_num_tokens=32, max_chunk_tokens=16)


def test_options_are_frozen():
    options = sp.SchedulingOptions()
    with pytest.raises(AttributeError):
        options.max_num_tokens = 5
    assert options.max_num_tokens == 0


@pytest.mark.parametrize(
    ("options", "limits", "fragments"),
    [
        (None, LIMITS, ("options must be a SchedulingOptions", "NoneType")),
        ({"max_num_tokens": 0}, LIMITS, ("options must be a SchedulingOptions", "dict")),
        (sp.SchedulingOptions(), (6, 64, 16), ("limits must be a StepPlannerLimits", "tuple")),
        (sp.SchedulingOptions(), None, ("limits must be a StepPlannerLimits", "NoneType")),
    ],
)
def test_resolve_refuses_wrong_types(options, limits, fragments):
    with pytest.raises(TypeError, match=matching(*fragments)):
        sp.resolve_scheduling_policy(options, limits)


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        (
            sp.SchedulingOptions(priority_reserved_slots=6),
            ("priority_reserved_slots=6", "0..5 (fewer than max_batch_size=6)"),
        ),
        (sp.SchedulingOptions(max_num_tokens=21), ("max_num_tokens=21", "[22, 384]")),
        (sp.SchedulingOptions(max_num_tokens=385), ("max_num_tokens=385", "[22, 384]")),
        (
            sp.SchedulingOptions(max_chunk_tokens=24),
            ("max_chunk_tokens=24", "multiple of kv_page_size=16"),
        ),
    ],
)
def test_resolve_names_the_field_and_range(options, fragments):
    with pytest.raises(ValueError, match=matching(*fragments)):
        sp.resolve_scheduling_policy(options, LIMITS)


@pytest.mark.parametrize(
    ("policy_arg", "limits_arg", "exc", "fragments"),
    [
        (None, LIMITS, TypeError, ("policy must be a ResolvedSchedulingPolicy", "NoneType")),
        (sp.SchedulingOptions(), LIMITS, TypeError, ("policy must be", "SchedulingOptions")),
        (
            "resolved",
            {"max_batch_size": 6},
            TypeError,
            ("limits must be a StepPlannerLimits", "dict"),
        ),
        (
            sp.ResolvedSchedulingPolicy(
                mode=sp.IfbSchedulingMode.AUTO, max_num_tokens=32, max_chunk_tokens=16
            ),
            LIMITS,
            RuntimeError,
            ("policy.mode", "AUTO", "resolve_scheduling_policy"),
        ),
        (
            sp.ResolvedSchedulingPolicy(
                mode=sp.IfbSchedulingMode.MIXED, max_num_tokens=10**6, max_chunk_tokens=16
            ),
            LIMITS,
            ValueError,
            ("max_num_tokens=1000000", "[22, 384]"),
        ),
        # A policy resolved for other limits: its budgets do not hold here.
        (
            sp.resolve_scheduling_policy(
                sp.SchedulingOptions(), sp.StepPlannerLimits(64, 2048, 16)
            ),
            LIMITS,
            ValueError,
            ("max_num_tokens=576",),
        ),
    ],
)
def test_planner_constructor_refuses(core, policy_arg, limits_arg, exc, fragments):
    if policy_arg == "resolved":
        policy_arg = sp.resolve_scheduling_policy(sp.SchedulingOptions(), LIMITS)
    with pytest.raises(exc, match=matching(*fragments)):
        core.StepPlanner(policy_arg, limits_arg)


# --- residents: containers -------------------------------------------------------------------


def objects(core, rows=ROWS):
    return [core.ResidentState(*r) for r in rows]


class ListSub(list):
    pass


class TupleSub(tuple):
    pass


@pytest.mark.parametrize("wrap", [list, tuple, ListSub, TupleSub], ids=lambda w: w.__name__)
def test_list_tuple_and_subclasses_plan_like_the_array(core, policy, wrap):
    got = new_planner(core, policy).plan(wrap(objects(core))).to_dict()
    assert got == new_planner(core, policy).plan(arr()).to_dict()


@pytest.mark.parametrize(
    "make",
    [
        lambda rs: iter(rs),
        lambda rs: (r for r in rs),
        lambda rs: collections.deque(rs),
        lambda rs: dict(enumerate(rs)),
        lambda rs: set(),
        lambda rs: range(3),
        lambda rs: rs[0],
        lambda rs: memoryview(b"abc"),
        lambda rs: array.array("i", [1, 2]),
        lambda rs: b"ab",
        lambda rs: {}.values(),
        lambda rs: 3.5,
        lambda rs: None,
    ],
    ids=[
        "iter",
        "generator",
        "deque",
        "dict",
        "set",
        "range",
        "single",
        "memoryview",
        "array.array",
        "bytes",
        "dict_values",
        "float",
        "None",
    ],
)
def test_other_iterables_are_refused(core, refuses, make):
    residents = make(objects(core))
    refuses(TypeError, ("residents must be a list or tuple", type(residents).__name__), residents)


@pytest.mark.parametrize(
    "bad",
    [None, 1, 1.5, (0, 9, 10, 0, False, 0), {"priority": 0}, np.zeros(1, RESIDENT_DTYPE)[0], "row"],
    ids=["None", "int", "float", "tuple", "dict", "np.void", "str"],
)
@pytest.mark.parametrize("at", [0, 2, 4])
def test_a_stray_element_is_refused_by_index(core, refuses, bad, at):
    residents = objects(core)
    residents[at] = bad
    refuses(TypeError, (f"residents[{at}] must be a ResidentState", type(bad).__name__), residents)


def test_a_stray_element_after_count_is_not_read(core, policy):
    residents = objects(core) + [None]
    got = new_planner(core, policy).plan(residents, len(ROWS)).to_dict()
    assert got == new_planner(core, policy).plan(arr()).to_dict()


def test_the_other_implementations_residents_are_refused(core, refuses):
    refuses(TypeError, ("residents[0] must be a ResidentState",), objects(foreign(core)))


# --- residents: arrays of other dtypes -------------------------------------------------------


def _with(**changes):
    """RESIDENT_DTYPE's fields with some names/formats/offsets/itemsize changed."""
    spec = {
        "names": list(RESIDENT_DTYPE.names),
        "formats": [RESIDENT_DTYPE.fields[n][0] for n in RESIDENT_DTYPE.names],
        "offsets": [RESIDENT_DTYPE.fields[n][1] for n in RESIDENT_DTYPE.names],
        "itemsize": RESIDENT_DTYPE.itemsize,
    }
    for key, fn in changes.items():
        spec[key] = fn(spec[key])
    return np.dtype(spec)


def _swap(i, j):
    def fn(seq):
        seq = list(seq)
        seq[i], seq[j] = seq[j], seq[i]
        return seq

    return fn


WRONG_DTYPES = {
    # Same fields and formats, but the names sit at each other's offsets: reading it as
    # RESIDENT_DTYPE would swap prompt_length and committed.
    "names_swapped": _with(names=_swap(2, 3)),
    "fields_in_another_order": np.dtype(
        [(n, RESIDENT_DTYPE.fields[n][0]) for n in reversed(RESIDENT_DTYPE.names)], align=True
    ),
    "packed_align_false": np.dtype(
        [(n, RESIDENT_DTYPE.fields[n][0]) for n in RESIDENT_DTYPE.names], align=False
    ),
    "big_endian": RESIDENT_DTYPE.newbyteorder(">"),
    "one_field_big_endian": _with(formats=lambda f: [np.dtype(">i4")] + f[1:]),
    "int64_priority": _with(
        formats=lambda f: [np.dtype(np.int64)] + f[1:], offsets=lambda o: [0, 8, 16, 20, 24, 28]
    ),
    "int32_arrival": _with(formats=lambda f: [f[0], np.dtype(np.int32)] + f[2:]),
    "uint32_committed": _with(formats=lambda f: f[:3] + [np.dtype(np.uint32)] + f[4:]),
    "int8_flag": _with(formats=lambda f: f[:4] + [np.dtype(np.int8)] + f[5:]),
    "longer_itemsize": _with(itemsize=lambda s: s + 8),
    "extra_field": np.dtype(RESIDENT_DTYPE.descr + [("extra", "<i4")]),
    "missing_field": np.dtype(
        [(n, RESIDENT_DTYPE.fields[n][0]) for n in RESIDENT_DTYPE.names[:-1]], align=True
    ),
    "renamed": _with(names=lambda ns: ["prio"] + ns[1:]),
    "void_32": np.dtype("V32"),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "object": np.dtype(object),
    "complex": np.dtype(np.complex128),
    "unicode": np.dtype("U8"),
    "datetime": np.dtype("M8[s]"),
    "sequence_dtype": sp.SEQUENCE_DTYPE,
}


@pytest.mark.parametrize("name", sorted(WRONG_DTYPES))
@pytest.mark.parametrize("shape", [(3,), (0,), (2, 2), ()], ids=["1d", "empty", "2d", "0d"])
def test_a_wrong_dtype_is_refused_never_reinterpreted(core, refuses, name, shape):
    dtype = WRONG_DTYPES[name]
    residents = np.zeros(shape, dtype=dtype)
    refuses(TypeError, ("residents array has dtype", "RESIDENT_DTYPE"), residents)


def test_an_object_array_of_resident_states_is_refused(core, refuses):
    residents = np.empty(len(ROWS), dtype=object)
    residents[:] = objects(core)
    refuses(TypeError, ("residents array has dtype object",), residents)


def test_a_uint8_view_of_a_valid_ledger_is_refused(core, refuses):
    refuses(TypeError, ("residents array has dtype uint8",), arr().view(np.uint8))


def test_the_same_layout_without_the_align_flag_is_read_as_is(core, policy):
    # Identical names, formats, offsets and itemsize: the same bytes, so no reinterpretation.
    same_layout = _with()
    assert not same_layout.isalignedstruct
    residents = arr().astype(same_layout)
    got = new_planner(core, policy).plan(residents).to_dict()
    assert got == new_planner(core, policy).plan(arr()).to_dict()


@pytest.mark.parametrize(
    ("shape", "ndim"), [((), 0), ((2, 3), 2), ((1, 5), 2), ((5, 1), 2), ((1, 1, 5), 3)]
)
def test_other_shapes_are_refused(core, refuses, shape, ndim):
    residents = np.zeros(shape, dtype=RESIDENT_DTYPE)
    refuses(ValueError, (f"ndim={ndim}", "allowed: 1"), residents)


@pytest.mark.parametrize("count", [None, 0])
def test_an_empty_array_plans_nothing(core, policy, count):
    planner = new_planner(core, policy)
    planner.plan(arr())
    plan = planner.plan(np.zeros(0, dtype=RESIDENT_DTYPE), count)
    assert plan.to_dict() == {
        "sequences": [],
        "paused": [],
        "num_prefill": 0,
        "num_decode": 0,
        "prefill_tokens": 0,
        "total_tokens": 0,
    }
    assert plan.num_residents == 0


# --- residents: strides, offsets, read-only memory -------------------------------------------


def every_other(rows=ROWS):
    big = np.zeros(2 * len(rows), dtype=RESIDENT_DTYPE)
    big[::2] = rows
    big[1::2] = [(9, 10**6 + i, 9, 0, False, 0) for i in range(len(rows))]  # decoys
    return big[::2]


def reversed_view(rows=ROWS):
    return arr(rows[::-1])[::-1]


def reversed_every_other(rows=ROWS):
    big = np.zeros(2 * len(rows), dtype=RESIDENT_DTYPE)
    big[::2] = rows[::-1]
    return big[-2::-2]


def unaligned(rows=ROWS, writable=True):
    raw = (bytearray if writable else bytes)(b"\xab" + arr(rows).tobytes())
    return np.frombuffer(raw, dtype=RESIDENT_DTYPE, offset=1, count=len(rows))


def read_only(rows=ROWS):
    a = arr(rows)
    a.flags.writeable = False
    return a


VIEWS = {
    "every_other": every_other,
    "reversed": reversed_view,
    "reversed_every_other": reversed_every_other,
    "unaligned_writable": unaligned,
    "unaligned_read_only": lambda: unaligned(writable=False),
    "read_only": read_only,
    "recarray": lambda: arr().view(np.recarray),
    "from_memoryview": lambda: np.asarray(memoryview(arr())),
    "slice_of_slice": lambda: every_other(ROWS + ROWS[:1])[: len(ROWS)],
}


def test_views_hold_the_rows_they_claim():
    for name, make in VIEWS.items():
        view = make()
        assert view.tolist() == arr().tolist(), name
    assert reversed_view().strides[0] < 0 and reversed_every_other().strides[0] < 0
    assert every_other().strides[0] == 2 * RESIDENT_DTYPE.itemsize
    assert not unaligned().flags.aligned


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("count", [None, 3, 0])
def test_views_plan_like_a_contiguous_copy(core, policy, view, count):
    residents = VIEWS[view]()
    if count == 0:
        assert new_planner(core, policy).plan(residents, 0).to_dict()["sequences"] == []
        return
    assert_same_plan(core, policy, residents, count)


def test_a_zero_stride_broadcast_is_one_resident_listed_thrice(core, policy):
    # Its rows are one resident: planning it would plan that resident three times, and
    # apply_to would advance it three times. Refused like a list naming one object twice.
    one = arr([(0, 7, 40, 0, False, 0)])
    residents = np.broadcast_to(one, (3,))
    assert residents.strides == (0,)
    planner = new_planner(core, policy)
    before = planner.plan(arr()).copy()
    with pytest.raises(ValueError, match=r"residents\[0\] and residents\[1\] share memory"):
        planner.plan(residents)
    assert planner.plan(arr()) == before
    assert_same_plan(core, policy, residents, 1)  # one row of it is one resident


def test_reasons_on_views_match_a_contiguous_copy(core, policy):
    for make in VIEWS.values():
        got, want = np.zeros(len(ROWS), np.uint8), np.zeros(len(ROWS), np.uint8)
        new_planner(core, policy).plan(make(), reasons=got)
        new_planner(core, policy).plan(arr(), reasons=want)
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    "view", ["every_other", "reversed", "reversed_every_other", "unaligned_writable", "recarray"]
)
def test_apply_to_writes_through_views_like_a_copy(core, policy, view):
    residents = VIEWS[view]()
    base = residents.base
    base_before = None if base is None else np.asarray(base).tobytes()
    contiguous = arr()
    planner = new_planner(core, policy)
    planner.plan(residents).apply_to(residents)
    planner.plan(contiguous).apply_to(contiguous)
    assert residents.tolist() == contiguous.tolist()
    assert residents.tolist() != ROWS, "the step must change something to show anything"
    if view == "every_other":  # the decoy rows between the viewed ones are untouched
        assert base[1::2].tolist() == [(9, 10**6 + i, 9, 0, False, 0) for i in range(len(ROWS))]
    del base_before


@pytest.mark.parametrize("view", ["read_only", "unaligned_read_only"])
def test_apply_to_refuses_read_only_memory(core, view):
    residents = VIEWS[view]()
    before = residents.tobytes()
    plan = new_planner(core).plan(residents)
    plan_before = plan.to_dict()
    with pytest.raises(ValueError, match="read-only"):
        plan.apply_to(residents)
    assert residents.tobytes() == before and plan.to_dict() == plan_before


def test_apply_to_refuses_a_broadcast(core):
    residents = np.broadcast_to(arr([(0, 7, 40, 0, False, 0)]), (3,))
    plan = new_planner(core).plan(np.ascontiguousarray(residents))
    with pytest.raises(ValueError, match="read-only"):
        plan.apply_to(residents)


# --- count -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (True, 1),
        (False, 0),
        (np.int8(2), 2),
        (np.uint64(3), 3),
        (np.int64(5), 5),
        (np.bool_(True), None),
        (np.intp(4), 4),
    ],
)
def test_integer_like_counts(core, policy, count, expected):
    planner = new_planner(core, policy)
    try:
        plan = planner.plan(arr(), count)
    except TypeError as exc:  # numpy.bool_ has no __index__: a refusal must name count
        assert expected is None and "count" in str(exc)
        return
    assert plan.num_residents == expected
    want = new_planner(core, policy).plan(arr(), expected).to_dict()
    assert plan.to_dict() == want


@pytest.mark.parametrize(
    ("count", "exc", "fragments"),
    [
        (2**64, ValueError, ("count=18446744073709551616", "max_batch_size=6")),
        (2**1000, ValueError, ("count=", "exceeds max_batch_size=6")),
        (-(2**70), ValueError, ("count=-1180591620717411303424", "negative")),
        (np.int64(-1), ValueError, ("count=-1", "negative")),
        (np.uint64(2**64 - 1), ValueError, ("count=18446744073709551615", "max_batch_size=6")),
        (np.float64(2.0), TypeError, ("count", "integer", "float64")),
        (np.float32(2.0), TypeError, ("count", "integer", "float32")),
        (fractions.Fraction(2), TypeError, ("count", "integer", "Fraction")),
        (decimal.Decimal(2), TypeError, ("count", "integer", "Decimal")),
        (2 + 0j, TypeError, ("count", "integer", "complex")),
        ([2], TypeError, ("count", "integer", "list")),
        (np.array([2]), TypeError, ("count", "integer", "ndarray")),
        (b"\x02", TypeError, ("count", "integer", "bytes")),
    ],
)
def test_count_refuses(core, refuses, count, exc, fragments):
    refuses(exc, fragments, arr(), count)


def test_a_zero_d_integer_array_is_a_count(core, policy):
    planner = new_planner(core, policy)
    assert planner.plan(arr(), np.array(2)).num_residents == 2


def test_a_count_whose_index_raises_propagates_and_changes_nothing(core):
    class Broken:
        def __index__(self):
            raise RuntimeError("broken __index__")

    planner = new_planner(core)
    plan = planner.plan(arr())
    before = plan.to_dict()
    with pytest.raises(RuntimeError, match="broken __index__"):
        planner.plan(arr(), Broken())
    assert plan.to_dict() == before
    assert_next_call_is_fresh(core, planner)


# --- reasons ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (lambda: np.zeros(5, np.bool_), ("reasons has dtype bool",)),
        (lambda: np.zeros(5, np.uint16), ("reasons has dtype uint16",)),
        (lambda: np.zeros(5, np.float64), ("reasons has dtype float64",)),
        (lambda: np.zeros(5, object), ("reasons has dtype object",)),
        (lambda: np.zeros(5, "S1"), ("reasons has dtype |S1",)),
        (lambda: np.zeros(5, RESIDENT_DTYPE), ("reasons has dtype",)),
        (lambda: np.zeros((), np.uint8), ("ndim=0",)),
        (lambda: np.zeros((1, 5), np.uint8), ("ndim=2",)),
        (lambda: np.frombuffer(bytes(5), np.uint8), ("read-only",)),
        (lambda: np.zeros(4, np.uint8), ("has len 4 < count=5",)),
        (lambda: bytearray(5), ("reasons is a bytearray",)),
        (lambda: memoryview(bytearray(5)), ("reasons is a memoryview",)),
        (lambda: array.array("B", bytes(5)), ("reasons is a array",)),
    ],
)
def test_reasons_refuses(core, refuses, make, fragments):
    refuses(ValueError, fragments, arr(), None, make())


def test_reasons_short_for_the_whole_array_but_long_enough_for_count(core, policy):
    reasons = np.full(3, 0xEE, np.uint8)
    new_planner(core, policy).plan(arr(), 3, reasons)
    assert 0xEE not in reasons.tolist()


def test_reasons_beyond_count_are_left_alone(core, policy):
    reasons = np.full(10, 0xEE, np.uint8)
    new_planner(core, policy).plan(arr(), 2, reasons)
    assert reasons[2:].tolist() == [0xEE] * 8
    assert 0xEE not in reasons[:2].tolist()


def test_reasons_aliasing_the_residents_is_planned_right_or_refused(core, policy):
    """reasons = a uint8 view of the residents' own bytes: reason codes land in row 0's fields
    while the kernel still reads them. Either the plan is the one of the unaliased rows, or
    the call is refused (ValueError naming reasons) with the rows untouched."""
    residents = arr()
    want = new_planner(core, policy).plan(arr()).to_dict()
    reasons = residents.view(np.uint8)
    try:
        got = new_planner(core, policy).plan(residents, None, reasons).to_dict()
    except ValueError as exc:
        assert "reasons" in str(exc)
        assert residents.tolist() == arr().tolist()
        return
    assert got == want


# --- a refused call leaves the planner as it was ---------------------------------------------


def test_interleaved_refusals_never_change_later_plans(core, policy):
    """Long random mix of valid and refused calls on one planner vs a fresh planner per call."""
    rng = np.random.default_rng(2024)
    planner = new_planner(core, policy)
    bad_calls = [
        lambda rows: (rows.astype(RESIDENT_DTYPE.newbyteorder(">")), None, None),
        lambda rows: (rows, len(rows) + 1, None),
        lambda rows: (rows, None, np.zeros(len(rows), np.int8)),
        lambda rows: (list(rows), None, None),
        lambda rows: (_with_bad_row(rows), None, None),
    ]
    for _ in range(300):
        rows = arr([ROWS[i] for i in rng.permutation(len(ROWS))[: rng.integers(1, 6)]])
        if rng.random() < 0.5:
            residents, count, reasons = bad_calls[rng.integers(len(bad_calls))](rows)
            if (
                isinstance(residents, np.ndarray)
                and residents.dtype == RESIDENT_DTYPE
                and count is None
                and reasons is None
                and len(residents) == 0
            ):
                continue
            with pytest.raises(ALLOWED):
                planner.plan(residents, count, reasons)
            continue
        fresh = new_planner(core, policy).plan(rows).to_dict()
        assert planner.plan(rows).to_dict() == fresh


def _with_bad_row(rows):
    bad = rows.copy()
    bad[-1]["committed"] = -1
    return bad


# --- apply_to --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "exc", "fragments"),
    [
        (lambda core: None, TypeError, ("residents must be a list or tuple", "NoneType")),
        (lambda core: iter(objects(core)), TypeError, ("residents must be a list or tuple",)),
        (
            lambda core: arr().astype(RESIDENT_DTYPE.newbyteorder(">")),
            TypeError,
            ("residents array has dtype",),
        ),
        (lambda core: arr().reshape(1, -1), ValueError, ("ndim=2",)),
        (lambda core: arr()[:3], ValueError, ("len(residents)=3", "resident count 5")),
        (lambda core: objects(core)[:2], ValueError, ("len(residents)=2", "resident count 5")),
        (
            lambda core: objects(core)[:4] + [None],
            TypeError,
            ("residents[4] must be a ResidentState",),
        ),
        (lambda core: objects(foreign(core)), TypeError, ("residents[0] must be a ResidentState",)),
    ],
)
def test_apply_to_refuses(core, make, exc, fragments):
    planner = new_planner(core, "mixed_fcfs")
    plan = planner.plan(arr())
    before = plan.to_dict()
    target = make(core)
    snapshot = _snapshot(target)
    with pytest.raises(exc, match=matching(*fragments)):
        plan.apply_to(target)
    assert plan.to_dict() == before and _snapshot(target) == snapshot


@pytest.mark.parametrize("kind", ["array", "list"])
def test_apply_to_refuses_int32_overflow_and_writes_nothing(core, kind):
    rows = [(0, 0, 10, 2**31 - 1, True, 0), (0, 1, 20, 0, False, 0)]
    planner = new_planner(core, "mixed_fcfs")
    target = arr(rows) if kind == "array" else objects(core, rows)
    plan = planner.plan(target)
    snapshot = _snapshot(target)
    with pytest.raises(
        OverflowError, match=matching("residents[0].committed=2147483647", "+ 1", "int32")
    ):
        plan.apply_to(target)
    assert _snapshot(target) == snapshot  # resident 1's chunk was not committed either


def test_apply_to_refuses_pause_counter_overflow(core):
    rows = [(0, 0, 20, 0, False, 0), (1, 1, 10, 12, True, 2**31 - 1)]
    options = sp.SchedulingOptions(
        scheduling_policy=sp.SchedulingPolicy.PRIORITY, preemption=sp.PreemptionMode.PAUSE
    )  # no max_pause_steps
    planner = core.StepPlanner(sp.resolve_scheduling_policy(options, LIMITS), LIMITS)
    plan = planner.plan(arr(rows))
    assert list(plan.paused) == [1]
    target = arr(rows)
    with pytest.raises(OverflowError, match="consecutive_paused_steps=2147483647"):
        plan.apply_to(target)
    assert target.tolist() == arr(rows).tolist()


# --- ResidentState ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "exc"),
    [
        ("priority", np.float64(1.0), TypeError),
        ("priority", np.int64(2**40), OverflowError),
        ("arrival", np.int8(-1), OverflowError),
        ("arrival", 2**64, OverflowError),
        ("prompt_length", fractions.Fraction(3), TypeError),
        ("committed", decimal.Decimal(3), TypeError),
        ("committed", b"3", TypeError),
        ("consecutive_paused_steps", [1], TypeError),
        ("context_committed", np.int64(2), TypeError),
        ("context_committed", 1.0, TypeError),
        ("context_committed", "", TypeError),
    ],
)
def test_resident_state_refuses_and_keeps_its_values(core, field, value, exc):
    with pytest.raises(exc, match=field):
        core.ResidentState(**{field: value})
    r = core.ResidentState(*ROWS[0])
    with pytest.raises(exc, match=field):
        setattr(r, field, value)
    assert r._astuple() == ROWS[0]


@pytest.mark.parametrize(
    ("field", "value", "stored"),
    [
        ("priority", np.int16(-3), -3),
        ("arrival", np.uint64(2**64 - 1), 2**64 - 1),
        ("committed", True, 1),
        ("context_committed", np.bool_(True), True),
        ("context_committed", np.uint8(1), True),
        ("context_committed", 0, False),
    ],
)
def test_resident_state_accepts_integer_likes(core, field, value, stored):
    r = core.ResidentState(**{field: value})
    assert getattr(r, field) == stored
    assert type(getattr(r, field)) is type(stored)


def test_resident_state_has_no_other_attributes(core):
    r = core.ResidentState(*ROWS[0])
    with pytest.raises(AttributeError):
        r.prompt = 5
    with pytest.raises(TypeError):
        core.ResidentState(*ROWS[0], 7)
    with pytest.raises(TypeError):
        core.ResidentState(bogus=1)
    assert r._astuple() == ROWS[0]


# --- Ledger ----------------------------------------------------------------------------------


def _ledger():
    from stepplanner.ledger import Ledger

    policy = sp.resolve_scheduling_policy(POLICIES["priority_pause"], LIMITS)
    ledger = Ledger(LIMITS, policy)
    for rid, (prio, length) in enumerate([(0, 10), (1, 20), (-1, 30), (2, 40)]):
        ledger.submit(100 + rid, length, prio)
    ledger.admit()
    ledger.submit(200, 5, 1)
    return ledger


def _ledger_state(ledger):
    return (ledger.to_records(), ledger.waiting_ids(), ledger.count, ledger.free_slots)


@pytest.mark.parametrize(
    ("method", "args", "exc"),
    [
        ("submit", (1.5, 10), TypeError),
        ("submit", (None, 10), TypeError),
        ("submit", ("7", 10), TypeError),
        ("submit", (2**64, 10), OverflowError),
        ("submit", (np.float64(3), 10), TypeError),
        ("submit", (300, 10.0), TypeError),
        ("submit", (300, np.int64(2**40)), OverflowError),
        ("submit", (300, -3), ValueError),
        ("submit", (300, 10, 0.5), TypeError),
        ("submit", (300, 10, "high"), TypeError),
        ("submit", (200, 10), ValueError),  # waiting already
        ("submit", (101, 10), ValueError),  # resident already
        ("retire", ([101, "x"],), TypeError),
        ("retire", ([101, 1.0],), TypeError),
        ("retire", ([None],), TypeError),
        ("retire", ([200],), ValueError),  # waiting, not resident
        ("retire", ([2**70],), OverflowError),
        ("retire", (5,), TypeError),
        ("retire_rows", (np.array([0.0]),), TypeError),
        ("retire_rows", (np.array([True]),), TypeError),
        ("retire_rows", (np.array(["0"]),), TypeError),
        ("retire_rows", ([4],), ValueError),
        ("retire_rows", ([[0, 1], [1, 2]],), ValueError),
        ("apply", (None,), TypeError),
        ("apply", ({"sequences": []},), TypeError),
        ("load", ([{"priority": 2**31}],), OverflowError),
        ("load", ([{"arrival": -1}],), OverflowError),
        ("load", ([{"context_committed": 2}],), TypeError),
        ("load", ([{"committed": 1.5}],), TypeError),
        ("load", ([{"request_id": "a"}],), TypeError),
        ("load", ([{"request_id": 200}],), ValueError),  # clashes with a waiting id
        ("load", ([{"arrival": 1}, {"arrival": 1}],), ValueError),
        ("load", ([None],), TypeError),
        ("load", ([{}] * (B + 1),), ValueError),
    ],
)
def test_ledger_refuses_and_changes_nothing(method, args, exc):
    ledger = _ledger()
    before = _ledger_state(ledger)
    with pytest.raises(exc):
        getattr(ledger, method)(*args)
    assert _ledger_state(ledger) == before
    ledger.submit(999, 5)  # still usable
    assert 999 in ledger.waiting_ids()


# --- CLI input files -------------------------------------------------------------------------


HOSTILE_FILES = {
    "empty": b"",
    "binary": b"\xff\xfe\x00\x81garbage\x00",
    "not_json": b"{residents: [}",
    "json_list": b"[1, 2, 3]",
    "json_number": b"1e400",
    "deep": b"[" * 5000 + b"]" * 5000,
    "residents_str": b'{"residents": "abc"}',
    "residents_ints": b'{"residents": [1, 2]}',
    "huge_values": b'{"residents": [{"priority": 1e400, "arrival": -5}]}',
    "nan": b'{"residents": [{"committed": NaN}]}',
    "bad_limits": b'{"limits": {"max_batch_size": true, "kv_page_size": "16"}, "residents": []}',
    "limits_list": b'{"limits": [4, 64, 16], "residents": []}',
    "bad_options": b'{"options": {"mode": 7, "policy": null}, "residents": []}',
    "unknown_key": b'{"residents": [], "extra": 1}',
    "too_many": b'{"limits": {"max_batch_size": 1}, "residents": [{}, {}]}',
}
HOSTILE_TRACES = {
    "empty": b"",
    "header_only": b"arrival_time,prompt_tokens,output_tokens\n",
    "binary": b"\xff\xfe\x00\x81\n\x00",
    "missing_column": b"arrival_time,prompt_tokens\n0,5\n",
    "words": b"arrival_time,prompt_tokens,output_tokens\nsoon,many,few\n",
    "nan_inf": b"arrival_time,prompt_tokens,output_tokens\nnan,5,5\ninf,5,5\n",
    "negative": b"arrival_time,prompt_tokens,output_tokens\n-1,-5,0\n",
    "huge": b"arrival_time,prompt_tokens,output_tokens,priority\n0,99999999999999999999,5,1e30\n",
    "floats": b"arrival_time,prompt_tokens,output_tokens\n0,5.5,2\n",
    "ragged": b"arrival_time,prompt_tokens,output_tokens\n0,5\n1,2,3,4,5\n",
}


def _cli(args, tmp_path, name, content):
    pytest.importorskip("click", reason="the CLI needs the 'cli' extra")
    from click.testing import CliRunner

    from stepplanner.cli import main

    path = tmp_path / name
    path.write_bytes(content)
    result = CliRunner().invoke(main, [*args(str(path))])
    return result


def _assert_clean_cli_error(result):
    """A one-line error and a non-zero exit: never a traceback out of the serving tool."""
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    assert "Error" in result.output


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_cli_explain_refuses_hostile_ledger_files(tmp_path, name):
    result = _cli(lambda p: ["explain", p], tmp_path, "ledger.json", HOSTILE_FILES[name])
    _assert_clean_cli_error(result)


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_cli_replay_refuses_hostile_record_files(tmp_path, name):
    result = _cli(lambda p: ["replay", p], tmp_path, "record.jsonl", HOSTILE_FILES[name])
    _assert_clean_cli_error(result)


@pytest.mark.parametrize("name", sorted(HOSTILE_TRACES))
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_cli_simulate_refuses_hostile_traces(tmp_path, name, suffix):
    content = HOSTILE_TRACES[name]
    result = _cli(
        lambda p: ["simulate", "--trace", p, "--no-progress"], tmp_path, "trace" + suffix, content
    )
    _assert_clean_cli_error(result)
