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
