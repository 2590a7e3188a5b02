"""SPEC §8 (draft tokens) beyond its worked examples: the compiled core against the reference on
drawn ledgers and drafts, the guarantees on every plan, and bad drafts refused alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplanner import (
    SchedulingOptions,
    SequenceWork,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from stepplanner.planner.checks import check_plan
from stepplanner.testing import (
    as_resident_array,
    as_resident_states,
    draft_counts,
    planning_cases,
)

BASE = settings().max_examples
PARITY = settings(max_examples=6 * BASE)


def outcome(planner: Any, residents: Any, drafts: Any) -> tuple[Any, ...]:
    reasons = np.full(max(len(residents), 1), 0xEE, dtype=np.uint8)
    try:
        plan = planner.plan(residents, reasons=reasons, drafts=drafts)
    except Exception as exc:  # noqa: BLE001 - the exception itself is the result compared
        return ("raised", type(exc), str(exc))
    return ("planned", plan.to_dict(), plan.draft_tokens, reasons.tolist())


def inputs(core: Any, rows: list[Any], drafts: list[Any]) -> list[tuple[Any, Any]]:
    states = as_resident_states(rows, core.ResidentState)
    array = as_resident_array(rows)
    out: list[tuple[Any, Any]] = [(states, drafts), (array, tuple(drafts))]
    if all(type(d) is int and -(2**31) <= d < 2**31 for d in drafts):
        out.append((array, np.array(drafts, dtype=np.int32)))
    return out


def same_everywhere(case: Any, compiled: Any, reference: Any, drafts: list[Any]) -> tuple:
    want = None
    for core in (reference, compiled):
        planner = core.StepPlanner(case.policy, case.limits)
        for residents, given_drafts in inputs(core, case.rows, drafts):
            got = outcome(planner, residents, given_drafts)
            if want is None:
                want = got
            assert got == want, f"{core.IMPLEMENTATION}, drafts {given_drafts!r}\n{case}"
    assert want is not None
    return want


@PARITY
@given(st.data())
def test_drafts_plan_alike_and_keep_every_guarantee(compiled, reference, data):
    case = data.draw(planning_cases())
    drafts = data.draw(draft_counts(case.limits, case.rows))
    result = same_everywhere(case, compiled, reference, drafts)
    assert result[0] == "planned", result
    planner = compiled.StepPlanner(case.policy, case.limits)
    plan = planner.plan(as_resident_array(case.rows), drafts=drafts)
    check_plan(case.policy, case.limits, case.rows, plan, drafts=drafts)
    assert plan.total_tokens == plan.prefill_tokens + plan.num_decode + plan.draft_tokens


@PARITY
@given(planning_cases())
def test_zero_drafts_plan_exactly_as_none(compiled, reference, case):
    for core in (compiled, reference):
        planner = core.StepPlanner(case.policy, case.limits)
        residents = as_resident_array(case.rows)
        without = planner.plan(residents).to_dict()
        assert planner.plan(residents, drafts=[0] * len(case.rows)).to_dict() == without
        assert planner.plan(residents).draft_tokens == 0


@PARITY
@given(st.data())
def test_more_drafts_never_take_what_the_first_prompt_needs(compiled, reference, data):
    """Whatever is proposed, the prompts get at least the page end the first one needs, and the
    decode rows' drafts only ever shrink the chunks, never the decode rows."""
    case = data.draw(planning_cases())
    drafts = data.draw(draft_counts(case.limits, case.rows))
    planner = compiled.StepPlanner(case.policy, case.limits)
    residents = as_resident_array(case.rows)
    without = planner.plan(residents).copy()
    plan = planner.plan(residents, drafts=drafts)
    decodes = lambda p: [s.resident for s in p.sequences if s.work == SequenceWork.DECODE]  # noqa: E731
    assert decodes(plan) == decodes(without)
    assert plan.prefill_tokens <= without.prefill_tokens
    if without.num_prefill:
        assert plan.num_prefill >= 1
        assert plan.sequences[0].resident == without.sequences[0].resident


# --- bad drafts -----------------------------------------------------------------------------------


