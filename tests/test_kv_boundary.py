"""The boundary around the KV page table and the step inputs: memory Python cannot write, objects
that are whole from birth and initialised once, no copies, and prepare's rows read once. Each test
runs on both implementations; a defect that crashed the interpreter is exercised in a subprocess,
so that a regression fails the test instead of killing pytest."""

from __future__ import annotations

import copy
import ctypes
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from stepplanner import SEQUENCE_DTYPE, StepPlannerLimits

LIMITS = StepPlannerLimits(2, 64, 16)
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


def rows(*items):
    return np.array(list(items), dtype=SEQUENCE_DTYPE)


def made(kv):
    table = kv.KVPageTable(2, 4, 8, 16)
    table.ensure(0, 17)
    table.ensure(1, 5)
    inputs = kv.StepInputs(LIMITS, table)
    inputs.prepare(rows((0, 1, 16, 1, True), (1, 0, 0, 5, True)))
    return table, inputs


def snapshot(table, inputs=None):
    state = [table.rows.tolist(), table.page_counts.tolist(), table.num_free_pages]
    if inputs is not None:
        state += [getattr(inputs, name).tolist() for name in NAMES]
        state += [buf.tolist() for buf in inputs.buffers().values()]
    return state


def run_snippet(kv, body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter with ``kv`` imported as ``kv``; a crash there is a
    negative return code here, not a dead test run."""
    prelude = textwrap.dedent(f"""
        import numpy as np
        import stepplanner as sp
        import {kv.__name__} as kv
    """)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_ran(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    for text in expected:
        assert text in result.stdout, (text, result.stdout, result.stderr[-3000:])


# --- the memory the kernels index by cannot be written from Python --------------------------


def test_table_arrays_and_their_bases_cannot_be_written(kv, assert_unwritable):
    table, inputs = made(kv)
    before = snapshot(table, inputs)
    compiled = kv.IMPLEMENTATION == "compiled"
    for array in (table.rows, table.page_counts):
        assert_unwritable(array, compiled)
    for name in NAMES:
        assert_unwritable(getattr(inputs, name), compiled)
    for array in inputs.buffers().values():
        assert_unwritable(array, compiled)
    assert snapshot(table, inputs) == before
    table.check()


@pytest.mark.parametrize(
    "attack",
    [
        "t.page_counts.base[0] = 10**8",
        "np.asarray(t.page_counts.base)[0] = 10**8",
        "t.rows.base[0, 0] = 10**8",
        "np.asarray(t.rows.base.base)[0] = 10**8",
        "memoryview(t.rows.base.base).cast('B')[0] = 0x7F",
    ],
)
def test_writing_a_base_then_releasing_does_not_crash(kv, attack):
    # The crash this guards against: a page count of 10**8 written through .base, then release.
    result = run_snippet(
        kv,
        f"""
        t = kv.KVPageTable(2, 4, 8, 16)
        t.ensure(0, 17)
        try:
            {attack}
        except (TypeError, ValueError, AttributeError) as e:
            print("refused:", type(e).__name__)
        t.release(0)
        t.check()
        print("released", t.num_free_pages, t.rows.tolist())
    """,
    )
    assert_ran(result, "refused:", "released 8 [[-1, -1, -1, -1], [-1, -1, -1, -1]]")


def test_a_page_id_written_through_a_base_never_reaches_slot_mapping(kv):
    result = run_snippet(
        kv,
        """
        lim = sp.StepPlannerLimits(2, 64, 16)
        t = kv.KVPageTable(2, 4, 8, 16)
        t.ensure(0, 17)
        inp = kv.StepInputs(lim, t)
        plan = np.array([(0, 1, 16, 1, True)], dtype=sp.SEQUENCE_DTYPE)
        for target in (t.rows, inp.buffers()["block_table"]):
            try:
                np.asarray(target.base)[0, 0] = 10**8
            except (TypeError, ValueError) as e:
                print("refused:", type(e).__name__)
        inp.prepare(plan)
        print("slots", inp.slot_mapping.tolist(), inp.block_table.tolist())
    """,
    )
    assert_ran(result, "refused: ValueError", "slots [16] [[0, 1, -1, -1]]")


def test_buffers_of_the_inputs_are_not_the_table(kv):
    """``buffers()`` hands out fixed addresses; none of them is the table's own memory."""
    table, inputs = made(kv)
    held = [table.rows, table.page_counts]
    for name, buf in inputs.buffers().items():
        assert not any(np.shares_memory(buf, mine) for mine in held), name
    block = inputs.buffers()["block_table"]
    assert inputs.block_table.ctypes.data == (
        block.ctypes.data + inputs.block_table_start * block.strides[0]
    )
    before = inputs.buffers()["slot_mapping"].ctypes.data
    inputs.prepare(rows((1, 1, 4, 1, True)))
    assert inputs.buffers()["slot_mapping"].ctypes.data == before


# --- initialised once, whole from birth ---------------------------------------------------


def test_table_refuses_a_second_init_and_keeps_its_state(kv):
    table, inputs = made(kv)
    before = snapshot(table, inputs)
    for args in ((2, 4, 8, 16), (1, 1, 1, 1), (0, 4, 8, 16)):
        with pytest.raises(RuntimeError, match="KVPageTable is already initialised"):
            table.__init__(*args)
    assert snapshot(table, inputs) == before
    table.check()


def test_inputs_refuse_a_second_init_and_keep_their_state(kv):
    table, inputs = made(kv)
    before = snapshot(table, inputs)
    other = kv.KVPageTable(4, 8, 8, 16)
    for args in ((LIMITS, table), (StepPlannerLimits(4, 64, 16), other), (None, None)):
        with pytest.raises(RuntimeError, match="StepInputs is already initialised"):
            inputs.__init__(*args)
    assert snapshot(table, inputs) == before
    assert inputs.page_table is table


def test_messages_of_a_second_init_match(compiled_kv, reference_kv):
    def message(kv):
        table, inputs = made(kv)
        errors = []
        for call in (lambda: table.__init__(1, 1, 1, 1), lambda: inputs.__init__(LIMITS, table)):
            with pytest.raises(RuntimeError) as info:
                call()
            errors.append(str(info.value))
        return errors

    assert message(compiled_kv) == message(reference_kv)


def test_compiled_objects_are_made_whole_by_new(compiled_kv):
    table = compiled_kv.KVPageTable.__new__(compiled_kv.KVPageTable, 2, 4, 8, 16)
    assert table.ensure(1, 40) and table.rows[1].tolist() == [0, 1, 2, -1]
    table.check()
    inputs = compiled_kv.StepInputs.__new__(compiled_kv.StepInputs, LIMITS, table)
    inputs.prepare(rows((1, 0, 0, 40, True)))
    assert inputs.block_table.tolist() == [[0, 1, 2, -1]]
    with pytest.raises(TypeError):
        compiled_kv.KVPageTable.__new__(compiled_kv.KVPageTable)
    with pytest.raises(ValueError, match="max_batch_size=0"):
        compiled_kv.KVPageTable.__new__(compiled_kv.KVPageTable, 0, 4, 8, 16)


# --- no copies ---------------------------------------------------------------------------


COPIES = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "pickle protocol 0": lambda obj: pickle.dumps(obj, protocol=0),
}


