"""The compiled ledger: waiting queue, admission, output accounting and retirement over C arrays.

Top of the file: the C (structs of ``_ledger.pxd``, ``noexcept nogil``): the queue's heaps,
the id map, admission, accounting and swap-remove retirement. Below: ``Ledger``, which checks
every argument first (through the same helpers and messages as the pure-Python twin,
``_ledger_py.py``; both call ``_shared.py``), then runs the C with nothing left to check. See ``stepplanner.ledger``.
"""

cimport cython
cimport numpy as cnp
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.math cimport INFINITY, NAN, isfinite, isnan
from libc.stdint cimport INT32_MAX, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport qsort
from libc.string cimport memcpy, memmove, memset

from stepplanner._core cimport (
    STATUS_OK,
    WORK_CONTEXT,
    WORK_DECODE,
    PlanC,
    ResidentC,
    SequenceC,
    StepPlan,
    _CoreMemory,
    check_row,
    first_repeated,
    repeated_resident_error,
)
from stepplanner.kv._kv cimport KVPageTable, PageTableC, grow_slot, move_slot, pages_for, release_slot
from stepplanner.kv._kv import geometry

cdef extern from *:
    """
    #include "pythread.h"
    /* The ledger's lock words: written by the thread holding the ledger's lock, read by a thread
       deciding whether to wait for it. Relaxed atomics where threads truly run at once (the
       header exists from 3.13 on); under the GIL a plain access is already ordered. */
    #if PY_VERSION_HEX >= 0x030D0000
    #define sp_load_ident(p) _Py_atomic_load_ulong_relaxed(p)
    #define sp_store_ident(p, v) _Py_atomic_store_ulong_relaxed(p, v)
    #define sp_load_flag(p) _Py_atomic_load_int_relaxed(p)
    #define sp_store_flag(p, v) _Py_atomic_store_int_relaxed(p, v)
    #else
    #define sp_load_ident(p) (*(p))
    #define sp_store_ident(p, v) (*(p) = (v))
    #define sp_load_flag(p) (*(p))
    #define sp_store_flag(p, v) (*(p) = (v))
    #endif
    """
    ctypedef void* PyThread_type_lock
    PyThread_type_lock PyThread_allocate_lock()
    void PyThread_free_lock(PyThread_type_lock)
    int PyThread_acquire_lock(PyThread_type_lock, int) nogil
    void PyThread_release_lock(PyThread_type_lock) nogil
    unsigned long PyThread_get_thread_ident()
    unsigned long sp_load_ident(const unsigned long*)
    void sp_store_ident(unsigned long*, unsigned long)
    int sp_load_flag(const int*)
    void sp_store_flag(int*, int)
    enum:
        WAIT_LOCK
        NOWAIT_LOCK

# How a call takes the ledger's lock (Ledger._acquire).
cdef enum:
    CALL_GUEST = 0    # submit, cancel: from any thread; waits for the call running
    CALL_QUIET = 1    # runs no caller code: waits for a call on another thread
    CALL_BUSY = 2     # runs caller code: a call from another thread meanwhile is refused

import numpy as np

from stepplanner import _errors
from stepplanner.ledger._shared import (
    EDF_SPAN,
    KEY_NONE,
    KEY_SPAN,
    KEY_ZERO,
    LEVEL_AT_RISK,
    LEVEL_DUE,
    LEVEL_RELEGATED,
    LEVEL_SLACK,
    LEVEL_STRIDE,
    CLASS_SPAN,
    STEP_TIME_WEIGHT,
    AdmissionOrder,
    admission_now,
    as_cached_tokens,
    as_lora_id,
    as_request_id,
    as_time,
    check_admits_args,
    check_constructor,
    check_deadline_args,
    check_ledger_args,
    check_relegation_args,
    check_rank_arrays,
    check_page_table,
    check_pending,
    check_worst_case,
    check_rows,
    check_waiting,
    draft_request,
    pages_in_use,
    parse_records,
    plan_classes,
    plan_sizes,
    plan_version,
    records_of,
    optional_now,
    request_deadlines,
    row_out_of_range,
    rows_argument,
    step_reasons_error,
    submission,
)
from stepplanner.ledger._shared import NEVER_RELEGATE_BELOW as _NEVER_RELEGATE_BELOW
from stepplanner.planner import _types
from stepplanner.planner._fields import as_int32
from stepplanner.planner._policy import ResolvedSchedulingPolicy

cnp.import_array()

IMPLEMENTATION = "compiled"
cdef uint64_t UINT64_MAX_ = 0xFFFFFFFFFFFFFFFFULL
# _shared's deadline constants as C constants: the rank pass multiplies and compares by them
# every row, and a module global is a load (and an imul by memory) each time. _shared.py holds
# the one definition; the import below fails if these ever drift from it.
cdef extern from *:
    """
    #define KEY_ZERO_ 2251799813685248ULL          /* 2**51 */
    #define KEY_SPAN_ 1125899906842624.0           /* 2**50 */
    #define KEY_NONE_ 4611686018427387904ULL       /* 2**62 */
    #define EDF_SPAN_ 2147483646.0                 /* 2**31 - 2 */
    #define LEVEL_DUE_ 0
    #define LEVEL_AT_RISK_ 1
    #define LEVEL_SLACK_ 2
    #define LEVEL_RELEGATED_ 3
    #define LEVEL_STRIDE_ 16777216                 /* 2**24 */
    #define CLASS_SPAN_ 8388607                    /* 2**23 - 1 */
    #define STEP_TIME_WEIGHT_ 0.25
    """
    const uint64_t KEY_ZERO_, KEY_NONE_
    const double KEY_SPAN_, EDF_SPAN_, STEP_TIME_WEIGHT_
    const int32_t LEVEL_DUE_, LEVEL_AT_RISK_, LEVEL_SLACK_, LEVEL_RELEGATED_
    const int32_t LEVEL_STRIDE_, CLASS_SPAN_

if (KEY_ZERO_, KEY_SPAN_, KEY_NONE_, EDF_SPAN_, LEVEL_DUE_, LEVEL_AT_RISK_, LEVEL_SLACK_,
        LEVEL_RELEGATED_, LEVEL_STRIDE_, CLASS_SPAN_, STEP_TIME_WEIGHT_) != (
        KEY_ZERO, KEY_SPAN, KEY_NONE, EDF_SPAN, LEVEL_DUE, LEVEL_AT_RISK, LEVEL_SLACK,
        LEVEL_RELEGATED, LEVEL_STRIDE, CLASS_SPAN, STEP_TIME_WEIGHT):
    raise ImportError("stepplanner.ledger._ledger: its deadline constants differ from "
                      "stepplanner.ledger._shared's; rebuild the extension")


# ============================================================================================
# 1. The waiting queue: two binary heaps over a pool of entries
# ============================================================================================

cdef inline bint before(const WaitingC* a, const WaitingC* b, int32_t order) noexcept nogil:
    if order == ORDER_FCFS:  # the plain queue first: it pays one test for the orders it lacks
        return a.arrival < b.arrival
    if order == ORDER_SHED:
        if a.shed_at != b.shed_at:
            return a.shed_at < b.shed_at
        return a.arrival < b.arrival
    if order >= ORDER_UNCACHED:
        if ((order == ORDER_PRIORITY_UNCACHED or order == ORDER_CLASS_DEADLINE_UNCACHED)
                and a.priority != b.priority):
            return a.priority < b.priority
        if a.work != b.work:
            return a.work < b.work   # -1 (starved, or out of slack) first, then the least work
        if a.work < 0 and order >= ORDER_EDF_UNCACHED and a.first_due != b.first_due:
            return a.first_due < b.first_due   # the deadline policies' own order
        return a.arrival < b.arrival
    if (order == ORDER_PRIORITY or order == ORDER_CLASS_DEADLINE) and a.priority != b.priority:
        return a.priority < b.priority
    if order >= ORDER_DEADLINE and a.first_due != b.first_due:
        return a.first_due < b.first_due   # inf (no objectives) after every deadline
    return a.arrival < b.arrival


cdef inline void heap_place(QueueC* q, HeapC* h, int32_t pos, int32_t slot) noexcept nogil:
    h.slots[pos] = slot
    q.pool[slot].position = pos


cdef void sift_up(QueueC* q, HeapC* h, int32_t pos) noexcept nogil:
    cdef int32_t slot = h.slots[pos], parent
    while pos > 0:
        parent = (pos - 1) >> 1
        if not before(&q.pool[slot], &q.pool[h.slots[parent]], h.order):
            break
        heap_place(q, h, pos, h.slots[parent])
        pos = parent
    heap_place(q, h, pos, slot)


cdef void sift_down(QueueC* q, HeapC* h, int32_t pos) noexcept nogil:
    cdef int32_t slot = h.slots[pos], child
    while True:
        child = 2 * pos + 1
        if child >= h.size:
            break
        if child + 1 < h.size and before(&q.pool[h.slots[child + 1]], &q.pool[h.slots[child]],
                                         h.order):
            child += 1
        if not before(&q.pool[h.slots[child]], &q.pool[slot], h.order):
            break
        heap_place(q, h, pos, h.slots[child])
        pos = child
    heap_place(q, h, pos, slot)


cdef void heap_push(QueueC* q, int32_t slot) noexcept nogil:
    cdef HeapC* h = &q.heaps[q.pool[slot].heap]
    h.slots[h.size] = slot
    q.pool[slot].position = h.size
    h.size += 1
    sift_up(q, h, h.size - 1)


cdef void heap_remove(QueueC* q, int32_t slot) noexcept nogil:
    """Take ``slot`` out of its heap from wherever it is: O(log n)."""
    cdef HeapC* h = &q.heaps[q.pool[slot].heap]
    cdef int32_t pos = q.pool[slot].position
    h.size -= 1
    if pos == h.size:
        return
    heap_place(q, h, pos, h.slots[h.size])
    if pos > 0 and before(&q.pool[h.slots[pos]], &q.pool[h.slots[(pos - 1) >> 1]], h.order):
        sift_up(q, h, pos)
    else:
        sift_down(q, h, pos)


cdef int32_t next_heap(const QueueC* q, int32_t free_slots, int32_t reserved) noexcept nogil:
    """The heap whose head admission takes next, or -1: the head of the whole queue, unless it is
    a priority >= 0 request held back by the reservation, when an urgent one may still pass."""
    cdef const HeapC* urgent = &q.heaps[HEAP_URGENT]
    cdef const HeapC* normal = &q.heaps[HEAP_NORMAL]
    cdef const HeapC* losing = &q.heaps[HEAP_LOSING]
    cdef int32_t head
    if urgent.size and (not normal.size or before(&q.pool[urgent.slots[0]],
                                                  &q.pool[normal.slots[0]], normal.order)):
        head = HEAP_URGENT
    elif normal.size:
        head = HEAP_NORMAL
    elif losing.size and (free_slots > reserved or q.pool[losing.slots[0]].priority < 0):
        # Relegated requests come after every other, and never take a reserved slot unless
        # they are urgent themselves.
        return HEAP_LOSING
    else:
        return -1
    if head == HEAP_NORMAL and free_slots <= reserved:
        return HEAP_URGENT if urgent.size else -1
    return head


cdef inline void shed_slot(QueueC* q, IdMapC* m, int32_t slot) noexcept nogil:
    """Hand a waiting request back to the runtime (``shed_ids``): out of its heap, the id map
    and the pool."""
    heap_remove(q, slot)
    map_delete(m, q.pool[slot].request_id)
    q.free[q.num_free] = slot
    q.num_free += 1
    q.shed[q.num_shed] = q.pool[slot].request_id
    q.num_shed += 1


cdef void new_shed_report(QueueC* q) noexcept nogil:
    """A loop call starts: what the last one reported is dropped, what ``submit`` shed since is
    kept (it is this call's to report)."""
    cdef int32_t rest = q.num_shed - q.num_reported
    if q.num_reported:
        memmove(q.shed, q.shed + q.num_reported, rest * sizeof(int64_t))
    q.num_shed = rest
    q.num_reported = 0


cdef inline void lose_waiting(QueueC* q, IdMapC* m, TableC* t, int32_t slot,
                              double now) noexcept nogil:
    """A waiting request that cannot make its first token in time: relegated, it waits behind
    every request that still can until ``now`` + its wait, then is shed (at once when it may not
    wait)."""
    cdef WaitingC* w = &q.pool[slot]
    heap_remove(q, slot)
    w.heap = HEAP_LOSING
    w.shed_at = now + w.wait
    heap_push(q, slot)
    t.relegated_ids[t.num_relegated] = w.request_id
    t.num_relegated += 1
    if not w.shed_at > now:
        shed_slot(q, m, slot)


ctypedef struct StampedSlot:
    uint64_t arrival
    int32_t slot


cdef int by_arrival(const void* a, const void* b) noexcept nogil:
    cdef uint64_t x = (<const StampedSlot*>a).arrival, y = (<const StampedSlot*>b).arrival
    return (x > y) - (x < y)


