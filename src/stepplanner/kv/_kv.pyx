"""Compiled KV page table and step attention inputs (the C side of stepplanner.KVPageTable and
stepplanner.StepInputs; the pure-Python twin is _kv_py.py).

Layout of this file, top to bottom:
  1. the kernels: page-pool bookkeeping and the fill of a step's inputs, C only, ``noexcept nogil``;
  2. ``KVPageTable``: validation at the boundary, then the kernels;
  3. ``StepInputs``: buffers sized once, ``prepare(plan)`` validates every row, then fills.

A plan row's ``resident`` is the ledger row index, and that index is the page table's slot.
Directives are set in setup.py, not here.
"""

cimport cython
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, INT32_MAX
from libc.string cimport memcpy, memset

import numpy as np

from .. import _errors
from stepplanner._core cimport WORK_DECODE, StepPlan, _CoreMemory
from ..planner._fields import as_int32
from . import _buffers
from ._buffers import block_table_rows, input_buffers, view_of
from ._checks import Geometry, check_page_table, inputs_arguments, table_arguments
from ..planner._types import SEQUENCE_DTYPE

cnp.import_array()

IMPLEMENTATION = "compiled"

cdef cnp.dtype _SEQUENCE_DESCR = SEQUENCE_DTYPE

# ============================================================================================
# 1. The kernels
# ============================================================================================

cdef int64_t pages_for(int64_t num_tokens, int32_t page_size) noexcept nogil:
    return (num_tokens + page_size - 1) // page_size


cdef void grow_slot(PageTableC* t, int32_t slot, int32_t need) noexcept nogil:
    cdef int32_t* row = t.rows + <Py_ssize_t>slot * t.max_pages
    cdef int32_t k
    for k in range(t.counts[slot], need):
        t.num_free -= 1
        row[k] = t.free_pages[t.num_free]
    t.counts[slot] = need


cdef void release_slot(PageTableC* t, int32_t slot) noexcept nogil:
    # Last page first, so the slot's first page is back on top of the pool: a slot released and
    # ensured again gets its pages back in the same order.
    cdef int32_t* row = t.rows + <Py_ssize_t>slot * t.max_pages
    cdef int32_t k
    for k in range(t.counts[slot] - 1, -1, -1):
        t.free_pages[t.num_free] = row[k]
        t.num_free += 1
        row[k] = -1
    t.counts[slot] = 0
    t.stamp[slot] = t.next_stamp
    t.next_stamp += 1


cdef void move_slot(PageTableC* t, int32_t src, int32_t dst) noexcept nogil:
    cdef int32_t* s = t.rows + <Py_ssize_t>src * t.max_pages
    cdef int32_t* d = t.rows + <Py_ssize_t>dst * t.max_pages
    cdef int32_t k
    for k in range(t.max_pages):
        d[k] = s[k]
        s[k] = -1
    t.counts[dst] = t.counts[src]
    t.counts[src] = 0
    t.stamp[src] = t.next_stamp
    t.stamp[dst] = t.next_stamp + 1
    t.next_stamp += 2


cdef int check_sequence(const PageTableC* t, const SequenceC* s) noexcept nogil:
    if <uint32_t>s.resident >= <uint32_t>t.num_slots:  # negative wraps to huge: one compare
        return ROW_RESIDENT_RANGE
    if s.past_length < 0:
        return ROW_PAST_NEGATIVE
    if s.query_length < 1:
        return ROW_QUERY_NOT_POSITIVE
    if s.past_length > INT32_MAX - s.query_length:
        return ROW_LENGTH_OVERFLOW
    if <int64_t>t.counts[s.resident] * t.page_size < <int64_t>s.past_length + s.query_length:
        return ROW_PAGES_MISSING
    return ROW_OK


