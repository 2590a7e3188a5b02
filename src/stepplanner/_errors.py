"""Every error message of the package, in one place.

The compiled core and the pure-Python reference raise through these builders, so their messages
cannot drift apart (the parity tests compare ``(type(e), str(e))``). A message names the field, the
value and what is allowed. Each builder returns the exception; the caller raises it.
"""

from __future__ import annotations

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1


def _type_name(value: object) -> str:
    return type(value).__name__


# --- scalar fields ---------------------------------------------------------------------------


def not_integer(field: str, value: object) -> TypeError:
    return TypeError(f"{field} must be an integer, got {_type_name(value)} {value!r}")


def not_bool(field: str, value: object) -> TypeError:
    return TypeError(f"{field} must be a bool (or 0/1), got {_type_name(value)} {value!r}")


def out_of_int32(field: str, value: int) -> OverflowError:
    return OverflowError(f"{field}={value} does not fit int32; allowed [{INT32_MIN}, {INT32_MAX}]")


def out_of_uint64(field: str, value: int) -> OverflowError:
    return OverflowError(f"{field}={value} does not fit uint64; allowed [0, {UINT64_MAX}]")


def not_enum(field: str, value: object, enum_type: type) -> ValueError:
    allowed = ", ".join(f"{m.name}({int(m)})" for m in enum_type)  # type: ignore[attr-defined]
    return ValueError(f"{field}={value!r} is not a {enum_type.__name__}; allowed: {allowed}")


def out_of_range(field: str, value: int, allowed: str) -> ValueError:
    return ValueError(f"{field}={value} is out of range; allowed: {allowed}")


# --- the planner ---------------------------------------------------------------------------


def unresolved_mode(mode: object) -> RuntimeError:
    return RuntimeError(
        f"policy.mode={mode!r} cannot be planned; allowed: MIXED or PREFILL_FIRST "
        "(pass the policy through resolve_scheduling_policy() first)"
    )


def residents_type(value: object) -> TypeError:
    return TypeError(
        "residents must be a list or tuple of ResidentState or a 1-D numpy array of "
        f"RESIDENT_DTYPE, got {_type_name(value)}"
    )


def element_type(index: int, value: object) -> TypeError:
    return TypeError(f"residents[{index}] must be a ResidentState, got {_type_name(value)}")


def array_dtype(dtype: object, expected: object) -> TypeError:
    return TypeError(
        f"residents array has dtype {dtype}; allowed: exactly RESIDENT_DTYPE {expected} "
        "(same fields, offsets and native byte order; convert with arr.astype(RESIDENT_DTYPE))"
    )


def array_ndim(ndim: int) -> ValueError:
    return ValueError(f"residents array has ndim={ndim}; allowed: 1")


def count_negative(count: int) -> ValueError:
    return ValueError(f"count={count} is negative; allowed: 0 <= count <= max_batch_size")


def planner_memory(max_batch_size: int, nbytes: int) -> MemoryError:
    return MemoryError(
        f"max_batch_size={max_batch_size} needs {nbytes / 2**30:.1f} GiB of planner buffers "
        f"({nbytes} bytes), which could not be allocated; a StepPlanner sizes its buffers for "
        "max_batch_size up front (SPEC §3), so pass the engine's real slot count"
    )


def count_over_batch(count: int, max_batch_size: int) -> ValueError:
    return ValueError(
        f"count={count} exceeds max_batch_size={max_batch_size}; allowed: 0..{max_batch_size}"
    )


def count_over_length(count: int, length: int) -> ValueError:
    return ValueError(f"count={count} exceeds len(residents)={length}; allowed: 0..{length}")


def plan_reentered() -> RuntimeError:
    return RuntimeError(
        "StepPlanner.plan() re-entered: it was called while a plan() on the same planner was "
        "still reading its residents (from code the residents container ran, e.g. a list "
        "subclass's __getitem__, or from another thread while that code ran); allowed: one "
        "plan() at a time per planner (use one planner per thread)"
    )


def resident_negative(index: int, field: str, value: int) -> ValueError:
    return ValueError(f"residents[{index}].{field}={value} is negative; allowed: >= 0")


def prompt_exhausted(index: int, prompt_length: int, committed: int) -> ValueError:
    return ValueError(
        f"residents[{index}] is prompt-incomplete (context_committed=False) but "
        f"prompt_length - committed = {prompt_length} - {committed} = "
        f"{prompt_length - committed}; allowed: > 0 (set context_committed once the prompt commits)"
    )


def prompt_too_long(index: int, prompt_length: int, max_input_length: int) -> ValueError:
    return ValueError(
        f"residents[{index}].prompt_length={prompt_length} exceeds "
        f"max_input_length={max_input_length} for a prompt-incomplete resident; "
        f"allowed: 1..{max_input_length}"
    )


def reasons_array(problem: str) -> ValueError:
    return ValueError(
        f"reasons {problem}; allowed: a writable 1-D numpy uint8 array with len >= count"
    )


