"""Every error message of the package, in one place.

The compiled core and the pure-Python reference raise through these builders, so their messages
cannot drift apart (the parity tests compare ``(type(e), str(e))``). A message names the field, the
value and what is allowed. Each builder returns the exception; the caller raises it.

Every exception the package raises about its input is a :class:`StepPlannerError` that is also
the builtin a caller expects (``StepPlannerValueError`` is a ``ValueError``, and so on), so
``except ValueError`` keeps working and ``except StepPlannerError`` tells the library's own
messages apart from a bug's exception (the CLI prints the first as one line and lets the second
keep its traceback).
"""

from __future__ import annotations

from collections.abc import Callable


class StepPlannerError(Exception):
    """Base class of every error stepplanner raises about its input or its use."""


class StepPlannerValueError(StepPlannerError, ValueError):
    """A value is out of range or inconsistent; the message names it and what is allowed."""


class StepPlannerTypeError(StepPlannerError, TypeError):
    """An argument has the wrong type; the message names it and what is allowed."""


class StepPlannerOverflowError(StepPlannerError, OverflowError):
    """A value or a result does not fit its C type (int32, uint64)."""


class StepPlannerMemoryError(StepPlannerError, MemoryError):
    """The limits need more memory than the machine gives."""


class StepPlannerRuntimeError(StepPlannerError, RuntimeError):
    """An object is used in a way its contract refuses (an unresolved policy, re-entry)."""


INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1


def _type_name(value: object) -> str:
    return type(value).__name__


def _shown(value: object, spell: Callable[[object], str] = str) -> str:
    """``value`` as a message shows it (``spell``: ``str`` or ``repr``); an int past Python's
    limit on converting ints to text (4300 digits, ``sys.set_int_max_str_digits``) by its size,
    since spelling it would raise a ValueError that names nothing."""
    try:
        return spell(value)
    except ValueError:
        return f"<an int of {value.bit_length()} bits>"  # type: ignore[attr-defined]


# --- scalar fields ---------------------------------------------------------------------------