@st.composite
def broken_drafts(draw: Any) -> tuple[Any, list[Any]]:
    case = draw(planning_cases().filter(lambda c: len(c.rows) > 0))
    drafts: list[Any] = draw(draft_counts(case.limits, case.rows))
    i = draw(st.integers(0, len(drafts) - 1))
    prompt_rows = [k for k, r in enumerate(case.rows) if not r[4]]
    kind = draw(st.sampled_from(["negative", "prompt", "overflow", "type", "short"]))
    if kind == "negative":
        drafts[i] = draw(st.integers(-(2**31), -1))
    elif kind == "prompt" and prompt_rows:
        drafts[draw(st.sampled_from(prompt_rows))] = draw(st.integers(1, 2**31 - 1))
    elif kind == "overflow":
        drafts[i] = draw(st.sampled_from([2**31, -(2**31) - 1, 2**63]))
    elif kind == "type":
        drafts[i] = draw(st.sampled_from([1.0, "2", None]))
    else:
        drafts = drafts[: draw(st.integers(0, len(drafts) - 1))]
    return case, drafts


@settings(max_examples=4 * BASE)
@given(broken_drafts())
def test_bad_drafts_are_refused_alike_and_leave_the_plan(compiled, reference, case_drafts):
    case, drafts = case_drafts
    result = same_everywhere(case, compiled, reference, drafts)
    if result[0] == "planned":  # e.g. "prompt" drawn where every row decodes: still valid
        return
    _, exc_type, message = result
    assert issubclass(exc_type, (ValueError, TypeError, OverflowError))
    assert "drafts" in message
    for core in (compiled, reference):
        planner = core.StepPlanner(case.policy, case.limits)
        residents = as_resident_array(case.rows)
        before = planner.plan(residents).to_dict()
        with pytest.raises(exc_type):
            planner.plan(residents, drafts=drafts)
        assert planner.plan.__self__ is planner
        assert before == planner.plan(residents).to_dict()


def _planner(core: Any) -> Any:
    limits = StepPlannerLimits(4, 64, 16)
    policy = resolve_scheduling_policy(SchedulingOptions(), limits)
    return core.StepPlanner(policy, limits)


ROWS = [(0, 0, 40, 41, True, 0), (0, 1, 60, 0, False, 0)]


@pytest.mark.parametrize(
    ("drafts", "error", "words"),
    [
        ([2, 1], ValueError, "drafts[1]=1 but residents[1] is prompt-incomplete"),
        ([-1, 0], ValueError, "drafts[0]=-1; allowed: >= 0"),
        ([1], ValueError, "drafts has len 1 < count=2"),
        ([2**31, 0], OverflowError, "drafts[0]=2147483648 does not fit int32"),
        ([1.5, 0], TypeError, "drafts[0] must be an integer"),
        (np.array([1, 0], dtype=np.int64), TypeError, "drafts array has dtype int64"),
        (np.zeros((2, 1), dtype=np.int32), TypeError, "ndim=2"),
        ({0: 1}, TypeError, "drafts must be a list or tuple of ints"),
    ],
)
def test_bad_drafts_name_the_field_the_value_and_what_is_allowed(core, drafts, error, words):
    planner = _planner(core)
    residents = as_resident_states(ROWS, core.ResidentState)
    kept = planner.plan(residents)
    before = kept.to_dict()
    with pytest.raises(error) as raised:
        planner.plan(residents, drafts=drafts)
    assert words in str(raised.value)
    assert kept.to_dict() == before


# --- inputs read once: code run while one input is read cannot change another (issue 41) ------


WORKED = [(0, 0, 40, 41, True, 0), (0, 1, 60, 0, False, 0), (0, 2, 20, 0, False, 0)]


def _worked_planner(core: Any) -> Any:
    limits = StepPlannerLimits(4, 64, 16)
    options = SchedulingOptions(max_num_tokens=52, max_chunk_tokens=32)
    return core.StepPlanner(resolve_scheduling_policy(options, limits), limits)


class _Meddling(list):
    """A drafts (or residents) list whose reads run ``meddle`` first, as user code may."""

    def __init__(self, items: Any, meddle: Any) -> None:
        super().__init__(items)
        self.meddle = meddle

    def __getitem__(self, index: Any) -> Any:
        self.meddle()
        return super().__getitem__(index)


