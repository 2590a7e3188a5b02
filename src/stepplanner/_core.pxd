# The C contract of the compiled core: constants, structs and the kernel's signature.
# _core.pyx implements it; the Python surface (StepPlanner, StepPlan, ResidentState) wraps it.

from libc.stdint cimport int32_t, uint8_t, uint64_t

cdef enum:
    WORK_CONTEXT = 0
    WORK_DECODE = 1

cdef enum:
    MODE_AUTO = 0
    MODE_MIXED = 1
    MODE_PREFILL_FIRST = 2

cdef enum:
    POLICY_FCFS = 0
    POLICY_PRIORITY = 1
    POLICY_EDF = 2        # the ledger's deadline policies: planned as PRIORITY (SPEC §7)
    POLICY_DEADLINE = 3

cdef enum:
    PREEMPT_NONE = 0
    PREEMPT_PAUSE = 1

# Mirrors stepplanner.Reason; REASON_RELEASED is a bit or'd on top of an outcome.
cdef enum:
    REASON_DECODE = 1
    REASON_CHUNK = 2
    REASON_CHUNK_FINAL = 3
    REASON_PAUSED = 4
    REASON_SKIPPED_BUDGET = 5
    REASON_SKIPPED_PAGE_TRIM = 6
    REASON_HELD_PREFILL_FIRST = 7
    REASON_RELEASED = 0x10

# What row validation finds; _core.pyx turns a status into the matching _errors exception.
cdef enum:
    STATUS_OK = 0
    STATUS_COMMITTED_NEGATIVE = 1
    STATUS_PROMPT_LENGTH_NEGATIVE = 2
    STATUS_PAUSED_STEPS_NEGATIVE = 3
    STATUS_PROMPT_EXHAUSTED = 4
    STATUS_PROMPT_TOO_LONG = 5
    STATUS_COMMITTED_OVERFLOW = 6      # apply_to: committed + query_length > INT32_MAX
    STATUS_PAUSED_STEPS_OVERFLOW = 7   # apply_to: consecutive_paused_steps + 1 > INT32_MAX

# One resident's ledger row; the layout is RESIDENT_DTYPE's (checked at import).
ctypedef struct ResidentC:
    int32_t priority
    uint64_t arrival
    int32_t prompt_length
    int32_t committed
    uint8_t context_committed
    int32_t consecutive_paused_steps

# One planned row; the layout is SEQUENCE_DTYPE's.
ctypedef struct SequenceC:
    int32_t resident
    int32_t work
    int32_t past_length
    int32_t query_length
    uint8_t select_last_token_logits

# A resolved policy and the limits, as plain ints. Every budget rule holds (checked in Python).
ctypedef struct ConfigC:
    int32_t mode
    int32_t scheduling_policy
    int32_t preemption
    int32_t max_pause_steps
    int32_t max_num_tokens
    int32_t max_chunk_tokens
    int32_t max_batch_size
    int32_t max_input_length
    int32_t kv_page_size
    int32_t t_max

# (priority, arrival, index) packed into 128 bits that compare as unsigned (hi, lo):
# hi = biased priority << 32 | arrival >> 32; lo = arrival << 32 | index.
ctypedef struct SortKeyC:
    uint64_t hi
    uint64_t lo

# Working memory of the kernel, sized for B at construction.
ctypedef struct ScratchC:
    SortKeyC* keys
    SortKeyC* merge_tmp
    int32_t* order          # residents in order; kept to seed the next call's sort
    int32_t order_count     # how many entries of `order` the previous call left
    uint8_t* paused         # per resident: 1 when paused in this plan
    int32_t* prompts        # the active prompt-incomplete residents, in order
    int32_t* decodes        # the active decoding residents, in order
    int32_t* grants         # per decode row (in order): the drafts it verifies (SPEC §8)
    int32_t* drafts         # per resident: the drafts plan() was given, copied in and checked

ctypedef struct PlanC:
    SequenceC* sequences    # num_prefill chunks, then num_decode decode rows
    int32_t* paused         # ascending resident indices
    int32_t num_paused
    int32_t num_residents   # the count the plan was made over
    int32_t num_prefill
    int32_t num_decode
    int32_t prefill_tokens
    int32_t total_tokens

# SPEC §3's per-resident validation of one row; STATUS_OK when it may be planned.
cdef int check_row(const ResidentC* row, int32_t max_input_length) noexcept nogil

# The first plan name (row k, or pause k - rows) of a resident an earlier name names, or -1;
# every name must be a valid resident and `mark` zero over them (it is zero again on return).
cdef int32_t first_repeated(const PlanC* p, uint8_t* mark) noexcept nogil
# The ValueError for a plan first_repeated found a repeat in, in the twins' shared words.
cdef object repeated_resident_error(const PlanC* p)

# The whole of SPEC §3 (and §8 when `drafts` is not NULL: per resident, checked) over validated
# rows. It cannot fail. `reasons` may be NULL.
cdef void plan_step(const ConfigC* cfg, const ResidentC* residents, int32_t count,
                    ScratchC* scratch, PlanC* out, uint8_t* reasons,
                    const int32_t* drafts) noexcept nogil

cdef class _PlanView:
    cdef StepPlan _plan

cdef class _SequencesView(_PlanView):
    pass

cdef class _PausedView(_PlanView):
    pass

# Memory the core writes and Python can only read (its buffer is exported read-only).
cdef class _CoreMemory:
    cdef void* data
    cdef Py_ssize_t size

cdef class StepPlan:
    cdef PlanC c
    cdef int32_t capacity     # rows of each buffer; plan() never needs more than B
    cdef object _seq_buf      # read-only numpy arrays over the _CoreMemory that c.sequences
    cdef object _paused_buf   # and c.paused point into
    cdef object _apply_buf    # a _CoreMemory of 2 × capacity int32: apply_to()'s scratch
    cdef uint64_t version     # bumped by every plan() that writes this plan; apply_to() checks it
    cdef object __weakref__
    cdef _allocate(self, int32_t capacity)
    cdef _copy_from(self, StepPlan src)
    cdef _apply_array(self, object arr)
    cdef _apply_objects(self, tuple residents)
    cdef int32_t* _apply_amounts(self)

cdef class ResidentState:
    cdef ResidentC c
    cdef uint64_t stamp       # the last plan()/apply_to() call that read it (see _core.pyx)
    cdef int32_t stamp_index  # and the index that call read it at

cdef class StepPlanner:
    cdef ConfigC cfg
    cdef ScratchC scratch
    cdef ResidentC* rows      # the call's residents, copied in as they are validated
    cdef StepPlan _plan
    cdef readonly object policy
    cdef readonly object limits
    cdef bint _planning       # plan() is reading the residents: a nested plan() is refused
    cdef void _free_buffers(self) noexcept
    cdef Py_ssize_t _count(self, object count, Py_ssize_t length) except -1
    cdef const ResidentC* _read_array(self, object residents, int32_t n,
                                      const uint8_t* reasons, bint ran_code) except NULL
    cdef const ResidentC* _in_place(self, object arr, int32_t n, const uint8_t* reasons)
    cdef int _copy_objects(self, object residents, int32_t n) except -1
    cdef int _copy_drafts(self, object drafts, int32_t n) except -1
    cdef int _check_draft_values(self, const ResidentC* rows, int32_t n) except -1
    cdef object _kernel_loop(self, object residents, Py_ssize_t iterations)
