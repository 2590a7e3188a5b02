"""The pure-Python twin of the step-time budget's pricing pass (``_step_time.pyx``): same
arithmetic in the same order, so the two choose the same budget."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _errors
from ..planner._types import RESIDENT_DTYPE, IfbSchedulingMode, PreemptionMode, SchedulingPolicy

__all__ = ["StepPricer", "plan_features", "price"]


class StepPricer:
    """See the compiled ``StepPricer``."""

    def __init__(
        self, planner: Any, policy: Any, limits: Any, max_step_seconds: float, coefficients: Any
    ) -> None:
        self.planner = planner
        self.last_plan: Any = None
        self.last_budget = int(policy.max_num_tokens)
        self.target = float(max_step_seconds)
        self.low = int(limits.max_batch_size + limits.kv_page_size)
        self.high = int(policy.max_num_tokens)
        self.pausing = (
            policy.mode == IfbSchedulingMode.MIXED
            and policy.scheduling_policy != SchedulingPolicy.FCFS
            and policy.preemption == PreemptionMode.PAUSE
        )
        self.release_at = policy.max_pause_steps if policy.max_pause_steps > 0 else 1 << 32
        self.set_model(*coefficients)

    def set_model(self, a: float, b: float, c: float, d: float, e: float, f: float) -> None:
        self.model = (float(a), float(b), float(c), float(d), float(e), float(f))

    def plan(
        self,
        residents: Any,
        count: Any = None,
        reasons: Any = None,
        drafts: Any = None,
        max_num_tokens: Any = None,
    ) -> Any:
        """See the compiled ``StepPricer.plan``."""
        planner = self.planner
        if (
            isinstance(residents, np.ndarray)
            and residents.ndim == 1
            and residents.dtype is RESIDENT_DTYPE
        ):
            length = residents.shape[0]
            if count is None:
                n = length
            elif type(count) is int and 0 <= count <= length:
                n = count
            else:  # planner.plan refuses it, in its own words
                return planner.plan(residents, count, reasons, drafts)
            chosen = self.budget(residents, n)
        else:  # another array or a list of ResidentState: checked by the planner, then priced
            first = planner.plan(residents, count, reasons, drafts)
            n = first.num_residents
            rows = residents if isinstance(residents, np.ndarray) else _as_rows(residents, n)
            chosen = self.budget(rows, n)
        if max_num_tokens is not None and max_num_tokens < chosen:
            chosen = max_num_tokens
        self.last_budget = chosen
        # Positional: the planner's own order (residents, count, reasons, drafts, budget).
        plan = planner.plan(
            residents, count, reasons, drafts, None if chosen == self.high else chosen
        )
        self.last_plan = plan
        return plan

    def budget(self, residents: Any, count: int) -> int:
        if (
            not isinstance(residents, np.ndarray)
            or residents.ndim != 1
            or residents.dtype != RESIDENT_DTYPE
        ):
            raise _errors.wrong_type("residents", "1-D RESIDENT_DTYPE array", residents)
        if count < 0 or count > len(residents):
            raise _errors.count_over_length(count, len(residents))
        rows = residents[:count]
        decoding = rows["context_committed"].astype(bool)
        prio = rows["priority"].astype(np.int64)
        active = np.ones(count, dtype=bool)
        if self.pausing and count and not decoding.all():
            bar = int(prio[~decoding].min())
            held = rows["consecutive_paused_steps"] < self.release_at
            active = ~((prio > bar) & held)
        committed = rows["committed"].astype(np.int64)
        dec, pro = active & decoding, active & ~decoding
        a, b, c, d, e, f = self.model
        return price(
            a,
            b,
            c,
            d,
            e,
            f,
            self.target,
            self.low,
            self.high,
            int(dec.sum()),
            int(pro.sum()),
            int(committed[dec].sum()),
            int(committed[pro].sum()),
            int(committed[pro].max()) if pro.any() else 0,
        )


def plan_features(plan: Any) -> tuple[int, int, int, int]:
    """See the compiled ``plan_features``."""
    seq = plan.as_array()
    query = seq["query_length"].astype(np.int64)
    past = seq["past_length"].astype(np.int64)
    tokens = int(query.sum())
    return tokens, int(past.sum()) + tokens, len(seq), int(np.dot(query, past + query))


def _as_rows(residents: Any, count: int) -> np.ndarray:
    """The first ``count`` of a list of ``ResidentState`` as a ``RESIDENT_DTYPE`` array."""
    fields = RESIDENT_DTYPE.names or ()
    return np.array(
        [tuple(getattr(residents[i], f) for f in fields) for i in range(count)],
        dtype=RESIDENT_DTYPE,
    )


def price(
    a: float,
    b: float,
    c: float,
    d: float,
    e: float,
    f: float,
    target: float,
    low: int,
    high: int,
    n_decode: int,
    n_prompt: int,
    depth: int,
    past: int,
    p0: int,
) -> int:
    """See the compiled ``price``."""
    if n_decode == 0:
        return high
    nd = float(n_decode)
    c0 = float(depth) + float(past) + nd
    q2 = d + e
    q1 = b + c + d * (c0 + nd) + e * float(p0)
    q0 = a + f * (nd + float(n_prompt)) + b * nd + c * c0 + d * nd * c0
    q0 += e * (float(depth) + nd)
    room = target - q0
    if room <= 0:
        return low
    if q2 > 0:
        v = 2 * room / (q1 + math.sqrt(q1 * q1 + 4 * q2 * room))
    elif q1 > 0:
        v = room / q1
    else:
        return high
    v += nd
    if v >= high:
        return high
    if v <= low:
        return low
    return int(v)
