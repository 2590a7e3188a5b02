# The step-time budget's pricing pass (ledger.step_time), in C: one pass over the residents a
# plan will read, before it, for the largest token budget whose step fits the time. Its twin is
# _step_time_py.py; tests/test_step_time_budget.py holds the two to each other.

cimport cython
cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.math cimport sqrt
from libc.stdint cimport INT32_MAX, int32_t, int64_t

from stepplanner._core cimport PlanC, ResidentC, StepPlan

import numpy as np

from .. import _errors
from ..planner._types import RESIDENT_DTYPE, IfbSchedulingMode, PreemptionMode, SchedulingPolicy

cnp.import_array()

cdef cnp.dtype _RESIDENT_DESCR = RESIDENT_DTYPE


@cython.auto_pickle(False)  # it holds a planner, which has its own pickling rules
cdef class StepPricer:
    """Prices a step over the residents at the step-time model and says the largest budget that
    fits ``max_step_seconds`` (SPEC §9's range), or the policy's own when that fits or when
    there is no decode row (see ``ledger.step_time``)."""

    def __init__(self, planner, policy, limits, double max_step_seconds, coefficients):
        self._reserve(limits.max_batch_size)  # the ledger's table never holds more
        self.planner = planner
        self.last_plan = None
        self.last_budget = policy.max_num_tokens
        self.target = max_step_seconds
        self.low = limits.max_batch_size + limits.kv_page_size
        self.high = policy.max_num_tokens
        self.pausing = (
            policy.mode == IfbSchedulingMode.MIXED
            and policy.scheduling_policy != SchedulingPolicy.FCFS
            and policy.preemption == PreemptionMode.PAUSE
        )
        self.release_at = policy.max_pause_steps if policy.max_pause_steps > 0 else 1LL << 32
        self.set_model(*coefficients)

    def __dealloc__(self):
        PyMem_Free(self.prompts)

    def set_model(self, double a, double b, double c, double d, double e, double f):
        self.a, self.b, self.c, self.d, self.e, self.f = a, b, c, d, e, f

    def plan(self, residents, count=None, reasons=None, drafts=None, max_num_tokens=None):
        """``planner.plan`` at the budget whose step fits ``max_step_seconds`` (the smaller of
        it and a given ``max_num_tokens``); the policy's (None) when that fits."""
        planner = self.planner
        cdef Py_ssize_t n, length
        cdef int32_t chosen
        cdef cnp.ndarray arr
        if (cnp.PyArray_Check(residents) and (<cnp.ndarray>residents).ndim == 1
                and (<cnp.ndarray>residents).descr is _RESIDENT_DESCR):
            arr = <cnp.ndarray>residents  # the ledger's own table: priced in place
            length = arr.shape[0]
            if count is None:
                n = length
            elif type(count) is int and 0 <= count <= length:
                n = count
            else:  # planner.plan refuses it, in its own words
                return planner.plan(residents, count, reasons, drafts)
            with cython.critical_section(self):  # one pass at a time in its scratch
                self._reserve(n)
                chosen = self._budget(<const char*>cnp.PyArray_DATA(arr), arr.strides[0],
                                      <int32_t>n)
        else:  # another array or a list of ResidentState: checked by the planner, then priced
            first = planner.plan(residents, count, reasons, drafts)
            n = first.num_residents
            chosen = self.budget(residents if cnp.PyArray_Check(residents)
                                 else _as_rows(residents, n), n)
        if max_num_tokens is not None and max_num_tokens < chosen:
            chosen = max_num_tokens
        self.last_budget = chosen
        # Positional: the planner's own order (residents, count, reasons, drafts, budget).
        plan = planner.plan(residents, count, reasons, drafts,
                            None if chosen == self.high else chosen)
        self.last_plan = plan
        return plan

    def budget(self, residents, Py_ssize_t count):
        """The budget for a plan of the first ``count`` rows of ``residents`` (a 1-D
        ``RESIDENT_DTYPE`` array)."""
        if not cnp.PyArray_Check(residents):
            raise _errors.wrong_type("residents", "1-D RESIDENT_DTYPE array", residents)
        cdef cnp.ndarray arr = <cnp.ndarray>residents
        if arr.ndim != 1 or not (arr.descr is _RESIDENT_DESCR
                                 or cnp.PyArray_EquivTypes(arr.descr, _RESIDENT_DESCR)):
            raise _errors.wrong_type("residents", "1-D RESIDENT_DTYPE array", residents)
        if count < 0 or count > arr.shape[0]:
            raise _errors.count_over_length(count, arr.shape[0])
        with cython.critical_section(self):  # one pass at a time in its scratch
            self._reserve(count)
            return self._budget(<const char*>cnp.PyArray_DATA(arr), arr.strides[0],
                                <int32_t>count)

    cdef int _reserve(self, Py_ssize_t count) except -1:
        """``prompts`` holds at least ``count`` rows (grown, never shrunk; B at the start)."""
        if count <= self.capacity:
            return 0
        cdef int32_t* grown = <int32_t*>PyMem_Realloc(self.prompts,
                                                      <size_t>count * sizeof(int32_t))
        if grown == NULL:
            raise MemoryError()
        self.prompts, self.capacity = grown, count
        return 0

    cdef int32_t _budget(self, const char* data, Py_ssize_t stride, int32_t count) noexcept:
        # Every step, over every resident, before the plan: the passes over all rows do only
        # what needs every row, branch-free (the rows' kinds and pauses are mixed; the kernel's
        # pause pass is written the same way). The pending prompts, a few rows of a busy step,
        # are listed by the first pass and their own sums taken from the list.
        cdef int32_t i, j, k = 0
        cdef int32_t* prompts = self.prompts  # _reserve(count) has run
        cdef const ResidentC* r
        for i in range(count):
            r = <const ResidentC*>(data + i * stride)
            prompts[k] = i  # kept only if it is a prompt (k then moves past it)
            k += r.context_committed == 0
        cdef int64_t bar = INT32_MAX  # no pending prompt, or not pausing: nothing is paused
        if self.pausing:  # SPEC §3 step 2: the bar is the first pending prompt's priority
            for j in range(k):
                bar = min(bar, (<const ResidentC*>(data + prompts[j] * stride)).priority)
        # The active rows' count and committed tokens; the decode rows' are those less the
        # active prompts'.
        cdef int64_t release_at = self.release_at, active, committed
        cdef int64_t n_active = 0, held = 0, n_prompt = 0, past = 0, p0 = 0
        for i in range(count):
            r = <const ResidentC*>(data + i * stride)
            active = (r.priority <= bar) | (r.consecutive_paused_steps >= release_at)
            n_active += active
            held += r.committed & -active
        for j in range(k):
            r = <const ResidentC*>(data + prompts[j] * stride)
            active = (r.priority <= bar) | (r.consecutive_paused_steps >= release_at)
            committed = r.committed & -active
            n_prompt += active
            past += committed
            p0 = max(p0, committed)
        return price(self.a, self.b, self.c, self.d, self.e, self.f, self.target, self.low,
                     self.high, n_active - n_prompt, n_prompt, held - past, past, p0)


