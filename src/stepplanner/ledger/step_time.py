"""A step-time budget: each step's token budget chosen from its predicted time (SPEC §9).

``StepTimeBudget(planner, coefficients, max_step_seconds)`` is a planner a ``Ledger`` (either
implementation) plans through: ``ledger.step(budget, ...)``. Before each plan it prices the step
the residents will make with the step-time model ``t = a + b*tokens + c*context +
d*tokens*context + e*attention + f*rows`` (the simulator's and ``stepplanner calibrate``'s,
docs/simulator.md) and passes the planner the largest token budget whose predicted time is at
most ``max_step_seconds``, clamped to SPEC §9's ``[B + P, policy.max_num_tokens]``:

* it plans at the policy's budget first; a plan without a decode row, or one predicted within
  the time, is the step (SPEC §3: a step without decode rows has T_max; no token waits on it);
* otherwise the decode rows are that plan's (the ones the planner did not pause), each at its
  KV depth (``past_length``), and the rest of the budget, ``v`` tokens, goes to chunks and
  drafts, priced at the deepest chunk's past (``context`` and ``attention`` grow with ``v``
  there), so a step whose decodes are deep in KV takes fewer prompt tokens; the planner plans
  again with that budget. Two plans then, each the kernel's (about a microsecond at B = 256).

``observe(seconds)`` after each step (the runtime's measured time of the plan just run) updates
the model online: the plan's features and time go into a ring of the last ``window`` steps, and
every ``refit_every`` steps ``a``, ``b`` and ``c`` are refitted by Huber-weighted least squares
(three reweightings) pulled towards the given coefficients (a ridge of weight ``prior_weight``
on the deviations), with ``d``, ``e``, ``f`` kept: bounded cost per step (a ring write; a 3 x 3
solve over ``window`` rows every ``refit_every`` steps; the prior weighs as ``prior_weight``
samples), robust to a few slow steps (a step the
fit misses by more than ``huber`` x the median absolute residual counts linearly, not squared),
and a fit that would make a coefficient negative or not finite is not taken.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _errors
from ..planner._types import IfbSchedulingMode

__all__ = ["StepTimeBudget", "plan_features"]

COEFFICIENTS = ("a", "b", "c", "d", "e", "f")


def plan_features(plan: Any) -> tuple[int, int, int, int]:
    """A plan's step-model features: ``tokens``, ``context`` (the KV positions its rows read),
    ``rows`` and ``attention`` (query-key pairs), as docs/simulator.md defines them."""
    seq = plan.as_array()
    query = seq["query_length"].astype(np.int64)
    past = seq["past_length"].astype(np.int64)
    tokens = int(query.sum())
    return tokens, int(past.sum()) + tokens, len(seq), int(np.dot(query, past + query))


def _seconds(field: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _errors.wrong_type(field, "a number of seconds", value)
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        allowed = "a finite number > 0" if positive else "a finite number >= 0"
        raise _errors.out_of_range(field, value, allowed)
    return x


def _count(field: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _errors.not_integer(field, value)
    if not low <= value <= high:
        raise _errors.out_of_range(field, value, f"{low}..{high}")
    return value


class StepTimeBudget:
    """A planner that caps each step's tokens by its predicted time (see the module doc).

    ``planner``: a ``StepPlanner`` (its ``policy`` must be MIXED); ``coefficients``: the model's
    ``a``..``f`` in seconds (a mapping, missing ones 0, or an object with those attributes such
    as a ``LatencyModel``); ``max_step_seconds``: the most a step with decode rows should take.
    """

    def __init__(
        self,
        planner: Any,
        coefficients: Mapping[str, float] | Any,
        max_step_seconds: float,
        *,
        window: int = 256,
        refit_every: int = 32,
        huber: float = 2.0,
        prior_weight: float = 0.01,
    ) -> None:
        policy, limits = planner.policy, planner.limits
        if policy.mode != IfbSchedulingMode.MIXED:
            raise _errors.out_of_range(
                "policy.mode", policy.mode.name, "MIXED (a per-step budget is MIXED's, SPEC §9)"
            )
        read = (
            coefficients.get
            if isinstance(coefficients, Mapping)
            else lambda k, default: getattr(coefficients, k, default)
        )
        if isinstance(coefficients, Mapping):
            unknown = sorted(set(coefficients) - set(COEFFICIENTS))
            if unknown:
                raise _errors.out_of_range(
                    "coefficients", unknown[0], "the keys " + ", ".join(COEFFICIENTS)
                )
        prior = [
            _seconds(f"coefficients[{k!r}]", read(k, 0.0), positive=False) for k in COEFFICIENTS
        ]
        target = _seconds("max_step_seconds", max_step_seconds, positive=True)
        window = _count("window", window, 8, 1 << 20)
        refit_every = _count("refit_every", refit_every, 1, 1 << 20)
        huber = _seconds("huber", huber, positive=True)
        prior_weight = _seconds("prior_weight", prior_weight, positive=False)
        # Checked in full before anything is kept.
        self.planner, self.policy, self.limits = planner, policy, limits
        self.max_step_seconds = target
        self._prior = np.array(prior[:3])
        self.a, self.b, self.c, self.d, self.e, self.f = prior
        self._low = int(limits.max_batch_size + limits.kv_page_size)
        self._high = int(policy.max_num_tokens)
        self._huber, self._prior_weight = huber, prior_weight
        self._x = np.zeros((window, 3))
        self._y = np.zeros(window)
        self._samples = 0  # observed so far (the ring holds min(samples, window))
        self._refit_every = refit_every
        self._last: Any = None  # the plan made last, until observed
        self.last_budget = self._high
        self.refits = 0

    @property
    def coefficients(self) -> dict[str, float]:
        """The model as it prices steps now."""
        return {k: float(getattr(self, k)) for k in COEFFICIENTS}

    def plan(
        self,
        residents: Any,
        count: Any = None,
        reasons: Any = None,
        drafts: Any = None,
        max_num_tokens: Any = None,
    ) -> Any:
        """``planner.plan``, then, when the plan has decode rows and its predicted time is over
        ``max_step_seconds``, ``planner.plan`` again with the budget that fits (SPEC §9): the
        decode rows it prices are the ones the planner kept (paused rows cost nothing)."""
        planner = self.planner
        plan = planner.plan(
            residents, count, reasons=reasons, drafts=drafts, max_num_tokens=max_num_tokens
        )
        self._last = plan
        self.last_budget = self._high if max_num_tokens is None else int(max_num_tokens)
        if plan.num_decode == 0 or plan.total_tokens <= self._low:
            return plan
        chosen = self._budget_for(plan.as_array(), plan.num_decode)
        if chosen < plan.total_tokens:
            self.last_budget = chosen
            plan = planner.plan(
                residents, count, reasons=reasons, drafts=drafts, max_num_tokens=chosen
            )
            self._last = plan
        return plan

    def _budget_for(self, seq: np.ndarray, n_decode: int) -> int:
        """The largest budget whose step fits, priced on the plan made at the policy's budget:
        its decode rows (one token each) at their KV depth, its chunk rows at their own past
        (a smaller budget plans the same prompts, or fewer), and v more tokens (chunks,
        drafts), each attending to the deepest chunk's past and to the v before it."""
        past = seq["past_length"]
        decode = seq["work"] == 1
        depth = float(past[decode].sum(dtype=np.int64))
        chunks = len(seq) - n_decode
        chunk_past = float(past[~decode].sum(dtype=np.int64)) if chunks else 0.0
        p0 = float(past[~decode].max()) if chunks else 0.0
        # time(v) = q2 v^2 + q1 v + q0 for v tokens beside the n_decode decode rows.
        a, b, c, d, e, f = self.a, self.b, self.c, self.d, self.e, self.f
        c0 = depth + chunk_past + n_decode  # context with no token beyond a decode row's one
        q2 = d + e
        q1 = b + c + d * (c0 + n_decode) + e * p0
        q0 = a + f * len(seq) + b * n_decode + c * c0 + d * n_decode * c0
        q0 += e * (depth + n_decode)
        room = self.max_step_seconds - q0
        if room <= 0:
            return self._low
        if q2 > 0:
            v = 2 * room / (q1 + math.sqrt(q1 * q1 + 4 * q2 * room))  # the root, stably
        elif q1 > 0:
            v = room / q1
        else:
            return self._high
        return int(max(self._low, min(self._high, n_decode + v)))

    def predict(self, plan: Any) -> float:
        """The model's seconds for ``plan`` (a ``StepPlan``)."""
        tokens, context, rows, attention = plan_features(plan)
        fixed = self.d * tokens * context + self.e * attention + self.f * rows
        return self.a + self.b * tokens + self.c * context + fixed

    def observe(self, seconds: float) -> None:
        """The plan made last took ``seconds`` (measured): a sample for the online fit. A value
        that is not a finite positive number is refused, naming it, with nothing changed."""
        took = _seconds("seconds", seconds, positive=True)
        plan, self._last = self._last, None
        if plan is None or plan.total_tokens == 0:
            return
        tokens, context, rows, attention = plan_features(plan)
        # The part the fit does not move (d, e, f) is taken off; a, b, c explain the rest.
        rest = took - (self.d * tokens * context + self.e * attention + self.f * rows)
        slot = self._samples % len(self._y)
        self._x[slot] = (1.0, tokens, context)
        self._y[slot] = rest
        self._samples += 1
        if self._samples % self._refit_every == 0:
            self._refit()

    def _refit(self) -> None:
        n = min(self._samples, len(self._y))
        x, y = self._x[:n], self._y[:n]
        scale = np.maximum(np.abs(x).max(axis=0), 1.0)  # columns to comparable sizes
        xs = x / scale
        prior = self._prior * scale
        # The ridge pulls towards the given model with the weight of prior_weight samples (a
        # column's mean square each), so a direction the window does not vary (a constant
        # batch: the constant and the context columns in step) keeps the prior's value.
        ridge = self._prior_weight * np.maximum(np.einsum("ij,ij->j", xs, xs) / n, 1e-12)
        theta = np.array([self.a, self.b, self.c]) * scale
        weights = np.ones(n)
        for _ in range(3):
            gram = (xs * weights[:, None]).T @ xs + np.diag(ridge)
            rhs = (xs * weights[:, None]).T @ y + ridge * prior
            try:
                theta = np.linalg.solve(gram, rhs)
            except np.linalg.LinAlgError:
                return
            residual = y - xs @ theta
            mad = float(np.median(np.abs(residual))) * 1.4826
            if mad <= 0:
                break
            cut = self._huber * mad
            weights = np.minimum(1.0, cut / np.maximum(np.abs(residual), 1e-300))
        fitted = theta / scale
        if not np.all(np.isfinite(fitted)) or np.any(fitted < 0):
            return
        self.a, self.b, self.c = (float(v) for v in fitted)
        self.refits += 1