cdef void relegate_hopeless(QueueC* q, IdMapC* m, TableC* t, const DeadlineC* d,
                            double now) noexcept nogil:
    """Relegate every waiting request that cannot make its first token even if served at once,
    wherever it stands in the queue (admission tests only the head: behind a class that keeps
    arriving, a lower one would otherwise wait unseen). It runs once ``now`` passes the earliest
    deadline that could be missed, in arrival order, and costs one pass over the queue."""
    if not now >= q.earliest_due:
        return
    cdef int32_t h, k, n = 0, slot
    cdef double earliest = INFINITY
    cdef const WaitingC* w
    cdef StampedSlot* found = <StampedSlot*>q.scratch
    for h in range(2):  # HEAP_NORMAL, HEAP_URGENT
        for k in range(q.heaps[h].size):
            slot = q.heaps[h].slots[k]
            w = &q.pool[slot]
            if w.priority < d.never_below or w.first_due == INFINITY:
                continue
            if too_late(d, w.prompt_length, w.first_due, now):
                found[n].arrival = w.arrival
                found[n].slot = slot
                n += 1
            elif w.first_due < earliest:
                earliest = w.first_due
    q.earliest_due = earliest
    if n > 1:
        qsort(found, n, sizeof(StampedSlot), by_arrival)
    for k in range(n):
        lose_waiting(q, m, t, found[k].slot, now)


cdef void shed_expired(QueueC* q, IdMapC* m, double now) noexcept nogil:
    """Hand back every relegated request whose wait is over."""
    cdef HeapC* losing = &q.heaps[HEAP_LOSING]
    while losing.size and q.pool[losing.slots[0]].shed_at <= now:
        shed_slot(q, m, losing.slots[0])


# ============================================================================================
# 2. The id map
# ============================================================================================

cdef inline uint64_t home(const IdMapC* m, int64_t key) noexcept nogil:
    # splitmix64's finaliser: sequential ids spread over the whole table.
    cdef uint64_t z = <uint64_t>key + 0x9E3779B97F4A7C15ULL
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return (z ^ (z >> 31)) & m.mask


# Every probe loop visits each slot at most once. The load stays <= 1/2 (the map is sized for
# every waiting and resident id twice over), so a probe always meets a free slot; the bound is
# there so that no state, however it came about, can make a lookup spin.

cdef inline int64_t map_find(const IdMapC* m, int64_t key) noexcept nogil:
    """The table index holding ``key``, or -1."""
    cdef uint64_t i = home(m, key), n
    for n in range(m.mask + 1):
        if not m.used[i]:
            return -1
        if m.keys[i] == key:
            return <int64_t>i
        i = (i + 1) & m.mask
    return -1


cdef inline void map_set(IdMapC* m, int64_t key, int32_t value) noexcept nogil:
    cdef uint64_t i = home(m, key), n
    for n in range(m.mask + 1):
        if not m.used[i] or m.keys[i] == key:
            m.used[i] = 1
            m.keys[i] = key
            m.values[i] = value
            return
        i = (i + 1) & m.mask


cdef void map_delete(IdMapC* m, int64_t key) noexcept nogil:
    cdef int64_t found = map_find(m, key)
    cdef uint64_t i, j, k, n
    if found < 0:
        return
    i = j = <uint64_t>found
    for n in range(m.mask):
        j = (j + 1) & m.mask
        if not m.used[j]:
            break
        k = home(m, m.keys[j])
        # The entry at j may stay unless its home lies cyclically outside (i, j].
        if (k > i and k <= j) if i <= j else (k > i or k <= j):
            continue
        m.keys[i] = m.keys[j]
        m.values[i] = m.values[j]
        i = j
    m.used[i] = 0


# ============================================================================================
# 3. Admission, accounting, retirement
# ============================================================================================

cdef inline int64_t worst_case(const WaitingC* w, const PageTableC* pages) noexcept nogil:
    """Pages for the request's prompt and every token it may emit (submit bounded the sum)."""
    return pages_for(<int64_t>w.prompt_length + w.max_new_tokens, pages.page_size)


cdef bint adapter_joins(AdaptersC* a, int64_t lora) noexcept nogil:
    """Whether a request of adapter ``lora`` may join the residents now; if it may, its adapter
    is held from then on (``_shared.AdapterSlots.join``)."""
    cdef int32_t k
    if lora == 0 or a.most == 0:
        return True
    for k in range(a.num_held):
        if a.held[k] == lora:
            return True
    if a.num_held >= a.most:
        return False
    a.held[a.num_held] = lora
    a.num_held += 1
    return True


cdef void hold_resident_adapters(AdaptersC* a, const TableC* t) noexcept nogil:
    """The residents' distinct adapters into ``a.held`` (at most ``a.most`` of them: admission
    never admits past it, and ``load`` refuses more)."""
    cdef int32_t r
    a.num_held = 0
    for r in range(t.count):
        adapter_joins(a, t.lora[r])


cdef bint holds_parked_adapters(const AdaptersC* a) noexcept nogil:
    """Whether ``a.held`` (the residents' adapters now) is the set the parked requests were
    parked under: then none of them can join yet."""
    cdef int32_t i, k
    if a.num_held != a.num_parked_held:
        return False
    for i in range(a.num_held):
        for k in range(a.num_parked_held):
            if a.parked_held[k] == a.held[i]:
                break
        else:
            return False
    return True


cdef void park(AdaptersC* a, QueueC* q, int32_t slot) noexcept nogil:
    """Take a waiting request that cannot join ``a.held`` out of its heap, into ``a.parked``;
    the first one parked notes the adapters they are all parked under (all ``most`` of them)."""
    if not a.num_parked:
        memcpy(a.parked_held, a.held, a.num_held * sizeof(int64_t))
        a.num_parked_held = a.num_held
    heap_remove(q, slot)
    q.pool[slot].position = -(a.num_parked + 1)
    a.parked[a.num_parked] = slot
    a.num_parked += 1


cdef void unpark_all(AdaptersC* a, QueueC* q) noexcept nogil:
    """Every parked request back into its heap, where its key puts it."""
    cdef int32_t k
    for k in range(a.num_parked):
        heap_push(q, a.parked[k])
    a.num_parked = 0


cdef void hold_adapters_and_unpark(AdaptersC* a, QueueC* q, const TableC* t) noexcept nogil:
    """The residents' adapters into ``a.held``; if they are no longer the set the parked
    requests were parked under, every parked request goes back into its heap (it may join)."""
    hold_resident_adapters(a, t)
    if a.num_parked and not holds_parked_adapters(a):
        unpark_all(a, q)


cdef void drop_parked(AdaptersC* a, QueueC* q, int32_t slot) noexcept nogil:
    """Take a parked request out of ``a.parked`` (it is cancelled): the last one moves into its
    place."""
    cdef int32_t k = -q.pool[slot].position - 1
    cdef int32_t last = a.parked[a.num_parked - 1]
    a.num_parked -= 1
    a.parked[k] = last
    q.pool[last].position = -(k + 1)


cdef inline bint ring_entry_live(const QueueC* q, const IdMapC* m, const StarvationC* s,
                                 int32_t k) noexcept nogil:
    """Whether ring entry ``k`` (an index into the ring's memory) is still a waiting request's."""
    cdef int32_t slot = s.ring[k]
    cdef const WaitingC* w = &q.pool[slot]
    cdef int64_t at
    if w.arrival != s.stamps[k]:
        return False  # its pool slot holds a later request
    at = map_find(m, w.request_id)
    return at >= 0 and m.values[at] == slot


cdef void ring_push(QueueC* q, const IdMapC* m, StarvationC* s, int32_t slot) noexcept nogil:
    """Append a new waiting request to the ring; a full ring is compacted first (it keeps only
    the live entries, at most max_waiting of its 2 x max_waiting)."""
    cdef int32_t k, j, n = 0
    if s.size == s.capacity:
        for j in range(s.size):
            k = (s.head + j) % s.capacity
            if ring_entry_live(q, m, s, k):
                # n <= j: an entry moves only to a place already read
                s.ring[(s.head + n) % s.capacity] = s.ring[k]
                s.stamps[(s.head + n) % s.capacity] = s.stamps[k]
                n += 1
        s.size = n
    k = (s.head + s.size) % s.capacity
    s.ring[k] = slot
    s.stamps[k] = q.pool[slot].arrival
    s.size += 1


cdef void starve_waiting(QueueC* q, const IdMapC* m, StarvationC* s, double now) noexcept nogil:
    """One admission pass of the starvation bound: every waiting request that has waited past
    it goes back to arrival order (its work -1, which sorts before any work, and among them by
    arrival), ahead of every request not starved. Each request starves once; a pass in which
    none does reads one ring entry (and drops the gone ones ahead of it)."""
    cdef double clock
    cdef int32_t slot
    cdef WaitingC* w
    s.passes += 1
    clock = now if s.by_seconds else s.passes
    while s.size:
        slot = s.ring[s.head]
        w = &q.pool[slot]
        if ring_entry_live(q, m, s, s.head):
            if not w.since + s.after <= clock:  # NaN now (no clock given): none starves
                return
            w.work = -1
            if w.position >= 0:  # a parked request goes back into its heap by its new key
                sift_up(q, &q.heaps[w.heap], w.position)
        s.head = (s.head + 1) % s.capacity
        s.size -= 1


cdef inline bint out_of_slack(const DeadlineC* d, const WaitingC* w, double now) noexcept nogil:
    """Whether a waiting request with a first-token deadline has no slack to spare at ``now``:
    admitted now, its uncached work at the chunk's pace (a chunk a step) would not bring its
    first token a step before it is due. As its row it would rank AT_RISK (or worse), not
    SLACK (rank_rows' test, on the work it has once its prefix hit is committed)."""
    cdef double est = step_estimate(d)
    return now + prompt_seconds(d, w.work, d.chunk, d.chunk_inverse) + est > w.first_due


cdef void note_slack(StarvationC* s, const DeadlineC* d, const WaitingC* w) noexcept nogil:
    """A request that waits with slack to spare (work >= 0, a deadline) joins the bound."""
    cdef double steps
    if w.work < 0 or w.first_due == INFINITY:
        return
    steps = <double>(steps_for(w.work, d.chunk, d.chunk_inverse) + 1)
    s.risk_min = min(s.risk_min, w.first_due - steps * s.risk_est)
    s.risk_steps = max(s.risk_steps, steps)


cdef void lose_slack(QueueC* q, const AdaptersC* a, StarvationC* s, const DeadlineC* d,
                     double now) noexcept nogil:
    """Uncached first under EDF/DEADLINE: every waiting request with no slack to spare at
    ``now`` goes to the policy's own order (work -1: first-token deadline, then arrival), ahead
    of every request of its class that still has slack. A pass reads the queue only once
    someone may have run out (``StarvationC``'s bound), then notes the bound anew."""
    cdef double est = step_estimate(d), grown = est - s.risk_est
    cdef int32_t h, k, slot
    cdef WaitingC* w
    if isnan(now):
        return  # no clock given (EDF's admit): none is judged
    # 1 us of margin: the bound is one rounding away from the test it stands for.
    if not now >= s.risk_min - s.risk_steps * (grown if grown > 0 else 0.0) - 1e-6:
        return
    s.risk_min = INFINITY
    s.risk_steps = 0
    s.risk_est = est
    for h in range(2):  # HEAP_NORMAL, HEAP_URGENT: a key that drops sifts up, never past k
        for k in range(q.heaps[h].size):
            slot = q.heaps[h].slots[k]
            w = &q.pool[slot]
            if w.work < 0 or w.first_due == INFINITY:
                continue
            if out_of_slack(d, w, now):
                w.work = -1
                sift_up(q, &q.heaps[h], w.position)
            else:
                note_slack(s, d, w)
    for k in range(a.num_parked):  # parked (EDF keeps them between passes): their keys only
        w = &q.pool[a.parked[k]]
        if w.work < 0 or w.first_due == INFINITY:
            continue
        if out_of_slack(d, w, now):
            w.work = -1
        else:
            note_slack(s, d, w)


