"""Compiled core of stepplanner: the SPEC §3 kernel over C structs, and the objects that own it.

Layout of this file, top to bottom:
  1. the kernel (``order_residents``, ``plan_step``, ``check_row``): C only, ``noexcept nogil``;
  2. ``ResidentState``: an extension type over one ``ResidentC``;
  3. ``StepPlan`` and its views: the planner's one plan, over buffers allocated once;
  4. ``StepPlanner``: validation at the boundary (fused with the copy into C rows), then the kernel;
  5. ``time_kernel_loop``: the benchmark's "C loop with no Python in between".

Directives are set in setup.py, not here.
"""

cimport cython
cimport numpy as cnp
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport (int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t, INT32_MAX,
                          INT32_MIN)
from libc.string cimport memcpy, memset

import collections.abc
import operator
import time

import numpy as np

from . import _errors
from .planner._fields import as_bool, as_int32, as_uint64
from .planner._policy import check_policy, step_budget
from .planner._types import (
    RESIDENT_DTYPE,
    SEQUENCE_DTYPE,
    AnyResidentState,
    AnyStepPlan,
    PlannedSequence,
    SequenceWork,
)
from .planner._types import first_repeat, plan_repr as _plan_repr, plan_to_dict as _plan_to_dict

cnp.import_array()

IMPLEMENTATION = "compiled"

# Keys per run the merge sort insertion-sorts before merging: below this, merging costs more.
cdef enum:
    MERGE_RUN = 8

# ============================================================================================
# 1. The kernel
# ============================================================================================

cdef inline bint key_less(const SortKeyC* a, const SortKeyC* b) noexcept nogil:
    # Bitwise, not short-circuit: the merge then has no data-dependent branch to mispredict.
    return (a.hi < b.hi) | ((a.hi == b.hi) & (a.lo < b.lo))


cdef inline SortKeyC make_key(const ResidentC* row, int32_t index, bint by_priority) noexcept nogil:
    # Flipping the sign bit makes int32 order agree with unsigned order.
    cdef uint32_t prio = 0x80000000u
    if by_priority:
        prio = (<uint32_t>row.priority) ^ 0x80000000u
    cdef SortKeyC key
    key.hi = ((<uint64_t>prio) << 32) | (row.arrival >> 32)
    key.lo = (row.arrival << 32) | <uint64_t>(<uint32_t>index)
    return key


cdef inline void insertion_sort(SortKeyC* keys, int64_t count) noexcept nogil:
    cdef SortKeyC held
    cdef int64_t i, j
    for i in range(1, count):
        held = keys[i]
        j = i
        while j > 0 and key_less(&held, &keys[j - 1]):
            keys[j] = keys[j - 1]
            j -= 1
        keys[j] = held


cdef void merge_sort(SortKeyC* keys, SortKeyC* tmp, int32_t count) noexcept nogil:
    """Runs of MERGE_RUN insertion-sorted in place, then bottom-up merges ping-ponging with tmp.

    The merge picks each output key by a select, not a branch: on a shuffled ledger a branch
    would be mispredicted half the time, which costs more than the comparisons themselves.
    """
    cdef SortKeyC* src = keys
    cdef SortKeyC* dst = tmp
    cdef SortKeyC* swap
    cdef const SortKeyC* pick
    cdef int64_t width = MERGE_RUN, lo, mid, hi, i, j, k
    cdef bint right
    lo = 0
    while lo < count:
        insertion_sort(&keys[lo], min(<int64_t>MERGE_RUN, count - lo))
        lo += MERGE_RUN
    while width < count:
        lo = 0
        while lo < count:
            mid = min(lo + width, <int64_t>count)
            hi = min(lo + 2 * width, <int64_t>count)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                right = key_less(&src[j], &src[i])
                pick = &src[j] if right else &src[i]
                dst[k] = pick[0]
                j += right
                i += 1 - right
                k += 1
            if i < mid:
                memcpy(&dst[k], &src[i], <size_t>(mid - i) * sizeof(SortKeyC))
            elif j < hi:
                memcpy(&dst[k], &src[j], <size_t>(hi - j) * sizeof(SortKeyC))
            lo = hi
        swap = src
        src = dst
        dst = swap
        width *= 2
    if src != keys:
        memcpy(keys, src, <size_t>count * sizeof(SortKeyC))


cdef int64_t split_run(SortKeyC* keys, SortKeyC* side, int64_t n) noexcept nogil:
    """Split keys[:n] in one pass into an increasing run, left in keys[:kept], and the keys
    that break it, appended to side in their order; returns kept.

    A key below the run's last one means one of the two moved. If it still follows the key
    before that one, the run's last key is the one that jumped (up) and gives way; otherwise
    the new key jumped (down) and leaves the run."""
    cdef SortKeyC held
    cdef int64_t i, kept = 0, moved = 0
    for i in range(n):
        held = keys[i]
        if kept == 0 or key_less(&keys[kept - 1], &held):
            keys[kept] = held
            kept += 1
        elif kept >= 2 and key_less(&keys[kept - 2], &held):
            side[moved] = keys[kept - 1]
            moved += 1
            keys[kept - 1] = held
        else:
            side[moved] = held
            moved += 1
    return kept


cdef void adaptive_sort(SortKeyC* keys, SortKeyC* spare, int64_t n) noexcept nogil:
    """Sort keys[:n] (spare: room for n keys): O(n) per level for keys that are sorted but
    for a few that moved far, and for a few sorted runs laid end to end (rows moving between
    two levels come out as such runs), O(n log n) when most of them moved.

    The keys that break the run are split off into spare and sorted the same way, with the
    run's free tail as their room, then merged back from the end. Each level halves the keys
    at least (more moved than stayed: merge sort), so it recurses at most log2(n) deep."""
    cdef int64_t kept, moved, i, j, w
    if n <= MERGE_RUN * 4:
        insertion_sort(keys, n)
        return
    kept = split_run(keys, spare, n)
    moved = n - kept
    if moved == 0:
        return
    if moved > kept:
        memcpy(&keys[kept], spare, <size_t>moved * sizeof(SortKeyC))
        merge_sort(keys, spare, <int32_t>n)
        return
    adaptive_sort(spare, &keys[kept], moved)
    w = n - 1
    j = moved - 1
    i = kept - 1
    while j >= 0:
        if i >= 0 and key_less(&spare[j], &keys[i]):
            keys[w] = keys[i]
            i -= 1
        else:
            keys[w] = spare[j]
            j -= 1
        w -= 1


cdef void order_residents(const ConfigC* cfg, const ResidentC* residents, int32_t count,
                          ScratchC* s) noexcept nogil:
    """Leave ``s.order`` holding the residents in (priority, arrival, index) order.

    Between engine steps the order barely changes, but some rows move far: a retired row's
    slot taken by the ledger's last row, a new row, rows whose rank the ledger changed (a
    deadline level). So the keys are laid out in the previous call's order and sorted by
    ``adaptive_sort``, which costs O(B) plus what the moved rows need.
    """
    cdef bint by_priority = cfg.scheduling_policy != POLICY_FCFS  # EDF, DEADLINE: SPEC §7
    cdef SortKeyC* keys = s.keys
    cdef int32_t i, j, idx, k = 0
    cdef int32_t prev = s.order_count

    if prev <= count:
        for j in range(prev):
            idx = s.order[j]
            keys[k] = make_key(&residents[idx], idx, by_priority)
            k += 1
        for i in range(prev, count):
            keys[k] = make_key(&residents[i], i, by_priority)
            k += 1
    else:
        # Rows beyond count have left; the previous order filtered to the rest is a permutation.
        for j in range(prev):
            idx = s.order[j]
            if idx < count:
                keys[k] = make_key(&residents[idx], idx, by_priority)
                k += 1

    adaptive_sort(keys, s.merge_tmp, count)

    for k in range(count):
        s.order[k] = <int32_t>(keys[k].lo & 0xFFFFFFFFu)
    s.order_count = count