def test_drafts_read_before_the_array_rows_so_a_change_they_make_is_checked(core):
    """A drafts list's __getitem__ that breaks an array row already passed its check: the rows
    are read (copied and checked) after the drafts, so the broken row is refused by name."""
    planner = _worked_planner(core)
    residents = as_resident_array(WORKED)
    kept = planner.plan(residents).to_dict()

    def meddle() -> None:
        residents["committed"][1] = -7

    with pytest.raises(ValueError, match=r"residents\[1\]\.committed=-7 is negative"):
        planner.plan(residents, drafts=_Meddling([4, 0, 0], meddle))
    assert planner.plan.__self__ is planner
    assert kept == planner.plan(as_resident_array(WORKED)).to_dict()


def test_drafts_that_grow_a_decode_row_past_its_check_are_planned_as_checked(core):
    """The change a drafts list makes to the rows happens before the rows are read: the plan is
    the one the changed rows give (a check-then-plan of the same values), never a mix."""
    planner = _worked_planner(core)
    residents = as_resident_array(WORKED)

    def meddle() -> None:
        residents["committed"][0] = 50  # still a valid decoding row

    plan = planner.plan(residents, drafts=_Meddling([4, 0, 0], meddle))
    assert [s.past_length for s in plan.sequences if s.resident == 0] == [50]
    check_plan(planner.policy, planner.limits, residents, plan, drafts=[4, 0, 0])


def test_a_drafts_array_shrunk_while_the_residents_list_is_read_is_read_before(core):
    """Residents as a list run code that resizes the drafts array: the drafts were copied
    first, so nothing is read past the array's end and the plan is the one it gave."""
    planner = _worked_planner(core)
    drafts = np.array([4, 0, 0], dtype=np.int32)
    states = as_resident_states(WORKED, core.ResidentState)

    def meddle() -> None:
        drafts.resize(0, refcheck=False)

    plan = planner.plan(_Meddling(states, meddle), drafts=drafts)
    assert plan.draft_tokens == 4
    assert [(s.resident, s.query_length) for s in plan.sequences] == [(1, 32), (0, 5)]


def test_a_reasons_array_resized_while_the_residents_are_read_is_checked_again(core):
    """reasons is checked again after the last user code ran: one shrunk below count by a
    residents list's __getitem__ is refused (and the plan kept), never written past its end."""
    planner = _worked_planner(core)
    states = as_resident_states(WORKED, core.ResidentState)
    kept = planner.plan(states).to_dict()
    reasons = np.zeros(3, dtype=np.uint8)

    def meddle() -> None:
        reasons.resize(1, refcheck=False)

    with pytest.raises(ValueError, match=r"reasons has len 1 < count=3"):
        planner.plan(_Meddling(states, meddle), reasons=reasons)
    assert kept == planner.plan(states).to_dict()


def test_an_ndarray_subclass_is_measured_by_its_shape_not_its_len(core):
    """len() of an ndarray subclass is user code; the rows read are those its shape holds."""

    class Lying(np.ndarray):
        def __len__(self) -> int:
            return 4

    planner = _worked_planner(core)
    residents = as_resident_array(WORKED[:2]).view(Lying)
    assert planner.plan(residents).num_residents == 2
    with pytest.raises(ValueError, match=r"count=3 exceeds"):
        planner.plan(residents, count=3)


@pytest.mark.parametrize("field", ["drafts", "residents", "reasons"])
def test_masked_arrays_are_refused_by_name(core, field):
    """A masked entry has no value: both cores refuse a masked array, before anything changes
    (the compiled one had read the data under the mask, the reference raised numpy's
    MaskError)."""
    planner = _worked_planner(core)
    residents = as_resident_array(WORKED)
    kept = planner.plan(residents).to_dict()
    given: dict[str, Any] = {
        "residents": residents,
        "drafts": np.zeros(3, dtype=np.int32),
        "reasons": np.zeros(3, dtype=np.uint8),
    }
    given[field] = np.ma.masked_array(given[field], mask=[True, False, False])
    with pytest.raises(TypeError, match=rf"^{field} is a numpy masked array; allowed: a plain"):
        planner.plan(given["residents"], reasons=given["reasons"], drafts=given["drafts"])
    assert kept == planner.plan(residents).to_dict()
