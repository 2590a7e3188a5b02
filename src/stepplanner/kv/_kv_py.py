"""Pure-Python twin of ``_kv``: the KV page table and the step's attention inputs, written for
clarity. The compiled module must agree with it on every array and on every error (type and
message); ``STEPPLANNER_IMPL=python`` selects it.

A plan row's ``resident`` is the ledger row index, and that index is the page table's slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _errors
from ..planner._fields import as_int32
from ..planner._policy import StepPlannerLimits
from ..planner._types import SEQUENCE_DTYPE, SequenceWork
from ._buffers import PADDED, block_table_rows, input_buffers, read_only, view_of
from ._checks import Geometry, check_page_table, inputs_arguments, table_arguments

IMPLEMENTATION = "python"


def _pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class KVPageTable:
    """Per resident slot a list of KV page ids over one pool (see the compiled twin)."""

    def __init__(
        self, max_batch_size: int, max_pages_per_sequence: int, num_pages: int, kv_page_size: int
    ) -> None:
        if hasattr(self, "_rows"):
            raise _errors.already_initialised("KVPageTable")
        b, m, n, p = table_arguments(
            max_batch_size, max_pages_per_sequence, num_pages, kv_page_size
        )
        try:
            self._rows = np.full((b, m), -1, dtype=np.int32)
            self._counts = np.zeros(b, dtype=np.int32)
        except MemoryError:
            raise _errors.kv_table_memory(b, m, n) from None
        self._free = list(range(n - 1, -1, -1))  # a stack whose top (the end) is page 0
        # Per slot a stamp no other slot ever had, renewed whenever its pages change other than
        # by growth: StepInputs keeps a block_table row whose stamp still matches its slot's.
        self._stamps = list(range(b))
        self._next_stamp = b
        self._num_pages = n
        self._page_size = p
        self._rows_view = read_only(self._rows)
        self._counts_view = read_only(self._counts)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise _errors.kv_not_copyable("KVPageTable")

    def __reduce__(self) -> Any:
        raise _errors.kv_not_copyable("KVPageTable")

    def _slot(self, field: str, value: object) -> int:
        v = as_int32(field, value)
        b = self._rows.shape[0]
        if not 0 <= v < b:
            raise _errors.out_of_range(field, v, f"0..{b - 1} (max_batch_size - 1)")
        return v

    @property
    def rows(self) -> np.ndarray:
        """Read-only int32 [max_batch_size, max_pages_per_sequence] view; -1 where unused."""
        return self._rows_view

    @property
    def page_counts(self) -> np.ndarray:
        return self._counts_view

    @property
    def max_batch_size(self) -> int:
        return int(self._rows.shape[0])

    @property
    def max_pages_per_sequence(self) -> int:
        return int(self._rows.shape[1])

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def kv_page_size(self) -> int:
        return self._page_size

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def tokens_held(self, slot: int) -> int:
        return int(self._counts[self._slot("slot", slot)]) * self._page_size

    def ensure(self, slot: int, num_tokens: int) -> bool:
        s = self._slot("slot", slot)
        n = as_int32("num_tokens", num_tokens)
        if n < 0:
            raise _errors.out_of_range("num_tokens", n, ">= 0")
        need = _pages_for(n, self._page_size)
        width = self._rows.shape[1]
        if need > width:
            raise _errors.kv_tokens_over_row(n, width, self._page_size)
        have = int(self._counts[s])
        if need <= have:
            return True
        if need - have > len(self._free):
            return False
        for k in range(have, need):
            self._rows[s, k] = self._free.pop()
        self._counts[s] = need
        return True

    def release(self, slot: int) -> None:
        s = self._slot("slot", slot)
        for k in reversed(range(int(self._counts[s]))):
            self._free.append(int(self._rows[s, k]))
        self._rows[s] = -1
        self._counts[s] = 0
        self._stamps[s] = self._next_stamp
        self._next_stamp += 1

    def move(self, src: int, dst: int) -> None:
        a = self._slot("src", src)
        b = self._slot("dst", dst)
        if a == b:
            return
        if self._counts[b]:
            raise _errors.kv_move_onto_pages(b, int(self._counts[b]))
        self._rows[b] = self._rows[a]
        self._counts[b] = self._counts[a]
        self._rows[a] = -1
        self._counts[a] = 0
        self._stamps[a], self._stamps[b] = self._next_stamp, self._next_stamp + 1
        self._next_stamp += 2

    def check(self) -> None:
        check_page_table(
            self._rows, self._counts, np.array(self._free, dtype=np.int32), self._num_pages
        )

    def __repr__(self) -> str:
        b, m, n, p, free = geometry(self)
        return (
            f"KVPageTable(max_batch_size={b}, max_pages_per_sequence={m}, num_pages={n}, "
            f"kv_page_size={p}, num_free_pages={free})"
        )


def geometry(table: KVPageTable) -> Geometry:
    """``table``'s sizes as its private storage holds them, as the compiled ``geometry`` reads
    the C struct: a subclass's public properties are never read (its private names are the
    table's own, not a surface to override)."""
    b, m = table._rows.shape
    return Geometry(int(b), int(m), table._num_pages, table._page_size, len(table._free))