@pytest.mark.parametrize("how", COPIES)
def test_table_and_inputs_refuse_to_be_copied(kv, how):
    table, inputs = made(kv)
    before = snapshot(table, inputs)
    for obj, name in ((table, "KVPageTable"), (inputs, "StepInputs")):
        with pytest.raises(TypeError, match=f"^{name} cannot be copied or pickled: "):
            COPIES[how](obj)
    assert snapshot(table, inputs) == before
    table.check()


def test_copy_messages_match(compiled_kv, reference_kv):
    def messages(kv):
        found = []
        for obj in made(kv):
            for how in COPIES.values():
                with pytest.raises(TypeError) as info:
                    how(obj)
                found.append(str(info.value))
        return found

    assert messages(compiled_kv) == messages(reference_kv)


# --- prepare reads the caller's rows once -------------------------------------------------


def test_rows_changed_by_another_thread_are_refused_or_filled_whole(kv):
    # The crash this guards against: a row validated, then changed by another thread before the
    # fill read it again (a heap overflow of slot_mapping). Bounded: a few thousand calls.
    result = run_snippet(
        kv,
        """
        import threading
        B, P = 16, 16
        lim = sp.StepPlannerLimits(max_batch_size=B, max_input_length=1024, kv_page_size=P)
        t = kv.KVPageTable(B, 1024 // P, B * 1024 // P, P)
        for s in range(B):
            t.ensure(s, 1024)
        inp = kv.StepInputs(lim, t)
        a = np.zeros(B, dtype=sp.SEQUENCE_DTYPE)
        a["resident"] = np.arange(B); a["query_length"] = 16; a["select_last_token_logits"] = True
        q = a["query_length"]
        stop = False
        def writer():
            while not stop:
                q[B - 1] = 2**31 - 2      # past 0 + huge: beyond every page and t_max
                q[B - 1] = 16
        th = threading.Thread(target=writer)
        th.start()
        ok = refused = bad = 0
        calls = 3000 if kv.IMPLEMENTATION == "compiled" else 200
        for _ in range(calls):
            try:
                inp.prepare(a)
                ok += 1
                bad += inp.num_tokens != 16 * B or inp.positions.max() >= 16
            except ValueError:
                refused += 1
        stop = True
        th.join()
        print("calls", ok + refused, "bad", bad)
    """,
    )
    assert_ran(result, "bad 0")


