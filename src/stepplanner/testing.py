"""Hypothesis strategies for stepplanner's inputs, for runtime authors testing their own loops.

Every strategy draws *valid* values: limits that construct, policies that
``resolve_scheduling_policy`` returns and a ``StepPlanner`` accepts, and ledgers that ``plan()``
plans without raising. They lean towards the corners where planners go wrong: empty ledgers,
one slot (B=1), page size 1, prompts shorter than a page (S_in < P), ledgers that are all
decoding or all prompt, negative priorities, duplicate arrival stamps, prefix-reused
``committed`` values off a page boundary, and ``consecutive_paused_steps`` at
``max_pause_steps`` and one either side.

A ledger row is a tuple in ``RESIDENT_DTYPE`` field order::

    (priority, arrival, prompt_length, committed, context_committed, consecutive_paused_steps)

:func:`as_resident_states` and :func:`as_resident_array` turn rows into what ``plan()`` takes.

This module needs hypothesis (``pip install "stepplanner[test]"``); the rest of the package does
not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "stepplanner.testing needs hypothesis, which is a test extra: "
        "pip install 'stepplanner[test]' (or pip install hypothesis)"
    ) from exc

from ._errors import INT32_MAX, INT32_MIN, UINT64_MAX
from .core import ResidentState
from .planner._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    default_max_num_tokens,
    mixed_feasible,
    resolve_scheduling_policy,
)
from .planner._types import (
    IfbSchedulingMode,
    PreemptionMode,
    Row,
    SchedulingPolicy,
    as_resident_array,
)

__all__ = [
    "PlanningCase",
    "Row",
    "as_resident_array",
    "as_resident_states",
    "draft_counts",
    "ledgers",
    "limits",
    "planning_cases",
    "policies",
    "resident_rows",
    "scheduling_options",
]


def as_resident_states(rows: Sequence[Row] | np.ndarray, resident_type: Any = None) -> list[Any]:
    """Rows (tuples or an array) as a list of ``ResidentState`` of ``resident_type``.

    ``resident_type`` defaults to ``stepplanner.ResidentState``; pass the reference's class to
    plan with the reference implementation.
    """
    if resident_type is None:
        resident_type = ResidentState
    if isinstance(rows, np.ndarray):
        rows = rows.tolist()
    return [resident_type(*r) for r in rows]


class PlanningCase(NamedTuple):
    """One planner input drawn as a whole: limits, a policy resolved for them, a valid ledger."""

    limits: StepPlannerLimits
    policy: ResolvedSchedulingPolicy
    rows: list[Row]


_MODES = st.sampled_from(IfbSchedulingMode)
_SCHEDULING = st.sampled_from(SchedulingPolicy)
_PREEMPTION = st.sampled_from(PreemptionMode)
_PAUSE_STEPS = st.one_of(st.just(0), st.integers(0, 4))
_BOOLS = st.booleans()


# --- limits and policies -------------------------------------------------------------------------


def limits(
    max_batch_size: int = 16, max_input_length: int = 256, max_page_size: int = 64
) -> st.SearchStrategy[StepPlannerLimits]:
    """Engine limits, small enough that plans stay readable; B=1, P=1 and S_in < P all occur,
    and so does a runtime step buffer (``max_step_tokens``) below B × S_in."""
    return _limits(max_batch_size, max_input_length, max_page_size)


@st.composite
def _limits(
    draw: Any, max_batch_size: int, max_input_length: int, max_page_size: int
) -> StepPlannerLimits:
    b = draw(st.one_of(st.just(1), st.integers(1, max_batch_size)))
    s_in = draw(st.one_of(st.integers(1, 8), st.integers(1, max_input_length)))
    p = draw(st.one_of(st.just(1), st.integers(1, max_page_size)))
    step = 0
    if draw(_BOOLS):  # anything from one page up to past B × S_in (where it no longer binds)
        step = draw(st.integers(max(p, b), max(p, b) + b * s_in))
    return StepPlannerLimits(b, s_in, p, step)


def scheduling_options(
    lim: StepPlannerLimits | None = None,
) -> st.SearchStrategy[SchedulingOptions]:
    """``SchedulingOptions`` that resolve without error for ``lim`` (any options when None)."""
    if lim is None:
        return st.builds(
            SchedulingOptions,
            ifb_scheduling_mode=_MODES,
            max_num_tokens=st.integers(0, 4096),
            max_chunk_tokens=st.integers(0, 4096),
            scheduling_policy=_SCHEDULING,
            preemption=_PREEMPTION,
            priority_reserved_slots=st.integers(0, 16),
            max_pause_steps=st.integers(0, 8),
        )
    return _valid_options(lim)


@st.composite
def _valid_options(draw: Any, lim: StepPlannerLimits) -> SchedulingOptions:
    b, p, t_max = lim.max_batch_size, lim.kv_page_size, lim.t_max
    feasible = mixed_feasible(lim)
    can_give = b + p <= t_max  # a given max_num_tokens needs [B + P, T_max] to be non-empty
    mode = draw(_MODES)
    max_num_tokens = draw(st.integers(b + p, t_max)) if can_give and draw(_BOOLS) else 0
    if max_num_tokens == 0 and not feasible:
        # Defaults need mixed batching to be feasible; MIXED must then be given a budget.
        if mode == IfbSchedulingMode.MIXED and not can_give:
            mode = IfbSchedulingMode.PREFILL_FIRST
        elif mode == IfbSchedulingMode.MIXED:
            max_num_tokens = draw(st.integers(b + p, t_max))
    effective = max_num_tokens or (default_max_num_tokens(lim) if feasible else 0)
    max_chunk_tokens = 0
    if effective - b >= p and draw(_BOOLS):
        max_chunk_tokens = p * draw(st.integers(1, (effective - b) // p))
    return SchedulingOptions(
        ifb_scheduling_mode=mode,
        max_num_tokens=max_num_tokens,
        max_chunk_tokens=max_chunk_tokens,
        scheduling_policy=draw(_SCHEDULING),
        preemption=draw(_PREEMPTION),
        priority_reserved_slots=draw(st.integers(0, b - 1)),
        max_pause_steps=draw(_PAUSE_STEPS),
    )


@st.composite
def policies(draw: Any, lim: StepPlannerLimits) -> ResolvedSchedulingPolicy:
    """A policy resolved for ``lim``: every mode, policy, preemption and budget rule occurs.

    MIXED + PRIORITY + PAUSE (the only combination that pauses) is drawn a third of the time.
    """
    options = draw(_valid_options(lim))
    if draw(st.integers(0, 2)) == 0:
        mode = options.ifb_scheduling_mode
        if mode == IfbSchedulingMode.AUTO:
            mode = IfbSchedulingMode.MIXED
        if (
            mode == IfbSchedulingMode.MIXED
            and options.max_num_tokens == 0
            and not mixed_feasible(lim)
        ):
            mode = IfbSchedulingMode.PREFILL_FIRST  # a default MIXED budget needs feasibility
        options = dataclasses.replace(
            options,
            ifb_scheduling_mode=mode,
            scheduling_policy=SchedulingPolicy.PRIORITY,
            preemption=PreemptionMode.PAUSE,
        )
    return resolve_scheduling_policy(options, lim)


# --- ledgers -------------------------------------------------------------------------------------


_PRIORITIES = st.one_of(st.integers(-2, 2), st.integers(INT32_MIN, INT32_MAX))
_ARRIVALS = st.one_of(st.integers(0, 64), st.integers(0, UINT64_MAX))


class _RowDraws:
    """The per-field strategies of one ledger's rows, built once per ledger (building and
    validating strategies per row costs more than drawing from them)."""

    def __init__(self, lim: StepPlannerLimits, max_pause_steps: int) -> None:
        s_in = lim.max_input_length
        boundary = [
            v for v in (max_pause_steps - 1, max_pause_steps, max_pause_steps + 1) if v >= 0
        ]
        self.p = lim.kv_page_size
        self.paused_steps = st.one_of(
            st.sampled_from(boundary), st.integers(0, 3), st.just(INT32_MAX)
        )
        self.prompt = st.integers(1, s_in)
        self.decoded_prompt = st.integers(0, 2 * s_in)
        self.overshoot = st.one_of(st.integers(0, 64), st.integers(0, INT32_MAX - 2 * s_in))
        self.fraction = st.integers(0, INT32_MAX)

    def row(self, draw: Any, decoding: bool | None) -> Row:
        if decoding is None:
            decoding = draw(_BOOLS)
        if decoding:
            prompt_length = draw(self.decoded_prompt)
            committed = prompt_length + draw(self.overshoot)
        else:
            prompt_length = draw(self.prompt)
            # committed often on a page end, else anywhere (a reused prefix ends mid-page)
            committed = draw(self.fraction) % prompt_length
            if draw(_BOOLS):
                committed -= committed % self.p
        return (
            draw(_PRIORITIES),
            draw(_ARRIVALS),
            prompt_length,
            committed,
            bool(decoding),
            draw(self.paused_steps),
        )


@st.composite
def resident_rows(
    draw: Any, lim: StepPlannerLimits, *, decoding: bool | None = None, max_pause_steps: int = 0
) -> Row:
    """One valid ledger row for ``lim``: prompt-incomplete or decoding (both when None)."""
    return _RowDraws(lim, max_pause_steps).row(draw, decoding)


_KINDS = st.sampled_from((None, None, True, False))  # mixed, all decoding, all prompt
_ARRIVAL_STYLE = st.sampled_from(("drawn", "unique", "all_equal"))


@st.composite
def _row_lists(draw: Any, lim: StepPlannerLimits, max_pause_steps: int) -> list[Row]:
    b = lim.max_batch_size
    size = draw(st.one_of(st.just(0), st.just(b), st.integers(0, b)))
    decoding = draw(_KINDS)
    fields = _RowDraws(lim, max_pause_steps)
    rows = [fields.row(draw, decoding) for _ in range(size)]
    style = draw(_ARRIVAL_STYLE)
    if rows and style == "unique":
        # Arrival stamps of a real queue: unique, in some admission order.
        stamps = draw(st.permutations(range(len(rows))))
        rows = [r[:1] + (s,) + r[2:] for r, s in zip(rows, stamps)]
    elif len(rows) > 1 and style == "all_equal":
        rows = [r[:1] + (rows[0][1],) + r[2:] for r in rows]  # every arrival equal: index decides
    return rows


def ledgers(
    lim: StepPlannerLimits, as_array: bool | None = False, max_pause_steps: int = 0
) -> st.SearchStrategy[Any]:
    """A valid ledger of 0..B rows: a list of :data:`Row` tuples, or a ``RESIDENT_DTYPE`` array.

    ``as_array``: False for row tuples, True for arrays, None for either. ``max_pause_steps``
    centres ``consecutive_paused_steps`` on that policy's release boundary.
    """
    rows = _row_lists(lim, max_pause_steps)
    if as_array is None:
        return st.one_of(rows, rows.map(as_resident_array))
    return rows.map(as_resident_array) if as_array else rows


@st.composite
def planning_cases(
    draw: Any, lim: st.SearchStrategy[StepPlannerLimits] | None = None
) -> PlanningCase:
    """Limits, a policy for them and a ledger for both, drawn together."""
    chosen = draw(lim if lim is not None else limits())
    policy = draw(policies(chosen))
    rows = draw(_row_lists(chosen, policy.max_pause_steps))
    return PlanningCase(chosen, policy, rows)


def draft_counts(lim: StepPlannerLimits, rows: Sequence[Row]) -> st.SearchStrategy[list[int]]:
    """Valid ``drafts`` for ``plan(rows, drafts=...)`` (SPEC §8): 0 for a prompt-incomplete row;
    for a decoding one none, a few (speculative decoding proposes 1–8) or up to past S_in − 1,
    where the per-row cap binds."""
    most = lim.max_input_length + 2
    counts = st.one_of(st.just(0), st.integers(0, 8), st.integers(0, most))
    return st.tuples(*(counts if r[4] else st.just(0) for r in rows)).map(list)