cdef int check_row(const ResidentC* row, int32_t max_input_length) noexcept nogil:
    if row.committed < 0:
        return STATUS_COMMITTED_NEGATIVE
    if row.prompt_length < 0:
        return STATUS_PROMPT_LENGTH_NEGATIVE
    if row.consecutive_paused_steps < 0:
        return STATUS_PAUSED_STEPS_NEGATIVE
    if not row.context_committed:
        if row.prompt_length - row.committed <= 0:
            return STATUS_PROMPT_EXHAUSTED
        if row.prompt_length > max_input_length:
            return STATUS_PROMPT_TOO_LONG
    return STATUS_OK


cdef int32_t first_bad_row(const ResidentC* rows, int32_t n, int32_t max_input_length) noexcept nogil:
    """The index of the first row that fails ``check_row``, or -1. (Every row passes in a valid
    step, so check_row's branches are predicted: fewer instructions than a branch-free test.)"""
    cdef int32_t i
    for i in range(n):
        if check_row(&rows[i], max_input_length) != STATUS_OK:
            return i
    return -1


cdef int32_t pause_residents(const ConfigC* cfg, const ResidentC* residents, int32_t count,
                             const int32_t* order, uint8_t* paused, int32_t* out_paused,
                             uint8_t* reasons) noexcept nogil:
    """SPEC §3 step 2: pause everyone whose priority value is worse than the first pending
    prompt's; returns how many, listed ascending in ``out_paused``.

    Priorities are mixed across the ledger, so each resident's outcome is computed with
    arithmetic rather than branched on.
    """
    cdef int32_t i, k, h = -1, num_paused = 0
    cdef const ResidentC* r
    cdef bint worse, released, stop
    # max_pause_steps == 0 releases nobody: no int32 count reaches 2**32.
    cdef int64_t release_at = cfg.max_pause_steps if cfg.max_pause_steps > 0 else 1LL << 32
    for k in range(count):
        if not residents[order[k]].context_committed:
            h = order[k]
            break
    if h < 0:
        return 0
    cdef int32_t bar = residents[h].priority
    for i in range(count):
        r = &residents[i]
        worse = r.priority > bar
        released = worse & (r.consecutive_paused_steps >= release_at)
        stop = worse & (released ^ 1)
        paused[i] = stop
        out_paused[num_paused] = i
        num_paused += stop
        if reasons != NULL:
            reasons[i] = stop * REASON_PAUSED | released * REASON_RELEASED
    return num_paused


cdef int32_t grant_drafts(const ConfigC* cfg, const ResidentC* residents, const int32_t* drafts,
                          ScratchC* scratch, int32_t num_decode, int32_t num_prompts) noexcept nogil:
    """SPEC §8: each decode row's drafts (into ``scratch.grants``), in order, from what the step
    holds beyond one token per decode row, less what the first prompt needs to reach its next
    page end (so it still advances); returns their sum. Out of plan_step's body, which a step
    without drafts runs as before."""
    cdef int32_t k, g, draft_tokens = 0, page = cfg.kv_page_size
    cdef int32_t spare = (cfg.max_num_tokens if cfg.mode == MODE_MIXED else cfg.t_max) - num_decode
    cdef const ResidentC* r
    if num_prompts > 0:
        r = &residents[scratch.prompts[0]]
        spare -= min(r.prompt_length - r.committed, page - r.committed % page)
    for k in range(num_decode):
        g = min(drafts[scratch.decodes[k]], cfg.max_input_length - 1, spare)
        scratch.grants[k] = g
        spare -= g
        draft_tokens += g
    return draft_tokens


cdef void plan_step(const ConfigC* cfg, const ResidentC* residents, int32_t count,
                    ScratchC* scratch, PlanC* out, uint8_t* reasons,
                    const int32_t* drafts) noexcept nogil:
    cdef bint by_priority = cfg.scheduling_policy != POLICY_FCFS  # EDF, DEADLINE: SPEC §7
    cdef int32_t* order = scratch.order
    cdef uint8_t* paused = scratch.paused
    cdef int32_t* prompts = scratch.prompts
    cdef int32_t* decodes = scratch.decodes
    cdef const ResidentC* r
    cdef SequenceC* seq
    cdef int32_t i, k, num_prompts = 0, num_decode = 0, num_prefill = 0, prefill_tokens = 0
    cdef int32_t budget, cap, rem, n, best, kept, draft_tokens = 0
    cdef int32_t page = cfg.kv_page_size, s_in = cfg.max_input_length
    cdef bint active, decoding

    order_residents(cfg, residents, count, scratch)
    memset(paused, 0, <size_t>count)
    if reasons != NULL:
        memset(reasons, 0, <size_t>count)
    out.num_residents = count
    out.num_paused = 0
    if cfg.mode == MODE_MIXED and by_priority and cfg.preemption == PREEMPT_PAUSE:
        out.num_paused = pause_residents(cfg, residents, count, order, paused, out.paused,
                                         reasons)

    # Split the active residents, in order, into prompts and decodes (each list index <= k).
    for k in range(count):
        i = order[k]
        active = paused[i] ^ 1
        decoding = residents[i].context_committed != 0
        prompts[num_prompts] = i
        num_prompts += active & (decoding ^ 1)
        decodes[num_decode] = i
        num_decode += active & decoding

    # Budget and cap (SPEC §3 steps 3 and 4).
    if cfg.mode == MODE_MIXED and num_decode > 0:
        budget, cap = cfg.max_num_tokens - num_decode, cfg.max_chunk_tokens
    else:
        budget, cap = cfg.t_max, s_in
    if cfg.mode != MODE_MIXED and num_prompts > 0:
        # PREFILL_FIRST with a prompt pending: no decodes; under PRIORITY only the best class.
        num_decode = 0
        best = 0
        if by_priority:
            best = residents[prompts[0]].priority
            for k in range(1, num_prompts):
                best = min(best, residents[prompts[k]].priority)
            kept = 0
            for k in range(num_prompts):
                prompts[kept] = prompts[k]
                kept += residents[prompts[k]].priority == best
            num_prompts = kept
        if reasons != NULL:
            for i in range(count):
                r = &residents[i]
                if r.context_committed or (by_priority and r.priority != best):
                    reasons[i] = REASON_HELD_PREFILL_FIRST

    if drafts != NULL and num_decode > 0:
        draft_tokens = grant_drafts(cfg, residents, drafts, scratch, num_decode, num_prompts)
        budget -= draft_tokens

    # Prompt chunks, in order; a resident that gets nothing is skipped, later ones may still fit.
    for k in range(num_prompts):
        i = prompts[k]
        r = &residents[i]
        rem = r.prompt_length - r.committed
        n = min(rem, cap, s_in, budget)
        if n < rem:
            n = (r.committed + n) // page * page - r.committed
        if n <= 0:
            if reasons != NULL:
                reasons[i] |= REASON_SKIPPED_BUDGET if budget == 0 else REASON_SKIPPED_PAGE_TRIM
            continue
        seq = &out.sequences[num_prefill]
        seq.resident = i
        seq.work = WORK_CONTEXT
        seq.past_length = r.committed
        seq.query_length = n
        seq.select_last_token_logits = n == rem
        if reasons != NULL:
            reasons[i] |= REASON_CHUNK_FINAL if n == rem else REASON_CHUNK
        num_prefill += 1
        prefill_tokens += n
        budget -= n

    # Decode rows after all chunks, in order.
    seq = &out.sequences[num_prefill]
    for k in range(num_decode):
        i = decodes[k]
        seq[k].resident = i
        seq[k].work = WORK_DECODE
        seq[k].past_length = residents[i].committed
        seq[k].query_length = 1
        seq[k].select_last_token_logits = 1
        if reasons != NULL:
            reasons[i] |= REASON_DECODE
    if draft_tokens > 0:
        for k in range(num_decode):
            seq[k].query_length += scratch.grants[k]

    out.num_prefill = num_prefill
    out.num_decode = num_decode
    out.prefill_tokens = prefill_tokens
    out.total_tokens = prefill_tokens + num_decode + draft_tokens


