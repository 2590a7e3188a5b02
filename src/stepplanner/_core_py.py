"""Pure-Python twin of the compiled core: the test oracle, and a fallback users select explicitly.

It is written for clarity, not speed: it follows SPEC §3 line by line, and the compiled core must
agree with it on every plan and on every error (type and message). Select it with
``STEPPLANNER_IMPL=python``; ``import stepplanner`` never falls back to it silently.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from . import _errors
from .planner._fields import RESIDENT_CONVERTERS, as_bool, as_int32
from .planner._policy import (
    ResolvedSchedulingPolicy,
    StepPlannerLimits,
    check_policy,
    step_budget,
)
from .planner._types import (
    REASON_RELEASED_FROM_PAUSE,
    RESIDENT_DTYPE,
    RESIDENT_FIELDS,
    SEQUENCE_DTYPE,
    AnyResidentState,
    AnyStepPlan,
    IfbSchedulingMode,
    PlannedSequence,
    PreemptionMode,
    Reason,
    SchedulingPolicy,
    SequenceWork,
    first_repeat,
    plan_repr,
    plan_to_dict,
)

IMPLEMENTATION = "python"

_FIELDS = RESIDENT_FIELDS
_CONVERT = RESIDENT_CONVERTERS


class ResidentState:
    """The ledger view of one resident that ``plan()`` reads (see the compiled twin)."""

    __slots__ = tuple("_" + f for f in _FIELDS)

    def __init__(
        self,
        priority: int = 0,
        arrival: int = 0,
        prompt_length: int = 0,
        committed: int = 0,
        context_committed: bool = False,
        consecutive_paused_steps: int = 0,
    ) -> None:
        self.priority = priority
        self.arrival = arrival
        self.prompt_length = prompt_length
        self.committed = committed
        self.context_committed = context_committed
        self.consecutive_paused_steps = consecutive_paused_steps

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _CONVERT:
            raise AttributeError(f"ResidentState has no attribute {name!r}")
        object.__setattr__(self, "_" + name, _CONVERT[name](name, value))

    def __getattr__(self, name: str) -> Any:
        if name in _CONVERT:
            return object.__getattribute__(self, "_" + name)
        raise AttributeError(f"ResidentState has no attribute {name!r}")

    def _astuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AnyResidentState):
            return NotImplemented
        return bool(self._astuple() == other._astuple())  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        body = ", ".join(f"{f}={getattr(self, f)!r}" for f in _FIELDS)
        return f"ResidentState({body})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ResidentState, self._astuple())


AnyResidentState.register(ResidentState)


class _PlanView(Sequence[Any]):
    """A live, read-only sequence over one of a plan's lists (overwritten by ``plan()``)."""

    __slots__ = ("_plan",)
    _plan: StepPlan

    def __new__(cls, plan: StepPlan) -> _PlanView:
        # A view exists only over a plan (as the compiled views do): never half-made.
        if not isinstance(plan, StepPlan):
            raise TypeError(f"{cls.__name__} views a StepPlan, got {type(plan).__name__}")
        view = super().__new__(cls)
        view._plan = plan
        return view

    def _items(self) -> Sequence[Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._items())

    def __getitem__(self, index: Any) -> Any:
        return self._items()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self) -> tuple[Any, ...]:
        # A live view has nothing to be live over once pickled or copied: it goes as its items.
        return (list, (list(self),))


class _SequencesView(_PlanView):
    __slots__ = ()

    def _items(self) -> Sequence[PlannedSequence]:
        return self._plan._rows


class _PausedView(_PlanView):
    __slots__ = ()

    def _items(self) -> Sequence[int]:
        return self._plan._paused


