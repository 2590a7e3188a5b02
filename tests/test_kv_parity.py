"""Differential tests: the compiled KVPageTable and StepInputs must agree with the reference.

Agreement means the same result and the same table (rows, page counts, free pages) after every
operation, the same arrays after every ``prepare``, or the same exception ``(type, message)``.
Operations and plans are drawn valid and invalid alike: out-of-range slots and token counts,
pools too small to grow, plans naming slots without pages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplanner import SEQUENCE_DTYPE, StepPlannerLimits
from stepplanner.kv._buffers import LAYOUTS, layout_arrays

BASE = settings().max_examples
PARITY = settings(max_examples=4 * BASE)

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


def attempt(call: Any) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except Exception as exc:  # noqa: BLE001 - the exception itself is the result compared
        return ("raised", type(exc), str(exc))


def table_state(table: Any) -> tuple[Any, ...]:
    return (table.rows.tolist(), table.page_counts.tolist(), table.num_free_pages)


def inputs_state(inputs: Any) -> dict[str, Any]:
    """Every array, or the error reading it raises (an array the layout does not fill)."""
    return {name: attempt(lambda name=name: getattr(inputs, name).tolist()) for name in NAMES}


def window_state(inputs: Any) -> tuple[Any, ...]:
    """Where block_table starts in its buffer, and the whole buffer: the rows outside this
    step's window are what earlier steps left there, and both twins must leave the same."""
    buffer = inputs.buffers().get("block_table")
    return (attempt(lambda: inputs.block_table_start), None if buffer is None else buffer.tolist())


@st.composite
def shapes(draw: Any) -> tuple[int, int, int, int]:
    b = draw(st.integers(1, 6))
    m = draw(st.integers(1, 6))
    n = draw(st.integers(1, b * m + 2))
    p = draw(st.sampled_from([1, 2, 3, 4, 8]))
    return b, m, n, p


def operations(b: int, m: int, p: int) -> Any:
    slot = st.integers(-1, b)  # one past either end: the range errors
    tokens = st.integers(-1, m * p + 1)
    return st.lists(
        st.one_of(
            st.tuples(st.just("ensure"), slot, tokens),
            st.tuples(st.just("release"), slot),
            st.tuples(st.just("move"), slot, slot),
        ),
        max_size=30,
    )


def plan_row(b: int, m: int, p: int) -> Any:
    return st.tuples(
        st.integers(-1, b),  # resident
        st.integers(0, 1),  # work (not read)
        st.integers(-1, m * p),  # past_length
        st.integers(0, 2 * p + 1),  # query_length
        st.booleans(),  # select_last_token_logits
    )


@PARITY
@given(data=st.data(), shape=shapes())
def test_page_table_and_inputs_agree(
    compiled_kv: Any, reference_kv: Any, data: Any, shape: tuple[int, int, int, int]
) -> None:
    b, m, n, p = shape
    tables = [mod.KVPageTable(b, m, n, p) for mod in (reference_kv, compiled_kv)]
    limits = StepPlannerLimits(b, data.draw(st.integers(1, 2 * p + 2)), p)
    layout = data.draw(st.sampled_from(LAYOUTS))
    inputs = [
        mod.StepInputs(limits, t, layout) for mod, t in zip((reference_kv, compiled_kv), tables)
    ]
    for op in data.draw(operations(b, m, p)):
        name, *args = op
        got = [attempt(lambda t=t, name=name, args=args: getattr(t, name)(*args)) for t in tables]
        assert got[0] == got[1], op
        assert table_state(tables[0]) == table_state(tables[1]), op
        # Between operations, a plan over the table as it is now: often valid, often not.
        rows = data.draw(st.lists(plan_row(b, m, p), max_size=b + 1))
        plan = np.array(rows, dtype=SEQUENCE_DTYPE)
        if data.draw(st.integers(0, 7), label="invalidate") == 0:
            for i in inputs:
                i.invalidate()
        got = [attempt(lambda i=i, plan=plan: inputs_state(i.prepare(plan))) for i in inputs]
        assert got[0] == got[1], rows
        assert inputs_state(inputs[0]) == inputs_state(inputs[1])
        assert window_state(inputs[0]) == window_state(inputs[1]), rows
    for t in tables:
        t.check()


@st.composite
def valid_steps(draw: Any) -> tuple[Any, ...]:
    """A table whose slots hold pages, and a plan that fits it: the all-valid path."""
    b, m, n, p = draw(shapes())
    held = draw(st.lists(st.integers(0, m * p), min_size=b, max_size=b))
    order = draw(st.permutations(range(b)))
    rows = []
    for slot in order[: draw(st.integers(0, b))]:
        end = draw(st.integers(0, held[slot]))
        if end == 0:
            continue
        query = draw(st.integers(1, end))
        rows.append((slot, 0, end - query, query, draw(st.booleans())))
    return (b, m, n, p), held, rows, draw(st.sampled_from(LAYOUTS))