# Listing stamps: a resident listed twice would get two plan rows and be advanced twice by
# apply_to (its checks pass per row, the sum overflows), so plan() and apply_to() refuse it. Each
# call takes a stamp no other call has had and marks every ResidentState it reads with it and the
# index it was read at; finding its own stamp already on an object is the second listing. That
# is O(n) with two stores into memory the call reads anyway, and no allocation.
#
# Taking a stamp is one atomic add on free-threaded builds (two planners may take stamps at
# once) and a plain increment under the GIL, which no Python code can interrupt. A lock here
# would cost every list plan() a lock/unlock (about 25 ns, a sixth of a B=8 plan, on CPython
# 3.11, where cython.pymutex is a PyThread lock).
cdef extern from *:
    """
    #ifdef Py_GIL_DISABLED
    #define __pyx_stepplanner_next_stamp(counter) (_Py_atomic_add_uint64((counter), 1) + 1)
    #else
    #define __pyx_stepplanner_next_stamp(counter) (++*(counter))
    #endif
    """
    uint64_t _next_stamp "__pyx_stepplanner_next_stamp"(uint64_t* counter) noexcept

cdef uint64_t _last_stamp = 0


cdef inline uint64_t _new_stamp() noexcept:
    return _next_stamp(&_last_stamp)


cdef inline int32_t _listed_before(ResidentState r, uint64_t stamp, int32_t index) noexcept:
    """The index this call first read ``r`` at, or -1 (and ``r`` marked as read at ``index``)."""
    if r.stamp == stamp:
        return r.stamp_index
    r.stamp = stamp
    r.stamp_index = index
    return -1


# ============================================================================================
# Layout check: the zero-copy paths read numpy rows as these structs.
# ============================================================================================

cdef ResidentC _r
cdef SequenceC _s

_layout = {
    "resident": (
        RESIDENT_DTYPE,
        sizeof(ResidentC),
        {
            "priority": <char*>&_r.priority - <char*>&_r,
            "arrival": <char*>&_r.arrival - <char*>&_r,
            "prompt_length": <char*>&_r.prompt_length - <char*>&_r,
            "committed": <char*>&_r.committed - <char*>&_r,
            "context_committed": <char*>&_r.context_committed - <char*>&_r,
            "consecutive_paused_steps": <char*>&_r.consecutive_paused_steps - <char*>&_r,
        },
    ),
    "sequence": (
        SEQUENCE_DTYPE,
        sizeof(SequenceC),
        {
            "resident": <char*>&_s.resident - <char*>&_s,
            "work": <char*>&_s.work - <char*>&_s,
            "past_length": <char*>&_s.past_length - <char*>&_s,
            "query_length": <char*>&_s.query_length - <char*>&_s,
            "select_last_token_logits": <char*>&_s.select_last_token_logits - <char*>&_s,
        },
    ),
}
for _name, (_dtype, _size, _offsets) in _layout.items():
    # The dtypes are the one definition of the fields (_types.ResidentRow): same names, same
    # order, same offsets as the structs, or no import.
    if (tuple(_offsets) != _dtype.names or _dtype.itemsize != _size
            or any(_dtype.fields[f][1] != o for f, o in _offsets.items())):
        raise ImportError(f"stepplanner._core: the C {_name} struct does not match its dtype "
                          f"({_size} bytes, offsets {_offsets}; dtype {_dtype})")
del _layout, _name, _dtype, _size, _offsets

cdef cnp.dtype _RESIDENT_DESCR = RESIDENT_DTYPE
cdef cnp.dtype _UINT8_DESCR = np.dtype(np.uint8)
cdef tuple _WORKS = (SequenceWork.CONTEXT, SequenceWork.DECODE)
cdef type _MaskedArray = np.ma.MaskedArray


# ============================================================================================
# 2. ResidentState
# ============================================================================================

cdef inline int32_t _int32(str field, object value) except? -1:
    cdef int overflow = 0
    cdef long long v
    if type(value) is not int:
        return as_int32(field, value)
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow or v < -2147483648 or v > 2147483647:
        raise _errors.out_of_int32(field, value)
    return <int32_t>v


cdef class ResidentState:
    """The ledger view of one resident that ``plan()`` reads: a C struct with attribute access.

    All fields default to 0/False and are writable; values outside the C types raise
    ``OverflowError`` and non-integers ``TypeError``, naming the field.
    """

    def __init__(self, priority=0, arrival=0, prompt_length=0, committed=0,
                 context_committed=False, consecutive_paused_steps=0):
        self.c.priority = _int32("priority", priority)
        self.c.arrival = as_uint64("arrival", arrival)
        self.c.prompt_length = _int32("prompt_length", prompt_length)
        self.c.committed = _int32("committed", committed)
        self.c.context_committed = as_bool("context_committed", context_committed)
        self.c.consecutive_paused_steps = _int32("consecutive_paused_steps",
                                                 consecutive_paused_steps)

    @property
    def priority(self):
        """Lower value = higher priority. Ignored under ``SchedulingPolicy.FCFS``."""
        return self.c.priority

    @priority.setter
    def priority(self, value):
        self.c.priority = _int32("priority", value)

    @property
    def arrival(self):
        """Monotonic admission-queue arrival stamp; unique per request (uint64)."""
        return self.c.arrival

    @arrival.setter
    def arrival(self, value):
        self.c.arrival = as_uint64("arrival", value)

    @property
    def prompt_length(self):
        return self.c.prompt_length

    @prompt_length.setter
    def prompt_length(self, value):
        self.c.prompt_length = _int32("prompt_length", value)

    @property
    def committed(self):
        """Tokens already in KV and recurrent state (the frontier)."""
        return self.c.committed

    @committed.setter
    def committed(self, value):
        self.c.committed = _int32("committed", value)

    @property
    def context_committed(self):
        """The final prompt chunk has committed: the resident decodes."""
        return <bint>self.c.context_committed

    @context_committed.setter
    def context_committed(self, value):
        self.c.context_committed = as_bool("context_committed", value)

    @property
    def consecutive_paused_steps(self):
        """Steps in a row that preemption=PAUSE withheld this resident, up to this plan."""
        return self.c.consecutive_paused_steps

    @consecutive_paused_steps.setter
    def consecutive_paused_steps(self, value):
        self.c.consecutive_paused_steps = _int32("consecutive_paused_steps", value)

    def _astuple(self):
        return (self.c.priority, self.c.arrival, self.c.prompt_length, self.c.committed,
                <bint>self.c.context_committed, self.c.consecutive_paused_steps)

    def __eq__(self, other):
        if not isinstance(other, AnyResidentState):
            return NotImplemented
        return self._astuple() == other._astuple()

    __hash__ = None  # mutable

    def __repr__(self):
        return ("ResidentState(priority={}, arrival={}, prompt_length={}, committed={}, "
                "context_committed={}, consecutive_paused_steps={})").format(*self._astuple())

    def __reduce__(self):
        return (ResidentState, self._astuple())


AnyResidentState.register(ResidentState)


# ============================================================================================
# 3. StepPlan
# ============================================================================================

cdef object _planned(const SequenceC* s, Py_ssize_t k):
    if s.work != WORK_CONTEXT and s.work != WORK_DECODE:  # _WORKS[s.work] would read anywhere
        raise _errors.plan_value(f"sequences[{k}].work", s.work, "0..1")
    return PlannedSequence(s.resident, _WORKS[s.work], s.past_length, s.query_length,
                           <bint>s.select_last_token_logits)


cdef Py_ssize_t _index(Py_ssize_t index, Py_ssize_t length) except -1:
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise IndexError("plan index out of range")
    return index


cdef class _PlanView:
    """A live, read-only sequence over one of a plan's buffers (overwritten by ``plan()``)."""

    def __cinit__(self, StepPlan plan not None):
        # Given its plan at birth: a view made any other way (``__new__`` from Python) is refused.
        self._plan = plan

    def __eq__(self, other):
        if isinstance(other, collections.abc.Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self):
        return repr(list(self))

    def index(self, value, start=0, stop=None):
        items = list(self)
        return items.index(value, start, len(items) if stop is None else stop)

    def count(self, value):
        return list(self).count(value)

    def __reduce__(self):
        # A live view has nothing to be live over once pickled or copied: it goes as its items.
        return (list, (list(self),))