def wrong_type(field: str, expected: str, value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(f"{field} must be a {expected}, got {_type_name(value)}")


def not_integer(field: str, value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(f"{field} must be an integer, got {_type_name(value)} {value!r}")


def not_bool(field: str, value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        f"{field} must be a bool (or 0/1), got {_type_name(value)} {value!r}"
    )


def out_of_int32(field: str, value: int, allowed: str = "") -> StepPlannerOverflowError:
    """``allowed``: the field's own range when it is narrower than int32 (``1..2147483647``)."""
    if allowed:
        return StepPlannerOverflowError(
            f"{field}={_shown(value)} does not fit int32; allowed: {allowed}"
        )
    return StepPlannerOverflowError(
        f"{field}={value} does not fit int32; allowed [{INT32_MIN}, {INT32_MAX}]"
    )


def out_of_uint64(field: str, value: int) -> StepPlannerOverflowError:
    return StepPlannerOverflowError(
        f"{field}={value} does not fit uint64; allowed [0, {UINT64_MAX}]"
    )


def _enum_spellings(enum_type: type) -> str:
    """The allowed values of an enum option, spelled one way wherever one is refused or listed
    (API, ``--config``, ``--grid``, the command line): ``fcfs, priority, edf, deadline (any
    case) or 0..3``."""
    members = list(enum_type)  # type: ignore[call-overload]
    names = ", ".join(m.name.lower() for m in members)
    numbers = [int(m) for m in members]
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{names} (any case) or {numbers[0]}..{numbers[-1]}"
    return f"{names} (any case) or {', '.join(map(str, numbers))}"


def not_enum(field: str, value: object, enum_type: type) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"{field}={_shown(value, repr)} is not a {enum_type.__name__}; "
        f"allowed: {_enum_spellings(enum_type)}"
    )


def out_of_range(field: str, value: object, allowed: str) -> StepPlannerValueError:
    return StepPlannerValueError(f"{field}={_shown(value)} is out of range; allowed: {allowed}")


# --- the planner ---------------------------------------------------------------------------


def unresolved_mode(mode: object) -> StepPlannerRuntimeError:
    return StepPlannerRuntimeError(
        f"policy.mode={mode!r} cannot be planned; allowed: MIXED or PREFILL_FIRST "
        "(pass the policy through resolve_scheduling_policy() first)"
    )


def residents_type(value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        "residents must be a list or tuple of ResidentState or a 1-D numpy array of "
        f"RESIDENT_DTYPE, got {_type_name(value)}"
    )


def element_type(index: int, value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        f"residents[{index}] must be a ResidentState, got {_type_name(value)}"
    )


def array_dtype(dtype: object, expected: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        f"residents array has dtype {dtype}; allowed: exactly RESIDENT_DTYPE {expected} "
        "(same fields, offsets and native byte order; convert with arr.astype(RESIDENT_DTYPE))"
    )


def masked_array(name: str) -> StepPlannerTypeError:
    # A masked entry has no value to plan with, and the two cores would read it differently
    # (the data under the mask, or numpy's MaskError): refused by name in both.
    return StepPlannerTypeError(
        f"{name} is a numpy masked array; allowed: a plain numpy array (a masked entry has no "
        f"value: pass {name}.filled(...) with the value each masked entry should take)"
    )


def array_ndim(ndim: int) -> StepPlannerValueError:
    return StepPlannerValueError(f"residents array has ndim={ndim}; allowed: 1")


def count_negative(count: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"count={count} is negative; allowed: 0 <= count <= max_batch_size"
    )


def planner_memory(max_batch_size: int, nbytes: int) -> StepPlannerMemoryError:
    return StepPlannerMemoryError(
        f"max_batch_size={max_batch_size} needs {nbytes / 2**30:.1f} GiB of planner buffers "
        f"({nbytes} bytes), which could not be allocated; a StepPlanner sizes its buffers for "
        "max_batch_size up front (SPEC §3), so pass the engine's real slot count"
    )


def count_over_batch(count: int, max_batch_size: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"count={count} exceeds max_batch_size={max_batch_size}; allowed: 0..{max_batch_size}"
    )


def count_over_length(count: int, length: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"count={count} exceeds len(residents)={length}; allowed: 0..{length}"
    )


def plan_reentered() -> StepPlannerRuntimeError:
    return StepPlannerRuntimeError(
        "StepPlanner.plan() re-entered: it was called while a plan() on the same planner was "
        "still reading its residents (from code the residents container ran, e.g. a list "
        "subclass's __getitem__, or from another thread while that code ran); allowed: one "
        "plan() at a time per planner (use one planner per thread)"
    )


def duplicate_resident(first: int, second: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"residents[{first}] and residents[{second}] are the same ResidentState; allowed: each "
        "resident once (a plan row per resident, and apply_to advances each once)"
    )


def rows_overlap(stride: int, itemsize: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"residents[0] and residents[1] share memory (array strides[0]={stride}, rows of "
        f"{itemsize} bytes); allowed: rows that do not overlap, |strides[0]| >= {itemsize} "
        "(each resident once; copy a broadcast array with np.array(arr))"
    )


def not_initialised(cls: str) -> StepPlannerRuntimeError:
    return StepPlannerRuntimeError(f"{cls}.__init__ was not called")


def resident_negative(index: int, field: str, value: int) -> StepPlannerValueError:
    return StepPlannerValueError(f"residents[{index}].{field}={value} is negative; allowed: >= 0")


def prompt_exhausted(index: int, prompt_length: int, committed: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"residents[{index}] is prompt-incomplete (context_committed=False) but "
        f"prompt_length - committed = {prompt_length} - {committed} = "
        f"{prompt_length - committed}; allowed: > 0 (set context_committed once the prompt commits)"
    )


def prompt_too_long(index: int, prompt_length: int, max_input_length: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"residents[{index}].prompt_length={prompt_length} exceeds "
        f"max_input_length={max_input_length} for a prompt-incomplete resident; "
        f"allowed: 1..{max_input_length}"
    )


def reasons_array(problem: str) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"reasons {problem}; allowed: a writable 1-D numpy uint8 array with len >= count"
    )


# --- draft tokens (SPEC §8) ------------------------------------------------------------------


_DRAFTS_ALLOWED = "a list or tuple of ints, or a 1-D numpy int32 array, one entry per resident"