@PARITY
@given(valid_steps())
def test_valid_steps_agree(compiled_kv: Any, reference_kv: Any, step: tuple[Any, ...]) -> None:
    (b, m, n, p), held, rows, layout = step
    states = []
    for mod, kind in [(reference_kv, layout), (compiled_kv, layout), (compiled_kv, "all")]:
        table = mod.KVPageTable(b, m, b * m, p)  # a pool that always suffices
        for slot, tokens in enumerate(held):
            assert table.ensure(slot, tokens)
        limits = StepPlannerLimits(b, m * p, p)
        inputs = mod.StepInputs(limits, table, kind)
        states.append(inputs_state(inputs.prepare(np.array(rows, dtype=SEQUENCE_DTYPE))))
    assert states[0] == states[1]
    # A layout fills exactly what "all" fills for its arrays, and refuses to show the others.
    filled = set(layout_arrays(layout)) | {"qo_indptr"}
    for name, result in states[1].items():
        if name in filled:
            assert result == states[2][name], name
        else:
            assert result[:2] == ("raised", AttributeError), name
    # And the arrays mean what they say: every new token's KV slot is in its row's pages.
    got = {name: result[1] for name, result in states[2].items()}
    for i, (_, _, past, query, _) in enumerate(rows):
        start, stop = got["cu_seqlens_q"][i], got["cu_seqlens_q"][i + 1]
        assert got["positions"][start:stop] == list(range(past, past + query))
        pages = got["kv_indices"][got["kv_indptr"][i] : got["kv_indptr"][i + 1]]
        assert [s // p for s in got["slot_mapping"][start:stop]] == [
            pages[pos // p] for pos in range(past, past + query)
        ]


@st.composite
def step_sequences(draw: Any) -> tuple[Any, ...]:
    """Slots that all hold pages, and a run of valid plans over them whose rows keep, shift,
    drop and gain positions from one step to the next (what a serving loop does), with the
    table's release + regrow (a retirement) and invalidate() in between."""
    b, m, n, p = draw(shapes())
    steps = []
    order = list(range(b))
    for _ in range(draw(st.integers(1, 8))):
        action = draw(
            st.sampled_from(["keep", "front", "drop", "append", "shuffle", "renew", "invalidate"])
        )
        if action == "front" and order:
            order = order[-1:] + order[:-1]
        elif action == "drop" and order:
            del order[draw(st.integers(0, len(order) - 1))]
        elif action == "append":
            order = order + [s for s in range(b) if s not in order][:1]
        elif action == "shuffle":
            order = draw(st.permutations(order))
        renew = draw(st.integers(0, b - 1)) if action == "renew" else None
        rows = []
        for slot in order:
            end = draw(st.integers(1, m * p))
            query = draw(st.integers(1, end))
            rows.append((slot, 0, end - query, query, True))
        steps.append((action, renew, rows))
    return (b, m, p), steps, draw(st.sampled_from(["all", "flash_attn"]))


@PARITY
@given(step_sequences())
def test_block_table_windows_agree_over_steps(
    compiled_kv: Any, reference_kv: Any, case: tuple[Any, ...]
) -> None:
    (b, m, p), steps, layout = case
    twins = []
    for mod in (reference_kv, compiled_kv):
        table = mod.KVPageTable(b, m, b * m, p)
        for slot in range(b):
            assert table.ensure(slot, m * p)
        twins.append((table, mod.StepInputs(StepPlannerLimits(b, m * p, p), table, layout)))
    for action, renew, rows in steps:
        plan = np.array(rows, dtype=SEQUENCE_DTYPE)
        for table, inputs in twins:
            if renew is not None:  # the slot's pages change other than by growth
                table.release(renew)
                assert table.ensure(renew, m * p)
            if action == "invalidate":
                inputs.invalidate()
            inputs.prepare(plan)
        assert inputs_state(twins[0][1]) == inputs_state(twins[1][1]), action
        assert window_state(twins[0][1]) == window_state(twins[1][1]), action
        table, inputs = twins[1]
        want = np.full((len(rows), m), -1)
        for i, (slot, _, past, query, _) in enumerate(rows):
            used = -(-(past + query) // p)
            want[i, :used] = table.rows[slot, :used]
        assert inputs.block_table.tolist() == want.tolist(), action