cdef class _SequencesView(_PlanView):
    """``plan.sequences``: all prompt chunks in order, then all decode rows in order."""

    def __len__(self):
        return self._plan.c.num_prefill + self._plan.c.num_decode

    def __getitem__(self, index):
        cdef Py_ssize_t n = len(self)
        if isinstance(index, slice):
            return [_planned(&self._plan.c.sequences[i], i) for i in range(*index.indices(n))]
        cdef Py_ssize_t i = _index(index, n)
        return _planned(&self._plan.c.sequences[i], i)


cdef class _PausedView(_PlanView):
    """``plan.paused``: the paused residents' indices, ascending."""

    def __len__(self):
        return self._plan.c.num_paused

    def __getitem__(self, index):
        cdef Py_ssize_t n = len(self)
        if isinstance(index, slice):
            return [self._plan.c.paused[i] for i in range(*index.indices(n))]
        return self._plan.c.paused[_index(index, n)]


collections.abc.Sequence.register(_SequencesView)
collections.abc.Sequence.register(_PausedView)


cdef class _CoreMemory:
    """Memory the core writes and Python can only read.

    Its buffer is exported read-only, so the numpy arrays over it cannot be made writable:
    numpy asks the final base before it sets ``WRITEABLE``. A writable view of a plan's buffers
    would let Python code put residents and work codes there that the core indexes by.
    """

    def __cinit__(self, Py_ssize_t size):
        if size < 0:  # reachable from Python as type(plan.as_array().base)(size)
            raise _errors.out_of_range("size", size, ">= 0")
        self.data = PyMem_Calloc(<size_t>max(size, 1), 1)
        if self.data == NULL:
            raise _errors.buffer_memory(size)
        self.size = size

    def __dealloc__(self):
        PyMem_Free(self.data)

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.size, 1, flags)  # 1: read-only

    def __releasebuffer__(self, Py_buffer* view):
        pass


cdef class StepPlan:
    """A planned step: ``num_prefill`` chunks, then ``num_decode`` decode rows (SPEC §3).

    The plan a ``StepPlanner`` returns is its one plan, **overwritten by the next call**: the
    ``sequences``/``paused`` views and the arrays from ``as_array()``/``paused_array()`` all show
    the buffers as they are now. Use ``copy()`` or ``to_dict()`` for a plan you keep;
    ``copy.copy``, ``copy.deepcopy`` and ``pickle`` make the same independent snapshot.
    """

    def __cinit__(self):
        # Every plan is whole from birth, however it was made (StepPlan(), __new__, unpickling):
        # an empty one views the shared empty buffers, which nothing writes (the kernel and
        # _copy_from write only plans that _allocate gave buffers of their own).
        self._seq_buf = _EMPTY_SEQ_BUF
        self._paused_buf = _EMPTY_PAUSED_BUF
        self._apply_buf = _EMPTY_APPLY_BUF
        self.c.sequences = <SequenceC*>cnp.PyArray_DATA(_EMPTY_SEQ_BUF)
        self.c.paused = <int32_t*>cnp.PyArray_DATA(_EMPTY_PAUSED_BUF)
        self.capacity = 0
        self.version = 0

    cdef _allocate(self, int32_t capacity):
        """Buffers of ``capacity`` rows, once, before anyone else holds the plan."""
        if self._seq_buf is not _EMPTY_SEQ_BUF:
            raise RuntimeError("stepplanner internal error: a plan's buffers are allocated once")
        # Sizes in Py_ssize_t: 2 * capacity does not fit int32 for every int32 capacity.
        cdef Py_ssize_t rows = max(<Py_ssize_t>capacity, 1)
        cdef _CoreMemory sequences = _CoreMemory(rows * <Py_ssize_t>sizeof(SequenceC))
        cdef _CoreMemory paused = _CoreMemory(rows * <Py_ssize_t>sizeof(int32_t))
        cdef _CoreMemory apply = _CoreMemory(2 * rows * <Py_ssize_t>sizeof(int32_t))
        # numpy arrays over the memory, so that as_array() hands out views that keep it alive.
        self._seq_buf = np.frombuffer(sequences, dtype=SEQUENCE_DTYPE)
        self._paused_buf = np.frombuffer(paused, dtype=np.int32)
        self._apply_buf = apply
        self.c.sequences = <SequenceC*>sequences.data
        self.c.paused = <int32_t*>paused.data
        self.capacity = capacity

    def __init__(self):
        """An empty plan. Called again, it empties the plan; its buffers stay as they are."""
        with cython.critical_section(self):
            self.version += 1
            self.c.num_paused = 0
            self.c.num_residents = 0
            self.c.num_prefill = 0
            self.c.num_decode = 0
            self.c.prefill_tokens = 0
            self.c.total_tokens = 0

    # The views are made per access, not kept: a plan holding views that hold the plan would be
    # a reference cycle, and every copy() would wait for the garbage collector.
    @property
    def sequences(self):
        """All prompt chunks in order, then all decode rows in order (``PlannedSequence``)."""
        return _SequencesView.__new__(_SequencesView, self)

    @property
    def paused(self):
        """Residents withheld by preemption=PAUSE, ascending index."""
        return _PausedView.__new__(_PausedView, self)

    @property
    def num_prefill(self):
        return self.c.num_prefill

    @property
    def num_decode(self):
        return self.c.num_decode

    @property
    def prefill_tokens(self):
        """Sum of the chunk lengths."""
        return self.c.prefill_tokens

    @property
    def total_tokens(self):
        """``prefill_tokens + num_decode + draft_tokens``: every row's query length."""
        return self.c.total_tokens

    @property
    def draft_tokens(self):
        """The draft tokens the decode rows verify (SPEC §8): their query lengths less one each."""
        return self.c.total_tokens - self.c.prefill_tokens - self.c.num_decode

    @property
    def num_residents(self):
        """How many resident rows this plan was made over (``count``)."""
        return self.c.num_residents

    @property
    def _version(self):
        """Changes whenever the plan does (``plan()``, ``__init__``): a ledger's ``step`` keeps
        the version of the plan it returned, and refuses to apply it once it has changed."""
        return self.version

    def as_array(self):
        """The sequences as a read-only ``SEQUENCE_DTYPE`` array viewing the plan's buffer."""
        return self._seq_buf[:self.c.num_prefill + self.c.num_decode]

    def paused_array(self):
        """The paused indices as a read-only int32 array viewing the plan's buffer."""
        return self._paused_buf[:self.c.num_paused]

    def copy(self):
        """A plan of its own, not tied to the planner (``plan()`` will not overwrite it)."""
        # Allocate first, then copy in pure C: no Python code (and so no other thread's plan())
        # can run between reading the first and the last byte. The capacity is the source's:
        # reading its row counts before the copy could race a plan() that changes them.
        cdef StepPlan other = StepPlan.__new__(StepPlan)
        other._allocate(self.capacity)
        with cython.critical_section(self):
            other._copy_from(self)
        return other

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()  # rows are plain ints: nothing deeper to copy

    def __reduce__(self):
        snapshot = self.copy()
        return (_restore_plan, (snapshot.as_array().tolist(), snapshot.paused_array().tolist(),
                                snapshot.num_residents))

    cdef _copy_from(self, StepPlan src):
        cdef SequenceC* seqs = self.c.sequences
        cdef int32_t* paused = self.c.paused
        self.c = src.c
        self.c.sequences = seqs
        self.c.paused = paused
        memcpy(seqs, src.c.sequences,
               <size_t>(src.c.num_prefill + src.c.num_decode) * sizeof(SequenceC))
        memcpy(paused, src.c.paused, <size_t>src.c.num_paused * sizeof(int32_t))

    def to_dict(self):
        """Plain data (JSON-ready): sequences as dicts, paused, and the four totals."""
        return _plan_to_dict(self.copy())  # building dicts runs Python code: read a snapshot

    def apply_to(self, residents):
        """Advance the ledger rows this plan was made over, as SPEC §6 says a runtime does.

        Each planned row's ``committed += query_length``; a chunk completing the prompt sets
        ``context_committed``; paused residents count ``consecutive_paused_steps`` up and every
        other row resets it to 0. ``residents`` is the same list of ``ResidentState`` or
        writable ``RESIDENT_DTYPE`` array the plan was made from. Everything is checked before
        anything is written: the plan's rows (each names one of its residents), then each row's
        ``committed`` and ``consecutive_paused_steps`` (``ValueError`` when negative, as
        ``plan()`` says; ``OverflowError`` when the result would not fit int32). A resident
        listed twice (the same object, or array rows that overlap) is a ``ValueError``; a
        ``plan()`` on the owning planner while the residents are read is a ``RuntimeError``.
        """
        cdef bint is_array = cnp.PyArray_Check(residents)
        cdef uint64_t version = self.version
        if not is_array:
            if not isinstance(residents, (list, tuple)):
                raise _errors.residents_type(residents)
            # One read of each element, before the lock (reading a list subclass runs its
            # code): the checks and the writes must see the same objects.
            residents = tuple(residents)
        with cython.critical_section(self):
            if self.version != version:
                # That code called plan() on the planner that owns this plan: the plan is not
                # the one the caller asked to apply.
                raise _errors.apply_reentered()
            # Rows in range only: no resident is searched for twice. Every compiled plan holds
            # each resident once: plan_step builds them distinct, copy() copies one, and
            # _restore_plan refuses an unpickled plan that repeats one.
            error = _rows_error(&self.c)
            if error is not None:
                raise error
            if is_array:
                self._apply_array(residents)
            else:
                self._apply_objects(residents)

    cdef _apply_array(self, object residents):
        cdef cnp.ndarray arr = <cnp.ndarray>residents
        cdef int32_t n = self.c.num_residents
        _check_resident_array(arr)
        if not cnp.PyArray_ISWRITEABLE(arr):
            raise _errors.apply_readonly()
        if arr.shape[0] < n:
            raise _errors.apply_length(arr.shape[0], n)
        cdef char* data = <char*>cnp.PyArray_DATA(arr)
        cdef Py_ssize_t stride = arr.strides[0]
        if n > 1 and abs(stride) < <Py_ssize_t>sizeof(ResidentC):
            raise _errors.rows_overlap(stride, sizeof(ResidentC))
        cdef ResidentC row
        cdef int32_t i, status
        cdef int32_t* add = self._apply_amounts()
        for i in range(n):
            memcpy(&row, data + i * stride, sizeof(ResidentC))
            status = _apply_status(&row, add[i], add[n + i])
            if status:
                raise _row_error(status, i, &row, 0, add[i])
        for i in range(n):
            memcpy(&row, data + i * stride, sizeof(ResidentC))
            _apply_row(&row, add[i], add[n + i])
            memcpy(data + i * stride, &row, sizeof(ResidentC))

    cdef _apply_objects(self, tuple residents):
        cdef int32_t n = self.c.num_residents
        cdef int32_t i, status
        if len(residents) < n:
            raise _errors.apply_length(len(residents), n)
        cdef uint64_t stamp = _new_stamp()
        cdef int32_t j
        for i in range(n):
            if type(residents[i]) is not ResidentState:
                raise _errors.element_type(i, residents[i])
            j = _listed_before(<ResidentState>residents[i], stamp, i)
            if j >= 0:
                raise _errors.duplicate_resident(j, i)
        cdef int32_t* add = self._apply_amounts()
        for i in range(n):
            status = _apply_status(&(<ResidentState>residents[i]).c, add[i], add[n + i])
            if status:
                raise _row_error(status, i, &(<ResidentState>residents[i]).c, 0, add[i])
        for i in range(n):
            _apply_row(&(<ResidentState>residents[i]).c, add[i], add[n + i])

    cdef int32_t* _apply_amounts(self):
        """Per resident: tokens to commit in [0, n), flags in [n, 2n) (1 final chunk, 2 paused).
        The rows were checked by _plan_error: every index is in [0, n)."""
        cdef int32_t n = self.c.num_residents
        cdef int32_t* add = <int32_t*>(<_CoreMemory>self._apply_buf).data
        cdef int32_t k
        cdef const SequenceC* s
        memset(add, 0, 2 * <size_t>n * sizeof(int32_t))
        for k in range(self.c.num_prefill + self.c.num_decode):
            s = &self.c.sequences[k]
            add[s.resident] = s.query_length
            if s.work == WORK_CONTEXT and s.select_last_token_logits:
                add[n + s.resident] |= 1
        for k in range(self.c.num_paused):
            add[n + self.c.paused[k]] |= 2
        return add

    def __eq__(self, other):
        if not isinstance(other, AnyStepPlan):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self):
        return _plan_repr(self.copy())