cdef int32_t first_bad_row(const PageTableC* t, const SequenceC* rows, int32_t count,
                          int64_t* tokens) noexcept nogil:
    """The index of the first row check_sequence refuses, or -1; sums query_length meanwhile.
    The common case (every row fine) is one branch per row: the range checks are or-ed."""
    cdef const int32_t* counts = t.counts
    cdef uint32_t num_slots = <uint32_t>t.num_slots
    cdef int64_t P = t.page_size, total = 0
    cdef int32_t i, r, past, query
    for i in range(count):
        r = rows[i].resident
        past = rows[i].past_length
        query = rows[i].query_length
        if ((<uint32_t>r >= num_slots) | (past < 0) | (query < 1)
                | (past > INT32_MAX - query)):
            return i
        if counts[r] * P < <int64_t>past + query:
            return i
        total += query
    tokens[0] = total
    return -1


cdef inline int32_t pages_to(int32_t end, int32_t P, int32_t shift) noexcept nogil:
    """ceil(end / P) for end >= 1: a shift, not a division, when P is a power of two."""
    return (((end - 1) >> shift) if shift >= 0 else (end - 1) // P) + 1


cdef inline void copy_block_row(int32_t* block, const int32_t* pages, int32_t start,
                                int32_t npages, int32_t fill) noexcept nogil:
    """block[start:npages] = pages[start:npages], then -1 over what the last step left beyond
    npages (fill entries): the cost is per changed page, not per max_pages_per_sequence."""
    cdef int32_t k
    if npages - start > 16:  # long runs: memcpy's vector stores; short ones: no call
        memcpy(block + start, pages + start, (npages - start) * sizeof(int32_t))
    else:
        for k in range(start, npages):
            block[k] = pages[k]
    if fill > npages:
        memset(block + npages, 0xFF, (fill - npages) * sizeof(int32_t))  # all-ones bytes: -1


cdef void fill_tokens(const PageTableC* t, const SequenceC* rows, int32_t count,
                      InputsC* out) noexcept nogil:
    """positions, slot_mapping, cu_seqlens_q, seq_lens_k, logits_indices."""
    # Every pointer is read into a local first: CPython builds with -fno-strict-aliasing, so a
    # store through an int32_t* would otherwise make the compiler reload the struct fields.
    cdef const int32_t* table_rows = t.rows
    cdef int32_t P = t.page_size, M = t.max_pages, shift = t.page_shift
    cdef int32_t* positions = out.positions
    cdef int64_t* slot_mapping = out.slot_mapping
    cdef int32_t* cu_seqlens_q = out.cu_seqlens_q
    cdef int32_t* seq_lens_k = out.seq_lens_k
    cdef int32_t* logits_indices = out.logits_indices
    cdef const int32_t* pages
    cdef int32_t i, k, n, pos, end, page_index
    cdef int32_t tokens = 0, logits = 0
    cdef int64_t delta, stop
    cu_seqlens_q[0] = 0
    for i in range(count):
        pages = table_rows + <Py_ssize_t>rows[i].resident * M
        pos = rows[i].past_length
        end = pos + rows[i].query_length
        if shift >= 0 and end - pos == 1:  # a decode row: one token, no loop
            positions[tokens] = pos
            slot_mapping[tokens] = (<int64_t>pages[pos >> shift] << shift) + (pos & (P - 1))
            tokens += 1
        else:
            # The new tokens a page at a time: within one page, slot = page * P + pos % P is
            # pos + (page - page_index) * P, a contiguous run, so the inner loop has no
            # division and no branch. One loop for both arrays: split in two, the compiler
            # vectorises them, and that measured slower (runs are at most P tokens).
            page_index = (pos >> shift) if shift >= 0 else pos // P
            while pos < end:
                stop = <int64_t>(page_index + 1) * P
                if stop > end:
                    stop = end
                n = <int32_t>stop - pos
                delta = (<int64_t>pages[page_index] - page_index) * P
                for k in range(n):
                    positions[tokens + k] = pos + k
                    slot_mapping[tokens + k] = delta + pos + k
                tokens += n
                pos += n
                page_index += 1
        cu_seqlens_q[i + 1] = tokens
        seq_lens_k[i] = end
        if rows[i].work == WORK_DECODE and rows[i].query_length > 1:
            # A row verifying drafts (SPEC §8): the runtime reads logits at every position.
            n = rows[i].query_length
            for k in range(n):
                logits_indices[logits + k] = tokens - n + k
            logits += n
        else:
            # Branch-free: a decode step's rows all sample, a prefill step's mostly not.
            logits_indices[logits] = tokens - 1
            logits += rows[i].select_last_token_logits != 0
    out.num_tokens = tokens
    out.num_logits = logits


cdef int32_t choose_block_start(const PageTableC* t, const SequenceC* rows, int32_t count,
                                const InputsC* out) noexcept nogil:
    """Where this step's block_table starts in its buffer of 2B rows: the last start if the
    first and the last row still find their pages there; else, among the last start and those
    that put a probed row (first, middle, last) where its slot's pages already are, the one
    under which most of 32 sampled rows find their pages in place; with none that fits, the
    middle of the buffer.

    Decode rows follow the chunk rows in arrival order, so a chunk row more or less in front
    moves every row one place and a retirement moves every row behind it. A window that moves
    with the rows keeps them where their pages already are, and only rows new to their place
    are copied."""
    cdef const uint64_t* stamp = t.stamp
    cdef const uint64_t* block_stamp = out.block_stamp
    cdef int32_t cap = out.block_rows
    cdef int32_t candidates[4]
    cdef int32_t n = 1, k, j, i, c, b, r, step, score
    cdef int32_t best = -1, best_score = -1
    c = out.block_start
    if (count > 0 and 0 <= c <= cap - count and block_stamp[c] == stamp[rows[0].resident]
            and block_stamp[c + count - 1] == stamp[rows[count - 1].resident]):
        return c  # the first and the last row are still in place: the steady case, at once
    candidates[0] = c
    if count > 0:
        for k in range(3):
            i = 0 if k == 0 else (count // 2 if k == 1 else count - 1)
            r = rows[i].resident
            b = out.slot_row[r]
            if b < 0 or block_stamp[b] != stamp[r]:
                continue
            c = b - i
            for j in range(n):
                if candidates[j] == c:
                    break
            else:
                candidates[n] = c
                n += 1
    step = count // 32 if count >= 32 else 1
    for k in range(n):
        c = candidates[k]
        if c < 0 or c > cap - count:
            continue
        if n == 1:
            return c  # the steady case: nothing to weigh
        score = 0
        i = 0
        while i < count:
            score += block_stamp[c + i] == stamp[rows[i].resident]
            i += step
        if score > best_score:  # ties keep the earlier candidate: the last start first
            best = c
            best_score = score
    return best if best >= 0 else (cap - count) // 2


cdef void fill_block_table(const PageTableC* t, const SequenceC* rows, int32_t count,
                           InputsC* out) noexcept nogil:
    """block_table, updated in place: only what changed since the last step is written."""
    cdef const int32_t* table_rows = t.rows
    cdef const uint64_t* stamp = t.stamp
    cdef int32_t P = t.page_size, M = t.max_pages, shift = t.page_shift
    cdef int32_t* block_table
    cdef int32_t* block_fill
    cdef uint64_t* block_stamp
    cdef int32_t* slot_row = out.slot_row
    cdef int32_t i, r, npages, fill, start
    if out.block_wipe:
        memset(out.block_table, 0xFF, <size_t>out.block_rows * M * sizeof(int32_t))
        memset(out.block_stamp, 0xFF, out.block_rows * sizeof(uint64_t))  # no stamp
        memset(out.block_fill, 0, out.block_rows * sizeof(int32_t))
        out.block_wipe = False
    start = choose_block_start(t, rows, count, out)
    out.block_start = start
    block_table = out.block_table + <Py_ssize_t>start * M
    block_fill = out.block_fill + start
    block_stamp = out.block_stamp + start
    for i in range(count):
        r = rows[i].resident
        npages = pages_to(rows[i].past_length + rows[i].query_length, P, shift)
        fill = block_fill[i]
        # A slot's pages only grow until its stamp changes, and no two slots ever share a
        # stamp, so a row holding the stamp its slot has now needs only the pages appended
        # since: steady decoding copies a page per row every P steps. slot_row follows copies
        # only: a row already holding the slot's pages is as good a place as any to find them.
        if block_stamp[i] == stamp[r]:
            if fill != npages:
                copy_block_row(block_table + <Py_ssize_t>i * M, table_rows + <Py_ssize_t>r * M,
                               fill if fill < npages else npages, npages, fill)
                block_fill[i] = npages
        else:
            copy_block_row(block_table + <Py_ssize_t>i * M, table_rows + <Py_ssize_t>r * M,
                           0, npages, fill)
            block_fill[i] = npages
            block_stamp[i] = stamp[r]
            slot_row[r] = start + i


cdef void fill_page_list(const PageTableC* t, const SequenceC* rows, int32_t count,
                         InputsC* out) noexcept nogil:
    """kv_indptr, kv_indices, kv_last_page_len: rewritten whole every step, since one row's new
    page moves every later row's pages."""
    cdef const int32_t* table_rows = t.rows
    cdef int32_t P = t.page_size, M = t.max_pages, shift = t.page_shift
    cdef int32_t* kv_indptr = out.kv_indptr
    cdef int32_t* kv_indices = out.kv_indices
    cdef int32_t* kv_last_page_len = out.kv_last_page_len
    cdef const int32_t* pages
    cdef int32_t i, k, end, npages, kv = 0
    kv_indptr[0] = 0
    for i in range(count):
        pages = table_rows + <Py_ssize_t>rows[i].resident * M
        end = rows[i].past_length + rows[i].query_length
        npages = pages_to(end, P, shift)
        if npages > 16:
            memcpy(kv_indices + kv, pages, npages * sizeof(int32_t))
        else:
            for k in range(npages):
                kv_indices[kv + k] = pages[k]
        kv += npages
        kv_indptr[i + 1] = kv
        kv_last_page_len[i] = end - (npages - 1) * P
    out.num_kv_pages = kv


cdef void fill_inputs(const PageTableC* t, const SequenceC* rows, int32_t count,
                      InputsC* out) noexcept nogil:
    # One pass per kernel family rather than one pass for all: each loop keeps its few
    # pointers in registers (one fused loop spilled them), and the rows are L1-hot by the second.
    fill_tokens(t, rows, count, out)
    if out.block_table != NULL:
        fill_block_table(t, rows, count, out)
    if out.kv_indices != NULL:
        fill_page_list(t, rows, count, out)
    out.num_rows = count


# ============================================================================================
# 2. KVPageTable
# ============================================================================================

cdef class KVPageTable:
    """Per resident slot a list of KV page ids over one pool of ``num_pages`` pages.

    A slot is a ledger row index (the ``resident`` of a plan row). ``ensure`` grows a slot's
    pages all or nothing, ``release`` returns them, ``move`` carries a row to another slot (the
    ledger's swap-remove). ``rows`` is a read-only int32 ``[max_batch_size,
    max_pages_per_sequence]`` view of the table itself, ``-1`` after each slot's last page.
    Every method checks its arguments before it changes anything.
    """

    def __cinit__(self, max_batch_size, max_pages_per_sequence, num_pages, kv_page_size):
        # Everything is made here, once: however the object is reached (``__init__`` called
        # again, ``__new__`` without arguments) it is never half-made.
        cdef int32_t b, m, n, p
        b, m, n, p = table_arguments(max_batch_size, max_pages_per_sequence, num_pages,
                                     kv_page_size)
        cdef _CoreMemory rows, counts, free, stamp
        try:
            rows = _CoreMemory(<Py_ssize_t>b * m * sizeof(int32_t))
            counts = _CoreMemory(b * <Py_ssize_t>sizeof(int32_t))
            free = _CoreMemory(n * <Py_ssize_t>sizeof(int32_t))
            stamp = _CoreMemory(b * <Py_ssize_t>sizeof(uint64_t))
        except MemoryError:
            raise _errors.kv_table_memory(b, m, n) from None
        cdef int32_t k
        memset(rows.data, 0xFF, <size_t>b * m * sizeof(int32_t))  # every entry -1
        self.c.free_pages = <int32_t*>free.data
        for k in range(n):  # the pool is a stack whose top is page 0: pages 0, 1, 2... first
            self.c.free_pages[k] = n - 1 - k
        self.c.rows = <int32_t*>rows.data
        self.c.counts = <int32_t*>counts.data
        self.c.stamp = <uint64_t*>stamp.data
        for k in range(b):
            self.c.stamp[k] = k
        self.c.next_stamp = b
        self.c.num_slots, self.c.max_pages, self.c.num_pages, self.c.page_size = b, m, n, p
        self.c.page_shift = (p.bit_length() - 1) if p & (p - 1) == 0 else -1
        self.c.num_free = n
        # Arrays over memory Python can only read: neither they nor their ``.base`` can be
        # written, so the ids and counts the kernels index by are the table's alone.
        self.rows = np.frombuffer(rows, dtype=np.int32).reshape(b, m)
        self.page_counts = np.frombuffer(counts, dtype=np.int32)
        self._free_buf = np.frombuffer(free, dtype=np.int32)
        self._stamp_buf = stamp

    def __init__(self, max_batch_size, max_pages_per_sequence, num_pages, kv_page_size):
        if self._initialised:
            raise _errors.already_initialised("KVPageTable")
        self._initialised = True

    def __reduce_ex__(self, protocol):
        raise _errors.kv_not_copyable("KVPageTable")

    def __reduce__(self):
        raise _errors.kv_not_copyable("KVPageTable")

    cdef int32_t _slot(self, str field, object value) except? -1:
        cdef int32_t v = as_int32(field, value)
        if v < 0 or v >= self.c.num_slots:
            raise _errors.out_of_range(field, v, f"0..{self.c.num_slots - 1} (max_batch_size - 1)")
        return v

    @property
    def max_batch_size(self):
        return self.c.num_slots

    @property
    def max_pages_per_sequence(self):
        return self.c.max_pages

    @property
    def num_pages(self):
        return self.c.num_pages

    @property
    def kv_page_size(self):
        return self.c.page_size

    @property
    def num_free_pages(self):
        return self.c.num_free

    def tokens_held(self, slot):
        """How many tokens the pages of ``slot`` hold (its page count × ``kv_page_size``)."""
        cdef int32_t s = self._slot("slot", slot)
        return <int64_t>self.c.counts[s] * self.c.page_size

    def ensure(self, slot, num_tokens):
        """Give ``slot`` pages for ``num_tokens`` tokens in all; ``False`` (and nothing changed)
        when the pool is short. A slot never shrinks here: ``release`` empties it."""
        cdef int32_t s = self._slot("slot", slot)
        cdef int32_t n = as_int32("num_tokens", num_tokens)
        if n < 0:
            raise _errors.out_of_range("num_tokens", n, ">= 0")
        cdef int64_t need = pages_for(n, self.c.page_size)
        if need > self.c.max_pages:
            raise _errors.kv_tokens_over_row(n, self.c.max_pages, self.c.page_size)
        with cython.critical_section(self):
            if need <= self.c.counts[s]:
                return True
            if need - self.c.counts[s] > self.c.num_free:
                return False
            grow_slot(&self.c, s, <int32_t>need)
        return True

    def release(self, slot):
        """Return every page of ``slot`` to the pool."""
        cdef int32_t s = self._slot("slot", slot)
        with cython.critical_section(self):
            release_slot(&self.c, s)

    def move(self, src, dst):
        """Move the pages of slot ``src`` to the empty slot ``dst``; ``src`` is then empty."""
        cdef int32_t a = self._slot("src", src)
        cdef int32_t b = self._slot("dst", dst)
        with cython.critical_section(self):
            if a == b:
                return
            if self.c.counts[b] != 0:
                raise _errors.kv_move_onto_pages(b, self.c.counts[b])
            move_slot(&self.c, a, b)

    def check(self):
        """Raise ``PageTableInvariantError`` unless every invariant of the table holds."""
        with cython.critical_section(self):
            check_page_table(self.rows, self.page_counts,
                             self._free_buf[:self.c.num_free], self.c.num_pages)

    def __repr__(self):
        return (f"KVPageTable(max_batch_size={self.c.num_slots}, "
                f"max_pages_per_sequence={self.c.max_pages}, num_pages={self.c.num_pages}, "
                f"kv_page_size={self.c.page_size}, num_free_pages={self.c.num_free})")


def geometry(KVPageTable table not None):
    """``table``'s sizes as its C struct holds them: what the kernels index by, and so what every
    check reads (a subclass may override the Python properties; it cannot change these)."""
    with cython.critical_section(table):
        return Geometry(table.c.num_slots, table.c.max_pages, table.c.num_pages,
                        table.c.page_size, table.c.num_free)


def counts(KVPageTable table not None):
    """The read-only view of ``table``'s page counts that its C writes (not a subclass's
    ``page_counts``)."""
    return table.page_counts


# ============================================================================================
# 3. StepInputs
# ============================================================================================

cdef object _row_error(int status, int32_t index, const SequenceC* s, const PageTableC* t):
    """The one place a row status becomes an exception."""
    if status == ROW_RESIDENT_RANGE:
        return _errors.kv_resident_range(index, s.resident, t.num_slots)
    if status == ROW_PAST_NEGATIVE:
        return _errors.kv_row_field(index, "past_length", s.past_length, ">= 0")
    if status == ROW_QUERY_NOT_POSITIVE:
        return _errors.kv_row_field(index, "query_length", s.query_length, ">= 1")
    if status == ROW_LENGTH_OVERFLOW:
        return _errors.kv_row_overflow(index, s.past_length, s.query_length)
    return _errors.kv_pages_missing(index, s.resident, s.past_length, s.query_length,
                                    t.counts[s.resident], t.page_size)


cdef void* _data(dict bufs, str name):
    """The data pointer of ``bufs[name]``, or NULL when the layout has no such buffer."""
    buf = bufs.get(name)
    return NULL if buf is None else cnp.PyArray_DATA(<cnp.ndarray>buf)


cdef class StepInputs:
    """The arrays attention kernels take for one step, filled by ``prepare(plan)`` (see
    ``stepplanner.StepInputs`` in the package docs for every array's definition).

    ``layout`` picks the kernel family: ``"flash_attn"`` fills ``block_table``,
    ``"flashinfer"`` fills ``kv_indptr``/``kv_indices``/``kv_last_page_len``, ``"all"`` (the
    default) both; the token and row arrays are filled always. Reading an array the layout
    skips raises ``AttributeError`` (its buffer is never allocated, so nothing stale is shown).

    Buffers are sized once for ``limits`` (B rows, ``limits.t_max`` tokens); ``prepare``
    allocates nothing. The arrays are views of the valid part of those buffers, so they are
    **overwritten by the next** ``prepare``: copy what you keep. ``block_table`` is a window
    of B of its buffer's 2B rows that moves with the rows from step to step, so a row that
    keeps its slot keeps its pages in place (``block_table_start`` says where it starts).
    """

    def __cinit__(self, limits, page_table, layout="all"):
        # Everything is made here, once (see KVPageTable.__cinit__).
        layout, _ = inputs_arguments(limits, page_table, KVPageTable, layout, geometry)
        cdef KVPageTable table = <KVPageTable>page_table
        cdef int32_t b = limits.max_batch_size, m = table.c.max_pages
        cdef int32_t t = limits.t_max
        # Memory Python can only read (see KVPageTable): what prepare wrote last step is what
        # the next prepare finds, whatever the caller does with the arrays.
        bufs = input_buffers(b, m, t, layout, _CoreMemory)
        cdef _CoreMemory block_state, rows_copy
        cdef int32_t block_rows = block_table_rows(b), slots = table.c.num_slots
        try:
            block_state = _CoreMemory(
                block_rows * <Py_ssize_t>(sizeof(uint64_t) + sizeof(int32_t))
                + slots * <Py_ssize_t>sizeof(int32_t))
            rows_copy = _CoreMemory(b * <Py_ssize_t>sizeof(SequenceC))
        except MemoryError:
            raise _errors.kv_inputs_memory(b, t, m) from None
        self._block_state = block_state
        self._rows_copy_mem = rows_copy
        self._rows_copy = <SequenceC*>rows_copy.data
        self.c.block_rows = block_rows
        self.c.block_start = -1
        self.c.block_wipe = False
        self.c.block_stamp = <uint64_t*>block_state.data
        self.c.block_fill = <int32_t*>(self.c.block_stamp + block_rows)
        self.c.slot_row = self.c.block_fill + block_rows
        memset(self.c.block_stamp, 0xFF, block_rows * sizeof(uint64_t))  # no stamp yet
        memset(self.c.slot_row, 0xFF, slots * sizeof(int32_t))           # -1: in no row yet
        self.c.positions = <int32_t*>_data(bufs, "positions")
        self.c.cu_seqlens_q = <int32_t*>_data(bufs, "cu_seqlens_q")
        self.c.seq_lens_k = <int32_t*>_data(bufs, "seq_lens_k")
        self.c.slot_mapping = <int64_t*>_data(bufs, "slot_mapping")
        self.c.logits_indices = <int32_t*>_data(bufs, "logits_indices")
        self.c.block_table = <int32_t*>_data(bufs, "block_table")
        self.c.kv_indptr = <int32_t*>_data(bufs, "kv_indptr")
        self.c.kv_indices = <int32_t*>_data(bufs, "kv_indices")
        self.c.kv_last_page_len = <int32_t*>_data(bufs, "kv_last_page_len")
        for name in _buffers.PADDED:
            if name in bufs:
                memset(cnp.PyArray_DATA(bufs[name]), 0xFF, cnp.PyArray_NBYTES(bufs[name]))  # -1
        self.c.num_rows = self.c.num_tokens = self.c.num_kv_pages = self.c.num_logits = 0
        self._bufs = bufs
        self._table = table
        self.max_rows = b
        self.max_tokens = t
        self.limits = limits
        self.page_table = page_table
        self.layout = layout

    def __init__(self, limits, page_table, layout="all"):
        if self._initialised:
            raise _errors.already_initialised("StepInputs")
        self._initialised = True

    def __reduce_ex__(self, protocol):
        raise _errors.kv_not_copyable("StepInputs")

    def __reduce__(self):
        raise _errors.kv_not_copyable("StepInputs")

    def prepare(self, plan):
        """Fill every array for ``plan``'s rows in order; returns ``self``.

        ``plan``: a ``StepPlan`` (read in place), or a 1-D ``SEQUENCE_DTYPE`` array, or any
        object whose ``as_array()`` gives one. A row whose slot holds too few pages is a
        ``ValueError`` naming the resident; a call that raises writes nothing.
        """
        cdef const char* rows
        cdef Py_ssize_t stride
        cdef Py_ssize_t count
        cdef cnp.ndarray arr
        if type(plan) is StepPlan:
            with cython.critical_section(plan, self._table):
                rows = <const char*>(<StepPlan>plan).c.sequences
                count = (<StepPlan>plan).c.num_prefill + (<StepPlan>plan).c.num_decode
                self._prepare(rows, sizeof(SequenceC), count, True)
            return self
        if not cnp.PyArray_Check(plan):
            as_array = getattr(plan, "as_array", None)
            if as_array is None:
                raise _errors.kv_plan_type(plan)
            plan = as_array()
            if not cnp.PyArray_Check(plan):
                raise _errors.kv_plan_type(plan)
        arr = <cnp.ndarray>plan
        if not (arr.descr is _SEQUENCE_DESCR or cnp.PyArray_EquivTypes(arr.descr, _SEQUENCE_DESCR)):
            raise _errors.kv_plan_dtype(arr.dtype, SEQUENCE_DTYPE)
        if arr.ndim != 1:
            raise _errors.kv_plan_ndim(arr.ndim)
        with cython.critical_section(self._table):
            self._prepare(<const char*>cnp.PyArray_DATA(arr), arr.strides[0], arr.shape[0], False)
        return self

    cdef int _prepare(self, const char* rows, Py_ssize_t stride, Py_ssize_t count,
                      bint in_place) except -1:
        # Rows another thread could change meanwhile (a caller's array, free-threaded builds
        # included) are copied once, and the copy is validated and filled from, so no row slips
        # past the checks. A StepPlan's rows are read in place: its memory is written only by
        # plan() under the plan's critical section, which the caller holds. The GIL stays held:
        # releasing it would gain nothing for a few microseconds of work.
        cdef const SequenceC* seqs = <const SequenceC*>rows
        cdef int32_t bad, i
        cdef int64_t tokens = 0
        cdef const PageTableC* t = &self._table.c
        if count > self.max_rows:
            raise _errors.kv_plan_rows(count, self.max_rows)
        if not in_place:
            if stride == sizeof(SequenceC):
                memcpy(self._rows_copy, rows, count * sizeof(SequenceC))
            else:
                for i in range(count):  # strided or unaligned: a row at a time
                    memcpy(&self._rows_copy[i], rows + i * stride, sizeof(SequenceC))
            seqs = self._rows_copy
        bad = first_bad_row(t, seqs, <int32_t>count, &tokens)
        if bad >= 0:
            raise _row_error(check_sequence(t, &seqs[bad]), bad, &seqs[bad], t)
        if tokens > self.max_tokens:
            raise _errors.kv_plan_tokens(tokens, self.max_tokens)
        fill_inputs(t, seqs, <int32_t>count, &self.c)
        return 0

    @property
    def num_rows(self):
        return self.c.num_rows

    @property
    def num_tokens(self):
        return self.c.num_tokens

    @property
    def max_num_tokens(self):
        """Tokens the buffers hold: ``limits.t_max``."""
        return self.max_tokens

    cdef object _view(self, str name, Py_ssize_t length):
        return view_of(self._bufs, name, length, self.layout)

    @property
    def positions(self):
        return self._view("positions", self.c.num_tokens)

    @property
    def cu_seqlens_q(self):
        return self._view("cu_seqlens_q", self.c.num_rows + 1)

    @property
    def qo_indptr(self):
        return self._view("cu_seqlens_q", self.c.num_rows + 1)

    @property
    def seq_lens_k(self):
        return self._view("seq_lens_k", self.c.num_rows)

    @property
    def slot_mapping(self):
        return self._view("slot_mapping", self.c.num_tokens)

    @property
    def block_table(self):
        return view_of(self._bufs, "block_table", self.c.num_rows, self.layout,
                       max(self.c.block_start, 0))

    @property
    def block_table_start(self):
        """The row of ``buffers()["block_table"]`` where ``block_table`` starts this step."""
        if self.c.block_table == NULL:
            return self._view("block_table", 0)  # the layout's AttributeError
        return max(self.c.block_start, 0)

    @property
    def kv_indptr(self):
        return self._view("kv_indptr", self.c.num_rows + 1)

    @property
    def kv_indices(self):
        return self._view("kv_indices", self.c.num_kv_pages)

    @property
    def kv_last_page_len(self):
        return self._view("kv_last_page_len", self.c.num_rows)

    @property
    def logits_indices(self):
        return self._view("logits_indices", self.c.num_logits)

    def buffers(self):
        """The full buffers of this layout by name (fixed addresses for the engine's lifetime,
        e.g. to capture in a CUDA graph); only each one's valid prefix is meaningful after
        ``prepare``, except ``block_table``'s (2B rows), whose valid rows start at
        ``block_table_start``.

        They are read-only: a consumer must not write them. ``prepare`` updates ``block_table``
        rows in place, trusting them to hold what it wrote; a consumer that writes them anyway
        (a DLPack tensor does not carry the read-only flag into every framework) calls
        ``invalidate()`` before the next ``prepare``. The page table never reads them."""
        return dict(self._bufs)

    def invalidate(self):
        """Forget what the buffers hold: the next ``prepare`` writes ``-1`` over the whole
        ``block_table`` buffer, then every row of the step, instead of appending each row's new
        pages. Nothing changes until then."""
        with cython.critical_section(self._table):
            self.c.block_wipe = True

    def __repr__(self):
        return (f"StepInputs(limits={self.limits!r}, page_table={self.page_table!r}, "
                f"layout={self.layout!r}, num_rows={self.c.num_rows}, "
                f"num_tokens={self.c.num_tokens})")