def drafts_type(value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(f"drafts must be {_DRAFTS_ALLOWED}, got {_type_name(value)}")


def drafts_array(dtype: object, ndim: int) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        f"drafts array has dtype {dtype} and ndim={ndim}; allowed: {_DRAFTS_ALLOWED}"
    )


def drafts_length(length: int, count: int) -> StepPlannerValueError:
    return StepPlannerValueError(f"drafts has len {length} < count={count}; allowed: len >= count")


def drafts_negative(index: int, value: int) -> StepPlannerValueError:
    return StepPlannerValueError(f"drafts[{index}]={value}; allowed: >= 0")


def drafts_for_prompt(index: int, value: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"drafts[{index}]={value} but residents[{index}] is prompt-incomplete "
        "(context_committed=False); allowed: 0 (drafts extend decode rows, SPEC §8)"
    )


def accepted_type(value: object) -> StepPlannerTypeError:
    dtype = getattr(value, "dtype", None)
    swapped = getattr(dtype, "isnative", True) is False  # >i4 on a little-endian machine
    return StepPlannerTypeError(
        "accepted must be a 1-D numpy int32 array in native byte order, one count per plan row "
        f"(the drafts the runtime accepted of those the row verified), got {_type_name(value)}"
        + (f" of dtype {dtype}" if dtype is not None else "")
        + (" (non-native byte order)" if swapped else "")
    )


def accepted_shape(shape: tuple[int, ...], rows: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"accepted has shape {shape}; allowed: ({rows},), one count per plan row"
    )


def accepted_range(index: int, resident: int, value: int, most: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"accepted[{index}]={value} for plan row {index} (resident {resident}); allowed: "
        f"0..{most} (the drafts that row verified)"
    )


def emitted_past_max_new(
    index: int, request_id: int, emitted: int, generated: int, max_new: int
) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan row {index} (request {request_id}) would emit {emitted} tokens with "
        f"{generated} of its max_new_tokens={max_new} out; allowed: at most {max_new - generated} "
        "(accept fewer drafts; Ledger.step caps the drafts it plans)"
    )


def ledger_drafts(value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        "drafts must be an int (each decoding request proposes that many) or a mapping from "
        f"request id to int, got {_type_name(value)}"
    )


# --- applying a plan -----------------------------------------------------------------------


def apply_length(length: int, needed: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"len(residents)={length} is smaller than the plan's resident count {needed}; "
        f"allowed: >= {needed}"
    )


def apply_readonly() -> StepPlannerValueError:
    return StepPlannerValueError("residents array is read-only; allowed: a writable array")


def apply_reentered() -> StepPlannerRuntimeError:
    return StepPlannerRuntimeError(
        "StepPlan.apply_to() saw its plan replaced while it read the residents (code the "
        "residents container ran, e.g. a list subclass's __iter__, or another thread, called "
        "plan() on the planner that owns this plan); allowed: no plan() on that planner until "
        "apply_to() returns (apply a copy() to be independent of it)"
    )


def buffer_memory(size: int) -> StepPlannerMemoryError:
    return StepPlannerMemoryError(f"{size} bytes for a plan's buffers could not be allocated")


def apply_overflow(index: int, field: str, value: int, add: int) -> StepPlannerOverflowError:
    return StepPlannerOverflowError(
        f"residents[{index}].{field}={value} + {add} does not fit int32; "
        f"allowed: result <= {INT32_MAX}"
    )


# --- the ledger (stepplanner.Ledger: compiled and pure-Python alike) -------------------------


class QueueFullError(StepPlannerError, RuntimeError):
    """``Ledger.submit`` past ``max_waiting``: the backpressure signal (a server's HTTP 429)."""


def not_int64(field: str, value: int) -> StepPlannerOverflowError:
    return StepPlannerOverflowError(
        f"{field}={value} does not fit int64; allowed [{-(2**63)}, {2**63 - 1}]"
    )


def ledger_prompt_length(
    request_id: int,
    length: int,
    max_input_length: int,
) -> StepPlannerValueError:
    if length < 1:
        return out_of_range("prompt_length", length, f"1..{max_input_length}")
    return StepPlannerValueError(
        f"prompt_length={length} exceeds max_input_length={max_input_length}: request "
        f"{request_id} is refused (a prompt is never truncated); allowed: 1..{max_input_length}"
    )