AnyStepPlan.register(StepPlan)

# The buffers every plan views until _allocate gives it its own (see StepPlan.__cinit__).
cdef cnp.ndarray _EMPTY_SEQ_BUF = np.frombuffer(_CoreMemory(sizeof(SequenceC)),
                                                dtype=SEQUENCE_DTYPE)
cdef cnp.ndarray _EMPTY_PAUSED_BUF = np.frombuffer(_CoreMemory(sizeof(int32_t)), dtype=np.int32)
cdef object _EMPTY_APPLY_BUF = _CoreMemory(2 * sizeof(int32_t))


cdef object _plan_error(const PlanC* p, uint8_t* mark):
    """None when every row of the plan names one of its residents and a known work, and no
    resident is named twice (in two rows, or a row and a pause), else the ValueError: what an
    unpickled plan must pass (a resident named twice would be advanced twice by a ledger).
    ``mark``: scratch of ``num_residents`` bytes."""
    error = _rows_error(p)
    if error is not None:
        return error
    memset(mark, 0, <size_t>p.num_residents)
    if first_repeated(p, mark) >= 0:
        return repeated_resident_error(p)
    return None


cdef object _rows_error(const PlanC* p):
    """None when every row names one of the plan's residents, a known work and a query length
    >= 0, and every pause one of its residents, else the ValueError: apply_to indexes its
    scratch by these, so it checks them first (O(rows))."""
    cdef int32_t n = p.num_residents, k
    cdef const SequenceC* s
    for k in range(p.num_prefill + p.num_decode):
        s = &p.sequences[k]
        if s.resident < 0 or s.resident >= n:
            return _errors.plan_value(f"sequences[{k}].resident", s.resident, f"0..{n - 1}")
        if s.work != WORK_CONTEXT and s.work != WORK_DECODE:
            return _errors.plan_value(f"sequences[{k}].work", s.work, "0..1")
        if s.query_length < 0:
            return _errors.plan_value(f"sequences[{k}].query_length", s.query_length,
                                      f"0..{INT32_MAX}")
    for k in range(p.num_paused):
        if p.paused[k] < 0 or p.paused[k] >= n:
            return _errors.plan_value(f"paused[{k}]", p.paused[k], f"0..{n - 1}")
    return None


cdef int32_t first_repeated(const PlanC* p, uint8_t* mark) noexcept nogil:
    """The first name (plan row ``k``, or pause ``k - rows`` after the ``rows`` plan rows) of a
    resident an earlier name names, or -1. Every name is a valid resident whose ``mark`` is 0;
    they are 0 again on return (the ledger keeps its ``mark`` zero between calls)."""
    cdef int32_t k, r, rows = p.num_prefill + p.num_decode, names = rows + p.num_paused
    cdef int32_t found = -1
    for k in range(names):
        r = p.sequences[k].resident if k < rows else p.paused[k - rows]
        if mark[r]:
            found = k
            names = k
            break
        mark[r] = 1
    for k in range(names):
        mark[p.sequences[k].resident if k < rows else p.paused[k - rows]] = 0
    return found


cdef object repeated_resident_error(const PlanC* p):
    """The shared search names the repeat and its first name in both twins' words."""
    cdef int32_t k, rows = p.num_prefill + p.num_decode
    return _errors.plan_resident_repeated(*first_repeat(
        [p.sequences[k].resident for k in range(rows)], [p.paused[k] for k in range(p.num_paused)]))


