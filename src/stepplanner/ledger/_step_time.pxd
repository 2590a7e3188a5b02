# The C contract of the step-time budget's pricing pass (_step_time.pyx; ledger.step_time).

from libc.stdint cimport int32_t, int64_t

cdef class StepPricer:
    cdef double a, b, c, d, e, f, target  # the step-time model (seconds) and the target
    cdef int32_t low, high                 # SPEC §9's range: B + P .. policy.max_num_tokens
    cdef bint pausing                      # MIXED + a priority order + PAUSE (SPEC §3 step 2)
    cdef int64_t release_at                # max_pause_steps, or never
    cdef public object planner
    cdef public object last_plan           # the plan made last (StepTimeBudget.observe reads it)
    cdef public int last_budget            # the budget it was made at
    cdef int32_t* prompts                  # scratch: the pending prompts' rows in a pricing pass
    cdef Py_ssize_t capacity               # its length
    cdef int _reserve(self, Py_ssize_t count) except -1
    # The budget for the first `count` rows at `data` (RESIDENT_DTYPE rows `stride` apart).
    cdef int32_t _budget(self, const char* data, Py_ssize_t stride, int32_t count) noexcept

# The largest n_decode + v whose step time(v) = q2 v^2 + q1 v + q0 fits `target`, in [low, high].
cdef int32_t price(double a, double b, double c, double d, double e, double f, double target,
                   int32_t low, int32_t high, int64_t n_decode, int64_t n_prompt, int64_t depth,
                   int64_t past, int64_t p0) noexcept nogil