class StepPlan:
    """One planned step. The planner's plan is overwritten by its next call: ``copy()`` to keep."""

    # An empty plan from birth, also when made with __new__ (as the compiled plan is).
    _rows: Sequence[PlannedSequence] = ()
    _paused: Sequence[int] = ()
    _num_residents = 0
    num_prefill = num_decode = prefill_tokens = total_tokens = 0
    _version = 0  # bumped whenever the plan changes: apply_to() checks it (see _apply)

    def __init__(self) -> None:
        self._version += 1
        self._rows = []
        self._paused = []
        self._num_residents = 0
        self.num_prefill = 0
        self.num_decode = 0
        self.prefill_tokens = 0
        self.total_tokens = 0

    @property
    def sequences(self) -> Sequence[PlannedSequence]:
        return _SequencesView(self)

    @property
    def paused(self) -> Sequence[int]:
        return _PausedView(self)

    @property
    def num_residents(self) -> int:
        """How many resident rows this plan was made over (``count``)."""
        return self._num_residents

    def as_array(self) -> np.ndarray:
        """The sequences as a ``SEQUENCE_DTYPE`` array (a copy here; a view in the core)."""
        return _read_only(np.array([tuple(r) for r in self._rows], dtype=SEQUENCE_DTYPE))

    def paused_array(self) -> np.ndarray:
        return _read_only(np.array(self._paused, dtype=np.int32))

    def copy(self) -> StepPlan:
        other = StepPlan()
        other._set(list(self._rows), list(self._paused), self._num_residents)
        return other

    def __copy__(self) -> StepPlan:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> StepPlan:
        return self.copy()  # rows are tuples of ints and enums: nothing deeper to copy

    def __reduce__(self) -> tuple[Any, ...]:
        # The compiled plan's pickle, value for value: either twin unpickles the other's, and
        # a pickle is checked on the way in, never trusted as attributes.
        return (
            _restore_plan,
            (self.as_array().tolist(), self.paused_array().tolist(), self._num_residents),
        )

    def to_dict(self) -> dict[str, Any]:
        return plan_to_dict(self)

    def _set(self, rows: list[PlannedSequence], paused: list[int], num_residents: int) -> None:
        self._version += 1
        self._rows = rows
        self._paused = paused
        self._num_residents = num_residents
        self.num_prefill = sum(r.work == SequenceWork.CONTEXT for r in rows)
        self.num_decode = len(rows) - self.num_prefill
        self.prefill_tokens = sum(r.query_length for r in rows if r.work == SequenceWork.CONTEXT)
        self.total_tokens = sum(r.query_length for r in rows)

    @property
    def draft_tokens(self) -> int:
        """The draft tokens the decode rows verify (SPEC §8): their query lengths less one each."""
        return self.total_tokens - self.prefill_tokens - self.num_decode

    def apply_to(self, residents: Any) -> None:
        """Advance the ledger rows this plan was made over, as SPEC §6 says a runtime does."""
        _apply(self, residents)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AnyStepPlan):
            return NotImplemented
        return bool(self.to_dict() == other.to_dict())  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return plan_repr(self)


AnyStepPlan.register(StepPlan)


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array`` over immutable bytes: like the core's views, it cannot be made writable."""
    return np.frombuffer(array.tobytes(), dtype=array.dtype)


def _count_of(residents: Any, count: Any, max_batch_size: int) -> int:
    """Check the container and ``count``; return how many rows to plan."""
    if isinstance(residents, np.ndarray):
        _check_resident_array(residents)
    elif not isinstance(residents, (list, tuple)):
        raise _errors.residents_type(residents)
    if count is not None:
        try:
            count = operator.index(count)
        except TypeError:
            raise _errors.not_integer("count", count) from None
    # Measured after count.__index__ ran: user code there may have changed the list. An array's
    # length is its shape: an ndarray subclass's __len__ is not asked.
    length = residents.shape[0] if isinstance(residents, np.ndarray) else len(residents)
    if count is None:
        count = length
    if count < 0:
        raise _errors.count_negative(count)
    if count > max_batch_size:
        raise _errors.count_over_batch(count, max_batch_size)
    if count > length:
        raise _errors.count_over_length(count, length)
    return int(count)


