"""A step-time budget: each step's token budget chosen from its predicted time (SPEC §9).

``StepTimeBudget(planner, coefficients, max_step_seconds)`` is a planner a ``Ledger`` (either
implementation) plans through: ``ledger.step(budget, ...)``. Before each plan it prices the step
the residents will make with the step-time model ``t = a + b*tokens + c*context +
d*tokens*context + e*attention + f*rows`` (the simulator's and ``stepplanner calibrate``'s,
docs/simulator.md) and passes the planner the largest token budget whose predicted time is at
most ``max_step_seconds``, clamped to SPEC §9's ``[B + P, policy.max_num_tokens]``:

* one pass over the residents (``StepPricer``, in C: ``_step_time.pyx``; its twin
  ``_step_time_py.py``) finds the decode rows the plan will have — the decoding residents the
  planner will not pause (SPEC §3 step 2's rule: under PAUSE with a priority order, a row whose
  priority is above the first pending prompt's, not released by ``max_pause_steps``) — and
  their KV depth (``committed``), and the prompts that may get chunks: their count, their
  committed tokens and the deepest one;
* with no decode row the plan is the policy's (SPEC §3: such a step has T_max; no token waits
  on its time); otherwise the step is priced as those decode rows (one token each, at their
  depth) and ``v`` more tokens (chunks and drafts) whose context and attention grow at the
  deepest prompt's depth, every pending prompt counted as a row and its committed tokens as
  context (an upper bound: fewer may get chunks), and ``v`` is the largest that fits; so a step
  whose decodes are deep in KV takes fewer prompt tokens. One plan, at that budget.

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
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _errors
from .._select import implementation
from ..planner._types import IfbSchedulingMode

# The pricing pass and the plans' features: compiled unless STEPPLANNER_IMPL=python (their
# twin, _step_time_py).
if TYPE_CHECKING:
    from ._step_time_py import StepPricer as _Pricer
    from ._step_time_py import plan_features
else:
    _impl = implementation("stepplanner.ledger._step_time", "stepplanner.ledger._step_time_py")
    _Pricer, plan_features = _impl.StepPricer, _impl.plan_features

__all__ = ["StepTimeBudget", "check_coefficients", "check_max_step_seconds", "plan_features"]

COEFFICIENTS = ("a", "b", "c", "d", "e", "f")


def _seconds(field: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _errors.wrong_type(field, "number of seconds", value)
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


def check_coefficients(
    coefficients: Mapping[str, float] | Any, field: str = "coefficients"
) -> list[float]:
    """The step model's ``a``..``f`` (seconds, each finite and >= 0) from a mapping (missing
    keys 0, an unknown key refused) or an object with those attributes (a ``LatencyModel``);
    a bad value is refused naming ``field[key]``."""
    read = (
        coefficients.get
        if isinstance(coefficients, Mapping)
        else lambda k, default: getattr(coefficients, k, default)
    )
    if isinstance(coefficients, Mapping):
        unknown = sorted(set(coefficients) - set(COEFFICIENTS))
        if unknown:
            raise _errors.out_of_range(field, unknown[0], "the keys " + ", ".join(COEFFICIENTS))
    return [_seconds(f"{field}[{k!r}]", read(k, 0.0), positive=False) for k in COEFFICIENTS]


def check_max_step_seconds(value: object) -> float:
    """``max_step_seconds``: a finite number of seconds > 0."""
    return _seconds("max_step_seconds", value, positive=True)


class StepTimeBudget(_Pricer):
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
        prior = check_coefficients(coefficients)
        target = check_max_step_seconds(max_step_seconds)
        window = _count("window", window, 8, 1 << 20)
        refit_every = _count("refit_every", refit_every, 1, 1 << 20)
        huber = _seconds("huber", huber, positive=True)
        prior_weight = _seconds("prior_weight", prior_weight, positive=False)
        # Checked in full before anything is kept.
        self.planner, self.policy, self.limits = planner, policy, limits
        self.max_step_seconds = target
        self._prior = np.array(prior[:3])
        self.a, self.b, self.c, self.d, self.e, self.f = prior
        _Pricer.__init__(self, planner, policy, limits, target, prior)
        self._huber, self._prior_weight = huber, prior_weight
        self._x = np.zeros((window, 3))
        self._y = np.zeros(window)
        self._samples = 0  # observed so far (the ring holds min(samples, window))
        self._refit_every = refit_every
        self.refits = 0

    @property
    def coefficients(self) -> dict[str, float]:
        """The model as it prices steps now."""
        return {k: float(getattr(self, k)) for k in COEFFICIENTS}

    def predict(self, plan: Any) -> float:
        """The model's seconds for ``plan`` (a ``StepPlan``)."""
        tokens, context, rows, attention = plan_features(plan)
        fixed = self.d * tokens * context + self.e * attention + self.f * rows
        return self.a + self.b * tokens + self.c * context + fixed

    def observe(self, seconds: float) -> None:
        """The plan made last took ``seconds`` (measured): a sample for the online fit. A value
        that is not a finite positive number is refused, naming it, with nothing changed."""
        took = _seconds("seconds", seconds, positive=True)
        plan, self.last_plan = self.last_plan, None
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
        self.set_model(self.a, self.b, self.c, self.d, self.e, self.f)
        self.refits += 1
