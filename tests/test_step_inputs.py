"""StepInputs on both implementations: the arrays attention kernels take, from a plan."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import SEQUENCE_DTYPE, StepPlannerLimits

NAMES = (
    "positions",
    "cu_seqlens_q",
    "qo_indptr",
    "seq_lens_k",
    "slot_mapping",
    "block_table",
    "kv_indptr",
    "kv_indices",
    "kv_last_page_len",
    "logits_indices",
)


def plan_rows(*rows):
    """(resident, work, past_length, query_length, select_last_token_logits) tuples."""
    return np.array(list(rows), dtype=SEQUENCE_DTYPE)


def arrays(inputs):
    return {name: getattr(inputs, name).tolist() for name in NAMES}


@pytest.fixture
def worked(kv):
    """P=4; slot 0 holds pages [0, 1], slot 1 pages [2, 3, 4], slot 2 page [5]."""
    table = kv.KVPageTable(4, 4, 16, 4)
    assert table.ensure(0, 6) and table.ensure(1, 10) and table.ensure(2, 1)
    return table, kv.StepInputs(StepPlannerLimits(4, 8, 4), table)


def test_worked_example(worked):
    table, inputs = worked
    # A final prompt chunk of 3 tokens after 3 committed (resident 0), a non-final chunk of 1
    # token at the start (resident 2), then a decode at position 9 (resident 1).
    out = inputs.prepare(plan_rows((0, 0, 3, 3, 1), (2, 0, 0, 1, 0), (1, 1, 9, 1, 1)))
    assert out is inputs
    assert arrays(inputs) == {
        "positions": [3, 4, 5, 0, 9],
        "cu_seqlens_q": [0, 3, 4, 5],
        "qo_indptr": [0, 3, 4, 5],
        "seq_lens_k": [6, 1, 10],
        # page * P + position % P: pos 3 -> page 0, pos 4, 5 -> page 1; pos 0 -> page 5;
        # pos 9 -> slot 1's third page (4).
        "slot_mapping": [3, 4 * 1 + 0, 4 * 1 + 1, 4 * 5 + 0, 4 * 4 + 1],
        "block_table": [[0, 1, -1, -1], [5, -1, -1, -1], [2, 3, 4, -1]],
        "kv_indptr": [0, 2, 3, 6],
        "kv_indices": [0, 1, 5, 2, 3, 4],
        "kv_last_page_len": [2, 1, 2],
        "logits_indices": [2, 4],
    }
    assert inputs.slot_mapping.dtype == np.int64
    assert all(getattr(inputs, n).dtype == np.int32 for n in NAMES if n != "slot_mapping")
    assert (inputs.num_rows, inputs.num_tokens) == (3, 5)


def test_block_table_lists_the_pages_of_the_rows_kv_only(worked):
    """Pages a slot holds beyond seq_lens_k (a reservation) are not listed; a row that held
    more pages the step before is padded back to -1."""
    table, inputs = worked
    inputs.prepare(plan_rows((1, 1, 9, 1, 1), (0, 0, 0, 6, 1)))
    assert inputs.block_table.tolist() == [[2, 3, 4, -1], [0, 1, -1, -1]]
    start = inputs.block_table_start
    inputs.prepare(plan_rows((1, 0, 0, 2, 0)))  # slot 1 holds 3 pages, its KV needs 1
    assert inputs.block_table.tolist() == [[2, -1, -1, -1]]
    assert inputs.block_table_start == start  # slot 1's row stayed where it was
    assert inputs.buffers()["block_table"][start].tolist() == [2, -1, -1, -1]


def test_an_empty_plan(worked):
    _, inputs = worked
    inputs.prepare(plan_rows((0, 0, 0, 6, 1)))
    inputs.prepare(plan_rows())
    assert arrays(inputs) == {n: [] for n in NAMES} | {
        "cu_seqlens_q": [0],
        "qo_indptr": [0],
        "kv_indptr": [0],
    }
    assert inputs.block_table.shape == (0, 4)
    inputs.invalidate()
    inputs.prepare(plan_rows())
    assert (inputs.buffers()["block_table"] == -1).all()  # invalidate wipes the whole buffer


def test_block_table_follows_rows_that_move(kv):
    """Rows that move together (a chunk row more in front, a row retired ahead) keep their
    buffer rows: the window over the buffer moves instead, and only rows new to their place
    are written. The arrays are what the rows say either way."""
    table = kv.KVPageTable(8, 4, 32, 4)
    for slot in range(8):
        assert table.ensure(slot, 16)
    inputs = kv.StepInputs(StepPlannerLimits(8, 16, 4), table, "flash_attn")
    decode = [(slot, 1, 4 + slot, 1, 1) for slot in range(1, 7)]
    inputs.prepare(plan_rows(*decode))
    start = inputs.block_table_start
    assert 0 <= start <= 16 - 6
    inputs.prepare(plan_rows((0, 0, 0, 3, 0), *decode))  # a chunk row in front
    assert inputs.block_table_start == start - 1
    inputs.prepare(plan_rows(*decode[:2], *decode[3:]))  # the third decode row retired
    assert inputs.block_table_start in (start, start + 1)
    for plan in (plan_rows(*decode[::-1]), plan_rows((7, 0, 0, 2, 1), *decode)):
        inputs.prepare(plan)
        want = np.full((len(plan), 4), -1)
        for i, (slot, _, past, query, _) in enumerate(plan.tolist()):
            used = -(-(past + query) // 4)
            want[i, :used] = table.rows[slot, :used]
        assert inputs.block_table.tolist() == want.tolist()
        buffer = inputs.buffers()["block_table"]
        assert np.shares_memory(inputs.block_table, buffer)
        assert inputs.block_table.ctypes.data == (
            buffer.ctypes.data + inputs.block_table_start * buffer.strides[0]
        )


def test_missing_pages_name_the_resident_and_write_nothing(worked):
    table, inputs = worked
    inputs.prepare(plan_rows((0, 0, 0, 6, 1)))
    before = {k: v.copy() for k, v in inputs.buffers().items()}
    with pytest.raises(
        ValueError,
        match=(
            r"plan row 1: resident 2 needs KV pages for 6 tokens \(past_length 1 \+ "
            r"query_length 5\) but its pages hold 4 tokens \(1 page\(s\) of 4\); "
            r"call page_table.ensure\(2, 6\) first"
        ),
    ):
        inputs.prepare(plan_rows((1, 1, 9, 1, 1), (2, 0, 1, 5, 1)))
    assert all(np.array_equal(before[k], v) for k, v in inputs.buffers().items())
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4, 5]  # the previous step's arrays


@pytest.mark.parametrize(
    ("rows", "error", "message"),
    [
        (
            ((4, 1, 0, 1, 1),),
            ValueError,
            r"plan row 0: resident=4 is not a page-table slot; "
            r"allowed: 0\.\.3",
        ),
        (((0, 1, 0, 1, 1), (-1, 1, 0, 1, 1)), ValueError, "plan row 1: resident=-1"),
        (
            ((0, 1, -1, 1, 1),),
            ValueError,
            "plan row 0: past_length=-1 is out of range; allowed: >= 0",
        ),
        (
            ((0, 1, 0, 0, 1),),
            ValueError,
            "plan row 0: query_length=0 is out of range; allowed: >= 1",
        ),
        (((0, 1, 2**31 - 1, 1, 1),), OverflowError, "plan row 0: past_length \\+ query_length"),
        (
            ((0, 1, 0, 1, 1),) * 5,
            ValueError,
            "plan has 5 rows; allowed: <= limits.max_batch_size=4",
        ),
        (
            ((0, 0, 0, 8, 1), (1, 0, 0, 8, 1), (2, 0, 0, 8, 1), (3, 0, 0, 9, 1)),
            ValueError,
            "plan has 33 query tokens in all; allowed: <= limits.t_max=32",
        ),
    ],
)
def test_bad_plans_are_refused_before_anything_is_written(kv, rows, error, message):
    table = kv.KVPageTable(4, 4, 16, 4)
    for slot in range(4):
        table.ensure(slot, 16)
    inputs = kv.StepInputs(StepPlannerLimits(4, 8, 4), table)
    before = {k: v.copy() for k, v in inputs.buffers().items()}
    with pytest.raises(error, match=message):
        inputs.prepare(plan_rows(*rows))
    assert all(np.array_equal(before[k], v) for k, v in inputs.buffers().items())


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (((2, 0, 1, 5, 1), (1, 1, 9, 1, 1)), r"plan row 0: resident 2 needs KV pages for 6 tokens"),
        (((0, 1, 0, 1, 1), (5, 1, 0, 1, 1)), r"plan row 1: resident=5 is not a page-table slot"),
    ],
)
def test_a_step_plan_read_in_place_is_checked_like_an_array(worked, rows, message):
    """A StepPlan's rows are validated where they lie (no copy): a plan that does not fit the
    page table is refused the same way, and nothing is written."""
    from stepplanner import _core

    _, inputs = worked
    inputs.prepare(plan_rows((0, 0, 0, 6, 1)))
    before = {k: v.copy() for k, v in inputs.buffers().items()}
    plan = _core._restore_plan(list(rows), [], 8)  # what unpickling a StepPlan builds
    with pytest.raises(ValueError, match=message):
        inputs.prepare(plan)
    assert all(np.array_equal(before[k], v) for k, v in inputs.buffers().items())
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4, 5]


def test_plan_types(worked):
    _, inputs = worked
    with pytest.raises(TypeError, match="plan must be a StepPlan, a 1-D SEQUENCE_DTYPE array"):
        inputs.prepare([(0, 0, 0, 1, 1)])
    with pytest.raises(TypeError, match="plan array has dtype int32"):
        inputs.prepare(np.zeros(3, dtype=np.int32))
    with pytest.raises(ValueError, match="plan array has ndim=2; allowed: 1"):
        inputs.prepare(np.zeros((1, 1), dtype=SEQUENCE_DTYPE))


def test_strided_plan_arrays_are_read_in_place(worked):
    _, inputs = worked
    rows = plan_rows((0, 0, 0, 6, 1), (9, 9, 9, 9, 9), (1, 1, 9, 1, 1))
    inputs.prepare(rows[::2])
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4, 5, 9]


def test_constructor_checks(kv):
    table = kv.KVPageTable(4, 4, 16, 4)
    with pytest.raises(
        ValueError, match="page_table.kv_page_size=4 differs from limits.kv_page_size=8"
    ):
        kv.StepInputs(StepPlannerLimits(4, 8, 8), table)
    with pytest.raises(
        ValueError, match="page_table.max_batch_size=4 is smaller than limits.max_batch_size=5"
    ):
        kv.StepInputs(StepPlannerLimits(5, 8, 4), table)
    with pytest.raises(TypeError, match="limits must be a StepPlannerLimits"):
        kv.StepInputs((4, 8, 4), table)
    with pytest.raises(TypeError, match="page_table must be a"):
        kv.StepInputs(StepPlannerLimits(4, 8, 4), object())
    big = kv.StepInputs(StepPlannerLimits(2, 8, 4), table)  # more slots than rows is fine
    assert big.buffers()["positions"].shape == (16,)


FLASH_ATTN_ONLY = ("block_table",)
FLASHINFER_ONLY = ("kv_indptr", "kv_indices", "kv_last_page_len")


@pytest.mark.parametrize(
    "layout, skipped", [("flash_attn", FLASHINFER_ONLY), ("flashinfer", FLASH_ATTN_ONLY)]
)
def test_a_layout_fills_its_kernel_familys_arrays_and_shows_no_other(kv, layout, skipped):
    table = kv.KVPageTable(4, 4, 16, 4)
    assert table.ensure(0, 6) and table.ensure(1, 10) and table.ensure(2, 1)
    limits = StepPlannerLimits(4, 8, 4)
    full, one = kv.StepInputs(limits, table), kv.StepInputs(limits, table, layout)
    assert (full.layout, one.layout) == ("all", layout)
    # Two steps, the second shorter and reordered: the incremental block_table must still match.
    for plan in (
        plan_rows((0, 0, 3, 3, 1), (2, 0, 0, 1, 0), (1, 1, 9, 1, 1)),
        plan_rows((1, 1, 9, 1, 1), (0, 0, 5, 1, 1)),
    ):
        full.prepare(plan)
        assert one.prepare(plan) is one
        for name in NAMES:
            if name in skipped:
                with pytest.raises(
                    AttributeError,
                    match=(
                        rf"StepInputs\(layout='{layout}'\) does not fill {name}; build it with "
                        rf"layout='(flash_attn|flashinfer)' or layout='all'"
                    ),
                ):
                    getattr(one, name)
                assert not hasattr(one, name)
            else:
                assert getattr(one, name).tolist() == getattr(full, name).tolist(), name
    # The skipped family's buffers are never allocated, so nothing stale can be read.
    assert set(one.buffers()) == set(full.buffers()) - set(skipped)
    assert f"layout='{layout}'" in repr(one)


def test_layout_is_checked(kv):
    table = kv.KVPageTable(4, 4, 16, 4)
    limits = StepPlannerLimits(4, 8, 4)
    with pytest.raises(
        ValueError,
        match="layout='flash' is not a StepInputs layout; allowed: "
        "'all', 'flash_attn', 'flashinfer'",
    ):
        kv.StepInputs(limits, table, "flash")
    with pytest.raises(TypeError, match="layout must be a str, got int"):
        kv.StepInputs(limits, table, layout=1)


def test_arrays_are_zero_copy_views_of_fixed_buffers(worked):
    _, inputs = worked
    buffers = inputs.buffers()
    inputs.prepare(plan_rows((0, 0, 0, 6, 1), (1, 1, 9, 1, 1)))
    for name in NAMES:
        key = "cu_seqlens_q" if name == "qo_indptr" else name
        assert np.shares_memory(getattr(inputs, name), buffers[key]), name
    first = inputs.positions
    inputs.prepare(plan_rows((1, 0, 0, 6, 1)))
    assert first[:6].tolist() == [0, 1, 2, 3, 4, 5]  # overwritten in place by the next prepare
    assert inputs.positions.ctypes.data == first.ctypes.data


def test_dlpack_export_shares_memory(worked):
    _, inputs = worked
    inputs.prepare(plan_rows((0, 0, 0, 6, 1), (1, 1, 9, 1, 1)))
    for name in NAMES:
        view = getattr(inputs, name)
        imported = np.from_dlpack(view)
        assert imported.ctypes.data == view.ctypes.data and np.array_equal(imported, view)


def run_serving_steps(sp_module, kv, steps=12):
    """Plans of a real planner over a real ledger, pages ensured before each prepare."""
    limits = StepPlannerLimits(4, 24, 4)
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(max_num_tokens=12), limits)
    planner = sp_module.StepPlanner(policy, limits)
    ledger = sp.Ledger(limits)
    table = kv.KVPageTable(4, 16, 64, 4)
    inputs = kv.StepInputs(limits, table)
    seen = []
    for step in range(steps):
        if step in (0, 2):  # later prompts arrive beside decodes, so they are chunked
            for rid, length in ((2 * step, 10 + step), (2 * step + 1, 17 + step)):
                ledger.submit(rid, length)
            ledger.admit()
        plan = planner.plan(ledger.residents)
        for row in plan.sequences:
            assert table.ensure(row.resident, row.past_length + row.query_length)
        inputs.prepare(plan)
        seen.append(arrays(inputs))
        ledger.apply(plan)
    return seen


def test_plans_from_both_planners_give_the_same_arrays(kv):
    from stepplanner import _core_py as _reference

    ours = run_serving_steps(sp, kv)
    theirs = run_serving_steps(_reference, kv)
    assert ours == theirs
    assert any(len(s["logits_indices"]) < len(s["seq_lens_k"]) for s in ours)  # chunked


@pytest.mark.parametrize("layout", ["all", "flash_attn", "flashinfer"])
def test_prepare_allocates_nothing(compiled, layout):
    from stepplanner.kv import _kv

    limits = StepPlannerLimits(64, 64, 16)
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits)
    planner = compiled.StepPlanner(policy, limits)
    ledger = np.zeros(64, dtype=sp.RESIDENT_DTYPE)
    for i in range(64):
        ledger[i] = (0, i, 40, 40 if i % 2 else 0, bool(i % 2), 0)
    table = _kv.KVPageTable(64, 8, 512, 16)
    for i in range(64):
        table.ensure(i, 64)
    inputs = _kv.StepInputs(limits, table, layout)
    plan = planner.plan(ledger)
    arr = plan.as_array()
    for _ in range(3):
        inputs.prepare(plan)
        inputs.prepare(arr)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(200):
            inputs.prepare(plan)
            inputs.prepare(arr)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown == 0
    assert inputs.num_rows == plan.num_prefill + plan.num_decode > 32


def test_buffers_are_sized_for_the_step_token_cap(kv):
    """T = limits.t_max = min(B × S_in, max_step_tokens): a runtime's step buffer caps it."""
    table = kv.KVPageTable(4, 64, 64, 4)
    for slot in range(4):
        table.ensure(slot, 8)
    limits = StepPlannerLimits(4, 64, 4, max_step_tokens=16)
    inputs = kv.StepInputs(limits, table)
    assert inputs.max_num_tokens == 16
    assert inputs.buffers()["positions"].shape == inputs.buffers()["slot_mapping"].shape == (16,)
    inputs.prepare(plan_rows(*[(s, 0, 4, 4, 1) for s in range(4)]))
    assert inputs.num_tokens == 16
    with pytest.raises(
        ValueError, match="plan has 17 query tokens in all; allowed: <= limits.t_max=16"
    ):
        inputs.prepare(plan_rows(*[(s, 0, 3, 4 + (s == 0), 1) for s in range(4)]))


