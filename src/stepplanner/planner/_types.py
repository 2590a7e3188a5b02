"""Value types shared by the compiled core and the pure-Python reference.

These carry no hot-path logic, so both implementations use the very same classes: an enum or a
``PlannedSequence`` from one compares equal to the other's, and parity tests can compare plans
directly.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "IfbSchedulingMode",
    "PlannedSequence",
    "PreemptionMode",
    "REASON_RELEASED_FROM_PAUSE",
    "RESIDENT_DTYPE",
    "RESIDENT_FIELDS",
    "ResidentRow",
    "Row",
    "SEQUENCE_DTYPE",
    "Reason",
    "SchedulingPolicy",
    "SequenceWork",
    "as_resident_array",
    "orders_by_priority",
    "first_repeat",
    "plan_repr",
    "plan_to_dict",
    "split_reason",
]


class SchedulingPolicy(enum.IntEnum):
    """Order in which residents are served: arrival only, or (priority, arrival).

    ``EDF`` and ``DEADLINE`` are the ledger's deadline policies (docs/scheduling.md): before
    each plan the ledger writes every row's ``priority`` and ``arrival`` from the request's
    deadlines, and the planner plans them exactly as ``PRIORITY`` (SPEC §7). ``EDF`` orders by
    the next deadline alone; ``DEADLINE`` ranks by slack against a step-time estimate and
    relegates requests that can no longer meet their objectives.
    """

    FCFS = 0
    PRIORITY = 1
    EDF = 2
    DEADLINE = 3


def orders_by_priority(policy: SchedulingPolicy) -> bool:
    """Whether the planner orders rows by (priority, arrival): every policy but ``FCFS``."""
    return policy != SchedulingPolicy.FCFS


class IfbSchedulingMode(enum.IntEnum):
    """How a step mixes prefill and decode. ``AUTO`` must be resolved before planning."""

    AUTO = 0
    MIXED = 1
    PREFILL_FIRST = 2


class PreemptionMode(enum.IntEnum):
    """``PAUSE`` withholds lower-priority residents while a better prompt is pending."""

    NONE = 0
    PAUSE = 1


class SequenceWork(enum.IntEnum):
    """What one planned row does: a prompt chunk or one decode token."""

    CONTEXT = 0
    DECODE = 1


class Reason(enum.IntEnum):
    """Why a resident got what it got in one plan (see ``StepPlanner.plan(reasons=...)``).

    A code may carry the bit :data:`REASON_RELEASED_FROM_PAUSE` on top: the resident would have
    been paused but ``max_pause_steps`` released it. :func:`split_reason` separates the two.
    """

    DECODE = 1
    CHUNK = 2
    CHUNK_FINAL = 3
    PAUSED = 4
    SKIPPED_BUDGET = 5
    SKIPPED_PAGE_TRIM = 6
    HELD_PREFILL_FIRST = 7


REASON_RELEASED_FROM_PAUSE = 0x10


def split_reason(code: int) -> tuple[Reason, bool]:
    """Split a reason code into its outcome and whether ``max_pause_steps`` released it."""
    code = int(code)
    return Reason(code & ~REASON_RELEASED_FROM_PAUSE), bool(code & REASON_RELEASED_FROM_PAUSE)


class PlannedSequence(NamedTuple):
    """One row of a plan: a prompt chunk (``CONTEXT``) or a decode token (``DECODE``).

    ``resident`` is the index of the resident in the rows passed to ``plan()``;
    ``past_length`` equals its ``committed``.
    """

    resident: int
    work: SequenceWork
    past_length: int
    query_length: int
    select_last_token_logits: bool


class ResidentRow(NamedTuple):
    """One ledger row as plain values: the one definition of the six resident fields.

    Everything else derives from it: ``RESIDENT_FIELDS``, ``RESIDENT_DTYPE`` (with the C types
    below), both ``ResidentState`` classes, the ledger and ``check_plan``; the compiled core
    checks at import that its C struct has these fields in this order.
    """

    priority: int
    arrival: int
    prompt_length: int
    committed: int
    context_committed: bool
    consecutive_paused_steps: int


RESIDENT_FIELDS: tuple[str, ...] = ResidentRow._fields

# One ledger row; the compiled core reads arrays of it in place (its C struct has this layout).
RESIDENT_DTYPE = np.dtype(
    list(
        zip(
            RESIDENT_FIELDS,
            (np.int32, np.uint64, np.int32, np.int32, np.bool_, np.int32),
            strict=True,
        )
    ),
    align=True,
)

# One plan row, as StepPlan.as_array() returns them.
SEQUENCE_DTYPE = np.dtype(
    [
        ("resident", np.int32),
        ("work", np.int32),
        ("past_length", np.int32),
        ("query_length", np.int32),
        ("select_last_token_logits", np.bool_),
    ],
    align=True,
)


# One ledger row as plain values, in RESIDENT_DTYPE's field order (what tests, the bench and the
# strategies build ledgers from).
Row = tuple[int, int, int, int, bool, int]


def as_resident_array(rows: Sequence[Row]) -> np.ndarray:
    """Rows as a ``RESIDENT_DTYPE`` array, the zero-copy input of ``plan()``."""
    return np.array([tuple(r) for r in rows], dtype=RESIDENT_DTYPE)


class AnyStepPlan(abc.ABC):  # noqa: B024 - a marker: both implementations register
    """Either implementation's ``StepPlan``: plans compare equal across the two."""


class AnyResidentState(abc.ABC):  # noqa: B024
    """Either implementation's ``ResidentState``: rows compare equal across the two."""


# --- plan formatting, shared so both implementations print and serialise plans alike ------


def plan_to_dict(plan: Any) -> dict[str, Any]:
    """Plain-data form of a plan, the same for both implementations (JSON-ready)."""
    return {
        "sequences": [
            {
                "resident": s.resident,
                "work": SequenceWork(s.work).name,
                "past_length": s.past_length,
                "query_length": s.query_length,
                "select_last_token_logits": bool(s.select_last_token_logits),
            }
            for s in plan.sequences
        ],
        "paused": list(plan.paused),
        "num_prefill": plan.num_prefill,
        "num_decode": plan.num_decode,
        "prefill_tokens": plan.prefill_tokens,
        "total_tokens": plan.total_tokens,
    }


def plan_repr(plan: Any) -> str:
    rows = " ".join(
        f"({s.resident},{SequenceWork(s.work).name},{s.past_length},{s.query_length},"
        f"{'T' if s.select_last_token_logits else 'F'})"
        for s in plan.sequences
    )
    return (
        f"StepPlan(num_prefill={plan.num_prefill}, num_decode={plan.num_decode}, "
        f"prefill_tokens={plan.prefill_tokens}, total_tokens={plan.total_tokens}, "
        f"sequences=[{rows}], paused={list(plan.paused)})"
    )


def first_repeat(resident: list[int], paused: list[int]) -> tuple[str, int, str] | None:
    """(where, resident, where first) of the first plan row or pause (rows first, then pauses,
    each in order) naming a resident an earlier one names, or None: a resident named twice
    would be advanced twice. The compiled core and ledger find the same one in C."""
    names = [f"sequences[{k}].resident" for k in range(len(resident))]
    names += [f"paused[{k}]" for k in range(len(paused))]
    first: dict[int, int] = {}
    for k, r in enumerate(resident + paused):
        j = first.setdefault(r, k)
        if j != k:
            return names[k], r, names[j]
    return None