def max_new_tokens_range(value: int) -> StepPlannerValueError:
    return out_of_range("max_new_tokens", value, "None or >= 1")


def duplicate_request(request_id: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"request_id={request_id} is already waiting or resident; allowed: an id not in the ledger"
    )


def queue_full(request_id: int, max_waiting: int) -> QueueFullError:
    return QueueFullError(
        f"the waiting queue is full (max_waiting={max_waiting}): request {request_id} is "
        "refused; allowed: submit again once admit() has made room (a server answers HTTP 429)"
    )


def stamps_exhausted(request_id: int) -> StepPlannerOverflowError:
    return StepPlannerOverflowError(
        f"request {request_id} cannot be stamped: the next arrival stamp would be 2**64, beyond "
        f"uint64 (a loaded resident has arrival {UINT64_MAX}); allowed: load() arrivals below "
        f"{UINT64_MAX} while requests are still to be submitted"
    )


def not_in_ledger(request_id: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"request_id={request_id} is not waiting or resident; allowed: an id in the ledger"
    )


def not_resident(request_id: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"request_id={request_id} is not resident; allowed: one of ledger.request_ids"
    )


def repeated_ids(ids: list[int]) -> StepPlannerValueError:
    return StepPlannerValueError(f"request_ids {ids} repeat an id; allowed: each at most once")


def plan_type(plan: object, expected: str) -> StepPlannerTypeError:
    return StepPlannerTypeError(f"plan must be a {expected}, got {_type_name(plan)}")


def ledger_reentered() -> StepPlannerRuntimeError:
    return StepPlannerRuntimeError(
        "Ledger re-entered: a ledger call was made while another call on the same ledger was "
        "still running (from code that call ran, e.g. an argument's __array__, __index__ or "
        "__getitem__, a planner's plan(), or from another thread while it ran such code); "
        "allowed: one ledger call at a time from the serving loop, and submit() and cancel() "
        "from any other thread (they wait for the call under way)"
    )


def plan_count(num_residents: int, count: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan was made over {num_residents} residents but the ledger holds "
        f"count={count}; allowed: a plan of ledger.residents"
    )


def finished_type(value: object) -> StepPlannerTypeError:
    dtype = getattr(value, "dtype", None)
    got = f"an array of dtype {dtype}" if dtype is not None else _type_name(value)
    return StepPlannerTypeError(
        f"finished must be a 1-D numpy bool array (one flag per plan row) or None, got {got}"
    )


def finished_shape(shape: tuple[int, ...], rows: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"finished has shape {shape}; allowed: ({rows},), one flag per plan row "
        "(len(plan.sequences))"
    )


def finished_without_token(row: int, resident: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"finished[{row}] is True but plan row {row} (resident {resident}) emits no token "
        "(select_last_token_logits is False: a non-final prompt chunk); allowed: True only on "
        "rows that sampled a token"
    )


def nothing_pending(field: str = "finished") -> StepPlannerValueError:
    return StepPlannerValueError(
        f"{field} was given but no plan of this ledger's step() is waiting to be "
        "applied (apply(), admit(), retire or load ran since); allowed: None"
    )


def planner_mismatch(limits: object, expected: object) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"planner has limits {limits!r}; allowed: a StepPlanner made for the "
        f"ledger's limits {expected!r}"
    )


def load_arrival_taken(index: int, arrival: int, request_id: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"residents[{index}].arrival={arrival} is the arrival stamp of waiting request "
        f"{request_id}; allowed: arrivals no waiting request holds (they must stay unique)"
    )


def plan_value(where: str, value: int, allowed: str) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan.{where}={value} is out of range; allowed: {allowed} (a plan's rows come from the "
        "planner; this one was changed outside it)"
    )


def plan_resident_repeated(where: str, resident: int, first: str) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan.{where}={resident} names the resident plan.{first} names already; allowed: each "
        "resident at most once, in one plan row or one pause (a plan's rows come from the "
        "planner; this one was changed outside it)"
    )