def _check_resident_array(residents: np.ndarray) -> None:
    """A 1-D array of RESIDENT_DTYPE, as plan() and apply_to() read (the core's twin)."""
    if isinstance(residents, np.ma.MaskedArray):
        raise _errors.masked_array("residents")
    if residents.dtype != RESIDENT_DTYPE:
        raise _errors.array_dtype(residents.dtype, RESIDENT_DTYPE)
    if residents.ndim != 1:
        raise _errors.array_ndim(residents.ndim)


def _load_rows(residents: Any, count: int, max_input_length: int) -> list[tuple[Any, ...]]:
    """The first ``count`` rows as field tuples, each checked (type, then values) in index order.
    An array's dtype and length are checked again: a drafts list's code may have changed them."""
    if isinstance(residents, np.ndarray):
        _check_resident_array(residents)
        if residents.shape[0] < count:
            raise _errors.count_over_length(count, residents.shape[0])
        _check_no_overlap(residents, count)
        rows = [tuple(row) for row in residents[:count].tolist()]
    else:
        seen: dict[int, tuple[int, ResidentState]] = {}
        rows = []
        for i in range(count):
            r = residents[i]
            if type(r) is not ResidentState:
                raise _errors.element_type(i, r)
            _check_listed_once(seen, i, r)
            rows.append(r._astuple())
            _check_row(i, rows[-1], max_input_length)
        return rows
    for i, row in enumerate(rows):
        _check_row(i, row, max_input_length)
    return rows


def _check_listed_once(
    seen: dict[int, tuple[int, ResidentState]], i: int, resident: ResidentState
) -> None:
    """A resident listed twice would be planned twice and advanced twice by apply_to."""
    # Keyed by id() and kept alive by ``seen``: a list subclass may hand out a new object per
    # read, and a freed one's id could come back.
    first, _ = seen.setdefault(id(resident), (i, resident))
    if first != i:
        raise _errors.duplicate_resident(first, i)


def _check_no_overlap(residents: np.ndarray, count: int) -> None:
    """Rows closer than one row apart (a zero or short stride) are one resident seen twice."""
    if count > 1 and abs(residents.strides[0]) < residents.itemsize:
        raise _errors.rows_overlap(residents.strides[0], residents.itemsize)


def _check_row(i: int, row: tuple[Any, ...], max_input_length: int) -> None:
    _prio, _arrival, prompt_length, committed, context_committed, cps = row
    if committed < 0:
        raise _errors.resident_negative(i, "committed", committed)
    if prompt_length < 0:
        raise _errors.resident_negative(i, "prompt_length", prompt_length)
    if cps < 0:
        raise _errors.resident_negative(i, "consecutive_paused_steps", cps)
    if not context_committed:
        if prompt_length - committed <= 0:
            raise _errors.prompt_exhausted(i, prompt_length, committed)
        if prompt_length > max_input_length:
            raise _errors.prompt_too_long(i, prompt_length, max_input_length)


def _check_reasons(reasons: Any, count: int) -> None:
    if reasons is None:
        return
    if not isinstance(reasons, np.ndarray):
        raise _errors.reasons_array(f"is a {type(reasons).__name__}")
    if isinstance(reasons, np.ma.MaskedArray):
        raise _errors.masked_array("reasons")
    if reasons.dtype != np.uint8 or reasons.ndim != 1:
        raise _errors.reasons_array(f"has dtype {reasons.dtype} and ndim={reasons.ndim}")
    if not reasons.flags.writeable:
        raise _errors.reasons_array("is read-only")
    if len(reasons) < count:
        raise _errors.reasons_array(f"has len {len(reasons)} < count={count}")
    if not reasons.flags.c_contiguous:
        raise _errors.reasons_array("is not contiguous")


def _check_drafts(drafts: Any, count: int) -> None:
    """SPEC §8's checks of the drafts container, before any row is read (values: _copy_drafts)."""
    if isinstance(drafts, np.ndarray):
        if isinstance(drafts, np.ma.MaskedArray):
            raise _errors.masked_array("drafts")
        if drafts.ndim != 1 or drafts.dtype != np.int32:
            raise _errors.drafts_array(drafts.dtype, drafts.ndim)
    elif not isinstance(drafts, (list, tuple)):
        raise _errors.drafts_type(drafts)
    if len(drafts) < count:
        raise _errors.drafts_length(len(drafts), count)


