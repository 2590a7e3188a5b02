"""End to end with torch on the CPU: a paged KV cache written through ``slot_mapping`` and read
through ``block_table`` (and through FlashInfer's ``kv_indptr``/``kv_indices``) gives the same
attention output as dense causal attention over each whole sequence, step after step, under
chunked prefill, pauses, decodes, arrivals and retirements from real plans.

Skipped when torch is not installed, unless STEPPLANNER_REQUIRE_TORCH=1 (CI installs
torch==2.13.0, the CPU build, and sets it), which makes a missing torch a failure.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

if os.environ.get("STEPPLANNER_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import stepplanner as sp  # noqa: E402
from stepplanner.kv import paging  # noqa: E402

HEADS, HEAD_DIM = 2, 8
TOLERANCE = 1e-5
B, S_IN, P = 4, 40, 4
MAX_NEW_TOKENS = 6


def sequence_tensors(request_id: int, length: int) -> tuple[torch.Tensor, ...]:
    """The q, k, v of every position of one request's sequence, fixed by its id."""
    g = torch.Generator().manual_seed(1000 + request_id)
    return tuple(torch.randn(length, HEADS, HEAD_DIM, generator=g) for _ in range(3))


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d, causal) v over one whole sequence: [length, heads, dim]."""
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HEAD_DIM)
    n = q.shape[0]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def paged_attention(
    q: torch.Tensor,
    positions: torch.Tensor,
    pages: torch.Tensor,
    seq_len: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> torch.Tensor:
    """One row's queries against its keys gathered from the cache through its page list."""
    slots = (pages[:, None].long() * P + torch.arange(P)).reshape(-1)[:seq_len]
    k, v = k_cache[slots], v_cache[slots]
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HEAD_DIM)
    mask = torch.arange(seq_len)[None, :] <= positions[:, None].long()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def test_paged_attention_matches_dense_causal_attention_step_after_step(kv):
    limits = sp.StepPlannerLimits(B, S_IN, P)
    options = sp.SchedulingOptions(
        ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED,
        max_num_tokens=12,
        max_chunk_tokens=4,
        scheduling_policy=sp.SchedulingPolicy.PRIORITY,
        preemption=sp.PreemptionMode.PAUSE,
        max_pause_steps=3,
    )
    policy = sp.resolve_scheduling_policy(options, limits)
    planner = sp.StepPlanner(policy, limits)
    ledger = sp.Ledger(limits, policy)
    max_pages = paging.worst_case_pages(S_IN, MAX_NEW_TOKENS, P)
    table = kv.KVPageTable(B, max_pages, B * max_pages, P)
    inputs = kv.StepInputs(limits, table)
    k_cache = torch.zeros(table.num_pages * P, HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)

    # (arrival step, request id, prompt length, priority): later, more urgent prompts arrive
    # while others decode, so they are chunked beside decode rows and pause the less urgent.
    arrivals = [
        (0, 0, 13, 5),
        (0, 1, 7, 5),
        (2, 2, 30, 1),
        (3, 3, 22, 0),
        (5, 4, 9, 7),
        (6, 5, 17, 2),
        (9, 6, 35, 0),
        (12, 7, 5, 3),
        (14, 8, 26, 1),
    ]
    seqs: dict[int, tuple[torch.Tensor, ...]] = {}
    prompt_of: dict[int, int] = {}
    worst = 0.0
    seen = {"chunk": 0, "final_chunk": 0, "decode": 0, "paused": 0, "retired": 0}

    for step in range(60):
        for _, rid, length, prio in [a for a in arrivals if a[0] == step]:
            ledger.submit(rid, length, prio)
            seqs[rid] = sequence_tensors(rid, length + MAX_NEW_TOKENS)
            prompt_of[rid] = length
        admitted = ledger.admit()
        for row in range(ledger.count - len(admitted), ledger.count):  # guaranteed no evict
            rid = int(ledger.request_ids[row])
            assert table.ensure(row, prompt_of[rid] + MAX_NEW_TOKENS)
        if ledger.count == 0:
            if step > max(a[0] for a in arrivals):
                break
            continue

        plan = planner.plan(ledger.residents)
        seen["paused"] += len(plan.paused)
        for row in plan.sequences:
            if row.work == sp.SequenceWork.DECODE:
                seen["decode"] += 1
            else:
                seen["final_chunk" if row.select_last_token_logits else "chunk"] += 1
            assert table.ensure(row.resident, row.past_length + row.query_length)
        inputs.prepare(plan)

        t = {
            name: torch.from_dlpack(getattr(inputs, name))
            for name in (
                "positions",
                "cu_seqlens_q",
                "seq_lens_k",
                "slot_mapping",
                "block_table",
                "kv_indptr",
                "kv_indices",
                "kv_last_page_len",
                "logits_indices",
            )
        }
        assert t["slot_mapping"].data_ptr() == inputs.slot_mapping.ctypes.data  # zero-copy
        assert t["slot_mapping"].dtype == torch.int64

        # The new tokens' q, k, v, flattened in plan order as the model would compute them.
        ids = ledger.request_ids
        rids = [int(ids[r.resident]) for r in plan.sequences]
        cu = t["cu_seqlens_q"].tolist()
        pos = t["positions"].long()
        q = torch.cat([seqs[rid][0][pos[cu[i] : cu[i + 1]]] for i, rid in enumerate(rids)])
        k = torch.cat([seqs[rid][1][pos[cu[i] : cu[i + 1]]] for i, rid in enumerate(rids)])
        v = torch.cat([seqs[rid][2][pos[cu[i] : cu[i + 1]]] for i, rid in enumerate(rids)])
        k_cache[t["slot_mapping"]] = k  # write: one slot per new token
        v_cache[t["slot_mapping"]] = v

        outputs = []
        for i, rid in enumerate(rids):
            seq_len = int(t["seq_lens_k"][i])
            n_pages = -(-seq_len // P)
            through_blocks = paged_attention(
                q[cu[i] : cu[i + 1]],
                pos[cu[i] : cu[i + 1]],
                t["block_table"][i, :n_pages],
                seq_len,
                k_cache,
                v_cache,
            )
            flashinfer_pages = t["kv_indices"][t["kv_indptr"][i] : t["kv_indptr"][i + 1]]
            assert len(flashinfer_pages) == n_pages
            assert int(t["kv_last_page_len"][i]) == seq_len - (n_pages - 1) * P
            through_indices = paged_attention(
                q[cu[i] : cu[i + 1]],
                pos[cu[i] : cu[i + 1]],
                flashinfer_pages,
                seq_len,
                k_cache,
                v_cache,
            )
            sq, sk, sv = (x[:seq_len] for x in seqs[rid])
            dense = dense_causal(sq, sk, sv)[pos[cu[i] : cu[i + 1]]]
            for got in (through_blocks, through_indices):
                worst = max(worst, float((got - dense).abs().max()))
            outputs.append(through_blocks)
        out = torch.cat(outputs)
        # The rows sampled are the last token of every row that selects logits.
        want = [cu[i + 1] - 1 for i, r in enumerate(plan.sequences) if r.select_last_token_logits]
        assert t["logits_indices"].tolist() == want
        assert out[t["logits_indices"].long()].shape[0] == len(want)

        ledger.apply(plan)
        table.check()
        done = [
            row
            for row, rid in enumerate(ledger.request_ids.tolist())
            if ledger.residents[row]["committed"] >= prompt_of[rid] + MAX_NEW_TOKENS - 1
        ]
        if done:
            paging.release_rows(table, done, ledger.count)
            ledger.retire_rows(done)
            seen["retired"] += len(done)
            table.check()
            assert table.num_free_pages == table.num_pages - int(table.page_counts.sum())

    assert worst <= TOLERANCE, worst
    print(f"max abs error {worst:.3g}; {seen}")
    # The run covered what it claims to: chunked prefill, pauses, decodes and retirements.
    assert seen["chunk"] > 0 and seen["final_chunk"] > 0 and seen["decode"] > 0
    assert seen["paused"] > 0 and seen["retired"] == len(arrivals)
    assert table.num_free_pages == table.num_pages


def test_torch_from_dlpack_shares_the_buffers(kv):
    table = kv.KVPageTable(2, 4, 8, 4)
    table.ensure(0, 8)
    table.ensure(1, 8)
    inputs = kv.StepInputs(sp.StepPlannerLimits(2, 8, 4), table)
    plan = np.array([(0, 0, 0, 3, 1), (1, 1, 5, 1, 1)], dtype=sp.SEQUENCE_DTYPE)
    inputs.prepare(plan)
    names = ("positions", "slot_mapping", "block_table", "kv_indices")
    tensors = {name: torch.from_dlpack(getattr(inputs, name)) for name in names}
    for name, tensor in tensors.items():
        assert tensor.data_ptr() == getattr(inputs, name).ctypes.data, name
    # Tensors over the whole buffers, made once, see every later step without a copy: the valid
    # part is a prefix, and block_table's rows start at block_table_start.
    whole = {name: torch.from_dlpack(inputs.buffers()[name]) for name in names}
    inputs.prepare(np.array([(1, 0, 4, 3, 1), (0, 1, 6, 1, 1)], dtype=sp.SEQUENCE_DTYPE))
    assert whole["positions"][: inputs.num_tokens].tolist() == [4, 5, 6, 6]
    assert whole["slot_mapping"][: inputs.num_tokens].tolist() == inputs.slot_mapping.tolist()
    start = inputs.block_table_start
    assert whole["block_table"][start : start + inputs.num_rows].tolist() == [
        [2, 3, -1, -1],
        [0, 1, -1, -1],
    ]