def _restore_plan(sequences, paused, num_residents):
    """The plan ``StepPlan.__reduce__`` pickled: plain rows back into buffers of their own, each
    value checked for its C type, then the rows checked as ``apply_to`` checks them."""
    cdef int32_t n = _int32("num_residents", num_residents)
    cdef Py_ssize_t rows = len(sequences), n_paused = len(paused), k
    if n < 0:
        raise _errors.plan_value("num_residents", n, f"0..{INT32_MAX}")
    if max(rows, n_paused) > n:
        raise _errors.plan_value("num_residents", n, f">= {max(rows, n_paused)} (its rows)")
    cdef StepPlan plan = StepPlan.__new__(StepPlan)
    plan._allocate(n)
    cdef SequenceC* s
    cdef int64_t prefill_tokens = 0, total_tokens = 0
    cdef int32_t num_prefill = 0
    for k in range(rows):
        resident, work, past_length, query_length, select_last = sequences[k]
        s = &plan.c.sequences[k]
        s.resident = _int32(f"sequences[{k}].resident", resident)
        s.work = _int32(f"sequences[{k}].work", work)
        s.past_length = _int32(f"sequences[{k}].past_length", past_length)
        s.query_length = _int32(f"sequences[{k}].query_length", query_length)
        s.select_last_token_logits = as_bool(f"sequences[{k}].select_last_token_logits",
                                             select_last)
        if s.work == WORK_CONTEXT:
            if num_prefill != k:
                raise _errors.plan_value(f"sequences[{k}].work", s.work,
                                         "1 (every chunk comes before every decode row)")
            num_prefill += 1
            prefill_tokens += s.query_length
        total_tokens += s.query_length
    for k in range(n_paused):
        plan.c.paused[k] = _int32(f"paused[{k}]", paused[k])
    if total_tokens > INT32_MAX:
        raise _errors.out_of_int32("total_tokens", total_tokens)
    plan.c.num_residents = n
    plan.c.num_prefill = num_prefill
    plan.c.num_decode = <int32_t>(rows - num_prefill)
    plan.c.num_paused = <int32_t>n_paused
    plan.c.prefill_tokens = <int32_t>prefill_tokens
    plan.c.total_tokens = <int32_t>total_tokens
    error = _plan_error(&plan.c, <uint8_t*>(<_CoreMemory>plan._apply_buf).data)
    if error is not None:
        raise error
    return plan


cdef inline int _apply_status(const ResidentC* row, int32_t add, int32_t flags) noexcept nogil:
    # In int64: INT32_MAX - committed overflows int32 once committed is negative.
    if row.committed < 0:
        return STATUS_COMMITTED_NEGATIVE
    if row.consecutive_paused_steps < 0:
        return STATUS_PAUSED_STEPS_NEGATIVE
    if <int64_t>row.committed + add > INT32_MAX:
        return STATUS_COMMITTED_OVERFLOW
    if (flags & 2) and <int64_t>row.consecutive_paused_steps + 1 > INT32_MAX:
        return STATUS_PAUSED_STEPS_OVERFLOW
    return STATUS_OK


cdef object _row_error(int status, Py_ssize_t index, const ResidentC* row, int32_t s_in,
                       int32_t add):
    """The one place a row's status (plan()'s validation, apply_to's) becomes an exception;
    ``s_in`` is read for STATUS_PROMPT_TOO_LONG, ``add`` for STATUS_COMMITTED_OVERFLOW."""
    if status == STATUS_COMMITTED_NEGATIVE:
        return _errors.resident_negative(index, "committed", row.committed)
    if status == STATUS_PROMPT_LENGTH_NEGATIVE:
        return _errors.resident_negative(index, "prompt_length", row.prompt_length)
    if status == STATUS_PAUSED_STEPS_NEGATIVE:
        return _errors.resident_negative(index, "consecutive_paused_steps",
                                         row.consecutive_paused_steps)
    if status == STATUS_PROMPT_EXHAUSTED:
        return _errors.prompt_exhausted(index, row.prompt_length, row.committed)
    if status == STATUS_PROMPT_TOO_LONG:
        return _errors.prompt_too_long(index, row.prompt_length, s_in)
    if status == STATUS_COMMITTED_OVERFLOW:
        return _errors.apply_overflow(index, "committed", row.committed, add)
    return _errors.apply_overflow(index, "consecutive_paused_steps",
                                  row.consecutive_paused_steps, 1)


cdef inline void _apply_row(ResidentC* row, int32_t add, int32_t flags) noexcept nogil:
    row.committed += add
    if flags & 1:
        row.context_committed = 1
    row.consecutive_paused_steps = row.consecutive_paused_steps + 1 if flags & 2 else 0


cdef StepPlan _new_plan(int32_t capacity):
    cdef StepPlan plan = StepPlan.__new__(StepPlan)
    plan._allocate(capacity)
    return plan


# ============================================================================================
# 4. StepPlanner
# ============================================================================================

# What one resident slot costs: the kernel's scratch, the row copy and the plan's buffers.
cdef size_t _BYTES_PER_SLOT = (2 * sizeof(SortKeyC) + 5 * sizeof(int32_t) + sizeof(uint8_t)
                               + sizeof(ResidentC) + sizeof(SequenceC) + 3 * sizeof(int32_t))