def _copy_drafts(drafts: Any, count: int) -> list[int]:
    """Each resident's drafts as an int (checked by ``_check_drafts``); values: _check_drafts_of."""
    if isinstance(drafts, np.ndarray):
        return [int(v) for v in drafts[:count]]
    if len(drafts) < count:  # a list subclass's code may have shrunk it since _check_drafts
        raise _errors.drafts_length(len(drafts), count)
    return [as_int32(f"drafts[{i}]", drafts[i]) for i in range(count)]


def _check_drafts_of(values: list[int], rows: list[tuple[Any, ...]]) -> None:
    """SPEC §8's checks of the copied drafts against the copied rows, in index order."""
    for i, v in enumerate(values):
        if v < 0:
            raise _errors.drafts_negative(i, v)
        if v > 0 and not rows[i][4]:
            raise _errors.drafts_for_prompt(i, v)


class StepPlanner:
    """Plans one in-flight-batching step per call (SPEC §3). See the compiled twin's docs."""

    def __init__(self, policy: ResolvedSchedulingPolicy, limits: StepPlannerLimits) -> None:
        check_policy(policy, limits)
        self._policy = policy
        self._limits = limits
        self._plan = StepPlan()
        self._planning = False  # set while plan() reads the residents: see plan()

    @property
    def policy(self) -> ResolvedSchedulingPolicy:
        return self._policy

    @property
    def limits(self) -> StepPlannerLimits:
        return self._limits

    def __repr__(self) -> str:
        return f"StepPlanner(policy={self._policy!r}, limits={self._limits!r})"

    def plan(
        self,
        residents: Any,
        count: Any = None,
        reasons: Any = None,
        drafts: Any = None,
        max_num_tokens: Any = None,
    ) -> StepPlan:
        lim, pol = self._limits, self._policy
        n_res = _count_of(residents, count, lim.max_batch_size)
        _check_reasons(reasons, n_res)
        if drafts is not None:
            _check_drafts(drafts, n_res)
        # SPEC §9: this step's budget in the policy's max_num_tokens' place, nowhere else.
        step_tokens = (
            pol.max_num_tokens if max_num_tokens is None else step_budget(max_num_tokens, pol, lim)
        )
        # Reading a list subclass runs its code, which may call plan() on this planner again:
        # refuse that call rather than let it replace the rows being read (as the core does).
        if self._planning:
            raise _errors.plan_reentered()
        self._planning = True
        try:
            # Every input is copied before any is checked against another, and drafts first:
            # reading a list runs its code, which may change the other inputs (the core's order).
            proposed = None if drafts is None else _copy_drafts(drafts, n_res)
            rows = _load_rows(residents, n_res, lim.max_input_length)
            _check_reasons(reasons, n_res)
            if proposed is not None:
                _check_drafts_of(proposed, rows)
        finally:
            self._planning = False

        s_in, p, t_max = lim.max_input_length, lim.kv_page_size, lim.t_max
        # EDF and DEADLINE rows carry the ledger's ranks: planned as PRIORITY (SPEC §7).
        by_priority = pol.scheduling_policy != SchedulingPolicy.FCFS
        prio = [r[0] if by_priority else 0 for r in rows]
        order = sorted(range(n_res), key=lambda i: (prio[i], rows[i][1], i))
        decoding = [bool(r[4]) for r in rows]
        why = [0] * n_res

        # Pause (MIXED + PRIORITY + PAUSE): everyone worse than the first pending prompt.
        paused: list[int] = []
        is_paused = [False] * n_res
        if (
            pol.mode == IfbSchedulingMode.MIXED
            and by_priority
            and pol.preemption == PreemptionMode.PAUSE
        ):
            h = next((i for i in order if not decoding[i]), None)
            if h is not None:
                for i in range(n_res):
                    if prio[i] > prio[h]:
                        if pol.max_pause_steps > 0 and rows[i][5] >= pol.max_pause_steps:
                            why[i] |= REASON_RELEASED_FROM_PAUSE
                        else:
                            is_paused[i] = True
                            why[i] = Reason.PAUSED
                            paused.append(i)

        if pol.mode == IfbSchedulingMode.MIXED:
            decodes = [i for i in order if decoding[i] and not is_paused[i]]
            prompts = [i for i in order if not decoding[i] and not is_paused[i]]
            if decodes:
                budget, cap = step_tokens - len(decodes), pol.max_chunk_tokens
            else:
                budget, cap = t_max, s_in
        elif any(not d for d in decoding):
            decodes = []
            budget, cap = t_max, s_in
            pending = [i for i in order if not decoding[i]]
            best = min(prio[i] for i in pending)
            prompts = [i for i in pending if prio[i] == best]
            for i in range(n_res):
                if decoding[i] or prio[i] != best:
                    why[i] = Reason.HELD_PREFILL_FIRST
        else:
            decodes, prompts, budget, cap = list(order), [], 0, 0

        # Drafts (SPEC §8): in order, from the step's tokens beyond one per decode row, less
        # what the first prompt needs to reach its next page end.
        grants = [0] * len(decodes)
        if proposed is not None and decodes:
            spare = (step_tokens if pol.mode == IfbSchedulingMode.MIXED else t_max) - len(decodes)
            if prompts:
                committed, prompt_length = rows[prompts[0]][3], rows[prompts[0]][2]
                spare -= min(prompt_length - committed, p - committed % p)
            for k, i in enumerate(decodes):
                grants[k] = min(proposed[i], s_in - 1, spare)
                spare -= grants[k]
            budget -= sum(grants)

        out: list[PlannedSequence] = []
        for i in prompts:
            committed, prompt_length = rows[i][3], rows[i][2]
            rem = prompt_length - committed
            n = min(rem, cap, s_in, budget)
            if n < rem:
                n = (committed + n) // p * p - committed
            if n <= 0:
                why[i] |= Reason.SKIPPED_BUDGET if budget == 0 else Reason.SKIPPED_PAGE_TRIM
                continue
            out.append(PlannedSequence(i, SequenceWork.CONTEXT, committed, n, n == rem))
            why[i] |= Reason.CHUNK_FINAL if n == rem else Reason.CHUNK
            budget -= n
        for i, g in zip(decodes, grants):
            out.append(PlannedSequence(i, SequenceWork.DECODE, rows[i][3], 1 + g, True))
            why[i] |= Reason.DECODE

        self._plan._set(out, paused, n_res)
        if reasons is not None:
            reasons[:n_res] = why
        return self._plan


