"""What both ledgers share in Python: argument conversion, the checks whose messages both raise,
and ``load()``'s parsing of records (that runs once per snapshot, never per step). The compiled
ledger (``_ledger.pyx``) and its pure-Python twin (``_ledger_py.py``) both call these, so the two
cannot check differently.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import _errors
from ..kv._checks import Geometry, check_table_fits
from ..kv.paging import worst_case_pages
from ..planner._fields import as_bool, as_float, as_int, as_int32, as_uint64
from ..planner._policy import ResolvedSchedulingPolicy, StepPlannerLimits, check_reserved_slots
from ..planner._slo import SLO, check_slo, check_slo_classes, slo_fields
from ..planner._types import (
    RESIDENT_DTYPE,
    RESIDENT_FIELDS,
    SchedulingPolicy,
    SequenceWork,
    first_repeat,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
# Queue bound when none is given: sixteen times the batch, a few seconds of arrivals for an
# engine of that size; past it a server should push back (HTTP 429), not queue without bound.
WAITING_PER_SLOT = 16
_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


# --- what both implementations share ----------------------------------------------------------


def as_request_id(value: object, field: str = "request_id") -> int:
    rid = as_int(field, value)
    if not INT64_MIN <= rid <= INT64_MAX:
        raise _errors.not_int64(field, rid)
    return rid


def check_ledger_args(limits: object, policy: object, max_waiting: object) -> tuple[bool, int, int]:
    """(by_priority, reserved_slots, max_waiting) of a new ledger, every argument checked."""
    if not isinstance(limits, StepPlannerLimits):
        raise _errors.StepPlannerTypeError(
            f"limits must be a StepPlannerLimits, got {type(limits).__name__}"
        )
    if policy is not None and not isinstance(policy, ResolvedSchedulingPolicy):
        raise _errors.StepPlannerTypeError(
            f"policy must be a ResolvedSchedulingPolicy or None, got {type(policy).__name__}"
        )
    reserved = policy.priority_reserved_slots if policy is not None else 0
    check_reserved_slots(reserved, limits)
    by_priority = policy is not None and policy.scheduling_policy == SchedulingPolicy.PRIORITY
    if max_waiting is None:
        bound = WAITING_PER_SLOT * limits.max_batch_size
    else:
        bound = as_int("max_waiting", max_waiting)
    if not 0 <= bound <= 2**31 - 1:
        raise _errors.out_of_range(
            "max_waiting", bound, f"0..{2**31 - 1} (or None: {WAITING_PER_SLOT} x max_batch_size)"
        )
    return by_priority, reserved, bound


def check_page_table(
    page_table: Any,
    limits: StepPlannerLimits,
    classes: tuple[Any, ...],
    allowed: str,
    geometry: Callable[[Any], Geometry],
) -> None:
    """A page table a new ledger may own: one of ``classes``, a slot per row, the limits' page
    size, and every page free (slot ``i`` is row ``i`` from the start). ``geometry`` reads the
    table's own storage: the ledger's C indexes by it, whatever a subclass's properties say."""
    if not isinstance(page_table, classes):
        raise _errors.ledger_page_table_type(page_table, allowed)
    sizes = geometry(page_table)
    check_table_fits(sizes, limits)
    if sizes.num_free_pages != sizes.num_pages:
        raise _errors.ledger_page_table_in_use(
            sizes.num_pages - sizes.num_free_pages, sizes.num_pages
        )


def check_worst_case(rid: int, length: int, limit: int, sizes: Geometry) -> None:
    """A request (``limit`` 0: no ``max_new_tokens``) whose worst case some row of a table of
    ``sizes`` can hold."""
    if limit == 0:
        raise _errors.ledger_unbounded_request(rid)
    pages = worst_case_pages(length, limit, sizes.kv_page_size)
    most = min(sizes.max_pages_per_sequence, sizes.num_pages)
    if pages > most:
        raise _errors.ledger_worst_case_pages(rid, length, limit, pages, most)