cdef int32_t admit_waiting(QueueC* q, TableC* t, IdMapC* m, PageTableC* pages,
                           const DeadlineC* d, AdaptersC* a, double now,
                           StarvationC* s, uint64_t* next_arrival) noexcept nogil:
    """Move waiting requests into free rows in queue order; returns how many. With ``pages``
    each admitted row gets its worst case, and the first request whose worst case the free pool
    cannot hold stops admission: nothing overtakes it, so it is never starved. Under DEADLINE
    (``now`` not NaN) a head that cannot make its first token in time even if served at once
    moves behind every request that still can (the relegated heap), and so does every waiting
    request that can no longer make it (``relegate_hopeless``); relegated requests whose wait
    is over are handed back (``shed_expired``). Classes below ``never_below`` are never
    relegated. With ``a.most`` adapters at most, a request whose adapter cannot join the
    residents' is passed over: parked out of its heap (so the queue is read on behind it), its
    key and so its place unchanged; the parked go back into their heaps once the residents'
    adapters change, or under DEADLINE when the pass ends (``AdaptersC``). Uncached first
    (``s.ring`` not NULL): the starvation bound moves those who waited past it first, and each
    admitted row's arrival is a fresh stamp from ``next_arrival``, so the planner chunks the
    residents' prompts in the order they were admitted."""
    cdef int32_t n = 0, h, slot, row
    cdef bint held = False  # a.held is filled at the first request with an adapter
    cdef int64_t need = 0
    cdef HeapC* heap
    cdef WaitingC* w
    cdef ResidentC* r
    new_shed_report(q)  # each admission pass reports what it (and submit since the last) shed
    if d.ranking == RANK_DEADLINE and not isnan(now):
        relegate_hopeless(q, m, t, d, now)
        shed_expired(q, m, now)
    if s.ring != NULL:
        starve_waiting(q, m, s, now)
        if s.by_slack:
            lose_slack(q, a, s, d, now)
    if a.num_parked and t.count < t.capacity:
        hold_adapters_and_unpark(a, q, t)
        held = True
    while t.count < t.capacity:
        h = next_heap(q, t.capacity - t.count, t.reserved_slots)
        if h < 0:
            break
        heap = &q.heaps[h]
        slot = heap.slots[0]
        w = &q.pool[slot]
        if (d.ranking == RANK_DEADLINE and not isnan(now) and h != HEAP_LOSING
                and w.priority >= d.never_below
                and too_late(d, w.prompt_length, w.first_due, now)):
            lose_waiting(q, m, t, slot, now)
            continue
        if a.most and w.lora:
            if not held:
                hold_resident_adapters(a, t)
                held = True
            if not adapter_joins(a, w.lora):
                park(a, q, slot)
                continue
        row = t.count
        if pages != NULL:
            need = worst_case(w, pages)
            if need > pages.num_free:
                break
            # A slot past the last row is empty unless the caller grew it through the table;
            # then it keeps what it has (the pool is never asked for more than it holds).
            if pages.counts[row] < need:
                grow_slot(pages, row, <int32_t>need)
        heap_remove(q, slot)
        r = &t.rows[row]
        r.priority = w.priority
        r.arrival = w.arrival
        if s.ring != NULL and next_arrival[0] < UINT64_MAX_:
            r.arrival = next_arrival[0]
            next_arrival[0] += 1
        r.prompt_length = w.prompt_length
        r.committed = 0
        r.context_committed = 0
        r.consecutive_paused_steps = 0
        t.ids[row] = w.request_id
        t.generated[row] = 0
        t.max_new[row] = w.max_new_tokens
        t.done[row] = 0
        t.first_due[row] = w.first_due
        t.due[row] = w.first_due
        t.gap[row] = w.gap
        t.stamp[row] = w.arrival
        t.klass[row] = w.priority
        t.relegated[row] = w.heap == HEAP_LOSING
        t.lora[row] = w.lora
        map_set(m, w.request_id, -(row + 1))
        q.free[q.num_free] = slot
        q.num_free += 1
        t.count += 1
        t.admitted[n] = w.request_id
        n += 1
    if d.ranking == RANK_DEADLINE:
        unpark_all(a, q)
    t.num_admitted = n
    q.num_reported = q.num_shed
    return n


cdef bint apply_is_clean(const PlanC* p, const TableC* t) noexcept nogil:
    """Whether ``apply_plan`` may advance the rows: every planned and paused index is a row and
    no field leaves int32 or starts negative, on any row (apply_to refuses a negative
    ``committed`` or ``consecutive_paused_steps`` on a row the plan does not name too). Anything
    else goes through ``StepPlan.apply_to``, which owns the messages for it."""
    cdef int32_t k, r, signs = 0
    cdef const SequenceC* s
    for r in range(t.count):  # the sign bits of both fields, or'd: no branch per row
        signs |= t.rows[r].committed | t.rows[r].consecutive_paused_steps
    if signs < 0:
        return False
    for k in range(p.num_prefill + p.num_decode):
        s = &p.sequences[k]
        r = s.resident
        if r < 0 or r >= t.count or s.query_length < 0:
            return False
        if s.query_length > INT32_MAX - t.rows[r].committed:
            return False
    for k in range(p.num_paused):
        r = p.paused[k]
        if r < 0 or r >= t.count or t.rows[r].consecutive_paused_steps == INT32_MAX:
            return False
    return True


cdef void apply_plan(const PlanC* p, TableC* t) noexcept nogil:
    """SPEC §6 over the table's rows, as ``StepPlan.apply_to`` does, with no copy in or out."""
    cdef int32_t k, r
    cdef const SequenceC* s
    cdef ResidentC* row
    for k in range(p.num_prefill + p.num_decode):
        s = &p.sequences[k]
        row = &t.rows[s.resident]
        row.committed += s.query_length
        if s.work == WORK_CONTEXT and s.select_last_token_logits:
            row.context_committed = 1
    for k in range(p.num_paused):
        t.mark[p.paused[k]] = 1
    for r in range(t.count):
        row = &t.rows[r]
        if t.mark[r]:
            row.consecutive_paused_steps += 1
            t.mark[r] = 0
        else:
            row.consecutive_paused_steps = 0


cdef int32_t first_row_out_of_range(const PlanC* p, int32_t count) noexcept nogil:
    """The first plan row whose resident is not a row below ``count``, or -1: the accounting
    indexes the table's arrays by it."""
    cdef int32_t k, r
    for k in range(p.num_prefill + p.num_decode):
        r = p.sequences[k].resident
        if r < 0 or r >= count:
            return k
    return -1


cdef int32_t first_row_beyond_pages(const PlanC* p, const PageTableC* pages) noexcept nogil:
    """The first plan row that would write KV past the pages its row holds, or -1 (every
    resident already checked to be a row)."""
    cdef int32_t k
    cdef const SequenceC* s
    for k in range(p.num_prefill + p.num_decode):
        s = &p.sequences[k]
        if (<int64_t>s.past_length + s.query_length
                > <int64_t>pages.counts[s.resident] * pages.page_size):
            return k
    return -1


cdef bint rows_plannable(const TableC* t, int32_t max_input_length) noexcept nogil:
    cdef int32_t i
    for i in range(t.count):
        if check_row(&t.rows[i], max_input_length) != STATUS_OK:
            return False
    return True


cdef inline int32_t emitted(const SequenceC* s, const int32_t* accepted, int32_t k) noexcept nogil:
    """Tokens plan row ``k`` emits (SPEC §8): a decode row 1 + its accepted drafts (all it
    verified when ``accepted`` is NULL), a final chunk 1, a non-final chunk none."""
    if s.work == WORK_DECODE:
        return s.query_length if accepted == NULL else 1 + accepted[k]
    return s.select_last_token_logits != 0


cdef void reject_drafts(const PlanC* p, TableC* t, const int32_t* accepted) noexcept nogil:
    """Take back the positions a decode row verified after its accepted drafts: applying the
    plan committed all of them, and the next step writes over their KV."""
    cdef int32_t k
    cdef const SequenceC* s
    for k in range(p.num_prefill + p.num_decode):
        s = &p.sequences[k]
        if s.work == WORK_DECODE:
            t.rows[s.resident].committed -= s.query_length - 1 - accepted[k]


cdef inline bint plan_drafted(const PlanC* p, const PlanC* foreign) noexcept nogil:
    """Whether a decode row of ``p`` may verify drafts. A compiled plan says so in its totals
    (made, or unpickled, from its rows: ``total_tokens`` = prefill + decode rows + drafts); a
    reference plan's rows (``foreign``) are read row by row."""
    return p == foreign or p.total_tokens - p.prefill_tokens - p.num_decode != 0


cdef void account(TableC* t, const PlanC* p, const uint8_t* mask,
                  const int32_t* accepted, bint drafted, double late_after, bint keep_due,
                  int32_t never_below) noexcept nogil:
    """Count each emitting row's tokens (1, or 1 + its accepted drafts); mark finished by
    max_new_tokens or the sampler's mask.

    ``keep_due`` (EDF, DEADLINE): each counted row's ``due`` moves to its next token's
    deadline, for the rank pass. ``late_after`` (DEADLINE; NaN: no check) is when the tokens
    came: a row whose token came after its deadline (``due`` before it moves) has lost its
    objectives and is relegated, in the same pass (unless its class is below ``never_below``);
    a relegated row's ``due`` is read no more."""
    # Locals: the byte stores (done, relegated) may alias anything, and would otherwise make C
    # load every pointer of t again each row.
    cdef int64_t* generated = t.generated
    cdef const int64_t* max_new = t.max_new
    cdef uint8_t* done = t.done
    cdef const uint8_t* relegated = t.relegated
    cdef double* due = t.due
    cdef const SequenceC* sequences = p.sequences
    cdef bint check_late = not isnan(late_after)
    cdef bint plain = accepted == NULL and not drafted  # each emitting row emits one token
    cdef int32_t k, r, n = 0, rows = p.num_prefill + p.num_decode
    cdef int64_t g
    for k in range(rows):
        if not sequences[k].select_last_token_logits:
            continue
        r = sequences[k].resident
        g = generated[r] + (1 if plain else emitted(&sequences[k], accepted, k))
        generated[r] = g
        if keep_due and not relegated[r]:  # a relegated row's deadlines are read no more
            if check_late and late_after > due[r] and t.klass[r] >= never_below:
                relegate(t, r)
            else:
                due[r] = next_due(t, r)  # the token after this one
        if done[r]:
            continue
        if (max_new[r] > 0 and g >= max_new[r]) or (mask != NULL and mask[k] != 0):
            done[r] = 1
            t.num_done += 1
            t.finished[n] = t.ids[r]
            n += 1
    t.num_finished = n


cdef void remove_marked(TableC* t, IdMapC* m, PageTableC* pages, uint8_t* mark,
                        int32_t num_marked) noexcept nogil:
    """Swap-remove the ``num_marked`` rows whose ``mark`` is set (``mark`` may be ``t.done``);
    with ``pages`` a removed row's pages go back to the pool and the moved row's pages move with
    it, so slot ``i`` stays row ``i``.

    From the top down: the last row is then never one still to be removed, and the scan stops at
    the lowest marked row."""
    cdef int32_t row = t.count - 1, last
    while num_marked > 0 and row >= 0:
        if mark[row]:
            map_delete(m, t.ids[row])
            if t.done[row]:
                t.num_done -= 1
            last = t.count - 1
            if pages != NULL:
                release_slot(pages, row)
                if row != last:
                    move_slot(pages, last, row)
            if row != last:
                t.rows[row] = t.rows[last]
                t.ids[row] = t.ids[last]
                t.generated[row] = t.generated[last]
                t.max_new[row] = t.max_new[last]
                t.done[row] = t.done[last]
                t.first_due[row] = t.first_due[last]
                t.due[row] = t.due[last]
                t.gap[row] = t.gap[last]
                t.stamp[row] = t.stamp[last]
                t.klass[row] = t.klass[last]
                t.relegated[row] = t.relegated[last]
                t.lora[row] = t.lora[last]
                map_set(m, t.ids[row], -(row + 1))
            mark[row] = 0
            memset(&t.rows[last], 0, sizeof(ResidentC))
            t.ids[last] = -1
            t.done[last] = 0
            t.count -= 1
            num_marked -= 1
        row -= 1


# ============================================================================================
# 4. Deadlines: the rank pass of EDF and DEADLINE (docs/scheduling.md; the twin's _rank)
# ============================================================================================

cdef inline double step_estimate(const DeadlineC* d) noexcept nogil:
    if d.measured:
        return d.estimate
    return d.base + d.per_token * <double>d.step_tokens


cdef inline int64_t steps_for(int64_t tokens, int64_t chunk, double inverse) noexcept nogil:
    """ceil(tokens / chunk), exactly, for 0 <= tokens < 2**31 and ``inverse`` = 1.0 / chunk.

    The rank pass asks it for every waiting prompt every step, and a 64-bit division costs tens
    of cycles where a multiply costs a few. The product is within tokens x 2**-52 < 2**-21 of
    the quotient k + r / chunk (r = tokens mod chunk): with r >= 1 that is less than r / chunk
    and less than (chunk - r) / chunk, so it truncates to k exactly and the remainder r > 0
    adds one; with r = 0 it truncates to k or k - 1, and the remainder (0, or chunk) makes
    either k. tests/test_deadlines.py checks every chunk boundary against exact integers."""
    cdef int64_t q = <int64_t>(<double>tokens * inverse)
    return q + (tokens - q * chunk > 0)


cdef inline double prompt_seconds(const DeadlineC* d, int64_t tokens, int64_t chunk,
                                  double inverse) noexcept nogil:
    """A prompt of ``tokens`` at ``chunk`` tokens a step (``inverse`` = 1.0 / chunk): steps x
    the step estimate."""
    return <double>steps_for(tokens, chunk, inverse) * step_estimate(d)


cdef inline bint too_late(const DeadlineC* d, int64_t tokens, double due,
                          double now) noexcept nogil:
    """Whether a prompt of ``tokens`` misses a first token due at ``due`` even if served at once
    from ``now``: the one test for relegating a waiting request, wherever the ledger makes it
    (admission, the sweep, ``submit``'s place rule, ``Ranker.admits``)."""
    return now + prompt_seconds(d, tokens, d.chunk, d.chunk_inverse) > due