def _check_plan_rows(plan: StepPlan) -> None:
    """Every row names a resident of the plan: apply_to indexes by these (the core in C)."""
    _check_rows(plan._rows, plan._paused, plan.num_residents)


def _check_rows(rows: Sequence[PlannedSequence], paused: Sequence[int], n: int) -> None:
    for k, s in enumerate(rows):
        if not 0 <= s.resident < n:
            raise _errors.plan_value(f"sequences[{k}].resident", s.resident, f"0..{n - 1}")
        if s.work not in (SequenceWork.CONTEXT, SequenceWork.DECODE):
            raise _errors.plan_value(f"sequences[{k}].work", s.work, "0..1")
        if not 0 <= s.query_length <= _errors.INT32_MAX:
            raise _errors.plan_value(
                f"sequences[{k}].query_length", s.query_length, f"0..{_errors.INT32_MAX}"
            )
    for k, i in enumerate(paused):
        if not 0 <= i < n:
            raise _errors.plan_value(f"paused[{k}]", i, f"0..{n - 1}")
    repeated = first_repeat([s.resident for s in rows], list(paused))
    if repeated is not None:
        raise _errors.plan_resident_repeated(*repeated)


def _restore_plan(sequences: Any, paused: Any, num_residents: Any) -> StepPlan:
    """The plan ``StepPlan.__reduce__`` pickled: each value checked for its C type, then the rows
    checked as ``apply_to`` checks them, in the compiled core's order and words."""
    n = as_int32("num_residents", num_residents)
    if n < 0:
        raise _errors.plan_value("num_residents", n, f"0..{_errors.INT32_MAX}")
    if max(len(sequences), len(paused)) > n:
        raise _errors.plan_value(
            "num_residents", n, f">= {max(len(sequences), len(paused))} (its rows)"
        )
    rows = []
    num_prefill = 0
    for k in range(len(sequences)):
        resident, work, past_length, query_length, select_last = sequences[k]
        row = PlannedSequence(
            as_int32(f"sequences[{k}].resident", resident),
            cast(SequenceWork, as_int32(f"sequences[{k}].work", work)),  # checked below
            as_int32(f"sequences[{k}].past_length", past_length),
            as_int32(f"sequences[{k}].query_length", query_length),
            as_bool(f"sequences[{k}].select_last_token_logits", select_last),
        )
        if row.work == SequenceWork.CONTEXT:
            if num_prefill != k:
                raise _errors.plan_value(
                    f"sequences[{k}].work",
                    row.work,
                    "1 (every chunk comes before every decode row)",
                )
            num_prefill += 1
        rows.append(row)
    pauses = [as_int32(f"paused[{k}]", paused[k]) for k in range(len(paused))]
    total = sum(r.query_length for r in rows)
    if total > _errors.INT32_MAX:
        raise _errors.out_of_int32("total_tokens", total)
    _check_rows(rows, pauses, n)
    plan = StepPlan()
    plan._set([r._replace(work=SequenceWork(r.work)) for r in rows], pauses, n)
    return plan


