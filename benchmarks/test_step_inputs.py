"""StepInputs.prepare at B=256 against the same arrays built with vectorised NumPy, and against
plan() for the same step, grouped side by side per scenario.

    pytest benchmarks/test_step_inputs.py --benchmark-group-by=group

Each ``prepare`` case runs for every layout (``all``, ``flash_attn``, ``flashinfer``).
Scenarios: ``all_decode`` (every resident of the steady ledger decoding, so 256 one-token rows
whose KV runs to thousands of tokens) and ``mixed`` (the steady ledger under the default MIXED
policy: decode rows plus prompt chunks). The page table holds each slot's KV and nothing more.
Before timing, each case checks that NumPy and ``prepare`` give the same arrays and that
``prepare`` allocates nothing (tracemalloc; recorded in ``extra_info``).

``test_kv_indices_copy`` is the floor of the FlashInfer layouts: one contiguous copy of as many
page ids as the step's ``kv_indices`` holds, which any host-side fill must at least write.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepplanner import _core
from stepplanner.bench import planner as bench
from stepplanner.kv import _kv
from stepplanner.kv import _kv_py as _kv_reference
from stepplanner.kv._buffers import LAYOUTS, layout_arrays
from stepplanner.planner._types import as_resident_array

BATCH = 256
P = bench.KV_PAGE_SIZE
SCENARIOS = ("all_decode", "mixed")


def numpy_inputs(seqs: np.ndarray, table_rows: np.ndarray, page: int) -> dict[str, np.ndarray]:
    """The arrays ``prepare`` fills, built the way a runtime without it would: vectorised NumPy."""
    resident = seqs["resident"].astype(np.int64)
    past = seqs["past_length"]
    query = seqs["query_length"]
    n = len(seqs)
    cu = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(query, out=cu[1:])
    row_of_token = np.repeat(np.arange(n), query)
    positions = (past[row_of_token] + np.arange(cu[-1]) - cu[row_of_token]).astype(np.int32)
    pages = table_rows[resident[row_of_token], positions // page]
    seq_lens_k = (past + query).astype(np.int32)
    npages = (seq_lens_k + page - 1) // page
    block = table_rows[resident]
    unused = np.arange(table_rows.shape[1]) >= npages[:, None]
    block[unused] = -1
    kv_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(npages, out=kv_indptr[1:])
    return {
        "positions": positions,
        "cu_seqlens_q": cu,
        "seq_lens_k": seq_lens_k,
        "slot_mapping": pages.astype(np.int64) * page + positions % page,
        "block_table": block,
        "kv_indptr": kv_indptr,
        "kv_indices": block[~unused],
        "kv_last_page_len": (seq_lens_k - (npages - 1) * page).astype(np.int32),
        "logits_indices": cu[1:][seqs["select_last_token_logits"].astype(bool)] - 1,
    }


def make_case(kv, scenario: str, layout: str = "all"):
    """(planner, ledger array, plan, table, inputs) for one scenario at B=256."""
    rows = bench.steady_ledger(BATCH)
    if scenario == "all_decode":
        rows = [(p, a, n, max(c, n), True, s) for p, a, n, c, _, s in rows]
    planner = bench.make_planner(_core, "mixed", BATCH)
    ledger = as_resident_array(rows)
    plan = planner.plan(ledger)
    max_tokens = int(max(ledger["committed"].max(), ledger["prompt_length"].max())) + 1
    max_pages = -(-max_tokens // P)
    table = kv.KVPageTable(BATCH, max_pages, BATCH * max_pages, P)
    for row in plan.as_array():
        assert table.ensure(int(row["resident"]), int(row["past_length"] + row["query_length"]))
    inputs = kv.StepInputs(planner.limits, table, layout)
    return planner, ledger, plan, table, inputs


@pytest.fixture(params=SCENARIOS)
def scenario(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


def test_prepare(benchmark, scenario: str, layout: str) -> None:
    planner, ledger, plan, table, inputs = make_case(_kv, scenario, layout)
    want = numpy_inputs(plan.as_array(), np.array(table.rows), P)
    inputs.prepare(plan)
    for name in layout_arrays(layout):
        assert np.array_equal(getattr(inputs, name), want[name]), name
    grown = bench.allocated_bytes(inputs.prepare, plan, calls=50)
    assert grown == 0, f"prepare allocated {grown} bytes"
    benchmark.group = f"{scenario} B={BATCH}"
    benchmark.extra_info.update(
        rows=inputs.num_rows,
        tokens=inputs.num_tokens,
        kv_pages=int(want["kv_indptr"][-1]),
        bytes_allocated=grown,
    )
    benchmark(inputs.prepare, plan)


def test_numpy(benchmark, scenario: str) -> None:
    planner, ledger, plan, table, inputs = make_case(_kv, scenario)
    seqs = plan.as_array()
    table_rows = table.rows
    benchmark.group = f"{scenario} B={BATCH}"
    benchmark(numpy_inputs, seqs, table_rows, P)


def test_plan(benchmark, scenario: str) -> None:
    planner, ledger, plan, table, inputs = make_case(_kv, scenario)
    benchmark.group = f"{scenario} B={BATCH}"
    benchmark(planner.plan, ledger)


def test_kv_indices_copy(benchmark, scenario: str) -> None:
    planner, ledger, plan, table, inputs = make_case(_kv, scenario, "flashinfer")
    inputs.prepare(plan)
    source = np.array(inputs.kv_indices)
    target = np.empty_like(source)
    benchmark.group = f"{scenario} B={BATCH}"
    benchmark.extra_info.update(kv_pages=int(source.size), bytes=int(source.nbytes))
    benchmark(np.copyto, target, source)


def test_prepare_reference(benchmark, scenario: str) -> None:
    planner, ledger, plan, table, inputs = make_case(_kv_reference, scenario)
    benchmark.group = f"{scenario} B={BATCH}"
    benchmark.pedantic(inputs.prepare, (plan,), rounds=5, iterations=1, warmup_rounds=1)


def test_prepare_reordered(benchmark, scenario: str, layout: str) -> None:
    """Rows in a new order every call (the plan, then the plan reversed): every row moves, and
    no window puts them back where their pages are, so every block_table row is copied again
    (255 of 256 per call, counted with the reference twin)."""
    planner, ledger, plan, table, inputs = make_case(_kv, scenario, layout)
    orders = [plan.as_array().copy(), plan.as_array()[::-1].copy()]
    turn = iter(orders * 10**6)
    benchmark.group = f"{scenario} B={BATCH}"
    benchmark(lambda: inputs.prepare(next(turn)))