cdef inline double next_due(const TableC* t, int32_t r) noexcept nogil:
    """When row ``r``'s next token is due (inf: no deadline)."""
    cdef int64_t g = t.generated[r]
    if g == 0:
        return t.first_due[r]
    if t.gap[r] > 0:
        return t.first_due[r] + <double>g * t.gap[r]
    return INFINITY


cdef inline double clamp(double x, double span) noexcept nogil:
    # Comparisons, not fmin/fmax: no libm call and no NaN rules (x is finite here).
    return span if x > span else (-span if x < -span else x)


cdef inline uint64_t slack_key(double slack) noexcept nogil:
    # Truncation (a cast), as the twin's int(): only the order matters, and a cast needs no libm.
    return <uint64_t>(KEY_ZERO_ + <int64_t>clamp(slack * 1e6, KEY_SPAN_))


cdef inline int32_t ranked_priority(int32_t k, int32_t level) noexcept nogil:
    """DEADLINE's priority for a row of class ``k`` at ``level``: the level, then the class."""
    k = CLASS_SPAN_ if k > CLASS_SPAN_ else (-CLASS_SPAN_ if k < -CLASS_SPAN_ else k)
    return level * LEVEL_STRIDE_ + k


cdef inline void relegate(TableC* t, int32_t r) noexcept nogil:
    t.relegated[r] = 1
    t.relegated_ids[t.num_relegated] = t.ids[r]
    t.num_relegated += 1


cdef void rank_rows(TableC* t, const DeadlineC* d, double now) noexcept nogil:
    """Write each row's priority and arrival from its deadlines at ``now``.

    EDF: priority = the next deadline in milliseconds from now (INT32_MAX: none), arrival =
    the stamp. DEADLINE: priority = a level (LEVEL_*), arrival = a prompt's slack in
    microseconds (least slack first), a decode's or a relegated row's stamp, and for rows
    without a deadline their stamp after every keyed row; a prompt that cannot make its first
    token even if served at once is relegated here. A row of a class below ``never_below`` is
    never relegated: late, it ranks as the most urgent of its kind (a decode DUE, a prompt
    AT_RISK by its negative slack)."""
    # Everything the loop reads, in locals: a store into a row (and relegate's byte store, which
    # may alias anything) would otherwise make C load every pointer of t and d again each row.
    cdef ResidentC* rows = t.rows
    cdef const uint8_t* relegated = t.relegated
    cdef const double* first_due = t.first_due
    cdef const double* kept_due = t.due
    cdef const uint64_t* stamp = t.stamp
    cdef const int32_t* klass = t.klass
    cdef int32_t count = t.count
    cdef double est = step_estimate(d), due, urgent, urgent_normal, normal_inverse
    cdef double chunk_inverse = d.chunk_inverse
    cdef int64_t chunk = d.chunk, rest, normal
    cdef int32_t r, decoding = 0, level, never_below = d.never_below
    cdef ResidentC* row
    if d.ranking == RANK_EDF:
        for r in range(count):
            row = &rows[r]
            due = next_due(t, r) if row.context_committed else first_due[r]
            if due == INFINITY:
                row.priority = INT32_MAX
            else:
                row.priority = <int32_t>clamp((due - now) * 1000.0, EDF_SPAN_)
            row.arrival = stamp[r]
        return
    # The normal pace: the chunk, unless decodes leave less room. They never do under a policy
    # resolved for MIXED (max_chunk_tokens <= max_num_tokens - B), so the pass over the rows that
    # counts them runs only when they could (PREFILL_FIRST with a small max_step_tokens).
    if d.step_tokens - count >= chunk:
        normal = max(d.page_size, chunk)  # the formula below with room for a chunk
    else:
        for r in range(count):
            decoding += rows[r].context_committed != 0
        normal = max(d.page_size, min(chunk, d.step_tokens - decoding))
    normal_inverse = 1.0 / <double>normal  # once a pass: steps_for multiplies by it
    for r in range(count):
        row = &rows[r]
        if relegated[r]:
            row.priority = ranked_priority(klass[r], LEVEL_RELEGATED_)
            row.arrival = stamp[r]
            continue
        if row.context_committed:
            # Kept by the ledger as tokens are counted; a Ranker's table has none.
            due = kept_due[r] if kept_due != NULL else next_due(t, r)
            if due < now and klass[r] >= never_below:
                # Its next token is already late whenever it comes: as lost as a late one (the
                # Ranker's runtime has no apply to see the late token itself).
                relegate(t, r)
                level = LEVEL_RELEGATED_
            elif due == INFINITY:
                row.priority = ranked_priority(klass[r], LEVEL_SLACK_)
                row.arrival = KEY_NONE_ + min(stamp[r], KEY_NONE_ - 1)
                continue
            else:
                # A decode's place within its level changes no plan (every active decode gets
                # a row, after the chunks): its stamp keeps the order, and so the planner's
                # sort, steady.
                level = LEVEL_DUE_ if due - now - est < est else LEVEL_SLACK_
            row.priority = ranked_priority(klass[r], level)
            row.arrival = stamp[r]
            continue
        due = first_due[r]
        if due == INFINITY:
            row.priority = ranked_priority(klass[r], LEVEL_SLACK_)
            row.arrival = KEY_NONE_ + min(stamp[r], KEY_NONE_ - 1)
            continue
        # prompt_seconds, over the locals.
        rest = <int64_t>row.prompt_length - row.committed
        urgent = <double>steps_for(rest, chunk, chunk_inverse) * est
        if now + urgent > due and klass[r] >= never_below:
            relegate(t, r)
            row.priority = ranked_priority(klass[r], LEVEL_RELEGATED_)
            row.arrival = stamp[r]
        else:
            # At the normal pace: most steps it is the urgent pace (decodes leave a chunk's
            # room), and the product is the same.
            if normal != chunk:
                urgent_normal = <double>steps_for(rest, normal, normal_inverse) * est
            else:
                urgent_normal = urgent
            level = LEVEL_AT_RISK_ if now + urgent_normal + est > due else LEVEL_SLACK_
            row.priority = ranked_priority(klass[r], level)
            row.arrival = slack_key(due - now - urgent)


cdef dict set_deadlines(DeadlineC* d, object limits, tuple checked, tuple relegation):
    """``d`` from a new ledger's (or ranker's) arguments as ``_shared.check_deadline_args`` and
    ``check_relegation_args`` returned them (``checked``, ``relegation``); returns the classes
    (the twin's ``_Deadlines`` does the same)."""
    cdef dict classes
    (d.ranking, classes, d.base, d.per_token, d.measured, d.step_tokens, d.chunk) = checked
    d.relegated_wait, d.never_below = relegation
    d.chunk_inverse = 1.0 / <double>d.chunk
    d.page_size = limits.kv_page_size
    d.last_now = NAN
    d.estimate = 0.0
    d.sampled = 0
    return classes


cdef void measure_step(DeadlineC* d, double now, bint ran) noexcept nogil:
    """step_time=None: a step's duration (between two steps' now) moves the estimate."""
    cdef double last = d.last_now, sample
    d.last_now = now
    if not d.measured or not ran or isnan(last):
        return
    sample = now - last
    # A clock that went back is no sample, nor one that jumped further than a double spans
    # (two finite nows 2e308 apart: inf), which would make the estimate inf, then NaN.
    if not (sample > 0 and sample < INFINITY):
        return
    if d.sampled:
        d.estimate += STEP_TIME_WEIGHT_ * (sample - d.estimate)
    else:
        d.estimate = sample
        d.sampled = 1


# ============================================================================================
# 5. Ledger
# ============================================================================================

cdef cnp.dtype _BOOL_DESCR = np.dtype(np.bool_)
cdef cnp.dtype _UINT8_DESCR = np.dtype(np.uint8)
cdef cnp.dtype _INT64_DESCR = np.dtype(np.int64)
cdef cnp.dtype _RESIDENT_DESCR = _types.RESIDENT_DTYPE


cdef class _RowMemory(_CoreMemory):
    """The resident rows' memory: ``_CoreMemory`` (allocated once, freed with its owner) that
    exports a writable buffer, since ``residents`` is writable.

    NumPy cannot resize an array over it (the array does not own its data) and it has no resize
    of its own, so no caller can move the rows from under ``t.rows``; NumPy owns no array the
    ledger keeps (``.base.resize(..., refcheck=False)`` would otherwise free them)."""

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.size, 0, flags)  # 0: writable


cdef _CoreMemory _int64_memory(int32_t n, int64_t** data):
    """Memory for ``n`` int64 zeros that only the C writes (Python can only read it); ``data``
    gets its pointer."""
    cdef _CoreMemory memory = _CoreMemory(max(n, 1) * <Py_ssize_t>sizeof(int64_t))
    data[0] = <int64_t*>memory.data
    return memory


cdef inline double now_of(object now) except? -1.0:
    """``now`` as ``as_time`` checks it, without its Python call for the loop's own float."""
    if type(now) is float and isfinite(<double>now):
        return <double>now
    return as_time("now", now)


cdef inline bint _intact(object view, object descr, Py_ssize_t n, const void* data,
                         bint writable) noexcept:
    """Whether a kept view still is what ``_view`` made: a caller holding it may have set its
    dtype, shape, strides or flags (it is one object for every caller)."""
    cdef cnp.ndarray arr = <cnp.ndarray>view
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_DIM(arr, 0) == n
            and <void*>cnp.PyArray_DESCR(arr) == <void*>descr
            and cnp.PyArray_STRIDE(arr, 0) == cnp.PyArray_ITEMSIZE(arr)
            and cnp.PyArray_DATA(arr) == data and cnp.PyArray_ISALIGNED(arr)
            and cnp.PyArray_ISWRITEABLE(arr) == writable)


cdef object _view(list cache, object memory, object descr, int32_t n, const void* data,
                  bint writable):
    """The first ``n`` items of ``memory`` as a 1-D array of ``descr``, made once per length and
    kept, so that the per-step properties allocate nothing once the lengths a run visits have
    been seen. Made from the memory itself, so its ``.base`` leads to no array the ledger
    keeps; a kept view a caller has changed is replaced, never handed out again. The ledger
    reads its own state from its C pointers, never through these."""
    view = cache[n]
    if view is None or not _intact(view, descr, n, data, writable):
        view = np.frombuffer(memory, dtype=descr, count=n)
        cache[n] = view
    return view