def plan_features(plan):
    """A plan's step-model features: ``tokens``, ``context`` (the KV positions its rows read),
    ``rows`` and ``attention`` (query-key pairs), as docs/simulator.md defines them. A compiled
    plan's are summed over its rows in C: ``observe`` reads them every step, and the numpy way
    (the twin's, kept here for any other plan) took 4 µs of its 6."""
    if isinstance(plan, StepPlan):
        with cython.critical_section(plan):  # as copy() reads it: whole, not mid-plan()
            return _features(&(<StepPlan>plan).c)
    seq = plan.as_array()
    query = seq["query_length"].astype(np.int64)
    past = seq["past_length"].astype(np.int64)
    tokens = int(query.sum())
    return tokens, int(past.sum()) + tokens, len(seq), int(np.dot(query, past + query))


cdef tuple _features(const PlanC* p):
    cdef int32_t i, n = p.num_prefill + p.num_decode
    cdef int64_t tokens = 0, past = 0, attention = 0, q, k
    for i in range(n):
        q = p.sequences[i].query_length
        k = p.sequences[i].past_length
        tokens += q
        past += k
        attention += q * (k + q)
    return tokens, past + tokens, n, attention


def _as_rows(residents, Py_ssize_t count):
    """The first ``count`` of a list of ``ResidentState`` as a ``RESIDENT_DTYPE`` array."""
    fields = RESIDENT_DTYPE.names
    return np.array([tuple(getattr(residents[i], f) for f in fields) for i in range(count)],
                    dtype=RESIDENT_DTYPE)


cdef int32_t price(double a, double b, double c, double d, double e, double f, double target,
                   int32_t low, int32_t high, int64_t n_decode, int64_t n_prompt, int64_t depth,
                   int64_t past, int64_t p0) noexcept nogil:
    """time(v) = q2 v^2 + q1 v + q0 for v tokens beside n_decode decode rows; the largest
    n_decode + v within target, clamped to [low, high] (high: no decode row, or it all fits)."""
    if n_decode == 0:
        return high
    cdef double nd = <double>n_decode
    cdef double c0 = <double>depth + <double>past + nd
    cdef double q2 = d + e
    cdef double q1 = b + c + d * (c0 + nd) + e * <double>p0
    cdef double q0 = a + f * (nd + <double>n_prompt) + b * nd + c * c0 + d * nd * c0
    q0 += e * (<double>depth + nd)
    cdef double room = target - q0
    cdef double v
    if room <= 0:
        return low
    if q2 > 0:
        v = 2 * room / (q1 + sqrt(q1 * q1 + 4 * q2 * room))
    elif q1 > 0:
        v = room / q1
    else:
        return high
    v += nd
    if v >= high:
        return high
    if v <= low:
        return low
    return <int32_t>v