cdef class StepPlanner:
    """Plans one in-flight-batching step per call (SPEC §3).

    ``policy`` comes from ``resolve_scheduling_policy(options, limits)``; a hand-built one is
    checked here (``RuntimeError`` for an unresolved mode, ``ValueError`` for broken budgets).
    All buffers are sized for ``limits.max_batch_size`` now (about 110 bytes per slot; a
    ``MemoryError`` naming B when that cannot be had); ``plan()`` allocates nothing.

    Threads: ``plan()`` holds a per-plan lock (a critical section on free-threaded CPython; the
    GIL elsewhere), so concurrent calls never corrupt memory, but they share the one returned
    plan. Use one planner per thread. ``plan()`` is not re-entrant: a call made while another
    is reading its residents (from a list subclass's ``__getitem__``) raises ``RuntimeError``.
    """

    def __cinit__(self):
        self.scratch.keys = NULL
        self.scratch.merge_tmp = NULL
        self.scratch.order = NULL
        self.scratch.paused = NULL
        self.scratch.prompts = NULL
        self.scratch.decodes = NULL
        self.rows = NULL
        self._planning = False

    def __init__(self, policy, limits):
        check_policy(policy, limits)
        if self.rows != NULL:
            raise _errors.already_initialised("StepPlanner")
        cdef int32_t b = limits.max_batch_size
        self.cfg.mode = policy.mode
        self.cfg.scheduling_policy = policy.scheduling_policy
        self.cfg.preemption = policy.preemption
        self.cfg.max_pause_steps = policy.max_pause_steps
        self.cfg.max_num_tokens = policy.max_num_tokens
        self.cfg.max_chunk_tokens = policy.max_chunk_tokens
        self.cfg.max_batch_size = b
        self.cfg.max_input_length = limits.max_input_length
        self.cfg.kv_page_size = limits.kv_page_size
        self.cfg.t_max = limits.t_max
        self.scratch.keys = <SortKeyC*>PyMem_Calloc(b, sizeof(SortKeyC))
        self.scratch.merge_tmp = <SortKeyC*>PyMem_Calloc(b, sizeof(SortKeyC))
        self.scratch.order = <int32_t*>PyMem_Calloc(b, sizeof(int32_t))
        self.scratch.paused = <uint8_t*>PyMem_Calloc(b, sizeof(uint8_t))
        self.scratch.order_count = 0
        self.scratch.prompts = <int32_t*>PyMem_Calloc(b, sizeof(int32_t))
        self.scratch.decodes = <int32_t*>PyMem_Calloc(b, sizeof(int32_t))
        self.scratch.grants = <int32_t*>PyMem_Calloc(b, sizeof(int32_t))
        self.scratch.drafts = <int32_t*>PyMem_Calloc(b, sizeof(int32_t))
        self.rows = <ResidentC*>PyMem_Calloc(b, sizeof(ResidentC))
        if (self.scratch.keys == NULL or self.scratch.merge_tmp == NULL
                or self.scratch.order == NULL or self.scratch.paused == NULL
                or self.scratch.prompts == NULL or self.scratch.decodes == NULL
                or self.scratch.grants == NULL or self.scratch.drafts == NULL
                or self.rows == NULL):
            self._free_buffers()  # so that nothing is half-made if __init__ is called again
            raise _errors.planner_memory(b, b * _BYTES_PER_SLOT)
        try:
            self._plan = _new_plan(b)
        except MemoryError:
            self._free_buffers()
            raise _errors.planner_memory(b, b * _BYTES_PER_SLOT) from None
        self.policy = policy
        self.limits = limits

    def __dealloc__(self):
        self._free_buffers()

    cdef void _free_buffers(self) noexcept:
        PyMem_Free(self.scratch.keys)
        PyMem_Free(self.scratch.merge_tmp)
        PyMem_Free(self.scratch.order)
        PyMem_Free(self.scratch.paused)
        PyMem_Free(self.scratch.prompts)
        PyMem_Free(self.scratch.decodes)
        PyMem_Free(self.scratch.grants)
        PyMem_Free(self.scratch.drafts)
        PyMem_Free(self.rows)
        self.scratch.keys = self.scratch.merge_tmp = NULL
        self.scratch.order = self.scratch.prompts = self.scratch.decodes = NULL
        self.scratch.grants = self.scratch.drafts = NULL
        self.scratch.paused = NULL
        self.rows = NULL

    def __repr__(self):
        return f"StepPlanner(policy={self.policy!r}, limits={self.limits!r})"

    def plan(self, residents, count=None, reasons=None, drafts=None, max_num_tokens=None):
        """Plan one step over ``residents`` and return the planner's one ``StepPlan``.

        ``residents``: a list or tuple of ``ResidentState``, or a 1-D ``RESIDENT_DTYPE`` array
        (read in place: the fast path). ``count`` (default: all) takes the first ``count`` rows.
        ``reasons``: optionally, a writable uint8 array of len >= count that receives each
        resident's ``Reason`` code (see ``split_reason``).
        ``drafts``: optionally, the draft tokens proposed for each resident this step (a list or
        tuple of ints or a 1-D int32 array, len >= count); decode rows verify what the budget
        grants of them (SPEC §8).
        ``max_num_tokens``: optionally, this step's token budget, in ``[B + P,
        policy.max_num_tokens]`` under MIXED (SPEC §9): it replaces the policy's for this plan.

        Inputs whose reading runs Python code (a list's ``__getitem__``, an int's ``__index__``)
        are copied into the planner's buffers first; then the arrays are checked and planned
        with no Python code in between, so nothing the caller's code does during the call
        reaches the kernel unchecked. A call that raises leaves the previous plan.
        """
        if self.rows == NULL:
            raise _errors.not_initialised("StepPlanner")
        cdef bint is_array = cnp.PyArray_Check(residents)
        if is_array:
            _check_resident_array(residents)
        elif not isinstance(residents, (list, tuple)):
            raise _errors.residents_type(residents)
        if count is not None and type(count) is not int:
            # Before len(): count.__index__ is user code and may change the list.
            try:
                count = operator.index(count)
            except TypeError:
                raise _errors.not_integer("count", count) from None
        # An array's length is its shape: an ndarray subclass's __len__ is not asked.
        cdef Py_ssize_t length = ((<cnp.ndarray>residents).shape[0] if is_array
                                  else len(residents))
        cdef Py_ssize_t n = self._count(count, length)
        cdef uint8_t* reasons_ptr = NULL
        if reasons is not None:
            reasons_ptr = _reasons_pointer(reasons, n)
        if drafts is not None:
            _check_drafts(drafts, n)
        # SPEC §9: the kernel reads this step's budget from a copy of the config (the policy's
        # stays as it was); checked here, before anything is written.
        cdef ConfigC step_cfg
        cdef const ConfigC* cfg = &self.cfg
        if max_num_tokens is not None:
            step_cfg = self.cfg
            if (type(max_num_tokens) is int and self.cfg.mode == MODE_MIXED
                    and self.cfg.max_batch_size + self.cfg.kv_page_size <= max_num_tokens
                    <= self.cfg.max_num_tokens):
                step_cfg.max_num_tokens = <int32_t>max_num_tokens  # in range: step_budget's
            else:  # the check and its messages, shared with the twin
                step_cfg.max_num_tokens = <int32_t>step_budget(max_num_tokens, self.policy,
                                                               self.limits)
            cfg = &step_cfg
        # Reading a list (its __getitem__) or an int (its __index__) runs Python code, which may
        # change any input: the arrays are read, and reasons' pointer taken, after it has run.
        cdef bint ran_code = not is_array or (drafts is not None
                                              and not cnp.PyArray_Check(drafts))
        cdef const ResidentC* rows = NULL
        with cython.critical_section(self._plan):
            # That code may call plan() on this planner, which would overwrite the rows this
            # call has copied in so far: it is refused instead (no Python code runs here
            # otherwise, so on GIL builds no other thread gets in).
            if self._planning:
                raise _errors.plan_reentered()
            self._planning = True
            try:
                if drafts is not None:
                    self._copy_drafts(drafts, <int32_t>n)
                if not is_array:
                    self._copy_objects(residents, <int32_t>n)
                    rows = self.rows
                if reasons is not None and ran_code:
                    reasons_ptr = _reasons_pointer(reasons, n)
                # No Python code runs from here to the kernel: the rows checked are the rows
                # planned, whether read in place or copied.
                if is_array:
                    rows = self._read_array(residents, <int32_t>n, reasons_ptr, ran_code)
                if drafts is not None:
                    self._check_draft_values(rows, <int32_t>n)
                plan_step(cfg, rows, <int32_t>n, &self.scratch, &self._plan.c,
                          reasons_ptr, self.scratch.drafts if drafts is not None else NULL)
                self._plan.version += 1
            finally:
                self._planning = False
        return self._plan

    cdef Py_ssize_t _count(self, object count, Py_ssize_t length) except -1:
        if count is None:
            # No Python int is made on this path: plan() allocates nothing.
            if length > self.cfg.max_batch_size:
                raise _errors.count_over_batch(length, self.cfg.max_batch_size)
            return length
        if count < 0:
            raise _errors.count_negative(count)
        if count > self.cfg.max_batch_size:
            raise _errors.count_over_batch(count, self.cfg.max_batch_size)
        if count > length:
            raise _errors.count_over_length(count, length)
        return count

    cdef const ResidentC* _read_array(self, object residents, int32_t n,
                                      const uint8_t* reasons, bint ran_code) except NULL:
        """The array's first n rows, checked: its own memory when the kernel can read it in
        place (see ``_in_place``), else a copy in ``self.rows``. After ``ran_code`` (a drafts
        list's) its dtype and length are checked again: that code may have changed them."""
        cdef cnp.ndarray arr = <cnp.ndarray>residents
        if ran_code:
            _check_resident_array(arr)
            if arr.shape[0] < n:
                self._planning = False  # building the error runs Python code: not in plan()
                raise _errors.count_over_length(n, arr.shape[0])
        cdef const char* data = <const char*>cnp.PyArray_DATA(arr)
        cdef Py_ssize_t stride = arr.strides[0]
        cdef int32_t i, bad, s_in = self.cfg.max_input_length
        if n > 1 and abs(stride) < <Py_ssize_t>sizeof(ResidentC):
            self._planning = False
            raise _errors.rows_overlap(stride, sizeof(ResidentC))
        cdef const ResidentC* rows = self._in_place(arr, n, reasons)
        if rows == NULL:
            for i in range(n):
                memcpy(&self.rows[i], data + i * stride, sizeof(ResidentC))
            rows = self.rows
        bad = first_bad_row(rows, n, s_in)
        if bad >= 0:
            self._planning = False
            raise _row_error(check_row(&rows[bad], s_in), bad, &rows[bad], s_in, 0)
        # An empty array's data pointer may be NULL, which is this method's error value.
        return rows if n > 0 else self.rows

    @cython.boundscheck(True)  # a list subclass's __getitem__ may have shrunk it
    cdef int _copy_drafts(self, object drafts, int32_t n) except -1:
        """The drafts (checked by ``_check_drafts``) copied into scratch as int32; their values
        are checked against the rows by ``_check_draft_values``, once the rows are in."""
        cdef int32_t i
        cdef int overflow = 0
        cdef long long big
        cdef object item
        cdef int32_t* out = self.scratch.drafts
        cdef cnp.ndarray arr
        cdef const char* data
        cdef Py_ssize_t stride
        if cnp.PyArray_Check(drafts):
            arr = <cnp.ndarray>drafts
            data = <const char*>cnp.PyArray_DATA(arr)
            stride = arr.strides[0]
            for i in range(n):
                memcpy(&out[i], data + i * stride, sizeof(int32_t))
            return 0
        if len(drafts) < n:  # a list subclass's code may have shrunk it since _check_drafts
            self._planning = False
            raise _errors.drafts_length(len(drafts), n)
        for i in range(n):
            item = drafts[i]
            if type(item) is int:  # no field name is made unless it is needed
                big = PyLong_AsLongLongAndOverflow(item, &overflow)
                if not overflow and INT32_MIN <= big <= INT32_MAX:
                    out[i] = <int32_t>big
                    continue
            try:
                out[i] = as_int32(f"drafts[{i}]", item)
            except Exception:
                self._planning = False
                raise
        return 0

    cdef int _check_draft_values(self, const ResidentC* rows, int32_t n) except -1:
        """SPEC §8's checks of the copied drafts against the checked rows, in index order."""
        cdef int32_t i, v
        cdef const int32_t* drafts = self.scratch.drafts
        for i in range(n):
            v = drafts[i]
            if v < 0:
                self._planning = False  # building the error runs Python code: not in plan()
                raise _errors.drafts_negative(i, v)
            if v > 0 and not rows[i].context_committed:
                self._planning = False
                raise _errors.drafts_for_prompt(i, v)
        return 0

    @cython.boundscheck(True)  # a list subclass's __getitem__ may have shrunk it
    cdef int _copy_objects(self, object residents, int32_t n) except -1:
        """Each element's row copied into ``self.rows`` and checked there, in index order (a
        later element's code cannot reach a row already copied)."""
        cdef int32_t i, j, s_in = self.cfg.max_input_length
        cdef int status
        cdef object item
        cdef ResidentC* rows = self.rows
        cdef uint64_t stamp = _new_stamp()
        for i in range(n):
            item = residents[i]
            if type(item) is not ResidentState:
                self._planning = False  # building the error runs Python code: not in plan()
                raise _errors.element_type(i, item)
            j = _listed_before(<ResidentState>item, stamp, i)
            if j >= 0:
                self._planning = False
                raise _errors.duplicate_resident(j, i)
            rows[i] = (<ResidentState>item).c
            status = check_row(&rows[i], s_in)
            if status != STATUS_OK:
                self._planning = False
                raise _row_error(status, i, &rows[i], s_in, 0)
        return 0

    cdef object _kernel_loop(self, object residents, Py_ssize_t iterations):
        """Rerun the kernel over the rows of the last successful ``plan(residents)``; ns taken.

        The rows are checked again, not trusted: an array shorter than that plan's count (or of
        another dtype) is refused rather than read past its end.
        """
        cdef Py_ssize_t k
        cdef int32_t n = self._plan.c.num_residents
        cdef const ResidentC* rows = NULL
        cdef cnp.ndarray arr
        if cnp.PyArray_Check(residents):
            _check_resident_array(residents)
            arr = <cnp.ndarray>residents
            if arr.shape[0] < n:
                raise _errors.count_over_length(n, arr.shape[0])
            rows = self._in_place(arr, n, NULL)
        if rows == NULL:
            rows = self.rows  # the copy plan() made: n <= B rows, all within the buffer
        with cython.critical_section(self._plan):
            if self._planning:
                raise _errors.plan_reentered()
            t0 = time.perf_counter_ns()
            for k in range(iterations):
                plan_step(&self.cfg, rows, n, &self.scratch, &self._plan.c, NULL, NULL)
            return time.perf_counter_ns() - t0

    cdef const ResidentC* _in_place(self, object residents, int32_t n, const uint8_t* reasons):
        """The array's first n rows for the kernel to read where they are, or NULL when they
        must be copied: strided or unaligned rows, or rows sharing memory with a buffer the
        kernel writes (``reasons``, or the plan's own arrays reached through ``.base``)."""
        cdef cnp.ndarray arr = <cnp.ndarray>residents
        cdef const void* data = cnp.PyArray_DATA(arr)
        cdef size_t size = <size_t>n * sizeof(ResidentC)
        cdef size_t capacity = <size_t>self._plan.capacity
        if arr.strides[0] != sizeof(ResidentC) or not cnp.PyArray_ISALIGNED(arr):
            return NULL
        if (_overlaps(data, size, reasons, <size_t>n)
                or _overlaps(data, size, self._plan.c.sequences, capacity * sizeof(SequenceC))
                or _overlaps(data, size, self._plan.c.paused, capacity * sizeof(int32_t))):
            return NULL
        return <const ResidentC*>data