def test_block_table_follows_released_and_moved_slots(kv):
    """A row's pages are copied again whenever its slot was released or moved since."""
    table = kv.KVPageTable(3, 4, 12, 4)
    table.ensure(0, 8)
    table.ensure(1, 4)
    inputs = kv.StepInputs(StepPlannerLimits(3, 16, 4), table)
    plan = plan_rows((0, 1, 7, 1, 1), (1, 1, 3, 1, 1))
    inputs.prepare(plan)
    assert inputs.block_table.tolist() == [[0, 1, -1, -1], [2, -1, -1, -1]]
    table.release(0)
    table.ensure(2, 8)  # takes slot 0's old pages
    table.ensure(0, 8)  # slot 0: new pages
    inputs.prepare(plan)
    assert inputs.block_table.tolist() == [[3, 4, -1, -1], [2, -1, -1, -1]]
    table.release(1)
    table.move(2, 1)  # slot 1 now holds what slot 2 held
    inputs.prepare(plan)
    assert inputs.block_table.tolist() == [[3, 4, -1, -1], [0, -1, -1, -1]]
    table.ensure(1, 12)  # growth only: the row gains its new page
    inputs.prepare(plan_rows((0, 1, 7, 1, 1), (1, 1, 11, 1, 1)))
    assert inputs.block_table.tolist() == [[3, 4, -1, -1], [0, 1, 2, -1]]


