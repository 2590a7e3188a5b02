# The C contract of the compiled ledger (stepplanner.ledger._ledger): the waiting queue, the id map
# and the resident table, as plain structs over preallocated arrays. _ledger.pyx implements
# them and the Ledger class that owns the memory; the planner's structs come from _core.pxd.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

from stepplanner._core cimport ResidentC

cdef enum:
    HEAP_NORMAL = 0   # priority >= 0
    HEAP_URGENT = 1   # priority < 0: may take the reserved slots
    HEAP_LOSING = 2   # DEADLINE: relegated at admission (cannot make its first token in time)

# The order of a heap: arrival; (priority, arrival); (first token due, arrival) for EDF;
# (priority, first token due, arrival) for DEADLINE; (when it is shed, arrival) for the
# relegated.
cdef enum:
    ORDER_FCFS = 0
    ORDER_PRIORITY = 1
    ORDER_DEADLINE = 2
    ORDER_CLASS_DEADLINE = 3
    ORDER_SHED = 4
    ORDER_UNCACHED = 5            # uncached first: (work, arrival), work -1 once starved
    ORDER_PRIORITY_UNCACHED = 6   # (priority, work, arrival)
    ORDER_EDF_UNCACHED = 7        # EDF, uncached first: work -1 (at risk or starved) by
                                  #   (first token due, arrival) first, then (work, arrival)
    ORDER_CLASS_DEADLINE_UNCACHED = 8  # DEADLINE, uncached first: the class, then as EDF's

# How the ledger ranks its rows before each plan (docs/scheduling.md; _shared.RANK_*).
cdef enum:
    RANK_NONE = 0
    RANK_EDF = 1
    RANK_DEADLINE = 2

# One waiting request, in a pool slot of the queue.
ctypedef struct WaitingC:
    int64_t request_id
    uint64_t arrival
    int64_t max_new_tokens    # 0: no limit
    int32_t priority
    int32_t prompt_length
    int32_t heap              # HEAP_NORMAL, HEAP_URGENT or HEAP_LOSING
    int32_t position          # index in that heap; -1 - its index in AdaptersC.parked if parked
    double first_due          # its first token's deadline (inf: no objectives)
    double gap                # its per-token objective (0: none)
    double wait               # how long it may wait once relegated (seconds)
    double shed_at            # relegated: when it is handed back (shed_ids); inf before
    int64_t lora              # its LoRA adapter (0: the base model)
    int32_t work              # uncached first: prompt tokens past its prefix hit; -1: starved
                              #   (or, under EDF/DEADLINE, out of slack to spare)
    double since              # uncached first: when it started waiting (admission passes or
                              #   seconds; see StarvationC)

# A binary min-heap of pool slots by queue key (its ORDER_*).
ctypedef struct HeapC:
    int32_t* slots
    int32_t size
    int32_t order

ctypedef struct QueueC:
    WaitingC* pool            # max_waiting entries
    int32_t* free             # a stack of unused pool slots
    int32_t num_free
    int32_t capacity          # max_waiting
    HeapC heaps[3]            # indexed by HEAP_NORMAL / HEAP_URGENT / HEAP_LOSING
    double earliest_due       # DEADLINE: at most the earliest first-token deadline among the
                              # requests that may be relegated (the sweep runs once now passes it)
    void* scratch             # max_waiting (arrival, slot) pairs: the sweep's finds
    int64_t* shed             # ids handed back (2 x max_waiting): those of the loop's last call
    int32_t num_shed          # first (num_reported), then those submit shed since
    int32_t num_reported

# Uncached first (docs/scheduling.md): a request starves once `since + after <= clock`, the clock
# being the admission passes so far (starvation_steps; after = steps + 1) or `now` (seconds).
# `ring` lists the pool slots of the requests not yet starved in submission order, so `since`
# never decreases along it (seconds: each request's arrival time, raised to the latest before
# it) and one look at its head tells whether anyone starves; entries of requests gone since
# (admitted, cancelled, shed) are dropped when they reach the head, or by a compaction when the
# ring is full (it holds 2 x max_waiting, so a compaction frees at least half of it).
ctypedef struct StarvationC:
    int32_t* ring             # NULL: admission in the policy's own order
    uint64_t* stamps          # each entry's arrival stamp (a reused pool slot is not its own)
    int32_t head
    int32_t size
    int32_t capacity
    int32_t by_seconds
    double after
    double passes             # admission passes so far
    double latest             # seconds: the latest arrival time submitted
    # Under EDF/DEADLINE (by_slack): a request with slack to spare is admitted by its work; one
    # without goes to the policy's own order (work -1), as a starved one does. No request with
    # work >= 0 loses its slack before `risk_min - risk_steps x (estimate - risk_est)` (the
    # estimate grown since risk_est), so a pass reads the queue only once that time has come.
    int32_t by_slack
    double risk_min           # the earliest `due - (steps + 1) x risk_est` among them (or less)
    double risk_steps         # the most `steps + 1` among them (or more)
    double risk_est           # the step estimate risk_min was computed with