cdef int _check_resident_array(object residents) except -1:
    """A 1-D array of RESIDENT_DTYPE (or a dtype numpy says is the same), as the kernel reads."""
    if not cnp.PyArray_CheckExact(residents) and isinstance(residents, _MaskedArray):
        raise _errors.masked_array("residents")
    cdef cnp.ndarray arr = <cnp.ndarray>residents
    if not (arr.descr is _RESIDENT_DESCR or cnp.PyArray_EquivTypes(arr.descr, _RESIDENT_DESCR)):
        raise _errors.array_dtype(arr.dtype, RESIDENT_DTYPE)
    if arr.ndim != 1:
        raise _errors.array_ndim(arr.ndim)
    return 0


cdef inline bint _overlaps(const void* a, size_t a_size, const void* b, size_t b_size) noexcept:
    cdef uintptr_t x = <uintptr_t>a, y = <uintptr_t>b
    return b != NULL and x < y + b_size and y < x + a_size


cdef int _check_drafts(object drafts, Py_ssize_t n) except -1:
    """SPEC §8's checks of the drafts container, before any row is read (values: _copy_drafts)."""
    cdef cnp.ndarray arr
    if cnp.PyArray_Check(drafts):
        if not cnp.PyArray_CheckExact(drafts) and isinstance(drafts, _MaskedArray):
            raise _errors.masked_array("drafts")
        arr = <cnp.ndarray>drafts
        if arr.ndim != 1 or arr.dtype != np.int32:
            raise _errors.drafts_array(arr.dtype, arr.ndim)
        if arr.shape[0] < n:
            raise _errors.drafts_length(arr.shape[0], n)
    elif isinstance(drafts, (list, tuple)):
        if len(drafts) < n:
            raise _errors.drafts_length(len(drafts), n)
    else:
        raise _errors.drafts_type(drafts)
    return 0


cdef uint8_t* _reasons_pointer(object reasons, Py_ssize_t n) except? NULL:
    if not cnp.PyArray_Check(reasons):
        raise _errors.reasons_array(f"is a {type(reasons).__name__}")
    if not cnp.PyArray_CheckExact(reasons) and isinstance(reasons, _MaskedArray):
        raise _errors.masked_array("reasons")
    cdef cnp.ndarray arr = <cnp.ndarray>reasons
    if not cnp.PyArray_EquivTypes(arr.descr, _UINT8_DESCR) or arr.ndim != 1:
        raise _errors.reasons_array(f"has dtype {arr.dtype} and ndim={arr.ndim}")
    if not cnp.PyArray_ISWRITEABLE(arr):
        raise _errors.reasons_array("is read-only")
    if arr.shape[0] < n:
        raise _errors.reasons_array(f"has len {arr.shape[0]} < count={n}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):  # not strides[0] == 1: numpy gives len 0/1 any stride
        raise _errors.reasons_array("is not contiguous")
    return <uint8_t*>cnp.PyArray_DATA(arr)


# ============================================================================================
# 5. The benchmark's C loop
# ============================================================================================

def time_kernel_loop(StepPlanner planner, residents, count=None, Py_ssize_t iterations=10000):
    """Nanoseconds per plan of the kernel alone, looped in C over the same buffers.

    ``planner.plan(residents, count)`` runs once first (validation and copy-in); then the kernel
    reruns ``iterations`` times with no Python in between, as a C program would call it. The
    ratio of ``plan()``'s time to this one is the cost of the Python boundary.
    """
    if iterations < 1:
        raise _errors.out_of_range("iterations", iterations, ">= 1")
    StepPlanner.plan(planner, residents, count)  # this class's plan(), whatever a subclass says
    return planner._kernel_loop(residents, iterations) / iterations