# --- applying a plan -----------------------------------------------------------------------


def apply_length(length: int, needed: int) -> ValueError:
    return ValueError(
        f"len(residents)={length} is smaller than the plan's resident count {needed}; "
        f"allowed: >= {needed}"
    )


def apply_readonly() -> ValueError:
    return ValueError("residents array is read-only; allowed: a writable array")


def apply_overflow(index: int, field: str, value: int, add: int) -> OverflowError:
    return OverflowError(
        f"residents[{index}].{field}={value} + {add} does not fit int32; "
        f"allowed: result <= {INT32_MAX}"
    )


# --- the ledger (stepplanner.Ledger: compiled and pure-Python alike) -------------------------


class QueueFullError(RuntimeError):
    """``Ledger.submit`` past ``max_waiting``: the backpressure signal (a server's HTTP 429)."""


def not_int64(field: str, value: int) -> OverflowError:
    return OverflowError(f"{field}={value} does not fit int64; allowed "
                         f"[{-(2**63)}, {2**63 - 1}]")


def ledger_prompt_length(request_id: int, length: int, max_input_length: int) -> ValueError:
    if length < 1:
        return ValueError(f"prompt_length={length} is out of range; allowed: "
                          f"1..{max_input_length}")
    return ValueError(
        f"prompt_length={length} exceeds max_input_length={max_input_length}: request "
        f"{request_id} is refused (a prompt is never truncated); allowed: 1..{max_input_length}")


def max_new_tokens_range(value: int) -> ValueError:
    return ValueError(f"max_new_tokens={value} is out of range; allowed: None or >= 1")


def duplicate_request(request_id: int) -> ValueError:
    return ValueError(f"request_id={request_id} is already waiting or resident; allowed: an id "
                      "not in the ledger")


def queue_full(request_id: int, max_waiting: int) -> QueueFullError:
    return QueueFullError(
        f"the waiting queue is full (max_waiting={max_waiting}): request {request_id} is "
        "refused; allowed: submit again once admit() has made room (a server answers HTTP 429)")


def stamps_exhausted(request_id: int) -> OverflowError:
    return OverflowError(
        f"request {request_id} cannot be stamped: the next arrival stamp would be 2**64, beyond "
        f"uint64 (a loaded resident has arrival {UINT64_MAX}); allowed: load() arrivals below "
        f"{UINT64_MAX} while requests are still to be submitted")


def not_in_ledger(request_id: int) -> ValueError:
    return ValueError(f"request_id={request_id} is not waiting or resident; allowed: an id in "
                      "the ledger")


def not_resident(request_id: int) -> ValueError:
    return ValueError(f"request_id={request_id} is not resident; allowed: one of "
                      "ledger.request_ids")


def repeated_ids(ids: list[int]) -> ValueError:
    return ValueError(f"request_ids {ids} repeat an id; allowed: each at most once")


def plan_type(plan: object, expected: str) -> TypeError:
    return TypeError(f"plan must be a {expected}, got {_type_name(plan)}")


def plan_count(num_residents: int, count: int) -> ValueError:
    return ValueError(f"plan was made over {num_residents} residents but the ledger holds "
                      f"count={count}; allowed: a plan of ledger.residents")


def finished_type(value: object) -> TypeError:
    dtype = getattr(value, "dtype", None)
    got = f"an array of dtype {dtype}" if dtype is not None else _type_name(value)
    return TypeError(f"finished must be a 1-D numpy bool array (one flag per plan row) or None, "
                     f"got {got}")


def finished_shape(shape: tuple[int, ...], rows: int) -> ValueError:
    return ValueError(f"finished has shape {shape}; allowed: ({rows},), one flag per plan row "
                      "(len(plan.sequences))")


def finished_without_token(row: int, resident: int) -> ValueError:
    return ValueError(
        f"finished[{row}] is True but plan row {row} (resident {resident}) emits no token "
        "(select_last_token_logits is False: a non-final prompt chunk); allowed: True only on "
        "rows that sampled a token")


def nothing_pending() -> ValueError:
    return ValueError("finished was given but no plan of this ledger's step() is waiting to be "
                      "applied (apply(), admit(), retire or load ran since); allowed: None")


def planner_mismatch(limits: object, expected: object) -> ValueError:
    return ValueError(f"planner has limits {limits!r}; allowed: a StepPlanner made for the "
                      f"ledger's limits {expected!r}")


def load_arrival_taken(index: int, arrival: int, request_id: int) -> ValueError:
    return ValueError(
        f"residents[{index}].arrival={arrival} is the arrival stamp of waiting request "
        f"{request_id}; allowed: arrivals no waiting request holds (they must stay unique)")


def plan_value(where: str, value: int, allowed: str) -> ValueError:
    return ValueError(
        f"plan.{where}={value} is out of range; allowed: {allowed} (a plan's rows come from the "
        "planner; this one was changed outside it)"
    )