def pending_plan_changed() -> StepPlannerValueError:
    return StepPlannerValueError(
        "the plan this ledger's last step() returned has changed since (its planner planned "
        "again: for another ledger, or by a plan() call of its own), so it is not the plan that "
        "ran; allowed: a planner of its own per ledger, and no other plan() on it between two "
        "step() calls (admit() drops the stale plan)"
    )


# --- the KV page table and the step's attention inputs ------------------------------------


def kv_tokens_over_row(num_tokens: int, max_pages: int, page_size: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"num_tokens={num_tokens} needs more than max_pages_per_sequence={max_pages} pages of "
        f"{page_size} tokens; allowed: 0..{max_pages * page_size}"
    )


def kv_move_onto_pages(dst: int, pages: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"dst={dst} holds {pages} page(s); allowed: an empty slot (release it first)"
    )


def kv_page_size_mismatch(table: int, limits: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"page_table.kv_page_size={table} differs from limits.kv_page_size={limits}; "
        "allowed: the same page size"
    )


def kv_slots_short(slots: int, max_batch_size: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"page_table.max_batch_size={slots} is smaller than limits.max_batch_size="
        f"{max_batch_size}; allowed: >= {max_batch_size} (one slot per ledger row)"
    )


def ledger_page_table_type(value: object, allowed: str) -> StepPlannerTypeError:
    return StepPlannerTypeError(f"page_table must be {allowed} or None, got {_type_name(value)}")


def ledger_page_table_in_use(used: int, num_pages: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"page_table holds {used} of its num_pages={num_pages} pages; allowed: a table with "
        "every page free (a new ledger has no residents, so pages held before are no row's)"
    )


def ledger_unbounded_request(request_id: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"request_id={request_id}: max_new_tokens=None is refused by a ledger with a page "
        "table, which reserves each request's worst case (prompt_length + max_new_tokens) at "
        "admission; allowed: max_new_tokens >= 1"
    )


def ledger_worst_case_pages(
    request_id: int, prompt_length: int, max_new_tokens: int, pages: int, limit: int
) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"request_id={request_id}: prompt_length + max_new_tokens = {prompt_length} + "
        f"{max_new_tokens} needs {pages} pages; allowed: at most {limit} (min of the page "
        "table's max_pages_per_sequence and num_pages)"
    )


def ledger_pages_exceeded(
    index: int, resident: int, request_id: int, tokens: int, held: int
) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan row {index} (resident {resident}, request {request_id}) would hold {tokens} "
        f"tokens of KV; allowed: at most the {held} its reserved pages hold (a request finished "
        "but not retired must be retired before it is planned a second time)"
    )


def ledger_load_with_pages() -> StepPlannerValueError:
    return StepPlannerValueError(
        "load() is refused: this ledger has a page_table, and loaded residents come without "
        "KV pages or output bounds, so their worst case cannot be reserved; allowed: load() on "
        "a ledger made with page_table=None"
    )


# --- deadlines (the ledger's EDF and DEADLINE policies, docs/scheduling.md) ------------------


def now_required(call: str, policy: str) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"{call}: now is required under SchedulingPolicy.{policy} (the ledger ranks by "
        "deadlines on the runtime's clock); allowed: a finite number of seconds"
    )


def now_required_for_starvation(call: str) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"{call}: now is required with starvation_seconds (the ledger measures how long a "
        "request has waited on the runtime's clock); allowed: a finite number of seconds"
    )


def arrival_time_for_starvation(request_id: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"request {request_id} has no arrival_time but the ledger bounds waits with "
        "starvation_seconds; allowed: its arrival time on the clock the runtime passes as now"
    )


def arrival_time_required(request_id: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"request {request_id} has objectives but no arrival_time; allowed: its arrival time "
        "on the clock the runtime passes as now (its deadlines count from it)"
    )


def not_finite_time(field: str, value: object) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"{field}={_shown(value, repr)} is not a time; allowed: a finite number of seconds"
    )


def not_a_deadline(field: str, value: object) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"{field}={_shown(value, repr)} is not a time; allowed: a number of seconds (inf: none)"
    )


def step_time_not_finite(
    base: float, per_token: float, budget: str, tokens: int
) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"step_time=({base!r}, {per_token!r}) estimates a step of {budget}={tokens} tokens at "
        f"base + per_token x {tokens} = inf seconds; allowed: parts whose estimate is a finite "
        "number of seconds"
    )


