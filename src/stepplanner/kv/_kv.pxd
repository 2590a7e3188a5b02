# The C contract of the KV page table and of the step's attention inputs.
# _kv.pyx implements it; KVPageTable and StepInputs wrap it. Plans are read through _core's
# SequenceC (read-only: this module never writes a plan).

from libc.stdint cimport int32_t, int64_t, uint64_t

from stepplanner._core cimport SequenceC

# Per resident slot a list of page ids over one pool of pages, each holding `page_size` tokens.
ctypedef struct PageTableC:
    int32_t num_slots          # B: the ledger's rows
    int32_t max_pages          # pages one slot may hold (the row width)
    int32_t num_pages          # pages in the pool, ids 0..num_pages-1
    int32_t page_size          # P tokens per page
    int32_t page_shift         # log2(P) when P is a power of two (the common case), else -1
    int32_t* rows              # num_slots × max_pages page ids, -1 after a slot's last page
    int32_t* counts            # pages each slot holds (its row's live prefix)
    int32_t* free_pages        # the free pool as a stack; the top is free_pages[num_free - 1]
    int32_t num_free
    uint64_t* stamp            # per slot: a value no other slot ever had, renewed whenever its
    uint64_t next_stamp        # pages change other than by growth (the next one to hand out)

# The buffers `prepare` fills, sized once for B rows and T tokens. A layout that skips a kernel
# family leaves that family's pointers NULL (block_table and its bookkeeping, or kv_indptr,
# kv_indices and kv_last_page_len), and fill_inputs writes none of them.
ctypedef struct InputsC:
    int32_t* positions         # [T]
    int32_t* cu_seqlens_q      # [B + 1]; also FlashInfer's qo_indptr
    int32_t* seq_lens_k        # [B]
    int64_t* slot_mapping      # [T]
    int32_t* block_table       # [2B × max_pages]; this step's rows start at block_start
    int32_t* block_fill        # per buffer row: entries before its -1 padding
    int32_t block_rows         # rows of the block_table buffer: 2 × B (see choose_block_start)
    int32_t block_start        # the buffer row where this step's block_table starts (-1: none yet)
    bint block_wipe            # invalidate() was called: -1 the whole buffer before the next fill
    uint64_t* block_stamp      # per buffer row: the stamp of the slot whose pages it holds
                               # (all ones: none; stamps count up from 0 and never get there)
    int32_t* slot_row          # per page-table slot: the buffer row its pages were last copied to
    int32_t* kv_indptr         # [B + 1]
    int32_t* kv_indices        # [B × max_pages]
    int32_t* kv_last_page_len  # [B]
    int32_t* logits_indices    # [B]
    int32_t num_rows
    int32_t num_tokens
    int32_t num_kv_pages       # kv_indptr[num_rows]
    int32_t num_logits

# What a prepare-time check finds about one plan row; _kv.pyx turns it into an exception.
cdef enum:
    ROW_OK = 0
    ROW_RESIDENT_RANGE = 1
    ROW_PAST_NEGATIVE = 2
    ROW_QUERY_NOT_POSITIVE = 3
    ROW_LENGTH_OVERFLOW = 4
    ROW_PAGES_MISSING = 5

# Pages that hold `num_tokens` tokens: ceil(num_tokens / page_size).
cdef int64_t pages_for(int64_t num_tokens, int32_t page_size) noexcept nogil

# Append pages to `slot` until it holds `need` (a caller checked need <= max_pages and that the
# pool has them).
cdef void grow_slot(PageTableC* t, int32_t slot, int32_t need) noexcept nogil
cdef void release_slot(PageTableC* t, int32_t slot) noexcept nogil
cdef void move_slot(PageTableC* t, int32_t src, int32_t dst) noexcept nogil

# The ROW_* status of one plan row against the page table.
cdef int check_sequence(const PageTableC* t, const SequenceC* s) noexcept nogil

# The index of the first row check_sequence refuses, or -1 (and `tokens` = the rows' tokens).
cdef int32_t first_bad_row(const PageTableC* t, const SequenceC* rows, int32_t count,
                           int64_t* tokens) noexcept nogil

# The buffer row where the block_table of `count` validated rows starts this step.
cdef int32_t choose_block_start(const PageTableC* t, const SequenceC* rows, int32_t count,
                                const InputsC* out) noexcept nogil

# Fill every buffer from `count` validated rows.
cdef void fill_inputs(const PageTableC* t, const SequenceC* rows, int32_t count,
                      InputsC* out) noexcept nogil


cdef class KVPageTable:
    cdef PageTableC c
    cdef object _free_buf        # arrays over _core._CoreMemory: memory the C code writes and
    cdef object _stamp_buf       # Python can only read
    cdef readonly object rows
    cdef readonly object page_counts
    cdef bint _initialised
    cdef object __weakref__
    cdef int32_t _slot(self, str field, object value) except? -1


cdef class StepInputs:
    cdef InputsC c
    cdef KVPageTable _table
    cdef int32_t max_rows
    cdef int32_t max_tokens
    cdef object _bufs          # name -> the full buffer, a read-only array over _CoreMemory
    cdef object _block_state   # the _CoreMemory of block_stamp, block_fill and slot_row
    cdef object _rows_copy_mem # the _CoreMemory of _rows_copy
    cdef SequenceC* _rows_copy # prepare's copy of the plan's rows: validated, then filled from
    cdef bint _initialised
    cdef readonly object limits
    cdef readonly object page_table
    cdef readonly str layout
    cdef object _view(self, str name, Py_ssize_t length)
    cdef int _prepare(self, const char* rows, Py_ssize_t stride, Py_ssize_t count,
                      bint in_place) except -1