def counts(table: KVPageTable) -> np.ndarray:
    """The read-only view of ``table``'s page counts (not a subclass's ``page_counts``)."""
    return table._counts_view


class StepInputs:
    """The arrays attention kernels take for one step (see the compiled twin)."""

    def __init__(
        self, limits: StepPlannerLimits, page_table: KVPageTable, layout: str = "all"
    ) -> None:
        if hasattr(self, "_out"):
            raise _errors.already_initialised("StepInputs")
        layout, sizes = inputs_arguments(limits, page_table, KVPageTable, layout, geometry)
        b, m, t = limits.max_batch_size, sizes.max_pages_per_sequence, limits.t_max
        self._out = input_buffers(b, m, t, layout)  # prepare writes these; users see _bufs
        for name in PADDED:
            if name in self._out:
                self._out[name][...] = -1
        self._bufs = {name: read_only(buf) for name, buf in self._out.items()}
        self._sizes = {"rows": 0, "tokens": 0, "kv": 0, "logits": 0}
        # Which slot's pages (by stamp, -1: none) each block_table buffer row holds, the buffer
        # row each slot's pages were last copied to, and where the last step's rows started.
        self._block_stamps = [-1] * block_table_rows(b)
        self._slot_rows = [-1] * sizes.max_batch_size
        self._block_start = -1
        self._block_wipe = False
        self._limits = limits
        self._table = page_table
        self._layout = layout

    @property
    def layout(self) -> str:
        return self._layout

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise _errors.kv_not_copyable("StepInputs")

    def __reduce__(self) -> Any:
        raise _errors.kv_not_copyable("StepInputs")

    @property
    def limits(self) -> StepPlannerLimits:
        return self._limits

    @property
    def page_table(self) -> KVPageTable:
        return self._table

    def prepare(self, plan: Any) -> StepInputs:
        rows = _plan_rows(plan).copy()  # validated and filled from the same rows (threads)
        # The table's own storage, as the compiled twin reads its C struct (not its properties).
        table = self._table
        slots, _, _, p, _ = geometry(table)
        pages_of, counts_of = table._rows, table._counts
        if len(rows) > self.limits.max_batch_size:
            raise _errors.kv_plan_rows(len(rows), self.limits.max_batch_size)
        tokens = 0
        for i, (resident, _work, past, query, _logits) in enumerate(rows.tolist()):
            if not 0 <= resident < slots:
                raise _errors.kv_resident_range(i, resident, slots)
            if past < 0:
                raise _errors.kv_row_field(i, "past_length", past, ">= 0")
            if query < 1:
                raise _errors.kv_row_field(i, "query_length", query, ">= 1")
            if past + query > _errors.INT32_MAX:
                raise _errors.kv_row_overflow(i, past, query)
            pages = int(counts_of[resident])
            if pages * p < past + query:
                raise _errors.kv_pages_missing(i, resident, past, query, pages, p)
            tokens += query
        if tokens > self.limits.t_max:
            raise _errors.kv_plan_tokens(tokens, self.limits.t_max)

        out = self._out
        blocks, page_list = "block_table" in out, "kv_indices" in out
        if blocks:
            if self._block_wipe:
                out["block_table"][...] = -1
                self._block_stamps = [-1] * len(self._block_stamps)
                self._block_wipe = False
            self._block_start = self._choose_block_start(rows["resident"].tolist())
        t = kv = n_logits = 0
        out["cu_seqlens_q"][0] = 0
        if page_list:
            out["kv_indptr"][0] = 0
        for i, (resident, work, past, query, logits) in enumerate(rows.tolist()):
            pages = pages_of[resident]
            end = past + query
            for pos in range(past, end):
                out["positions"][t] = pos
                out["slot_mapping"][t] = int(pages[pos // p]) * p + pos % p
                t += 1
            out["cu_seqlens_q"][i + 1] = t
            out["seq_lens_k"][i] = end
            used = _pages_for(end, p)
            if blocks:
                row = self._block_start + i
                out["block_table"][row] = -1
                out["block_table"][row, :used] = pages[:used]
                if self._block_stamps[row] != table._stamps[resident]:  # where the compiled
                    self._block_stamps[row] = table._stamps[resident]  # twin copies pages
                    self._slot_rows[resident] = row
            if page_list:
                out["kv_indices"][kv : kv + used] = pages[:used]
                kv += used
                out["kv_indptr"][i + 1] = kv
                out["kv_last_page_len"][i] = end - (used - 1) * p
            if work == SequenceWork.DECODE and query > 1:  # verifying drafts: every position
                out["logits_indices"][n_logits : n_logits + query] = range(t - query, t)
                n_logits += query
            elif logits:
                out["logits_indices"][n_logits] = t - 1
                n_logits += 1
        self._sizes = {"rows": len(rows), "tokens": t, "kv": kv, "logits": n_logits}
        return self

    @property
    def num_rows(self) -> int:
        return self._sizes["rows"]

    @property
    def num_tokens(self) -> int:
        return self._sizes["tokens"]

    @property
    def max_num_tokens(self) -> int:
        return self.limits.t_max

    def _view(self, name: str, length: int) -> np.ndarray:
        return view_of(self._bufs, name, length, self._layout)

    @property
    def positions(self) -> np.ndarray:
        return self._view("positions", self._sizes["tokens"])

    @property
    def cu_seqlens_q(self) -> np.ndarray:
        return self._view("cu_seqlens_q", self._sizes["rows"] + 1)

    @property
    def qo_indptr(self) -> np.ndarray:
        return self._view("cu_seqlens_q", self._sizes["rows"] + 1)

    @property
    def seq_lens_k(self) -> np.ndarray:
        return self._view("seq_lens_k", self._sizes["rows"])

    @property
    def slot_mapping(self) -> np.ndarray:
        return self._view("slot_mapping", self._sizes["tokens"])

    @property
    def block_table(self) -> np.ndarray:
        return view_of(
            self._bufs, "block_table", self._sizes["rows"], self._layout, max(self._block_start, 0)
        )

    @property
    def block_table_start(self) -> int:
        """The row of ``buffers()["block_table"]`` where ``block_table`` starts this step."""
        self._view("block_table", 0)  # the layout's AttributeError
        return max(self._block_start, 0)

    def _choose_block_start(self, residents: list[int]) -> int:
        """The compiled twin's ``choose_block_start``, step for step: the last start while the
        first and last rows are still in place there; else the last start or one that puts a
        probed row (first, middle, last) where its slot's pages already are, whichever finds
        most of 32 sampled rows' pages in place; else the buffer's middle."""
        stamps, held = self._table._stamps, self._block_stamps
        cap, count = len(held), len(residents)
        last = self._block_start
        if (
            count
            and 0 <= last <= cap - count
            and held[last] == stamps[residents[0]]
            and held[last + count - 1] == stamps[residents[-1]]
        ):
            return last
        candidates = [last]
        for i in (0, count // 2, count - 1) if count else ():
            r = residents[i]
            row = self._slot_rows[r]
            if row >= 0 and held[row] == stamps[r] and row - i not in candidates:
                candidates.append(row - i)
        step = count // 32 if count >= 32 else 1
        best, best_score = -1, -1
        for c in candidates:
            if c < 0 or c > cap - count:
                continue
            if len(candidates) == 1:
                return c
            score = sum(held[c + i] == stamps[residents[i]] for i in range(0, count, step))
            if score > best_score:
                best, best_score = c, score
        return best if best >= 0 else (cap - count) // 2

    @property
    def kv_indptr(self) -> np.ndarray:
        return self._view("kv_indptr", self._sizes["rows"] + 1)

    @property
    def kv_indices(self) -> np.ndarray:
        return self._view("kv_indices", self._sizes["kv"])

    @property
    def kv_last_page_len(self) -> np.ndarray:
        return self._view("kv_last_page_len", self._sizes["rows"])

    @property
    def logits_indices(self) -> np.ndarray:
        return self._view("logits_indices", self._sizes["logits"])

    def buffers(self) -> dict[str, np.ndarray]:
        return dict(self._bufs)

    def invalidate(self) -> None:
        """The next ``prepare`` writes -1 over the whole ``block_table`` buffer first (this twin
        rewrites every row of a step anyway; the wipe is for the rows outside it)."""
        self._block_wipe = True

    def __repr__(self) -> str:
        return (
            f"StepInputs(limits={self.limits!r}, page_table={self.page_table!r}, "
            f"layout={self._layout!r}, num_rows={self.num_rows}, "
            f"num_tokens={self.num_tokens})"
        )


def _plan_rows(plan: Any) -> np.ndarray:
    """The plan's rows as a 1-D SEQUENCE_DTYPE array, checked like the compiled twin does."""
    if not isinstance(plan, np.ndarray):
        as_array = getattr(plan, "as_array", None)
        if as_array is None:
            raise _errors.kv_plan_type(plan)
        plan = as_array()
        if not isinstance(plan, np.ndarray):
            raise _errors.kv_plan_type(plan)
    if plan.dtype != SEQUENCE_DTYPE:
        raise _errors.kv_plan_dtype(plan.dtype, SEQUENCE_DTYPE)
    if plan.ndim != 1:
        raise _errors.kv_plan_ndim(plan.ndim)
    return plan