@cython.final
cdef class Ledger:
    """Dense resident table, waiting queue and output accounting for one engine, in C.

    See ``stepplanner.ledger`` for the surface and the decisions; ``_ledger_py.Ledger`` is
    the pure-Python twin held to it by the tests. Every method that reads or writes the queue or
    the rows holds the ledger's lock for the whole call (see ``_acquire``): ``submit`` and
    ``cancel`` wait for it from any thread; the other calls are the serving loop's.
    """

    cdef QueueC q
    cdef IdMapC m
    cdef TableC t
    cdef uint64_t next_arrival
    cdef bint stamps_exhausted      # load() gave arrival 2**64 - 1: no stamp is left
    cdef _RowMemory _rows           # the memory of t.rows (the writable residents)
    cdef _CoreMemory _ids, _generated, _finished, _admitted   # memory only the C writes
    cdef _CoreMemory _relegated_memory
    cdef list _rows_views, _ids_views, _generated_views, _finished_views, _admitted_views
    cdef list _relegated_views, _shed_views
    cdef _CoreMemory _shed_memory
    cdef DeadlineC d                # the rank pass's policy and step-time estimate
    cdef AdaptersC a                # LoRA: the most distinct adapters the residents hold
    cdef StarvationC s              # uncached first: the starvation bound (ring NULL: off)
    cdef dict _classes              # slo_classes: priority -> SLO
    cdef object _policy_name
    cdef object _pending            # the plan of step() not yet applied, or None
    cdef uint64_t _pending_version  # its version when step() returned it (a compiled plan)
    cdef object _foreign_version    # the same for a plan of another class (plan_version)
    cdef bint _initialised          # __init__ ran (a second call is refused)
    cdef object _fits               # the last planner step() found made for these limits
    cdef PlanC _foreign             # a reference StepPlan's rows, seen as the C plan struct
    cdef object _foreign_arrays     # the arrays _foreign points into
    cdef int32_t* _accepted         # apply's accepted counts, read once (B entries)
    cdef uint8_t* _mask_copy        # the sampler's mask, read once (B entries)
    cdef object _drafts             # step()'s drafts per row: int32, capacity long
    cdef readonly object limits
    cdef readonly bint by_priority
    cdef readonly int32_t reserved_slots
    cdef readonly int32_t max_waiting
    cdef readonly object page_table  # the KVPageTable whose pages follow the rows, or None
    cdef PageTableC* pages           # its C table (NULL: none); page_table keeps it alive
    cdef int64_t max_tokens          # with pages: the most prompt + max_new_tokens a row holds
    cdef PyThread_type_lock _lock   # held by every call that reads or writes the state
    cdef unsigned long _holder      # the thread holding _lock (0: none): see _acquire
    cdef int _busy                  # the holder is a CALL_BUSY call (runs caller code)

    def __cinit__(self, limits, policy=None, *, max_waiting=None, page_table=None,
                  slo_classes=None, step_time=None, relegated_wait=None,
                  never_relegate_below=_NEVER_RELEGATE_BELOW, max_loras=None,
                  admission=AdmissionOrder.ARRIVAL, starvation_steps=None,
                  starvation_seconds=None):
        (self.by_priority, self.reserved_slots, self.max_waiting), deadlines, relegation, loras, \
            (order_by, after, by_seconds) = check_constructor(
                limits, policy, max_waiting, slo_classes, step_time, relegated_wait,
                never_relegate_below, max_loras, admission, starvation_steps, starvation_seconds)
        self.a.most = loras
        self._classes = set_deadlines(&self.d, limits, deadlines, relegation)
        self._policy_name = policy.scheduling_policy.name if policy is not None else "FCFS"
        cdef PageTableC* pages
        if page_table is not None:
            # The compiled table only: the C below grows, releases and moves its slots directly.
            check_page_table(page_table, limits, (KVPageTable,), "a stepplanner.kv._kv.KVPageTable",
                             geometry)
            pages = &(<KVPageTable>page_table).c
            self.page_table = page_table
            self.pages = pages
            self.max_tokens = min(<int64_t>min(pages.max_pages, pages.num_pages) * pages.page_size,
                                  <int64_t>INT32_MAX)
        self.limits = limits
        cdef int32_t b = limits.max_batch_size, w = self.max_waiting
        self._rows = _RowMemory(b * <Py_ssize_t>sizeof(ResidentC))
        self.t.rows = <ResidentC*>self._rows.data
        # What the C indexes by (ids key the id map) lives in memory Python can only read: no
        # view of it, nor its .base, can be made writable.
        self._ids = _int64_memory(b, &self.t.ids)
        self._generated = _int64_memory(b, &self.t.generated)
        self._finished = _int64_memory(b, &self.t.finished)
        self._admitted = _int64_memory(b, &self.t.admitted)
        self._relegated_memory = _int64_memory(b + w, &self.t.relegated_ids)
        self._shed_memory = _int64_memory(2 * w, &self.q.shed)
        memset(self.t.ids, 0xFF, b * sizeof(int64_t))  # every id -1
        self.t.capacity = b
        self.t.reserved_slots = self.reserved_slots
        self.t.max_new = <int64_t*>PyMem_Calloc(b, sizeof(int64_t))
        self.t.done = <uint8_t*>PyMem_Calloc(b, sizeof(uint8_t))
        self.t.mark = <uint8_t*>PyMem_Calloc(b, sizeof(uint8_t))
        self.t.cancelled = <uint8_t*>PyMem_Calloc(b, sizeof(uint8_t))
        self.t.first_due = <double*>PyMem_Calloc(b, sizeof(double))
        self.t.gap = <double*>PyMem_Calloc(b, sizeof(double))
        self.t.due = <double*>PyMem_Calloc(b, sizeof(double))
        self.t.stamp = <uint64_t*>PyMem_Calloc(b, sizeof(uint64_t))
        self.t.klass = <int32_t*>PyMem_Calloc(b, sizeof(int32_t))
        self.t.relegated = <uint8_t*>PyMem_Calloc(b, sizeof(uint8_t))
        self._accepted = <int32_t*>PyMem_Calloc(b, sizeof(int32_t))  # a plan has <= B rows
        self._mask_copy = <uint8_t*>PyMem_Calloc(b, sizeof(uint8_t))
        self.t.lora = <int64_t*>PyMem_Calloc(b, sizeof(int64_t))
        if self.a.most:
            # One past what the residents can hold: held_back's walk with every row taken may
            # join one more adapter before it stops (admission never does).
            self.a.held = <int64_t*>PyMem_Calloc(min(self.a.most, b) + 1, sizeof(int64_t))
            self.a.parked_held = <int64_t*>PyMem_Calloc(max(min(self.a.most, b), 1),
                                                        sizeof(int64_t))
            self.a.parked = <int32_t*>PyMem_Calloc(max(w, 1), sizeof(int32_t))
        self._lock = PyThread_allocate_lock()
        self.q.capacity = w
        self.q.pool = <WaitingC*>PyMem_Calloc(max(w, 1), sizeof(WaitingC))
        self.q.free = <int32_t*>PyMem_Calloc(max(w, 1), sizeof(int32_t))
        self.q.heaps[HEAP_NORMAL].slots = <int32_t*>PyMem_Calloc(max(w, 1), sizeof(int32_t))
        self.q.heaps[HEAP_URGENT].slots = <int32_t*>PyMem_Calloc(max(w, 1), sizeof(int32_t))
        self.q.heaps[HEAP_LOSING].slots = <int32_t*>PyMem_Calloc(max(w, 1), sizeof(int32_t))
        self.q.scratch = PyMem_Calloc(max(w, 1), sizeof(StampedSlot))
        self.q.earliest_due = INFINITY
        cdef bint uncached = order_by == AdmissionOrder.UNCACHED_FIRST
        if uncached:
            self.s.capacity = 2 * max(w, 1)
            self.s.ring = <int32_t*>PyMem_Calloc(self.s.capacity, sizeof(int32_t))
            self.s.stamps = <uint64_t*>PyMem_Calloc(self.s.capacity, sizeof(uint64_t))
            self.s.after = after
            self.s.by_seconds = by_seconds
            self.s.latest = -INFINITY
            self.s.by_slack = self.d.ranking != RANK_NONE
            self.s.risk_min = INFINITY
            self.s.risk_est = step_estimate(&self.d)
        # DEADLINE admits by class, then first-token deadline: which class gets a slot is the
        # operator's call; what runs in a step is the deadlines' (rank_rows). Uncached first
        # orders the requests with slack to spare within that (lose_slack).
        cdef int32_t order = (ORDER_CLASS_DEADLINE_UNCACHED if uncached
                              and self.d.ranking == RANK_DEADLINE
                              else ORDER_EDF_UNCACHED if uncached and self.d.ranking == RANK_EDF
                              else ORDER_CLASS_DEADLINE if self.d.ranking == RANK_DEADLINE
                              else ORDER_DEADLINE if self.d.ranking == RANK_EDF
                              else ORDER_PRIORITY_UNCACHED if uncached and self.by_priority
                              else ORDER_UNCACHED if uncached
                              else ORDER_PRIORITY if self.by_priority else ORDER_FCFS)
        self.q.heaps[HEAP_NORMAL].order = order
        self.q.heaps[HEAP_URGENT].order = order
        self.q.heaps[HEAP_LOSING].order = ORDER_SHED
        cdef uint64_t slots = 8
        while slots < 2 * (<uint64_t>b + <uint64_t>w):
            slots <<= 1
        self.m.mask = slots - 1
        self.m.keys = <int64_t*>PyMem_Calloc(slots, sizeof(int64_t))
        self.m.values = <int32_t*>PyMem_Calloc(slots, sizeof(int32_t))
        self.m.used = <uint8_t*>PyMem_Calloc(slots, sizeof(uint8_t))
        if self._lock == NULL:
            raise MemoryError("the ledger's lock could not be allocated")
        if (self.t.max_new == NULL or self.t.done == NULL or self.t.mark == NULL
                or self.t.cancelled == NULL or self.t.first_due == NULL or self.t.gap == NULL
                or self.t.due == NULL
                or self.t.stamp == NULL or self.t.relegated == NULL or self.t.klass == NULL
                or self.t.lora == NULL or self._accepted == NULL or self._mask_copy == NULL
                or (self.a.most and (self.a.held == NULL or self.a.parked == NULL
                                     or self.a.parked_held == NULL))
                or self.q.pool == NULL or self.q.free == NULL
                or self.q.heaps[0].slots == NULL or self.q.heaps[1].slots == NULL
                or self.q.heaps[2].slots == NULL or self.q.scratch == NULL
                or (uncached and (self.s.ring == NULL or self.s.stamps == NULL))
                or self.m.keys == NULL or self.m.values == NULL or self.m.used == NULL):
            raise _errors.StepPlannerMemoryError(
                f"max_waiting={w} and max_batch_size={b}: the ledger's queue and "
                "id map could not be allocated; allowed: a smaller max_waiting")
        cdef int32_t i
        for i in range(w):
            self.q.free[i] = w - 1 - i
        self.q.num_free = w
        self._rows_views = [None] * (b + 1)
        self._ids_views = [None] * (b + 1)
        self._generated_views = [None] * (b + 1)
        self._finished_views = [None] * (b + 1)
        self._admitted_views = [None] * (b + 1)
        self._relegated_views = [None] * (b + w + 1)
        self._shed_views = [None] * (2 * w + 1)
        for i in range(b):
            self.t.first_due[i] = INFINITY
            self.t.due[i] = INFINITY

    def __init__(self, limits, policy=None, *, max_waiting=None, page_table=None,
                 slo_classes=None, step_time=None, relegated_wait=None,
                 never_relegate_below=_NEVER_RELEGATE_BELOW, max_loras=None,
                 admission=AdmissionOrder.ARRIVAL, starvation_steps=None,
                 starvation_seconds=None):
        # Everything was checked and allocated by __cinit__; a second call would leave the old
        # limits, rows and queue under new arguments, so it is refused (as KVPageTable does).
        if self._initialised:
            raise _errors.already_initialised("Ledger")
        self._initialised = True

    def __dealloc__(self):
        PyMem_Free(self.t.max_new)
        PyMem_Free(self.t.done)
        PyMem_Free(self.t.mark)
        PyMem_Free(self.t.cancelled)
        PyMem_Free(self.t.first_due)
        PyMem_Free(self.t.gap)
        PyMem_Free(self.t.due)
        PyMem_Free(self.t.stamp)
        PyMem_Free(self.t.klass)
        PyMem_Free(self.t.relegated)
        PyMem_Free(self.t.lora)
        PyMem_Free(self._accepted)
        PyMem_Free(self._mask_copy)
        PyMem_Free(self.a.held)
        PyMem_Free(self.a.parked)
        PyMem_Free(self.a.parked_held)
        if self._lock != NULL:
            PyThread_free_lock(self._lock)
        PyMem_Free(self.q.pool)
        PyMem_Free(self.q.free)
        PyMem_Free(self.q.heaps[0].slots)
        PyMem_Free(self.q.heaps[1].slots)
        PyMem_Free(self.q.heaps[2].slots)
        PyMem_Free(self.q.scratch)
        PyMem_Free(self.s.ring)
        PyMem_Free(self.s.stamps)
        PyMem_Free(self.m.keys)
        PyMem_Free(self.m.values)
        PyMem_Free(self.m.used)

    # --- views ------------------------------------------------------------------------------

    @property
    def capacity(self):
        return self.t.capacity

    @property
    def count(self):
        return self.t.count

    @property
    def free_slots(self):
        return self.t.capacity - self.t.count

    @property
    def waiting(self):
        return self.q.capacity - self.q.num_free

    @property
    def max_loras(self):
        """The most distinct LoRA adapters the residents hold (None: no limit)."""
        return self.a.most or None

    @property
    def relegated_waiting(self):
        """Of ``waiting``, the requests relegated in the queue (DEADLINE): each is handed back
        once its wait is over, or when a request that can still make it needs its place."""
        return self.q.heaps[HEAP_LOSING].size

    @property
    def residents(self):
        """Rows ``0..count-1`` as a writable view: what ``planner.plan()`` reads in place."""
        return _view(self._rows_views, self._rows, _RESIDENT_DESCR, self.t.count, self.t.rows,
                     True)

    @property
    def request_ids(self):
        """The request id of each resident row (read-only view)."""
        return _view(self._ids_views, self._ids, _INT64_DESCR, self.t.count, self.t.ids, False)

    @property
    def output_tokens(self):
        """Tokens each resident has emitted (read-only view)."""
        return _view(self._generated_views, self._generated, _INT64_DESCR, self.t.count,
                     self.t.generated, False)

    @property
    def finished_ids(self):
        """Ids the last ``apply``/``step`` marked finished, in plan order (read-only view)."""
        return _view(self._finished_views, self._finished, _INT64_DESCR, self.t.num_finished,
                     self.t.finished, False)

    @property
    def admitted_ids(self):
        """Ids the last ``admit``/``step`` admitted, in queue order (read-only view)."""
        return _view(self._admitted_views, self._admitted, _INT64_DESCR, self.t.num_admitted,
                     self.t.admitted, False)

    @property
    def relegated_ids(self):
        """Ids the last ``step``/``admit``/``apply``/``rank`` relegated (DEADLINE: they can no
        longer meet their objectives), in the order it did (read-only view)."""
        return _view(self._relegated_views, self._relegated_memory, _INT64_DESCR,
                     self.t.num_relegated, self.t.relegated_ids, False)

    @property
    def shed_ids(self):
        """Ids the last ``step``/``admit`` handed back (DEADLINE: relegated requests whose
        wait ran out, or whose queue place a viable request took in a ``submit`` since the
        call before), in the order it did; the runtime answers them now (read-only view)."""
        return _view(self._shed_views, self._shed_memory, _INT64_DESCR, self.q.num_reported,
                     self.q.shed, False)

    @property
    def step_time_estimate(self):
        """The seconds the rank pass expects a step to take (``step_time``, or measured)."""
        return step_estimate(&self.d)

    cdef object _own_rows(self):
        """Rows ``0..count-1`` as a new array no caller holds, for the ledger's own reads."""
        return np.frombuffer(self._rows, dtype=_RESIDENT_DESCR, count=self.t.count)

    @property
    def reserved_pages(self):
        """Pages the residents' worst cases hold (0 without a page table)."""
        if self.pages == NULL:
            return 0
        return self.pages.num_pages - self.pages.num_free

    @property
    def held_back(self):
        """Requests waiting for pages: all of ``waiting`` when the request admission takes next
        (with ``max_loras``: the first whose adapter can join) needs more pages than are free
        (nothing overtakes it), else 0."""
        if self.pages == NULL:
            return 0  # nothing waits for pages: a view, read without the lock (as the twin)
        self._acquire(CALL_QUIET)  # the queue's heads move under a submit from another thread
        try:
            return self._held_back()
        finally:
            self._release()

    cdef int32_t _held_back(self) noexcept:
        # The request admission takes next is the first whose adapter can join: the ones
        # before it are parked for the walk (as admission would) and put back after it, so
        # that a read leaves the queue as it was (under DEADLINE nothing stays parked).
        cdef int32_t h, k, slot, held = 0, parked_before
        cdef bint adapters = False  # self.a.held is filled when first needed, as in admission
        cdef WaitingC* w
        if self.a.num_parked:
            hold_adapters_and_unpark(&self.a, &self.q, &self.t)  # as the next admission will
            adapters = True
        parked_before = self.a.num_parked
        while True:
            h = next_heap(&self.q, self.t.capacity - self.t.count, self.t.reserved_slots)
            if h < 0:
                break
            slot = self.q.heaps[h].slots[0]
            w = &self.q.pool[slot]
            if self.a.most and w.lora:
                if not adapters:
                    hold_resident_adapters(&self.a, &self.t)
                    adapters = True
                if not adapter_joins(&self.a, w.lora):
                    park(&self.a, &self.q, slot)
                    continue
            if worst_case(w, self.pages) > self.pages.num_free:
                held = self.q.capacity - self.q.num_free
            break
        for k in range(parked_before, self.a.num_parked):
            heap_push(&self.q, self.a.parked[k])
        self.a.num_parked = parked_before
        return held

    def kv_pages_in_use(self):
        """Pages that hold committed KV now: ``sum(ceil(committed / kv_page_size))``."""
        return pages_in_use(self._own_rows()["committed"], self.limits.kv_page_size)

    def __repr__(self):
        return (f"Ledger(count={self.count}, capacity={self.capacity}, waiting={self.waiting}, "
                f"max_waiting={self.max_waiting}, reserved_slots={self.reserved_slots}, "
                f"order={self._order_name()})")

    def _order_name(self):
        if self.d.ranking != RANK_NONE:
            return self._policy_name
        return "PRIORITY" if self.by_priority else "FCFS"

    cdef int _acquire(self, int kind) except -1:
        """Take the ledger's lock for one call, which releases it with ``_release``.

        The lock is held for the whole call, caller code included (an argument's ``__index__``/
        ``__array__``/``__getitem__``, a planner), so no call sees state another call has half
        changed. A call that finds it held:

        * by its own thread is a re-entry from code the ledger runs: refused, whatever the call
          (waiting would deadlock), and the outer call goes on from the state it read;
        * by another thread: ``submit``/``cancel`` (``CALL_GUEST``) wait for it, with the GIL
          released, however long the call runs; the serving loop's calls wait for a call that
          runs no caller code (a ``submit``, an ``admit``), and are refused while one that runs
          caller code is under way (``CALL_BUSY``: a ``step`` planning), as they always were:
          only one thread drives the loop.

        ``_holder`` and ``_busy`` are read without the lock: a thread compares ``_holder`` with
        its own id, which only it writes, and a stale ``_busy`` makes a loop call wait where it
        could have been refused (or be refused as the other call ends), never corrupt anything."""
        cdef unsigned long me = PyThread_get_thread_ident()
        if not PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            if sp_load_ident(&self._holder) == me or (
                    kind != CALL_GUEST and sp_load_flag(&self._busy)):
                raise _errors.ledger_reentered()
            with nogil:
                PyThread_acquire_lock(self._lock, WAIT_LOCK)
        sp_store_ident(&self._holder, me)
        sp_store_flag(&self._busy, kind == CALL_BUSY)
        return 0

    cdef void _release(self) noexcept:
        sp_store_flag(&self._busy, 0)
        sp_store_ident(&self._holder, 0)
        PyThread_release_lock(self._lock)

    # --- admission ----------------------------------------------------------------------------

    @cython.critical_section
    def submit(self, request_id, prompt_length, priority=0, max_new_tokens=None, *,
               arrival_time=None, slo=None, lora_id=0, cached_tokens=0):
        """Queue a request; returns its arrival stamp. Safe from any thread: it waits for the
        call under way (see ``_acquire``)."""
        self._acquire(CALL_GUEST)
        try:
            return self._submit(request_id, prompt_length, priority, max_new_tokens,
                                arrival_time, slo, lora_id, cached_tokens)
        finally:
            self._release()

    cdef object _submit(self, object request_id, object prompt_length, object priority,
                        object max_new_tokens, object arrival_time, object slo,
                        object lora_id, object cached_tokens):
        cdef int64_t rid, limit = 0, lora
        cdef int32_t length, prio
        if (type(request_id) is int and type(prompt_length) is int and type(priority) is int
                and (max_new_tokens is None or type(max_new_tokens) is int)
                and -2**63 <= request_id < 2**63 and 1 <= prompt_length <= self.limits.max_input_length
                and -2**31 <= priority < 2**31
                and (max_new_tokens is None or 1 <= max_new_tokens < 2**63)):
            rid, length, prio = request_id, prompt_length, priority
            if max_new_tokens is not None:
                limit = max_new_tokens
        else:  # the shared checks raise the shared messages (and may run caller code)
            rid, length, prio, limit = submission(request_id, prompt_length, priority,
                                                  max_new_tokens, self.limits.max_input_length)
        lora = lora_id if type(lora_id) is int and 0 <= lora_id < 2**63 else as_lora_id(lora_id)
        cdef int32_t cached = (cached_tokens if type(cached_tokens) is int
                               and 0 <= cached_tokens <= length
                               else as_cached_tokens(cached_tokens, length))
        cdef double since = 0.0
        if self.s.ring != NULL:
            if not self.s.by_seconds:
                since = self.s.passes
            elif arrival_time is None:
                raise _errors.arrival_time_for_starvation(rid)
            else:  # the ring's order: each request's time raised to the latest before it
                since = max(as_time("arrival_time", arrival_time), self.s.latest)
        cdef double due = INFINITY, gap = 0.0, ttft = INFINITY
        if slo is not None or arrival_time is not None or self._classes:
            due, gap, ttft = request_deadlines(rid, prio, arrival_time, slo, self._classes)
        if self.pages != NULL and (limit == 0 or limit > self.max_tokens - length):
            # raises the shared message, over the sizes the C uses
            check_worst_case(rid, length, limit, geometry(self.page_table))
        if map_find(&self.m, rid) >= 0:
            raise _errors.duplicate_request(rid)
        if self.q.num_free == 0 and not self._may_shed(prio, length, ttft):
            raise _errors.queue_full(rid, self.max_waiting)
        if self.stamps_exhausted:
            raise _errors.stamps_exhausted(rid)
        if self.q.num_free == 0:  # a relegated request gives its place up (_may_shed)
            shed_slot(&self.q, &self.m, self.q.heaps[HEAP_LOSING].slots[0])
        cdef uint64_t arrival = self.next_arrival
        if arrival == UINT64_MAX_:
            self.stamps_exhausted = True
        else:
            self.next_arrival += 1
        self.q.num_free -= 1
        cdef int32_t slot = self.q.free[self.q.num_free]
        cdef WaitingC* w = &self.q.pool[slot]
        w.request_id = rid
        w.arrival = arrival
        w.max_new_tokens = limit
        w.priority = prio
        w.prompt_length = length
        w.first_due = due
        w.gap = gap
        w.wait = ttft if isnan(self.d.relegated_wait) else self.d.relegated_wait
        w.shed_at = INFINITY
        w.lora = lora
        w.work = length - cached
        w.since = since
        if self.s.ring != NULL:
            self.s.latest = since
            ring_push(&self.q, &self.m, &self.s, slot)
            if self.s.by_slack:
                note_slack(&self.s, &self.d, w)
        if due < self.q.earliest_due and prio >= self.d.never_below:
            self.q.earliest_due = due
        w.heap = HEAP_URGENT if prio < 0 else HEAP_NORMAL
        heap_push(&self.q, slot)
        map_set(&self.m, rid, slot)
        return arrival

    cdef bint _may_shed(self, int32_t prio, int32_t length, double ttft) noexcept:
        """Whether a full queue makes room for a new request by shedding a relegated one: only
        for a request that can still make its first token (served at once on arrival), never
        for one that would be relegated itself."""
        if self.q.heaps[HEAP_LOSING].size == 0:
            return False
        return (self.d.ranking != RANK_DEADLINE or prio < self.d.never_below
                or not too_late(&self.d, length, ttft, 0.0))

    @cython.critical_section
    def cancel(self, request_id):
        """Remove a request wherever it is: out of the queue (O(log n)) or out of its row; a
        resident of the pending ``step`` plan leaves with that plan. Safe from any thread."""
        self._acquire(CALL_GUEST)
        try:
            self._cancel(as_request_id(request_id))  # may run caller code (__index__)
        finally:
            self._release()

    cdef _cancel(self, int64_t rid):
        cdef int64_t at = map_find(&self.m, rid)
        if at < 0:
            raise _errors.not_in_ledger(rid)
        cdef int32_t value = self.m.values[at]
        if value >= 0:
            if self.q.pool[value].position < 0:
                drop_parked(&self.a, &self.q, value)
            else:
                heap_remove(&self.q, value)
            map_delete(&self.m, rid)
            self.q.free[self.q.num_free] = value
            self.q.num_free += 1
            return
        cdef int32_t row = -(value + 1)
        if self._pending is None:
            self._remove([row])
            return
        # The engine may be running the pending plan now, and step(planner, finished) will
        # apply it: the rows stay as they are until then (row indices are the plan's), and this
        # one leaves with it. Marked done, it is never reported finished.
        if self.t.cancelled[row]:
            raise _errors.not_in_ledger(rid)  # cancelled already: as if it had left
        self.t.cancelled[row] = 1
        self.t.num_cancelled += 1
        if not self.t.done[row]:
            self.t.done[row] = 1
            self.t.num_done += 1

    @cython.critical_section
    def admit(self, *, now=None):
        """Move waiting requests into free slots in queue order; returns the admitted ids."""
        self._acquire(CALL_QUIET)
        try:
            when = admission_now("admit", now, self.d.ranking, RANK_DEADLINE, self.s.by_seconds)
            self._pending = None
            if self.t.num_cancelled:
                self._remove_marked(self.t.cancelled, self.t.num_cancelled)
            self.t.num_relegated = 0
            self._admit_waiting(NAN if when is None else when)
            return self.admitted_ids.tolist()
        finally:
            self._release()

    @cython.critical_section
    def waiting_ids(self):
        """Waiting request ids in queue order (for reports; O(n log n))."""
        self._acquire(CALL_QUIET)  # submit/cancel from another thread wait until it has read
        try:
            return self._waiting_ids()
        finally:
            self._release()

    cdef list _waiting_slots(self):
        """Every waiting request's pool slot: the heaps', then the parked ones."""
        cdef int32_t h, k
        slots = []
        for h in range(3):
            for k in range(self.q.heaps[h].size):
                slots.append(self.q.heaps[h].slots[k])
        for k in range(self.a.num_parked):
            slots.append(self.a.parked[k])
        return slots

    cdef list _waiting_ids(self):
        cdef int32_t slot
        cdef WaitingC* w
        entries = []
        for slot in self._waiting_slots():
            w = &self.q.pool[slot]
            if w.heap == HEAP_LOSING:
                entries.append(((True, w.shed_at, w.arrival), w.request_id))
            elif self.s.by_slack:  # uncached first under EDF/DEADLINE: the heaps' key
                if w.work < 0:
                    within = (0, w.first_due, w.arrival)
                else:
                    within = (1, w.work, w.arrival)
                if self.d.ranking == RANK_DEADLINE:
                    entries.append(((False, w.priority) + within, w.request_id))
                else:
                    entries.append(((False,) + within, w.request_id))
            elif self.d.ranking == RANK_DEADLINE:
                entries.append(((False, w.priority, w.first_due, w.arrival), w.request_id))
            elif self.d.ranking == RANK_EDF:
                entries.append(((False, w.first_due, w.arrival), w.request_id))
            elif self.s.ring != NULL:  # uncached first: the heaps' key (-1 work: starved)
                if self.by_priority:
                    entries.append(((w.priority, w.work, w.arrival), w.request_id))
                else:
                    entries.append(((w.work, w.arrival), w.request_id))
            elif self.by_priority:
                entries.append(((w.priority, w.arrival), w.request_id))
            else:
                entries.append(((w.arrival,), w.request_id))
        entries.sort()
        return [rid for _, rid in entries]

    # --- the step -----------------------------------------------------------------------------

    @cython.critical_section
    def apply(self, plan, finished=None, *, accepted=None, retire=False, now=None):
        """Advance the residents by ``plan`` (SPEC §6), count each emitted token, mark finished
        requests; with ``retire`` also remove them. ``accepted``: per plan row, the drafts the
        runtime accepted of those a decode row verified (SPEC §8; None: all). Returns
        ``finished_ids``."""
        cdef const uint8_t* mask = NULL
        cdef const int32_t* acc = NULL
        cdef const PlanC* p
        self._acquire(CALL_BUSY)
        try:
            when = optional_now("apply", now, self.d.ranking, RANK_DEADLINE)
            p = self._check_apply(plan, finished, accepted, &mask, &acc)
            self.t.num_relegated = 0
            self._apply(plan, p, mask, acc, retire, NAN if when is None else when)
            return self.finished_ids
        finally:
            self._release()

    cdef const PlanC* _plan_struct(self, object plan) except NULL:
        """The plan as the C struct: a compiled plan's own, or a view of a reference plan's
        arrays (SEQUENCE_DTYPE has SequenceC's layout)."""
        if isinstance(plan, StepPlan):
            return &(<StepPlan>plan).c
        if not isinstance(plan, plan_classes()):  # a duck-typed plan could name any row
            raise _errors.plan_type(plan, "StepPlan")
        n = plan.num_residents
        # Copies, flat and C-ordered: apply_to() runs caller code before account() reads them.
        seq = np.array(plan.as_array(), dtype=_types.SEQUENCE_DTYPE, order="C").reshape(-1)
        paused = np.array(plan.paused_array(), dtype=np.int32, order="C").reshape(-1)
        if len(seq) > INT32_MAX or len(paused) > INT32_MAX:  # then _check_plan_rows refuses it
            seq, paused = seq[:INT32_MAX], paused[:INT32_MAX]
        self._foreign_arrays = (seq, paused)
        self._foreign.sequences = <SequenceC*>cnp.PyArray_DATA(seq)
        self._foreign.paused = <int32_t*>cnp.PyArray_DATA(paused)
        self._foreign.num_paused = len(paused)
        self._foreign.num_residents = n
        # The ledger reads rows 0..num_prefill + num_decode - 1 and never the split.
        self._foreign.num_prefill = 0
        self._foreign.num_decode = len(seq)
        return &self._foreign

    cdef const PlanC* _check_apply(self, object plan, object finished, object accepted,
                                   const uint8_t** mask, const int32_t** acc) except NULL:
        cdef const PlanC* p = self._plan_struct(plan)
        if p.num_residents != self.t.count:
            raise _errors.plan_count(p.num_residents, self.t.count)
        self._check_plan_rows(p)
        if self.pages != NULL:
            self._check_reserved(p)
        cdef int32_t rows = p.num_prefill + p.num_decode, k, r
        cdef cnp.ndarray arr
        if finished is not None:
            if (not cnp.PyArray_Check(finished)
                    or (<cnp.ndarray>finished).descr.type_num != cnp.NPY_BOOL):
                raise _errors.finished_type(finished)
            arr = <cnp.ndarray>finished
            if arr.ndim != 1 or cnp.PyArray_DIM(arr, 0) != rows:
                raise _errors.finished_shape((<object>arr).shape, rows)
            # Read once, into the ledger's own bytes: the mask may be a view of memory that
            # applying the plan or counting its tokens writes (the residents' rows).
            self._copy_mask(<const char*>cnp.PyArray_DATA(arr), cnp.PyArray_STRIDE(arr, 0), rows)
            for k in range(rows):
                if self._mask_copy[k] and not p.sequences[k].select_last_token_logits:
                    raise _errors.finished_without_token(k, p.sequences[k].resident)
            mask[0] = self._mask_copy
        if accepted is not None:
            acc[0] = self._check_accepted(p, accepted)
        k = self._first_past_max_new(p, acc[0])
        if k >= 0:
            r = p.sequences[k].resident
            raise _errors.emitted_past_max_new(
                k, self.t.ids[r], emitted(&p.sequences[k], acc[0], k), self.t.generated[r],
                self.t.max_new[r])
        return p

    cdef void _copy_mask(self, const char* data, Py_ssize_t stride, int32_t rows) noexcept:
        cdef int32_t k
        if stride == 1:
            memcpy(self._mask_copy, data, rows)  # account() reads a flag as != 0
            return
        for k in range(rows):
            self._mask_copy[k] = data[k * stride]

    cdef const int32_t* _check_accepted(self, const PlanC* p, object accepted) except? NULL:
        """SPEC §8's accepted counts, one per plan row, each within what the row verified:
        native int32 only (another byte order is refused, never read as native), read once into
        the ledger's own buffer, which the checks, the rejected drafts and the accounting read
        (``accepted`` may be a view of the rows that applying the plan writes)."""
        cdef int32_t rows = p.num_prefill + p.num_decode, k, most, a
        cdef const SequenceC* s
        if (not cnp.PyArray_Check(accepted)
                or (<cnp.ndarray>accepted).descr.type_num != cnp.NPY_INT32
                or not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>accepted)):
            raise _errors.accepted_type(accepted)
        if (<cnp.ndarray>accepted).ndim != 1 or cnp.PyArray_DIM(<cnp.ndarray>accepted, 0) != rows:
            raise _errors.accepted_shape((<object>accepted).shape, rows)
        cdef const char* data = <const char*>cnp.PyArray_DATA(<cnp.ndarray>accepted)
        cdef Py_ssize_t stride = cnp.PyArray_STRIDE(<cnp.ndarray>accepted, 0)
        cdef int32_t* acc = self._accepted
        for k in range(rows):  # memcpy: the array may be unaligned
            memcpy(&acc[k], data + k * stride, sizeof(int32_t))
        for k in range(rows):
            s = &p.sequences[k]
            most = s.query_length - 1 if s.work == WORK_DECODE else 0
            a = acc[k]
            if a < 0 or a > most:
                raise _errors.accepted_range(k, s.resident, a, most)
        return acc

    cdef int32_t _first_past_max_new(self, const PlanC* p, const int32_t* acc) noexcept:
        """The first plan row whose tokens would take its request past max_new_tokens, or -1.
        Only a row verifying drafts can (any other emits at most one token, and a request not
        done has one left), so a plan without drafts costs nothing."""
        cdef int32_t k, r
        cdef const SequenceC* s
        if not plan_drafted(p, &self._foreign):
            return -1
        for k in range(p.num_prefill + p.num_decode):
            s = &p.sequences[k]
            if s.work != WORK_DECODE or s.query_length == 1:
                continue
            r = s.resident
            if (not self.t.done[r] and self.t.max_new[r] > 0
                    and self.t.generated[r] + emitted(s, acc, k) > self.t.max_new[r]):
                return k
        return -1

    cdef void _admit_waiting(self, double now):
        # The table's own methods hold its critical section; so does the ledger while its C
        # changes the table, so that another thread's ensure or release cannot interleave with
        # it on a free-threaded build (a no-op under the GIL).
        if self.pages == NULL:
            admit_waiting(&self.q, &self.t, &self.m, NULL, &self.d, &self.a, now, &self.s,
                          &self.next_arrival)
        else:
            with cython.critical_section(self.page_table):
                admit_waiting(&self.q, &self.t, &self.m, self.pages, &self.d, &self.a, now,
                              &self.s, &self.next_arrival)

    cdef void _remove_marked(self, uint8_t* mark, int32_t num_marked):
        """Swap-remove the marked rows. Every removal takes the cancelled rows with it (they
        are done, and ``_remove`` marks them), so none is left to move."""
        if self.pages == NULL:
            remove_marked(&self.t, &self.m, NULL, mark, num_marked)
        else:
            with cython.critical_section(self.page_table):  # see _admit_waiting
                remove_marked(&self.t, &self.m, self.pages, mark, num_marked)
        if self.t.num_cancelled:
            memset(self.t.cancelled, 0, self.t.capacity * sizeof(uint8_t))
            self.t.num_cancelled = 0

    cdef int _check_reserved(self, const PlanC* p) except -1:
        cdef int32_t k = first_row_beyond_pages(p, self.pages)
        if k < 0:
            return 0
        cdef const SequenceC* s = &p.sequences[k]
        raise _errors.ledger_pages_exceeded(
            k, s.resident, self.t.ids[s.resident], <int64_t>s.past_length + s.query_length,
            <int64_t>self.pages.counts[s.resident] * self.pages.page_size)

    cdef int _check_plan_rows(self, const PlanC* p) except -1:
        """As ``_shared.plan_rows_in_range``, in its order: sizes, rows, pauses, repeats."""
        cdef int32_t k, rows = p.num_prefill + p.num_decode
        if rows > self.t.count or p.num_paused > self.t.count:
            plan_sizes(rows, p.num_paused, self.t.count)  # raises the shared message
        k = first_row_out_of_range(p, self.t.count)
        if k >= 0:
            raise row_out_of_range(k, p.sequences[k].resident, self.t.count)
        if p != &self._foreign:
            # A compiled plan's pauses and residents were checked where it was made: plan_step
            # builds them in range and distinct, and an unpickled one is refused otherwise.
            return 0
        for k in range(p.num_paused):
            if p.paused[k] < 0 or p.paused[k] >= self.t.count:
                raise _errors.plan_value(f"paused[{k}]", p.paused[k], f"0..{self.t.count - 1}")
        if first_repeated(p, self.t.mark) >= 0:
            raise repeated_resident_error(p)
        return 0

    cdef _apply(self, object plan, const PlanC* p, const uint8_t* mask,
                const int32_t* accepted, bint retire, double now):
        if apply_is_clean(p, &self.t):
            apply_plan(p, &self.t)
        else:  # it raises the matching error, or applies what it accepts
            plan.apply_to(self._own_rows())
            # apply_to() may be a subclass's: account() indexes by the rows only once they are
            # known to be in range again.
            self._check_plan_rows(p)
        self._pending = None
        if accepted != NULL:
            reject_drafts(p, &self.t, accepted)
        account(&self.t, p, mask, accepted, plan_drafted(p, &self._foreign),
                now if self.d.ranking == RANK_DEADLINE else NAN,
                self.d.ranking != RANK_NONE, self.d.never_below)
        self._foreign_arrays = None
        if retire and self.t.num_done:
            self._remove_marked(self.t.done, self.t.num_done)
        elif self.t.num_cancelled:  # they left with the plan they were pending in
            self._remove_marked(self.t.cancelled, self.t.num_cancelled)

    @cython.critical_section
    def retire_finished(self):
        """Remove every resident that an ``apply`` marked finished."""
        self._acquire(CALL_QUIET)
        try:
            self._pending = None
            self._remove_marked(self.t.done, self.t.num_done)
        finally:
            self._release()

    @cython.critical_section
    def step(self, planner, finished=None, *, accepted=None, drafts=None, reasons=None,
             now=None):
        """One call per engine step: apply the plan of the previous ``step`` (with the sampler's
        ``finished`` mask and, with speculative decoding, the ``accepted`` drafts over its rows)
        and retire what finished, admit, rank (EDF, DEADLINE: from ``now``, the runtime's
        clock), then plan, with ``drafts`` (an int for every decoding request, or a mapping
        from request id) capped at each request's max_new_tokens (SPEC §8)."""
        self._acquire(CALL_BUSY)
        try:
            return self._step(planner, finished, accepted, drafts, reasons, now)
        finally:
            self._release()

    @cython.critical_section
    def rank(self, now):
        """Write each row's priority and arrival from its deadlines at ``now`` (what ``step``
        does before it plans); a no-op under FCFS and PRIORITY."""
        self._acquire(CALL_QUIET)
        try:
            when = now_of(now)
            self.t.num_relegated = 0
            if self.d.ranking != RANK_NONE:
                rank_rows(&self.t, &self.d, when)
        finally:
            self._release()

    @cython.critical_section
    def measure(self, now, ran=True):
        """A step (``ran``: one that planned work) ended at ``now``: the measured estimate
        (``step_time=None``) moves towards the time since the previous one. ``step`` does this
        itself; a runtime that plans with ``admit``/``rank``/``apply`` calls it once a step."""
        self._acquire(CALL_QUIET)
        try:
            measure_step(&self.d, now_of(now), bool(ran))
        finally:
            self._release()

    cdef object _step(self, object planner, object finished, object accepted, object drafts,
                      object reasons, object now):
        if planner is not self._fits:  # comparing limits allocates: once per planner
            if getattr(planner, "limits", None) != self.limits:
                raise _errors.planner_mismatch(getattr(planner, "limits", None), self.limits)
            self._fits = planner
        cdef object pending = self._pending
        cdef const uint8_t* mask = NULL
        cdef const int32_t* acc = NULL
        cdef const PlanC* p = NULL
        cdef double when = NAN
        if type(now) is float and isfinite(<double>now):  # the loop's own call: nothing to check
            when = <double>now
        elif now is not None or self.d.ranking != RANK_NONE or self.s.by_seconds:
            when = admission_now("step", now, self.d.ranking, RANK_EDF, self.s.by_seconds)
        proposed = None if drafts is None else draft_request(drafts)
        if pending is None:
            if finished is not None:
                raise _errors.nothing_pending()
            if accepted is not None:
                raise _errors.nothing_pending("accepted")
            # Rows that load() or the caller wrote are checked before anything changes (a
            # pending plan's rows were checked when it was made, and applying keeps them valid).
            if not rows_plannable(&self.t, self.limits.max_input_length):
                planner.plan(self.residents)  # raises the planner's own message for the row
        else:
            # The planner's one plan: if it planned again (for another ledger), it is not the
            # plan that ran. A compiled plan's version is read in C (no int is made per step).
            if isinstance(pending, StepPlan):
                if (<StepPlan>pending).version != self._pending_version:
                    raise _errors.pending_plan_changed()
            else:
                check_pending(pending, self._foreign_version)
            p = self._check_apply(pending, finished, accepted, &mask, &acc)
        if reasons is not None:
            _check_reasons(reasons, self.t.capacity)
        self.t.num_relegated = 0
        if not isnan(when):
            measure_step(&self.d, when, p != NULL and p.num_prefill + p.num_decode > 0)
        if pending is not None:
            self._apply(pending, p, mask, acc, True, when)
        self._admit_waiting(when)
        if self.d.ranking != RANK_NONE:
            rank_rows(&self.t, &self.d, when)
        if proposed is None:
            plan = planner.plan(self.residents, None, reasons)
        else:
            plan = planner.plan(self.residents, None, reasons, self._draft_counts(proposed))
        if isinstance(plan, StepPlan):
            self._pending_version = (<StepPlan>plan).version
        else:
            self._foreign_version = plan_version(plan)
        self._pending = plan
        return plan

    cdef object _draft_counts(self, object proposed):
        """Each row's drafts for this plan (SPEC §8): as proposed, for the requests decoding
        now (an entry for one that is not, a request waiting, prefilling or gone since the
        proposer saw it decode, is passed over), never past the request's max_new_tokens: a row
        verifying g drafts emits up to g + 1 tokens."""
        cdef int32_t r, n = self.t.count, k = 0
        cdef int64_t at, room
        if self._drafts is None:
            self._drafts = np.zeros(self.t.capacity, dtype=np.int32)
        cdef int32_t[::1] out = self._drafts
        cdef bint by_id = isinstance(proposed, dict)
        if by_id:
            out[:n] = 0
            for rid, count in proposed.items():
                at = map_find(&self.m, rid)
                if at >= 0 and self.m.values[at] < 0:
                    out[-(self.m.values[at] + 1)] = count
        else:
            k = proposed
        for r in range(n):
            if not self.t.rows[r].context_committed:  # a mapping's entry or the int alike
                out[r] = 0
                continue
            if not by_id:
                out[r] = k
            if self.t.max_new[r] > 0:
                room = max(self.t.max_new[r] - self.t.generated[r] - 1, 0)
                if out[r] > room:
                    out[r] = <int32_t>room
        return self._drafts[:n]

    @cython.critical_section
    def retire(self, request_ids):
        """Remove requests by id; the last rows move into the freed slots."""
        self._acquire(CALL_BUSY)
        try:
            self._retire(request_ids)
        finally:
            self._release()

    cdef _retire(self, object request_ids):
        ids = [as_request_id(r) for r in request_ids]
        if len(set(ids)) != len(ids):
            raise _errors.repeated_ids(ids)
        cdef int64_t at
        cdef list rows = []
        for rid in ids:
            at = map_find(&self.m, rid)
            if at < 0 or self.m.values[at] >= 0:
                raise _errors.not_resident(rid)
            rows.append(-(self.m.values[at] + 1))
        self._remove(rows)

    @cython.critical_section
    def retire_rows(self, rows):
        """Remove residents by row index."""
        self._acquire(CALL_BUSY)
        try:
            listed = rows_argument(rows)  # runs caller code (__array__) before count is read
            check_rows(listed, self.t.count)
            self._remove(listed)
        finally:
            self._release()

    cdef _remove(self, list rows):
        """Swap-remove ``rows`` (distinct), and the cancelled rows with them in the same pass:
        the rows the caller named are indices into the table as it is."""
        cdef int32_t r, n = len(rows)
        self._pending = None
        for row in rows:
            self.t.mark[<int32_t>row] = 1
        if self.t.num_cancelled:
            for r in range(self.t.count):
                if self.t.cancelled[r] and not self.t.mark[r]:
                    self.t.mark[r] = 1
                    n += 1
        self._remove_marked(self.t.mark, n)

    # --- snapshots ----------------------------------------------------------------------------

    def _waiting_stamps(self):
        cdef int32_t slot
        stamps = {}
        for slot in self._waiting_slots():
            stamps[self.q.pool[slot].request_id] = self.q.pool[slot].arrival
        return stamps

    @cython.critical_section
    def load(self, residents):
        """Replace the resident table with ``residents`` (see ``stepplanner.ledger``)."""
        self._acquire(CALL_BUSY)
        try:
            self._load(residents)
        finally:
            self._release()

    cdef _load(self, object residents):
        if self.pages != NULL:
            raise _errors.ledger_load_with_pages()
        if self.d.ranking != RANK_NONE:
            raise _errors.ledger_load_with_deadlines(self._policy_name)
        # Every record is read (caller code: a Mapping's __getitem__) before the ledger is.
        table, ids, loras = parse_records(residents, self.t.capacity, self.a.most)
        check_waiting(table, ids, self._waiting_stamps())
        cdef int32_t n = len(table), row
        cdef const int64_t[::1] new_ids = ids
        cdef const int64_t[::1] new_loras = loras
        self._pending = None
        for row in range(self.t.count):  # the old residents leave the id map; the waiting stay
            map_delete(&self.m, self.t.ids[row])
        memset(self.t.rows, 0, self.t.capacity * sizeof(ResidentC))
        if n:  # parse_records made it: a new C-contiguous RESIDENT_DTYPE array of n rows
            memcpy(self.t.rows, cnp.PyArray_DATA(table), n * sizeof(ResidentC))
        memset(self.t.ids, 0xFF, self.t.capacity * sizeof(int64_t))
        memset(self.t.lora, 0, self.t.capacity * sizeof(int64_t))
        for row in range(n):
            self.t.ids[row] = new_ids[row]
            self.t.lora[row] = new_loras[row]
            map_set(&self.m, new_ids[row], -(row + 1))
        memset(self.t.generated, 0, self.t.capacity * sizeof(int64_t))
        memset(self.t.max_new, 0, self.t.capacity * sizeof(int64_t))
        memset(self.t.done, 0, self.t.capacity * sizeof(uint8_t))
        memset(self.t.cancelled, 0, self.t.capacity * sizeof(uint8_t))
        memset(self.t.relegated, 0, self.t.capacity * sizeof(uint8_t))
        memset(self.t.gap, 0, self.t.capacity * sizeof(double))
        for row in range(self.t.capacity):
            self.t.first_due[row] = INFINITY
            self.t.due[row] = INFINITY
        self.t.num_done = self.t.num_finished = self.t.num_admitted = self.t.num_cancelled = 0
        self.t.count = n
        if n:
            top = int(table["arrival"].max())
            if top == UINT64_MAX_:
                self.stamps_exhausted = True
            elif top + 1 > self.next_arrival:
                self.next_arrival = top + 1

    @cython.critical_section
    def to_records(self):
        """The residents as JSON-ready dicts (``load`` reads them back)."""
        self._acquire(CALL_QUIET)
        try:
            ids = np.frombuffer(self._ids, dtype=_INT64_DESCR, count=self.t.count)
            loras = np.empty(self.t.count, dtype=_INT64_DESCR)
            if self.t.count:
                memcpy(cnp.PyArray_DATA(loras), self.t.lora, self.t.count * sizeof(int64_t))
            return records_of(self._own_rows(), ids, loras)
        finally:
            self._release()


