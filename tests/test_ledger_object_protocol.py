"""What Python's object protocol lets a caller do to a ledger, its page table and its plans, on
both ledgers (issue 20 A): a ``KVPageTable`` subclass whose properties lie, handed-out views
whose ``.base`` is resized or whose dtype, shape or flags are set, a plan that names a resident
twice, one planner shared by two ledgers, ``__init__`` called again. Every one is refused with
the same message by both implementations, or changes nothing the ledger reads; none corrupts
memory.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stepplanner import SchedulingOptions, StepPlannerLimits, _errors, resolve_scheduling_policy
from stepplanner import _core_py as reference_core
from stepplanner.planner._types import PlannedSequence, SequenceWork

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16)
POLICY = resolve_scheduling_policy(SchedulingOptions(), LIMITS)
VIEWS = ("residents", "request_ids", "output_tokens", "finished_ids", "admitted_ids")


def _message(error: Exception) -> tuple[type, str]:
    return type(error), str(error)


def _state(ledger) -> tuple:
    table = ledger.page_table
    pages = (
        ()
        if table is None
        else (table.rows.tolist(), table.page_counts.tolist(), table.num_free_pages)
    )
    return (
        ledger.to_records(),
        ledger.waiting_ids(),
        ledger.output_tokens.tolist(),
        ledger.finished_ids.tolist(),
        ledger.admitted_ids.tolist(),
    ) + pages


def _liar(table_class, **lies):
    """A subclass of ``table_class`` whose properties say ``lies`` (name -> value)."""
    return type(
        "Liar", (table_class,), {name: property(lambda self, v=v: v) for name, v in lies.items()}
    )


# --- A.1: a page table subclass whose properties lie ---------------------------------------------


def test_a_table_claiming_more_slots_is_refused_by_its_real_size(paged_impl):
    # The issue's reproducer: a 1-slot table that says 64. The compiled ledger once accepted it,
    # and admit() wrote 63 rows past the table's C arrays.
    table = _liar(paged_impl.KVPageTable, max_batch_size=64)(1, 4, 4096, 16)
    limits = StepPlannerLimits(64, 64, 16)
    policy = resolve_scheduling_policy(SchedulingOptions(), limits)
    with pytest.raises(ValueError) as info:
        paged_impl.Ledger(limits, policy, page_table=table)
    assert _message(info.value) == _message(_errors.kv_slots_short(1, 64))
    with pytest.raises(ValueError) as info:
        paged_impl.StepInputs(limits, table)
    assert _message(info.value) == _message(_errors.kv_slots_short(1, 64))


def test_a_table_claiming_wider_rows_cannot_grow_a_slot_past_them(paged_impl):
    # A 2 x 2 table over 256 pages that says each slot may hold 127 pages: submit() once let a
    # worst case of 254 pages in, and admit() grew slot 0 to 254 pages in a row of 2.
    table = _liar(paged_impl.KVPageTable, max_pages_per_sequence=127)(2, 2, 256, 16)
    limits = StepPlannerLimits(2, 64, 16)
    ledger = paged_impl.Ledger(
        limits, resolve_scheduling_policy(SchedulingOptions(), limits), page_table=table
    )
    with pytest.raises(ValueError) as info:
        ledger.submit(1, 16, max_new_tokens=254 * 16 - 16)
    assert _message(info.value) == _message(
        _errors.ledger_worst_case_pages(1, 16, 254 * 16 - 16, 254, 2)
    )
    assert ledger.waiting == 0
    ledger.submit(2, 16, max_new_tokens=16)  # two pages: what a row really holds
    assert ledger.admit() == [2]
    assert table.page_counts.tolist() == [2, 0]
    table.check()


def test_a_table_claiming_the_limits_page_size_is_refused_by_its_real_one(paged_impl):
    table = _liar(paged_impl.KVPageTable, kv_page_size=16)(4, 4, 16, 8)
    for make in (
        lambda: paged_impl.StepInputs(LIMITS, table),
        lambda: paged_impl.Ledger(LIMITS, POLICY, page_table=table),
    ):
        with pytest.raises(ValueError) as info:
            make()
        assert _message(info.value) == _message(_errors.kv_page_size_mismatch(8, 16))


def test_a_table_claiming_every_page_free_is_refused_when_it_holds_some(paged_impl):
    table = _liar(paged_impl.KVPageTable, num_free_pages=16, num_pages=16)(4, 4, 16, 16)
    assert table.ensure(0, 40)
    with pytest.raises(ValueError) as info:
        paged_impl.Ledger(LIMITS, POLICY, page_table=table)
    assert _message(info.value) == _message(_errors.ledger_page_table_in_use(3, 16))


def test_step_inputs_size_their_buffers_by_the_real_row_width(paged_impl):
    table = _liar(paged_impl.KVPageTable, max_pages_per_sequence=64, max_batch_size=9)(4, 4, 16, 16)
    inputs = paged_impl.StepInputs(LIMITS, table)
    assert inputs.buffers()["block_table"].shape == (8, 4)
    assert inputs.buffers()["kv_indices"].shape == (16,)


def test_a_ledger_drives_its_table_by_the_table_class_not_a_subclass(paged_impl):
    """The compiled ledger's C grows, releases and moves the table's slots itself; the twin
    does the same through the table class's own methods, never a subclass's."""

    class Sly(paged_impl.KVPageTable):
        def ensure(self, slot, num_tokens):
            return True

        def release(self, slot):
            pass

        def move(self, src, dst):
            pass

        @property
        def page_counts(self):
            return np.zeros(4, dtype=np.int32)

    table = Sly(4, 4, 16, 16)
    ledger = paged_impl.Ledger(LIMITS, POLICY, page_table=table)
    for rid in range(3):
        ledger.submit(rid, 20, max_new_tokens=12)
    assert ledger.admit() == [0, 1, 2]
    counts = paged_impl.KVPageTable.page_counts.__get__(table)
    assert counts.tolist() == [2, 2, 2, 0] and ledger.reserved_pages == 6
    ledger.retire([0])
    assert counts.tolist() == [2, 2, 0, 0] and ledger.request_ids.tolist() == [2, 1]
    assert ledger.held_back == 0 and ledger.kv_pages_in_use() == 0


# --- A.2: the memory under the views cannot be resized -------------------------------------------


def _resize_everything_under(view) -> None:
    """Try to resize every object down ``view``'s base chain: each must refuse."""
    obj = view
    while obj is not None:
        if isinstance(obj, np.ndarray):
            with pytest.raises(ValueError, match="resize"):
                obj.resize(max(obj.size, 1) * 64, refcheck=False)
            nxt = obj.base
        elif isinstance(obj, memoryview):
            nxt = obj.obj
        else:
            if isinstance(obj, bytearray):
                with pytest.raises(BufferError):
                    obj.extend(bytes(4096))
            assert not hasattr(obj, "resize"), type(obj)
            nxt = None
        obj = nxt