# Request id -> where it is: value >= 0 is a pool slot (waiting), value < 0 is row -(value + 1).
# Open addressing with linear probing at load <= 1/2; deletion shifts entries back, so the table
# never fills with tombstones however long the ledger runs.
ctypedef struct IdMapC:
    int64_t* keys
    int32_t* values
    uint8_t* used
    uint64_t mask             # slots - 1 (slots a power of two)

# The residents (rows 0..count-1, dense) and their output accounting.
ctypedef struct TableC:
    ResidentC* rows
    int64_t* ids
    int64_t* generated        # tokens each resident has emitted
    int64_t* max_new          # 0: no limit
    uint8_t* done             # marked finished by an apply, not yet retired
    uint8_t* mark             # scratch: rows to remove
    int32_t num_done
    uint8_t* cancelled        # cancelled while a step() plan was pending: leaves with that plan
    int32_t num_cancelled     # (every cancelled row is also done, so none is reported finished)
    int64_t* finished         # ids the last apply marked finished, in plan order
    int32_t num_finished
    int64_t* admitted         # ids the last admission moved in, in queue order
    int32_t num_admitted
    double* first_due         # deadlines: the first token's due time (inf: no objectives)
    double* gap               # the per-token objective (0: none)
    double* due               # the next token's deadline (next_due), kept by admission and
                              # account; NULL in a Ranker's table (it computes next_due)
    uint64_t* stamp           # the submission stamp (rows' arrival holds the rank under EDF/DEADLINE)
    int32_t* klass            # the request's own priority (rows' priority holds the rank)
    uint8_t* relegated        # DEADLINE gave up on its objectives: served after the rest
    int64_t* lora             # each row's LoRA adapter, 0: the base model (NULL in a Ranker's)
    int64_t* relegated_ids    # ids the last call relegated (rows and waiting requests)
    int32_t num_relegated
    int32_t count
    int32_t capacity          # B
    int32_t reserved_slots


# LoRA admission (docs/decisions.md, "LoRA adapters"; _shared.AdapterSlots is the same rule in
# Python): the residents hold at most `most` distinct adapters, and admission passes over a
# request whose adapter cannot join. A passed-over request is parked: out of its heap (its
# position then -1 - its index in `parked`), so that later passes do not walk it again, until
# the residents' adapters are no longer `parked_held` (one of them has left: it may join now).
# Under DEADLINE a waiting request must meet the head's "too late" check whenever it would be
# the head, so there every pass puts its parked requests back when it ends.
ctypedef struct AdaptersC:
    int32_t most              # 0: no limit
    int32_t num_held
    int64_t* held             # min(most, B) + 1 entries: the residents' adapters (scratch)
    int32_t* parked           # max_waiting pool slots: the requests kept out of the heaps
    int32_t num_parked
    int64_t* parked_held      # min(most, B) entries: the residents' adapters when they were
    int32_t num_parked_held   #   parked (all `most` of them: none of the parked could join)


# What the rank pass needs (docs/scheduling.md): the policy's ranking and the step-time estimate.
ctypedef struct DeadlineC:
    int32_t ranking           # RANK_*
    int32_t measured          # the estimate is measured from now (step_time=None)
    int32_t sampled           # it has been measured at least once
    int64_t step_tokens       # a full step's tokens (max_num_tokens)
    int64_t chunk             # the most a prompt advances in a step (max_chunk_tokens)
    double chunk_inverse      # 1.0 / chunk (steps_for multiplies instead of dividing)
    int64_t page_size
    double base               # step_time=(base, per_token): a step of t tokens takes
    double per_token          #   base + per_token * t seconds
    double estimate           # the measured step time
    double last_now           # the now of the previous step (NaN: none yet)
    int32_t never_below       # classes below this are never relegated
    double relegated_wait     # seconds a relegated request may wait (NaN: its TTFT objective)