def _apply(plan: StepPlan, residents: Any) -> None:
    """SPEC §6 for one plan over the rows it was made from; checks everything before writing."""
    version = plan._version
    is_array = isinstance(residents, np.ndarray)
    if not is_array and not isinstance(residents, (list, tuple)):
        raise _errors.residents_type(residents)
    if not is_array:
        # One read of each element: the checks and the writes must see the same objects.
        residents = tuple(residents)
    if plan._version != version:
        # Reading a list subclass ran code that called plan() on the planner owning this plan.
        raise _errors.apply_reentered()
    n = plan.num_residents
    _check_plan_rows(plan)
    if is_array:
        _check_resident_array(residents)
        if not residents.flags.writeable:
            raise _errors.apply_readonly()
    if len(residents) < n:
        raise _errors.apply_length(len(residents), n)
    if is_array:
        _check_no_overlap(residents, n)
    else:
        residents = residents[:n]
        seen: dict[int, tuple[int, ResidentState]] = {}
        for i in range(n):
            if type(residents[i]) is not ResidentState:
                raise _errors.element_type(i, residents[i])
            _check_listed_once(seen, i, residents[i])

    add = [0] * n
    final = [False] * n
    for s in plan.sequences:
        add[s.resident] = s.query_length
        final[s.resident] = s.work == SequenceWork.CONTEXT and bool(s.select_last_token_logits)
    paused = set(plan.paused)
    rows = (
        [list(r) for r in residents[:n].tolist()]
        if is_array
        else [list(residents[i]._astuple()) for i in range(n)]
    )
    for i, row in enumerate(rows):
        # A counter that went negative since plan() is refused as plan() would refuse it.
        if row[3] < 0:
            raise _errors.resident_negative(i, "committed", row[3])
        if row[5] < 0:
            raise _errors.resident_negative(i, "consecutive_paused_steps", row[5])
        if row[3] + add[i] > _errors.INT32_MAX:
            raise _errors.apply_overflow(i, "committed", row[3], add[i])
        if i in paused and row[5] + 1 > _errors.INT32_MAX:
            raise _errors.apply_overflow(i, "consecutive_paused_steps", row[5], 1)
    for i, row in enumerate(rows):
        row[3] += add[i]
        row[4] = row[4] or final[i]
        row[5] = row[5] + 1 if i in paused else 0
        if is_array:
            residents[i] = tuple(row)
        else:
            r = residents[i]
            r.committed, r.context_committed, r.consecutive_paused_steps = row[3], row[4], row[5]