# --- buffers(): fixed addresses a consumer reads; one that writes them invalidates ----------


def scribble(array: np.ndarray, value: int) -> None:
    """Write ``value`` over ``array``'s memory the way a consumer's kernel or a DLPack tensor
    would: through the raw address, past NumPy's read-only flag."""
    junk = np.full(array.shape, value, dtype=array.dtype)
    ctypes.memmove(array.ctypes.data, junk.ctypes.data, array.nbytes)


def written_then_invalidated(kv):
    table = kv.KVPageTable(2, 4, 8, 16)
    table.ensure(0, 40)
    table.ensure(1, 5)
    inputs = kv.StepInputs(LIMITS, table)
    both = rows((0, 1, 32, 1, True), (1, 0, 0, 5, True))
    inputs.prepare(both)
    expected, before = inputs.block_table.tolist(), snapshot(table)
    for buf in inputs.buffers().values():
        scribble(buf, 7)
    assert snapshot(table) == before  # the table never shares memory with them
    table.check()
    inputs.invalidate()
    assert inputs.buffers()["block_table"].tolist() == [[7] * 4] * 4  # nothing until prepare
    inputs.prepare(both)  # the same rows in the same slots as before
    assert inputs.block_table.tolist() == expected
    seen = [getattr(inputs, name).tolist() for name in NAMES]
    for buf in inputs.buffers().values():
        scribble(buf, 7)
    inputs.invalidate()
    inputs.prepare(rows((0, 1, 32, 1, True)))  # one row: the rest of the buffer is wiped
    return seen, inputs.buffers()["block_table"].tolist(), inputs.block_table_start


def test_a_consumer_that_wrote_the_buffers_invalidates_them(kv):
    seen, block_table, start = written_then_invalidated(kv)
    assert seen[NAMES.index("block_table")] == [[0, 1, 2, -1], [3, -1, -1, -1]]
    want = [[-1] * 4] * 4
    want[start] = [0, 1, 2, -1]
    assert block_table == want


def test_invalidate_agrees_across_implementations(compiled_kv, reference_kv):
    assert written_then_invalidated(compiled_kv) == written_then_invalidated(reference_kv)


def test_no_referent_of_the_compiled_objects_is_writable_memory(compiled_kv, assert_unwritable):
    """``gc.get_referents`` reaches every object field of a cdef class: none of them may be
    memory the kernels index by that Python could write."""
    import gc

    table, inputs = made(compiled_kv)
    found = 0
    for obj in (table, inputs):
        for ref in gc.get_referents(obj):
            for item in ref.values() if isinstance(ref, dict) else [ref]:
                if isinstance(item, np.ndarray):
                    found += 1
                    assert_unwritable(item, compiled=True)
                elif not isinstance(
                    item, (type(None), type, str, int, StepPlannerLimits, compiled_kv.KVPageTable)
                ):
                    assert memoryview(item).readonly, type(item)
    assert found >= 4