def pages_in_use(committed: np.ndarray, page_size: int) -> int:
    """Pages that hold committed KV: ``sum(ceil(committed / P))``."""
    return int(((committed.astype(np.int64) + page_size - 1) // page_size).sum())


def submission(
    rid: object,
    prompt_length: object,
    priority: object,
    max_new_tokens: object,
    max_input_length: int,
) -> tuple[int, int, int, int]:
    """(request_id, prompt_length, priority, max_new or 0 for none), each field checked."""
    rid_ = as_request_id(rid)
    length = as_int32("prompt_length", prompt_length)
    prio = as_int32("priority", priority)
    limit = 0
    if max_new_tokens is not None:
        limit = as_int("max_new_tokens", max_new_tokens)
        if limit > INT64_MAX:
            raise _errors.not_int64("max_new_tokens", limit)
        if limit < 1:
            raise _errors.max_new_tokens_range(limit)
    if not 1 <= length <= max_input_length:
        raise _errors.ledger_prompt_length(rid_, length, max_input_length)
    return rid_, length, prio, limit


# --- admission order (docs/scheduling.md, "Uncached work first") --------------------------------


class AdmissionOrder(enum.IntEnum):
    """The order in which a ledger admits waiting requests, within the policy's classes.

    ``ARRIVAL``: the policy's own (SPEC order: arrival, or priority then arrival).
    ``UNCACHED_FIRST``: the fewest prompt tokens still to compute after the prefix-cache hit
    (``prompt_length - cached_tokens``) first, ties by arrival; a request that has waited past
    the starvation bound goes back to arrival order, ahead of every one that has not. Under
    ``EDF`` and ``DEADLINE`` only requests with *slack to spare* are ordered so: one whose
    uncached work, started now at a chunk a step, would not bring its first token a step before
    its deadline (it would rank ``AT_RISK``), or that has starved, keeps the policy's own order
    (first-token deadline, then arrival; under DEADLINE within its class), ahead of those with
    slack."""

    ARRIVAL = 0
    UNCACHED_FIRST = 1


# The checked admission arguments: (order, bound, by_seconds). ``bound``: a request is starved
# once ``since + bound <= clock``, where the clock is the admission passes so far (steps; bound =
# starvation_steps + 1, so that 0 means "from its first pass": arrival order) or ``now`` (seconds).
AdmissionArgs = tuple[int, float, bool]
NO_ADMISSION_ARGS: AdmissionArgs = (0, 0.0, False)


def check_admission_args(
    admission: object, starvation_steps: object, starvation_seconds: object
) -> AdmissionArgs:
    """``Ledger(admission=, starvation_steps=, starvation_seconds=)``, checked: an
    ``AdmissionOrder``; under ``UNCACHED_FIRST`` exactly one bound (an unbounded shortest-first
    order starves long prompts for as long as shorter ones keep arriving); under ``ARRIVAL`` none
    (a bound given there would be silently ignored)."""
    if isinstance(admission, bool) or not isinstance(admission, (int, AdmissionOrder)):
        raise _errors.wrong_type("admission", "stepplanner.AdmissionOrder", admission)
    if admission not in (AdmissionOrder.ARRIVAL, AdmissionOrder.UNCACHED_FIRST):
        raise _errors.out_of_range(
            "admission",
            admission,
            "AdmissionOrder.ARRIVAL (0) or AdmissionOrder.UNCACHED_FIRST (1)",
        )
    order = int(admission)
    given = [
        name
        for name, value in (
            ("starvation_steps", starvation_steps),
            ("starvation_seconds", starvation_seconds),
        )
        if value is not None
    ]
    if order == AdmissionOrder.ARRIVAL:
        if given:
            raise _errors.StepPlannerValueError(
                f"{given[0]} is given but admission is AdmissionOrder.ARRIVAL, which has no "
                "starvation bound; allowed: None, or admission=AdmissionOrder.UNCACHED_FIRST"
            )
        return NO_ADMISSION_ARGS
    if len(given) != 1:
        raise _errors.StepPlannerValueError(
            "admission=AdmissionOrder.UNCACHED_FIRST needs exactly one starvation bound, got "
            f"{' and '.join(given) or 'neither'}; allowed: starvation_steps=N "
            f"(0..{_errors.INT32_MAX}) or starvation_seconds=S (a finite number >= 0)"
        )
    if starvation_steps is not None:
        steps = as_int("starvation_steps", starvation_steps)
        if not 0 <= steps <= _errors.INT32_MAX:
            raise _errors.out_of_range("starvation_steps", steps, f"0..{_errors.INT32_MAX}")
        return order, float(steps + 1), False
    if isinstance(starvation_seconds, bool) or not isinstance(starvation_seconds, (int, float)):
        kind = type(starvation_seconds).__name__
        raise _errors.StepPlannerTypeError(
            f"starvation_seconds must be a number of seconds, got {kind}"
        )
    seconds = as_float(starvation_seconds)
    if seconds is None or not 0.0 <= seconds < math.inf:
        raise _errors.out_of_range("starvation_seconds", starvation_seconds, "a finite number >= 0")
    return order, seconds, True


def as_cached_tokens(value: object, prompt_length: int) -> int:
    """``submit(cached_tokens=)``: the prompt tokens the runtime's prefix cache already holds
    for the request, 0..prompt_length (an int32)."""
    cached = as_int32("cached_tokens", value)
    if not 0 <= cached <= prompt_length:
        raise _errors.out_of_range(
            "cached_tokens", cached, f"0..{prompt_length} (the request's prompt_length)"
        )
    return cached


def admission_now(
    call: str, now: object, ranking: int, needed: int, by_seconds: bool
) -> float | None:
    """``optional_now``, and with a starvation bound in seconds ``now`` is required too (the
    bound is measured on the runtime's clock)."""
    if now is None and by_seconds:
        raise _errors.now_required_for_starvation(call)
    return optional_now(call, now, ranking, needed)


# --- deadlines (docs/scheduling.md): the numbers both ledgers' rank passes use -----------------

# How a ledger ranks its rows before each plan: not at all (FCFS, PRIORITY), by the next deadline
# (EDF), or by slack with relegation (DEADLINE).
RANK_NONE, RANK_EDF, RANK_DEADLINE = 0, 1, 2
# DEADLINE's levels, written into each row's priority (the planner pauses every row whose
# priority is larger than the first pending prompt's: SPEC §3 step 2).
LEVEL_DUE = 0  # a decode that cannot skip a step without missing its next deadline
LEVEL_AT_RISK = 1  # a prompt that misses its first-token deadline at the normal pace
LEVEL_SLACK = 2  # everything that can still meet its objectives and can wait a step
LEVEL_RELEGATED = 3  # a request that can no longer meet them: served after the rest
# Within a level, the request's own priority class decides (lower first): priority = level x
# LEVEL_STRIDE + the class, clamped to +-CLASS_SPAN (classes beyond it tie with the bound).
LEVEL_STRIDE = 2**24
CLASS_SPAN = 2**23 - 1


def level_of(priority: int) -> int:
    """The DEADLINE level a row's ``priority`` holds (its class taken off)."""
    return (int(priority) + LEVEL_STRIDE // 2) // LEVEL_STRIDE


# Keys written into ``arrival`` (uint64): a prompt's slack in microseconds around KEY_ZERO
# (clamped to +-KEY_SPAN), rows without a deadline after every keyed row (KEY_NONE + stamp),
# decodes and relegated rows by stamp. EDF writes the next deadline in milliseconds from now
# into ``priority``.
KEY_ZERO = 2**51
KEY_SPAN = 2**50
KEY_NONE = 2**62
EDF_SPAN = 2**31 - 2  # EDF's priority: +-EDF_SPAN ms; INT32_MAX is "no deadline"
# A measured step time: each step's duration moves the estimate this far towards it.
STEP_TIME_WEIGHT = 0.25


# What check_deadline_args returns: (ranking, classes, base, per_token, measured, step tokens,
# chunk).
DeadlineArgs = tuple[int, dict[int, SLO], float, float, bool, int, int]


def check_deadline_args(
    policy: ResolvedSchedulingPolicy | None,
    limits: StepPlannerLimits,
    slo_classes: object,
    step_time: object,
) -> DeadlineArgs:
    """(ranking, classes, base seconds, seconds per token, measured, step tokens, chunk) of a
    new ledger: what its rank pass needs, every argument checked.

    ``step_time``: ``(base, per_token)`` seconds, the estimate of a step of ``t`` tokens being
    ``base + per_token * t``, or ``None`` to measure it from the ``now`` of consecutive steps.
    A step is estimated at the policy's full budget (``max_num_tokens``); a prompt advances by at
    most ``max_chunk_tokens`` a step."""
    classes = check_slo_classes(slo_classes)
    policy_id = policy.scheduling_policy if policy is not None else SchedulingPolicy.FCFS
    ranking = {SchedulingPolicy.EDF: RANK_EDF, SchedulingPolicy.DEADLINE: RANK_DEADLINE}.get(
        policy_id, RANK_NONE
    )
    measured = step_time is None
    base = per_token = 0.0
    if not measured:
        if (
            not isinstance(step_time, tuple)
            or len(step_time) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in step_time)
        ):
            raise _errors.StepPlannerTypeError(
                "step_time must be a (base_seconds, seconds_per_token) pair of numbers, or None "
                f"(measured from now), got {step_time!r}"
            )
        parts = []
        for name, given in zip(("step_time base", "step_time per_token"), step_time):
            value = as_float(given)
            if value is None or not (value >= 0 and value < float("inf")):
                shown = given if value is None else value
                raise _errors.out_of_range(name, shown, "a finite number of seconds >= 0")
            parts.append(value)
        base, per_token = parts
    if policy is None:
        budget, step_tokens, chunk = "max_step_tokens", limits.t_max, limits.max_input_length
    else:
        budget, step_tokens, chunk = (
            "max_num_tokens",
            policy.max_num_tokens,
            policy.max_chunk_tokens,
        )
    # Each part finite is not enough: the rank pass prices every step at the full budget, and an
    # infinite estimate would relegate every request with an objective for good. (The sum, in
    # the order the compiled ledger's step_estimate adds it.)
    if not base + per_token * step_tokens < float("inf"):
        raise _errors.step_time_not_finite(base, per_token, budget, step_tokens)
    return ranking, classes, base, per_token, measured, step_tokens, chunk


def check_constructor(
    limits: Any,
    policy: Any,
    max_waiting: object,
    slo_classes: object,
    step_time: object,
    relegated_wait: object = None,
    never_relegate_below: object = 0,
    max_loras: object = None,
    admission: object = 0,
    starvation_steps: object = None,
    starvation_seconds: object = None,
) -> tuple[tuple[bool, int, int], DeadlineArgs, tuple[float, int], int, AdmissionArgs]:
    """A new ledger's arguments, checked in one order for both ledgers (``check_ledger_args``,
    ``check_deadline_args``, ``check_relegation_args``, then ``check_max_loras``: limits, policy,
    max_waiting, slo_classes, step_time, relegated_wait, never_relegate_below, max_loras, then
    ``check_admission_args``; the page table is checked after, by the caller), so that any mix
    of bad arguments is refused with the same error by both."""
    ledger_args = check_ledger_args(limits, policy, max_waiting)
    deadlines = check_deadline_args(policy, limits, slo_classes, step_time)
    relegation = check_relegation_args(relegated_wait, never_relegate_below)
    loras = check_max_loras(max_loras)
    order = check_admission_args(admission, starvation_steps, starvation_seconds)
    return ledger_args, deadlines, relegation, loras, order


# --- LoRA adapters (docs/decisions.md, "LoRA adapters") ----------------------------------------


def check_max_loras(value: object) -> int:
    """``max_loras`` as the most distinct adapters the residents may hold; 0 for None (no
    limit)."""
    if value is None:
        return 0
    most = as_int("max_loras", value)
    if not 1 <= most <= 2**31 - 1:
        raise _errors.out_of_range("max_loras", most, f"1..{2**31 - 1}, or None for no limit")
    return most


def as_lora_id(value: object, field: str = "lora_id") -> int:
    """A request's adapter: 0 for the base model, else the runtime's adapter id (vLLM's
    ``lora_int_id``)."""
    lora = as_int(field, value)
    if lora > INT64_MAX:
        raise _errors.not_int64(field, lora)
    if lora < 0:
        raise _errors.out_of_range(field, lora, f"0 (the base model)..{INT64_MAX}")
    return lora


class AdapterSlots:
    """The rule of LoRA admission: the residents hold at most ``most`` distinct adapters (the
    base model, 0, is none), so every step's rows do. ``join`` asks, in queue order, whether a
    request may be admitted; a request it turns away waits and the caller reads on. The
    pure-Python ledger and the vLLM integration use this class; the compiled ledger's
    ``admit_waiting`` is its C twin."""

    __slots__ = ("held", "most")

    def __init__(self, most: int, resident: Iterable[int]) -> None:
        self.most = most  # 0: no limit (and ``resident`` is not read)
        self.held = {lora for lora in resident if lora} if most else set()

    def fits(self, lora: int) -> bool:
        """Whether a request of adapter ``lora`` could join the residents now (nothing held)."""
        return not lora or not self.most or lora in self.held or len(self.held) < self.most

    def join(self, lora: int) -> bool:
        """Whether a request of adapter ``lora`` may join the residents now; if it may, its
        adapter is held from then on (the caller admits it)."""
        if not self.fits(lora):
            return False
        if lora and self.most:
            self.held.add(lora)
        return True


def check_resident_loras(loras: np.ndarray, most: int) -> None:
    """``load()``'s adapters: at most ``most`` distinct ones (0: any number)."""
    held = np.unique(loras[loras != 0])
    if most and held.size > most:
        raise _errors.StepPlannerValueError(
            f"the residents hold {held.size} distinct lora_id values ({held[: most + 1].tolist()}"
            f"{', ...' if held.size > most + 1 else ''}); allowed: at most max_loras={most}"
        )


# Relegation (docs/scheduling.md, "Overload"): who may be given up on, and how long a request
# given up on may wait in the queue before it is handed back (shed_ids).
NEVER_RELEGATE_BELOW = 0  # the urgent classes (priority < 0) are never relegated by default


def check_relegation_args(
    relegated_wait: object, never_relegate_below: object
) -> tuple[float, int]:
    """(wait, floor) of a new ledger or ranker: ``relegated_wait`` seconds a relegated request
    may still wait in the queue (NaN for ``None``: each request its own TTFT objective; 0: handed
    back at once), and the class below which nothing is relegated."""
    floor = as_int32("never_relegate_below", never_relegate_below)
    if relegated_wait is None:
        return math.nan, floor
    if isinstance(relegated_wait, bool) or not isinstance(relegated_wait, (int, float)):
        raise _errors.StepPlannerTypeError(
            "relegated_wait must be a number of seconds or None (each request's own TTFT "
            f"objective), got {type(relegated_wait).__name__}"
        )
    try:
        wait = float(relegated_wait)
    except OverflowError:
        wait = math.inf
    if not (wait >= 0 and wait < math.inf):
        raise _errors.out_of_range(
            "relegated_wait",
            relegated_wait,
            "a finite number of seconds >= 0 (0: hand relegated requests back at once), or None",
        )
    return wait, floor


def as_time(field: str, value: object) -> float:
    """A time on the runtime's clock, or a duration: a finite float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _errors.StepPlannerTypeError(
            f"{field} must be a number of seconds, got {type(value).__name__}"
        )
    seconds = as_float(value)
    if seconds is None or seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise _errors.not_finite_time(field, value)
    return seconds


def request_deadlines(
    rid: int, priority: int, arrival_time: object, slo: object, classes: dict[int, SLO]
) -> tuple[float, float, float]:
    """(first token due, per-token gap, TTFT objective) of a submitted request: its own
    ``slo``, else its priority class's, else none (``inf``, 0, ``inf``)."""
    own = check_slo("slo", slo)
    chosen = own if own is not None else classes.get(priority)
    if arrival_time is not None:
        arrival = as_time("arrival_time", arrival_time)
    elif chosen is not None:
        raise _errors.arrival_time_required(rid)
    else:
        arrival = 0.0
    due, gap = slo_fields(chosen, arrival)
    return due, gap, chosen.ttft if chosen is not None else math.inf


def check_admits_args(
    prompt_tokens: object, first_due: object, now: object
) -> tuple[int, float, float]:
    """``Ranker.admits``' arguments: a prompt of 0..INT32_MAX tokens (a ledger row's
    ``prompt_length``), a first-token deadline (a number; ``inf``: none) and ``now``."""
    tokens = as_int32("prompt_tokens", prompt_tokens)
    if tokens < 0:
        raise _errors.StepPlannerValueError(
            f"prompt_tokens={tokens} is negative; allowed: 0..{_errors.INT32_MAX}"
        )
    if isinstance(first_due, bool) or not isinstance(first_due, (int, float)):
        raise _errors.StepPlannerTypeError(
            f"first_due must be a number of seconds, got {type(first_due).__name__}"
        )
    due = as_float(first_due)
    if due is None or due != due:  # an int past a float: refused, not taken for inf
        raise _errors.not_a_deadline("first_due", first_due)
    return tokens, due, as_time("now", now)


def optional_now(call: str, now: object, ranking: int, needed: int) -> float | None:
    """``now`` as a float; ``None`` when not given and the ledger's ranking needs none here
    (``needed``: the least ranking that requires it)."""
    if now is None:
        if ranking >= needed and ranking != RANK_NONE:
            policy = "EDF" if ranking == RANK_EDF else "DEADLINE"
            raise _errors.now_required(call, policy)
        return None
    return as_time("now", now)


# What Ranker.rank reads and writes: (argument, dtype, written).
RANK_ARRAYS = (
    ("first_due", np.dtype(np.float64), False),
    ("gap", np.dtype(np.float64), False),
    ("generated", np.dtype(np.int64), False),
    ("stamp", np.dtype(np.uint64), False),
    ("relegated", np.dtype(np.uint8), True),
)


def check_rank_arrays(
    rows: object, arrays: Sequence[object], capacity: int, classes: object = None
) -> int:
    """``Ranker.rank``'s arguments: ``rows`` a writable C-contiguous 1-D RESIDENT_DTYPE array of
    at most ``capacity`` rows, and one C-contiguous 1-D array per row of each of RANK_ARRAYS
    (``relegated`` writable), and of ``classes`` (int32) unless it is None. Returns the row
    count."""
    if (
        not isinstance(rows, np.ndarray)
        or rows.dtype != RESIDENT_DTYPE
        or rows.ndim != 1
        or not rows.flags.c_contiguous
        or not rows.flags.writeable
    ):
        raise _errors.StepPlannerTypeError(
            "rows must be a writable C-contiguous 1-D array of RESIDENT_DTYPE, got "
            f"{type(rows).__name__}" + (f" of {rows.dtype}" if isinstance(rows, np.ndarray) else "")
        )
    n = len(rows)
    if n > capacity:
        raise _errors.out_of_range("len(rows)", n, f"0..{capacity} (max_batch_size)")
    extra = () if classes is None else ((("classes", np.dtype(np.int32), False), classes),)
    for (name, dtype, written), value in (*zip(RANK_ARRAYS, arrays), *extra):
        if (
            not isinstance(value, np.ndarray)
            or value.dtype != dtype
            or value.ndim != 1
            or not value.flags.c_contiguous
            or (written and not value.flags.writeable)
        ):
            raise _errors.StepPlannerTypeError(
                f"{name} must be a {'writable ' if written else ''}C-contiguous 1-D {dtype} "
                f"array, got {type(value).__name__}"
                + (f" of {value.dtype}" if isinstance(value, np.ndarray) else "")
            )
        if len(value) != n:
            raise _errors.StepPlannerValueError(
                f"{name} has {len(value)} entries for {n} rows; allowed: one per row"
            )
    return n


def parse_records(
    residents: Sequence[Mapping[str, Any]], capacity: int, max_loras: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``load()``'s records as (RESIDENT_DTYPE table, int64 ids, int64 adapters), checked
    against each other (at most ``max_loras`` distinct adapters; 0: any number).

    Every record is read here, before the ledger's own state is: the records' code (a Mapping's
    ``__getitem__``) runs before ``check_waiting`` sees the queue."""
    if len(residents) > capacity:
        raise _errors.StepPlannerValueError(
            f"{len(residents)} residents exceed max_batch_size={capacity}; allowed: 0..{capacity}"
        )
    table = np.zeros(len(residents), dtype=RESIDENT_DTYPE)
    ids = np.arange(len(residents), dtype=np.int64)
    loras = np.zeros(len(residents), dtype=np.int64)
    for i, record in enumerate(residents):
        table[i], rid, loras[i] = _row(i, record)
        if rid is not None:
            ids[i] = rid
    for name, column in (("arrival", table["arrival"]), ("request_id", ids)):
        if np.unique(column).size != column.size:
            raise _errors.StepPlannerValueError(
                f"two residents have the same {name}; allowed: unique values"
            )
    check_resident_loras(loras, max_loras)
    return table, ids, loras


def check_waiting(table: np.ndarray, ids: np.ndarray, waiting: Mapping[int, int]) -> None:
    """Parsed records against ``waiting`` (request id -> arrival stamp of each waiting request)."""
    for rid in ids.tolist():
        if rid in waiting:
            raise _errors.StepPlannerValueError(f"request_id {rid} is also waiting")
    stamps = {arrival: rid for rid, arrival in waiting.items()}
    for i, arrival in enumerate(table["arrival"].tolist()):
        if arrival in stamps:
            raise _errors.load_arrival_taken(i, arrival, stamps[arrival])


def _row(index: int, record: Mapping[str, Any]) -> tuple[tuple[Any, ...], int | None, int]:
    if not isinstance(record, Mapping):
        raise _errors.StepPlannerTypeError(
            f"residents[{index}] must be an object/dict, got {type(record).__name__}"
        )
    unknown = set(record) - set(RESIDENT_FIELDS) - {"request_id", "lora_id"}
    if unknown:
        raise _errors.StepPlannerValueError(
            f"residents[{index}] has unknown field(s) {sorted(unknown)}; allowed: "
            f"{', '.join(RESIDENT_FIELDS)}, request_id, lora_id"
        )
    get = record.get
    where = f"residents[{index}]."
    row = (
        as_int32(where + "priority", get("priority", 0)),
        as_uint64(where + "arrival", get("arrival", index)),
        as_int32(where + "prompt_length", get("prompt_length", 0)),
        as_int32(where + "committed", get("committed", 0)),
        as_bool(where + "context_committed", get("context_committed", False)),
        as_int32(where + "consecutive_paused_steps", get("consecutive_paused_steps", 0)),
    )
    lora = as_lora_id(get("lora_id", 0), where + "lora_id")
    # Absent means the row index; present must be an id (a None is refused, like any field's).
    if "request_id" not in record:
        return row, None, lora
    return row, as_request_id(record["request_id"], where + "request_id"), lora


def rows_argument(rows: object) -> list[int]:
    """``retire_rows``' argument as a list of ints, converted before the ledger reads its count
    (``__array__`` is the caller's code); ``check_rows`` then checks it against the count."""
    try:
        arr = np.asarray(rows)
    except ValueError:  # ragged nesting: numpy's message would not say which argument
        raise _errors.StepPlannerValueError(
            f"rows={rows!r} is not a flat sequence of row indices"
        ) from None
    if arr.size and arr.dtype.kind not in "iu":
        raise _errors.StepPlannerTypeError(f"rows must be integers, got dtype {arr.dtype}")
    listed: list[int] = arr.ravel().tolist()
    return listed


def check_rows(listed: list[int], count: int) -> None:
    """Distinct row indices below ``count``."""
    for row in listed:
        if not 0 <= row < count:
            raise _errors.StepPlannerValueError(
                f"row {row} is out of range; allowed: 0..{count - 1}"
            )
    if len(set(listed)) != len(listed):
        raise _errors.StepPlannerValueError(
            f"rows {listed} repeat a row; allowed: each at most once"
        )


def plan_sizes(rows: int, paused: int, count: int) -> None:
    """A plan over ``count`` residents has at most one row and one pause per resident."""
    for where, n in (("num_sequences", rows), ("num_paused", paused)):
        if n > count:
            raise _errors.plan_value(where, n, f"0..{count}, at most one per resident")


def plan_rows_in_range(resident: np.ndarray, paused: np.ndarray, count: int) -> None:
    """Every plan row and every pause names a resident row, and no resident twice: the
    accounting indexes the ledger's tables by them, and a resident named twice would be advanced
    (and counted) twice. The compiled ledger's ``_check_plan_rows`` checks the same, in the same
    order."""
    plan_sizes(len(resident), len(paused), count)
    bad = np.flatnonzero((resident < 0) | (resident >= count))
    if bad.size:
        k = int(bad[0])
        raise row_out_of_range(k, int(resident[k]), count)
    bad = np.flatnonzero((paused < 0) | (paused >= count))
    if bad.size:
        k = int(bad[0])
        raise _errors.plan_value(f"paused[{k}]", int(paused[k]), f"0..{count - 1}")
    repeated = first_repeat(resident.tolist(), paused.tolist())
    if repeated is not None:
        raise _errors.plan_resident_repeated(*repeated)


def plan_version(plan: Any) -> int | None:
    """The version of either implementation's ``StepPlan``: it changes whenever the plan does
    (None for anything else a planner returned: ``apply``/``step`` refuse that as no plan)."""
    version: int | None = getattr(plan, "_version", None)
    return version


def check_pending(plan: Any, version: int | None) -> None:
    """The plan ``step()`` left pending is still the one it returned (``version`` then)."""
    if plan_version(plan) != version:
        raise _errors.pending_plan_changed()


def row_out_of_range(k: int, resident: int, count: int) -> _errors.StepPlannerValueError:
    """The error for plan row ``k``, whose resident is no row below ``count``."""
    return _errors.plan_value(f"sequences[{k}].resident", resident, f"0..{count - 1}")


def step_reasons_error(capacity: int) -> _errors.StepPlannerValueError:
    """The error for a ``reasons`` that ``step()`` refuses: it needs a code per slot (not per
    resident), since admission may fill every slot before the plan is made."""
    return _errors.reasons_array(
        f"must hold a code per slot for step() (len >= capacity={capacity})"
    )


_PLAN_CLASSES: tuple[type, ...] = ()


def plan_classes() -> tuple[Any, ...]:
    """The StepPlan classes a ledger applies: the reference plan's and, when built, the core's.
    A duck-typed plan is refused: the compiled ledger indexes C arrays by what a plan holds."""
    global _PLAN_CLASSES
    if not _PLAN_CLASSES:
        from .._core_py import StepPlan as ReferencePlan

        try:
            from .._core import StepPlan as CorePlan
        except ImportError:  # a pure-Python install
            _PLAN_CLASSES = (ReferencePlan,)
        else:
            _PLAN_CLASSES = (ReferencePlan, CorePlan)
    return _PLAN_CLASSES


def finished_mask(finished: object, rows: int) -> np.ndarray | None:
    """The sampler's mask checked: None, or a 1-D bool array of one flag per plan row, copied
    (read once: it may be a view of the rows that applying the plan writes)."""
    if finished is None:
        return None
    if not isinstance(finished, np.ndarray) or finished.dtype != np.bool_:
        raise _errors.finished_type(finished)
    if finished.shape != (rows,):
        raise _errors.finished_shape(finished.shape, rows)
    return finished.copy()


def accepted_counts(accepted: object, seq: np.ndarray) -> np.ndarray | None:
    """The runtime's accepted drafts checked: None, or a 1-D int32 array of one count per plan
    row, each in 0..(the drafts that row verified) (SPEC §8: 0 for a chunk)."""
    if accepted is None:
        return None
    if not isinstance(accepted, np.ndarray) or accepted.dtype != np.int32:
        raise _errors.accepted_type(accepted)
    if accepted.shape != (len(seq),):
        raise _errors.accepted_shape(accepted.shape, len(seq))
    most = np.where(seq["work"] == SequenceWork.DECODE, seq["query_length"] - 1, 0)
    bad = np.flatnonzero((accepted < 0) | (accepted > most))
    if bad.size:
        k = int(bad[0])
        raise _errors.accepted_range(k, int(seq["resident"][k]), int(accepted[k]), int(most[k]))
    return accepted


def emitted_tokens(seq: np.ndarray, accepted: np.ndarray | None) -> np.ndarray:
    """Tokens each plan row emits (SPEC §8): a final chunk 1, a decode row 1 + its accepted
    drafts (all it verified when ``accepted`` is None), a non-final chunk none."""
    decode = seq["work"] == SequenceWork.DECODE
    verified = seq["query_length"].astype(np.int64) - 1
    drafts = verified if accepted is None else accepted.astype(np.int64)
    return np.where(decode, 1 + drafts, seq["select_last_token_logits"].astype(np.int64))


def draft_request(drafts: object) -> int | dict[int, int]:
    """``Ledger.step``'s ``drafts`` checked before anything changes: a count for every decoding
    request, or counts by request id."""
    if isinstance(drafts, Mapping):
        out = {}
        for rid, k in drafts.items():
            n = as_int32(f"drafts[{rid!r}]", k)
            if n < 0:
                raise _errors.drafts_negative(rid, n)
            out[as_request_id(rid)] = n
        return out
    if isinstance(drafts, (bool, float, str)) or not hasattr(drafts, "__index__"):
        raise _errors.ledger_drafts(drafts)
    n = as_int32("drafts", drafts)
    if n < 0:
        raise _errors.out_of_range("drafts", n, ">= 0")
    return n


def records_of(rows: np.ndarray, ids: np.ndarray, loras: np.ndarray) -> list[dict[str, Any]]:
    """The residents as dicts; a row with an adapter also carries its ``lora_id``."""
    out = []
    for row, rid, lora in zip(rows.tolist(), ids.tolist(), loras.tolist()):
        record = dict(zip(RESIDENT_FIELDS, row))
        record["context_committed"] = bool(record["context_committed"])
        record["request_id"] = rid
        if lora:
            record["lora_id"] = lora
        out.append(record)
    return out


def read_only(view: np.ndarray) -> np.ndarray:
    """A copy over immutable bytes: neither it nor its ``.base`` can be made writable, as with
    the compiled ledger's views of C memory (the twin pays a copy per read; it is the model)."""
    return np.frombuffer(view.tobytes(), dtype=view.dtype)


# --- preemption by the work it throws away (docs/scheduling.md) --------------------------------


def least_work_victim(
    computed: Sequence[int], protected: Sequence[bool], later: Sequence[Any]
) -> tuple[int, bool]:
    """The resident to recompute-preempt when KV runs out: the one whose preemption throws away
    the fewest computed tokens (``computed``), never one of a protected class (``protected``:
    a class the policy never gives up on) while another will do; among equals the one latest
    in the policy's order (the largest ``later`` key, as vLLM's own rule takes the last). Returns
    its index and whether it is protected (every candidate was). One rule for the simulator and
    the vLLM adapter; the caller passes the candidates it may preempt (at least one)."""
    pool = [i for i, p in enumerate(protected) if not p] or list(range(len(computed)))
    best = pool[0]
    for i in pool[1:]:
        if computed[i] < computed[best] or (
            computed[i] == computed[best] and later[i] > later[best]
        ):
            best = i
    return best, bool(protected[best])