# --- the KV page table and the step's attention inputs ------------------------------------


def kv_tokens_over_row(num_tokens: int, max_pages: int, page_size: int) -> ValueError:
    return ValueError(
        f"num_tokens={num_tokens} needs more than max_pages_per_sequence={max_pages} pages of "
        f"{page_size} tokens; allowed: 0..{max_pages * page_size}"
    )


def kv_move_onto_pages(dst: int, pages: int) -> ValueError:
    return ValueError(
        f"dst={dst} holds {pages} page(s); allowed: an empty slot (release it first)"
    )


def kv_page_size_mismatch(table: int, limits: int) -> ValueError:
    return ValueError(
        f"page_table.kv_page_size={table} differs from limits.kv_page_size={limits}; "
        "allowed: the same page size"
    )


def kv_slots_short(slots: int, max_batch_size: int) -> ValueError:
    return ValueError(
        f"page_table.max_batch_size={slots} is smaller than limits.max_batch_size="
        f"{max_batch_size}; allowed: >= {max_batch_size} (one slot per ledger row)"
    )


def kv_inputs_memory(max_batch_size: int, max_tokens: int, max_pages: int) -> MemoryError:
    return MemoryError(
        f"StepInputs buffers for max_batch_size={max_batch_size}, t_max={max_tokens} tokens "
        f"and max_pages_per_sequence={max_pages} could not be allocated"
    )


def kv_plan_type(value: object) -> TypeError:
    return TypeError(
        "plan must be a StepPlan, a 1-D SEQUENCE_DTYPE array or an object whose as_array() "
        f"gives one, got {_type_name(value)}"
    )


def kv_plan_dtype(dtype: object, expected: object) -> TypeError:
    return TypeError(f"plan array has dtype {dtype}; allowed: exactly SEQUENCE_DTYPE {expected}")


def kv_plan_ndim(ndim: int) -> ValueError:
    return ValueError(f"plan array has ndim={ndim}; allowed: 1")


def kv_plan_rows(rows: int, max_batch_size: int) -> ValueError:
    return ValueError(
        f"plan has {rows} rows; allowed: <= limits.max_batch_size={max_batch_size}"
    )


def kv_plan_tokens(tokens: int, max_tokens: int) -> ValueError:
    return ValueError(
        f"plan has {tokens} query tokens in all; allowed: <= limits.t_max={max_tokens}"
    )


def kv_resident_range(index: int, resident: int, slots: int) -> ValueError:
    return ValueError(
        f"plan row {index}: resident={resident} is not a page-table slot; "
        f"allowed: 0..{slots - 1}"
    )


def kv_row_field(index: int, field: str, value: int, allowed: str) -> ValueError:
    return ValueError(f"plan row {index}: {field}={value} is out of range; allowed: {allowed}")


def kv_row_overflow(index: int, past_length: int, query_length: int) -> OverflowError:
    return OverflowError(
        f"plan row {index}: past_length + query_length = {past_length} + {query_length} "
        f"does not fit int32; allowed: <= {INT32_MAX}"
    )


def kv_pages_missing(index: int, resident: int, past_length: int, query_length: int,
                     pages: int, page_size: int) -> ValueError:
    need = past_length + query_length
    return ValueError(
        f"plan row {index}: resident {resident} needs KV pages for {need} tokens "
        f"(past_length {past_length} + query_length {query_length}) but its pages hold "
        f"{pages * page_size} tokens ({pages} page(s) of {page_size}); "
        f"call page_table.ensure({resident}, {need}) first"
    )


def kv_table_memory(max_batch_size: int, max_pages: int, num_pages: int) -> MemoryError:
    nbytes = 4 * (max_batch_size * max_pages + num_pages) + 12 * max_batch_size
    return MemoryError(
        f"KVPageTable(max_batch_size={max_batch_size}, max_pages_per_sequence={max_pages}, "
        f"num_pages={num_pages}) needs {nbytes} bytes, which could not be allocated"
    )


def kv_layout(value: object, allowed: tuple[str, ...]) -> ValueError:
    return ValueError(f"layout={value!r} is not a StepInputs layout; allowed: "
                      + ", ".join(repr(name) for name in allowed))


def kv_layout_type(value: object) -> TypeError:
    return TypeError(f"layout must be a str, got {_type_name(value)}")


def kv_array_not_filled(name: str, layout: str, needed: str) -> AttributeError:
    return AttributeError(
        f"StepInputs(layout={layout!r}) does not fill {name}; build it with layout={needed!r} "
        "or layout='all'"
    )


def already_initialised(name: str) -> RuntimeError:
    return RuntimeError(f"{name} is already initialised; allowed: __init__ once (make a new "
                        f"{name} instead)")


def kv_not_copyable(name: str) -> TypeError:
    return TypeError(
        f"{name} cannot be copied or pickled: its page ids name KV cache memory that belongs to "
        f"one engine, so a second copy would hand out the same pages twice; make a new {name}"
    )