def ledger_load_with_deadlines(policy: str) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"load() is refused under SchedulingPolicy.{policy}: loaded residents come without "
        "arrival times or objectives, and their rows' priority and arrival are the ledger's "
        "ranks; allowed: load() under FCFS or PRIORITY"
    )


def kv_inputs_memory(
    max_batch_size: int,
    max_tokens: int,
    max_pages: int,
) -> StepPlannerMemoryError:
    return StepPlannerMemoryError(
        f"StepInputs buffers for max_batch_size={max_batch_size}, t_max={max_tokens} tokens "
        f"and max_pages_per_sequence={max_pages} could not be allocated"
    )


def kv_plan_type(value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        "plan must be a StepPlan, a 1-D SEQUENCE_DTYPE array or an object whose as_array() "
        f"gives one, got {_type_name(value)}"
    )


def kv_plan_dtype(dtype: object, expected: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        f"plan array has dtype {dtype}; allowed: exactly SEQUENCE_DTYPE {expected}"
    )


def kv_plan_ndim(ndim: int) -> StepPlannerValueError:
    return StepPlannerValueError(f"plan array has ndim={ndim}; allowed: 1")


def kv_plan_rows(rows: int, max_batch_size: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan has {rows} rows; allowed: <= limits.max_batch_size={max_batch_size}"
    )


def kv_plan_tokens(tokens: int, max_tokens: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan has {tokens} query tokens in all; allowed: <= limits.t_max={max_tokens}"
    )


def kv_resident_range(index: int, resident: int, slots: int) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan row {index}: resident={resident} is not a page-table slot; allowed: 0..{slots - 1}"
    )


def kv_row_field(index: int, field: str, value: int, allowed: str) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"plan row {index}: {field}={value} is out of range; allowed: {allowed}"
    )


def kv_row_overflow(index: int, past_length: int, query_length: int) -> StepPlannerOverflowError:
    return StepPlannerOverflowError(
        f"plan row {index}: past_length + query_length = {past_length} + {query_length} "
        f"does not fit int32; allowed: <= {INT32_MAX}"
    )


def kv_pages_missing(
    index: int, resident: int, past_length: int, query_length: int, pages: int, page_size: int
) -> StepPlannerValueError:
    need = past_length + query_length
    return StepPlannerValueError(
        f"plan row {index}: resident {resident} needs KV pages for {need} tokens "
        f"(past_length {past_length} + query_length {query_length}) but its pages hold "
        f"{pages * page_size} tokens ({pages} page(s) of {page_size}); "
        f"call page_table.ensure({resident}, {need}) first"
    )


def kv_table_memory(max_batch_size: int, max_pages: int, num_pages: int) -> StepPlannerMemoryError:
    nbytes = 4 * (max_batch_size * max_pages + num_pages) + 12 * max_batch_size
    return StepPlannerMemoryError(
        f"KVPageTable(max_batch_size={max_batch_size}, max_pages_per_sequence={max_pages}, "
        f"num_pages={num_pages}) needs {nbytes} bytes, which could not be allocated"
    )


def kv_layout(value: object, allowed: tuple[str, ...]) -> StepPlannerValueError:
    return StepPlannerValueError(
        f"layout={value!r} is not a StepInputs layout; allowed: "
        + ", ".join(repr(name) for name in allowed)
    )


def kv_layout_type(value: object) -> StepPlannerTypeError:
    return StepPlannerTypeError(f"layout must be a str, got {_type_name(value)}")


def kv_array_not_filled(name: str, layout: str, needed: str) -> AttributeError:
    return AttributeError(
        f"StepInputs(layout={layout!r}) does not fill {name}; build it with layout={needed!r} "
        "or layout='all'"
    )


def already_initialised(name: str) -> StepPlannerRuntimeError:
    return StepPlannerRuntimeError(
        f"{name} is already initialised; allowed: __init__ once (make a new {name} instead)"
    )


def kv_not_copyable(name: str) -> StepPlannerTypeError:
    return StepPlannerTypeError(
        f"{name} cannot be copied or pickled: its page ids name KV cache memory that belongs to "
        f"one engine, so a second copy would hand out the same pages twice; make a new {name}"
    )