cdef int _check_reasons(object reasons, int32_t capacity) except -1:
    if (not cnp.PyArray_Check(reasons)
            or not cnp.PyArray_EquivTypes((<cnp.ndarray>reasons).descr, _UINT8_DESCR)
            or (<cnp.ndarray>reasons).ndim != 1
            or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>reasons)
            or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>reasons)
            or cnp.PyArray_DIM(<cnp.ndarray>reasons, 0) < capacity):
        raise step_reasons_error(capacity)
    return 0


@cython.final
cdef class Ranker:
    """The ledger's rank pass over rows a runtime keeps itself (the vLLM scheduler keeps no
    ``Ledger``): the same C as the ledger's (``rank_rows``), so an adapter keeps no copy of the
    policy. ``Ranker(limits, policy, *, step_time=None)``; see ``stepplanner.ledger``."""

    cdef DeadlineC d
    cdef readonly object limits
    cdef readonly object policy
    cdef _CoreMemory _positions, _lost   # row i's id is i; the rows the last rank relegated
    cdef _CoreMemory _no_classes         # every row of class 0 (rank() without classes)
    cdef int64_t* positions
    cdef int64_t* lost
    cdef int32_t* no_classes
    cdef list _lost_views

    def __cinit__(self, limits, policy, *, step_time=None, relegated_wait=None,
                  never_relegate_below=_NEVER_RELEGATE_BELOW):
        if not isinstance(policy, ResolvedSchedulingPolicy):
            raise _errors.wrong_type("policy", "ResolvedSchedulingPolicy", policy)
        check_ledger_args(limits, policy, 0)
        set_deadlines(&self.d, limits, check_deadline_args(policy, limits, None, step_time),
                      check_relegation_args(relegated_wait, never_relegate_below))
        self.limits, self.policy = limits, policy
        cdef int32_t b = limits.max_batch_size, i
        self._positions = _int64_memory(b, &self.positions)
        self._lost = _int64_memory(b, &self.lost)
        self._no_classes = _CoreMemory(max(b, 1) * <Py_ssize_t>sizeof(int32_t))
        self.no_classes = <int32_t*>self._no_classes.data
        for i in range(b):
            self.positions[i] = i
        self._lost_views = [None] * (b + 1)

    def __init__(self, limits, policy, *, step_time=None, relegated_wait=None,
                 never_relegate_below=_NEVER_RELEGATE_BELOW):
        # Everything was checked and set by __cinit__ (this signature is the one callers see);
        # a second call changes nothing.
        pass

    @property
    def step_time_estimate(self):
        return step_estimate(&self.d)

    def relegated_wait(self, ttft):
        """Seconds a request relegated while waiting may still wait before it is handed back:
        ``relegated_wait``, or (None) its own TTFT objective ``ttft``."""
        if isnan(self.d.relegated_wait):
            return as_time("ttft", ttft)
        return self.d.relegated_wait

    def measure(self, now, ran=True):
        """A step (``ran``: one that planned work) ended at ``now``: the measured estimate
        (``step_time=None``) moves towards the time since the previous one."""
        measure_step(&self.d, now_of(now), bool(ran))

    def admits(self, prompt_tokens, first_due, now, priority=0):
        """Whether a waiting prompt can still make its first token in time if served at once
        (always True but under DEADLINE, and for a ``priority`` below ``never_relegate_below``):
        the ledger relegates one that cannot at admission."""
        cdef int64_t tokens
        cdef double due, when
        tokens, due, when = check_admits_args(prompt_tokens, first_due, now)
        cdef int32_t klass = as_int32("priority", priority)
        if self.d.ranking != RANK_DEADLINE or klass < self.d.never_below:
            return True
        return not too_late(&self.d, tokens, due, when)

    def rank(self, rows, first_due, gap, generated, stamp, relegated, now, *, classes=None):
        """Write ``rows``' priority and arrival as the ledger does before it plans; returns the
        positions it relegated (and sets them in ``relegated``). ``classes``: each row's own
        priority (int32; None: all 0), which orders rows within a DEADLINE level. A no-op under
        FCFS/PRIORITY."""
        cdef int32_t n = check_rank_arrays(rows, (first_due, gap, generated, stamp, relegated),
                                           self.limits.max_batch_size, classes)
        cdef double when = now_of(now)
        cdef TableC t
        memset(&t, 0, sizeof(TableC))
        if self.d.ranking == RANK_NONE:
            return _view(self._lost_views, self._lost, _INT64_DESCR, 0, self.lost, False)
        t.rows = <ResidentC*>cnp.PyArray_DATA(<cnp.ndarray>rows)
        t.first_due = <double*>cnp.PyArray_DATA(<cnp.ndarray>first_due)
        t.gap = <double*>cnp.PyArray_DATA(<cnp.ndarray>gap)
        t.generated = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>generated)
        t.stamp = <uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>stamp)
        t.relegated = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>relegated)
        t.klass = (self.no_classes if classes is None
                   else <int32_t*>cnp.PyArray_DATA(<cnp.ndarray>classes))
        t.ids = self.positions
        t.relegated_ids = self.lost
        t.count = n
        rank_rows(&t, &self.d, when)
        return _view(self._lost_views, self._lost, _INT64_DESCR, t.num_relegated, self.lost,
                     False)