def test_arrays_are_read_only_to_users(worked):
    _, inputs = worked
    inputs.prepare(plan_rows((0, 0, 0, 6, 1)))
    for name in NAMES:
        with pytest.raises(ValueError, match="read-only"):
            getattr(inputs, name)[...] = 0
    assert not any(buf.flags.writeable for buf in inputs.buffers().values())


def test_the_readme_serving_loop_runs_every_request_to_completion(paged_impl):
    """README's plan -> ensure pages -> prepare -> run -> apply loop, at a small size, with the
    ledger owning the page table."""
    limits = StepPlannerLimits(8, 64, 4)
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits)
    planner = paged_impl.StepPlanner(policy, limits)
    pages = paged_impl.KVPageTable(8, max_pages_per_sequence=18, num_pages=72, kv_page_size=4)
    inputs = paged_impl.StepInputs(limits, pages)
    ledger = paged_impl.Ledger(limits, policy, page_table=pages)
    prompts = (60, 7, 33, 12, 64, 1, 25, 40, 9, 50)
    for rid, length in enumerate(prompts):
        ledger.submit(rid, length, max_new_tokens=5)
    served, waited_for_pages = [], 0

    def model(positions, slot_mapping, block_table, cu_seqlens_q):
        assert len(positions) == len(slot_mapping) == cu_seqlens_q[-1]
        assert (block_table[:, 0] >= 0).all()  # every planned row has its pages
        return np.zeros(len(cu_seqlens_q) - 1, dtype=bool)  # no EOS: max_new_tokens ends them

    plan = ledger.step(planner)
    while ledger.count or ledger.waiting:
        batch = inputs.prepare(plan)
        finished = model(batch.positions, batch.slot_mapping, batch.block_table, batch.cu_seqlens_q)
        plan = ledger.step(planner, finished)
        served += ledger.finished_ids.tolist()
        waited_for_pages += ledger.held_back > 0
        pages.check()
    assert sorted(served) == list(range(10))
    assert pages.num_free_pages == pages.num_pages
    assert waited_for_pages  # 93 worst-case pages over a pool of 72: the pool did bind


def test_a_row_verifying_drafts_gives_logits_at_every_position(worked):
    """SPEC §8: the runtime reads logits at all 1 + g positions of a verifying decode row, so
    logits_indices lists each of them; a decode row without drafts and a final chunk give one."""
    _table, inputs = worked
    # Resident 1 decodes at 9 verifying 2 drafts (positions 9, 10, 11); resident 0 completes
    # its prompt (3 tokens after 3); resident 2 decodes at 0 with no drafts.
    inputs.prepare(plan_rows((0, 0, 3, 3, 1), (1, 1, 9, 3, 1), (2, 1, 0, 1, 1)))
    assert inputs.cu_seqlens_q.tolist() == [0, 3, 6, 7]
    assert inputs.logits_indices.tolist() == [2, 3, 4, 5, 6]