def test_no_view_can_free_or_move_the_memory_the_ledger_writes(ledger_impl):
    ledger = ledger_impl.Ledger(LIMITS, POLICY)
    planner = ledger_impl.StepPlanner(POLICY, LIMITS)
    ledger.submit(1, 20, max_new_tokens=4)
    ledger.step(planner)
    for name in VIEWS:
        _resize_everything_under(getattr(ledger, name))
    # The issue's reproducer went on: submit + admit wrote into freed memory and the residents
    # read zeros.
    ledger.submit(2, 30, max_new_tokens=4)
    ledger.submit(3, 40, max_new_tokens=4)
    assert ledger.admit() == [2, 3]
    assert ledger.residents["prompt_length"].tolist() == [20, 30, 40]
    assert ledger.request_ids.tolist() == [1, 2, 3]


# --- A.3: a handed-out view changed by its holder ------------------------------------------------


def _tamper(view, how: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy deprecates some setters
        if how == "dtype":
            view.dtype = np.dtype([("raw", np.uint8, (view.itemsize,))])
        elif how == "shape":
            view.shape = (len(view), 1)
        elif how == "strides":
            view.strides = (0,)
        elif how == "readonly":
            view.flags.writeable = False


@pytest.mark.parametrize("how", ["dtype", "shape", "strides", "readonly"])
@pytest.mark.parametrize("name", VIEWS)
def test_a_view_changed_by_its_holder_changes_nothing_the_ledger_reads(ledger_impl, name, how):
    def run(tamper: bool):
        ledger = ledger_impl.Ledger(LIMITS, POLICY)
        planner = ledger_impl.StepPlanner(POLICY, LIMITS)
        for rid, length in ((1, 20), (2, 30)):
            ledger.submit(rid, length, max_new_tokens=2)
        plan, held, out = ledger.step(planner), None, []
        for _ in range(5):
            if held is None and len(getattr(ledger, name)):  # the first step it shows rows
                held = getattr(ledger, name)
                if tamper:
                    _tamper(held, how)
            finished = np.zeros(plan.num_prefill + plan.num_decode, dtype=bool)
            plan = ledger.step(planner, finished)
            out.append((plan.to_dict(), _state(ledger)))
            for view in VIEWS:  # what a later caller gets is the ledger's state, as it was made
                got = getattr(ledger, view)
                assert got.ndim == 1 and got.dtype == (
                    ledger_impl.Ledger(LIMITS).residents.dtype if view == "residents" else np.int64
                )
            assert ledger.residents.flags.writeable
        assert held is not None
        return out, held

    (tampered, held), (clean, _) = run(True), run(False)
    assert tampered == clean
    if how == "dtype":
        assert held.dtype.names == ("raw",)  # the holder's object stays as the holder made it


def test_the_issue_reproducers_on_residents_and_request_ids(ledger_impl):
    ledger = ledger_impl.Ledger(LIMITS, POLICY)
    planner = ledger_impl.StepPlanner(POLICY, LIMITS)
    ledger.submit(1, 20, max_new_tokens=3)
    ledger.submit(2, 30, max_new_tokens=3)
    plan = ledger.step(planner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        r = ledger.residents
        r.dtype = np.dtype([("raw", np.uint8, (32,))])
        ledger.request_ids.shape = (2, 1)
    plan = ledger.step(planner, np.zeros(plan.num_prefill + plan.num_decode, dtype=bool))
    assert [rec["request_id"] for rec in ledger.to_records()] == [1, 2]
    assert ledger.residents["committed"].tolist() == [20, 30]
    assert ledger.kv_pages_in_use() == 2 + 2


# --- A.4: a plan naming one resident twice --------------------------------------------------------


def _reference_plan(rows, paused, n):
    """A reference StepPlan with these rows: what unpickling an edited plan gives."""
    plan = reference_core.StepPlan()
    plan._set([PlannedSequence(*r) for r in rows], list(paused), n)
    return plan


DECODE = int(SequenceWork.DECODE)
REPEATS = {  # rows, paused -> (where, resident, first)
    "two rows": (
        [(0, DECODE, 40, 1, True), (0, DECODE, 40, 1, True)],
        [],
        ("sequences[1].resident", 0, "sequences[0].resident"),
    ),
    "row and pause": ([(1, DECODE, 50, 1, True)], [1], ("paused[0]", 1, "sequences[0].resident")),
    "two pauses": ([], [0, 0], ("paused[1]", 0, "paused[0]")),
}


def _two_decoding(ledger_impl, committed=(40, 50)):
    ledger = ledger_impl.Ledger(LIMITS, POLICY)
    ledger.load(
        [
            {
                "prompt_length": 10,
                "committed": c,
                "context_committed": True,
                "request_id": rid,
                "arrival": rid,
            }
            for rid, c in zip((7, 8), committed)
        ]
    )
    return ledger


@pytest.mark.parametrize("case", sorted(REPEATS))
def test_a_plan_naming_a_resident_twice_is_refused_with_nothing_written(ledger_impl, case):
    rows, paused, repeated = REPEATS[case]
    expected = _message(_errors.plan_resident_repeated(*repeated))
    ledger = _two_decoding(ledger_impl)
    before = _state(ledger)
    plan = _reference_plan(rows, paused, 2)
    with pytest.raises(ValueError) as info:
        ledger.apply(plan)
    assert _message(info.value) == expected
    assert _state(ledger) == before
    residents = ledger.residents.copy()
    with pytest.raises(ValueError) as info:
        plan.apply_to(residents)
    assert _message(info.value) == expected
    assert residents.tolist() == ledger.residents.tolist()


@pytest.mark.parametrize("case", sorted(REPEATS))
def test_a_compiled_plan_naming_a_resident_twice_cannot_be_built(compiled, case):
    rows, paused, repeated = REPEATS[case]
    restore = compiled.StepPlan().__reduce__()[0]  # what unpickling calls
    with pytest.raises(ValueError) as info:
        restore(rows, paused, 2)
    assert _message(info.value) == _message(_errors.plan_resident_repeated(*repeated))


def test_two_decode_rows_of_one_resident_cannot_overflow_committed(ledger_impl):
    # Applied as two rows, committed = 2**30 + 2 * 2**30 would wrap int32 (C signed overflow).
    ledger = _two_decoding(ledger_impl, committed=(2**30, 5))
    before = _state(ledger)
    plan = _reference_plan([(0, DECODE, 2**30, 2**30, True)] * 2, [], 2)
    with pytest.raises(ValueError, match="names the resident"):
        ledger.apply(plan)
    assert _state(ledger) == before


# --- A.5: one planner, two ledgers ----------------------------------------------------------------


def test_a_pending_plan_replanned_for_another_ledger_is_refused(ledger_impl):
    limits = StepPlannerLimits(4, 64, 8)
    policy = resolve_scheduling_policy(SchedulingOptions(max_num_tokens=16), limits)
    a, b = (ledger_impl.Ledger(limits, policy) for _ in range(2))
    planner = ledger_impl.StepPlanner(policy, limits)
    a.submit(1, 40, max_new_tokens=4)
    b.submit(2, 8, max_new_tokens=4)
    plan = a.step(planner)
    rows = plan.num_prefill + plan.num_decode
    b.step(planner)  # the planner's one plan is now b's
    before = _state(a)
    for finished in (np.zeros(rows, dtype=bool), None):
        with pytest.raises(ValueError) as info:
            a.step(planner, finished)
        assert _message(info.value) == _message(_errors.pending_plan_changed())
        assert _state(a) == before
    # Once the stale plan is dropped (admit() changes the residents), a goes on, and its
    # 40-token prompt is prefilled in full before it decodes.
    a.admit()
    plan, seen = a.step(planner), []
    while a.count:
        seen.append((a.residents["committed"][0], a.residents["context_committed"][0]))
        plan = a.step(planner, np.zeros(plan.num_prefill + plan.num_decode, dtype=bool))
    assert seen[0] == (0, False) and all(c >= 40 for c, done in seen if done), seen


def test_a_plan_call_between_two_steps_is_refused_too(ledger_impl):
    ledger = ledger_impl.Ledger(LIMITS, POLICY)
    planner = ledger_impl.StepPlanner(POLICY, LIMITS)
    ledger.submit(1, 20, max_new_tokens=4)
    plan = ledger.step(planner)
    rows = plan.num_prefill + plan.num_decode
    planner.plan(ledger.residents)  # the same rows: the plan changed only in its version
    with pytest.raises(ValueError) as info:
        ledger.step(planner, np.zeros(rows, dtype=bool))
    assert _message(info.value) == _message(_errors.pending_plan_changed())


def test_a_planner_returning_no_plan_is_refused_at_the_next_step(ledger_impl):
    class Odd:
        limits = LIMITS

        def plan(self, residents, count=None, reasons=None):
            return object()

    ledger = ledger_impl.Ledger(LIMITS, POLICY)
    ledger.submit(1, 20, max_new_tokens=4)
    ledger.step(Odd())
    with pytest.raises(TypeError) as info:
        ledger.step(Odd())
    assert "StepPlan" in str(info.value)


def test_plans_of_the_other_implementation_are_versioned_too(ledger_impl, compiled, reference):
    for core in (compiled, reference):  # either ledger steps with either planner
        ledger = ledger_impl.Ledger(LIMITS, POLICY)
        planner, other = (core.StepPlanner(POLICY, LIMITS) for _ in range(2))
        ledger.submit(1, 20, max_new_tokens=4)
        plan = ledger.step(planner)
        rows = plan.num_prefill + plan.num_decode
        other.plan(ledger.residents)  # another planner: the pending plan is untouched
        plan = ledger.step(planner, np.zeros(rows, dtype=bool))
        planner.plan(ledger.residents)
        with pytest.raises(ValueError, match="has changed since"):
            ledger.step(planner, np.zeros(plan.num_prefill + plan.num_decode, dtype=bool))


# --- A.6: __init__ called again -------------------------------------------------------------------


def test_init_called_again_is_refused_and_changes_nothing(ledger_impl):
    ledger = ledger_impl.Ledger(LIMITS, POLICY, max_waiting=3)
    ledger.submit(1, 20)
    ledger.admit()
    ledger.submit(2, 20)
    before = (_state(ledger), ledger.limits, ledger.max_waiting, ledger.capacity)
    other = StepPlannerLimits(8, 32, 16)
    for args, kwargs in (((LIMITS, POLICY), {}), ((other,), {"max_waiting": 9})):
        with pytest.raises(RuntimeError) as info:
            ledger.__init__(*args, **kwargs)
        assert _message(info.value) == _message(_errors.already_initialised("Ledger"))
    assert (_state(ledger), ledger.limits, ledger.max_waiting, ledger.capacity) == before
