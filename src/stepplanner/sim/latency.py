"""The simulator's step-latency model:
``t_step = a + b * tokens + c * context + d * tokens * context + e * attention + f * rows``.

``tokens`` is the plan's ``total_tokens``; ``context`` is ``sum(past_length + query_length)`` over
the planned rows: the KV positions attention reads; ``attention`` is
``sum(query_length * (past_length + query_length))``, the query-key pairs of a per-row causal
attention; ``rows`` the planned rows. ``a`` is the fixed cost of one forward pass (streaming the
weights once), ``b`` the per-token cost of the dense layers, ``c`` the per-position cost of
reading the KV cache. The three further terms are 0 unless a calibration finds them:

* ``d``: an engine that runs the whole step as ONE masked attention over the packed batch
  (transformers' ``sdpa``/``eager`` continuous batching: every query token meets every key of
  the step, the block-diagonal mask discards most of the work) pays per token x context;
* ``e``: a per-row kernel (flash/paged attention, vLLM) pays per query-key pair of each row;
* ``f``: per-sequence host work (batch assembly, sampling, output bookkeeping).

Measured on transformers 5.24 on the CPU (docs/simulator.md, "Fidelity"), ``d`` and ``f`` are
what ``a + b * tokens + c * context`` was missing there.

Default coefficients: Llama-3.1-8B-Instruct, FP8 weights, one H100 SXM 80GB, TensorRT-LLM.
This is an approximation derived from public figures, not a measurement of ours. They come from
``tools/fit_latency.py``, which fits (a, b, c) jointly so that the simulator itself reproduces
the ten "Llama 3.1 8B / H100 TP1 (FP8)" rows of NVIDIA's TensorRT-LLM performance overview
(docs/source/performance/perf-overview.md, "Throughput Measurements": total output tokens/s at
maximum load for ISL/OSL 128/128 ... 20000/2000, :data:`TRTLLM_H100_LLAMA31_8B_FP8`): each row
is simulated as a saturated run (:mod:`stepplanner.sim.calibration`: the benchmark's requests, all
at t=0, on the engine trtllm-bench configures), and the fit is least squares in relative run time
with ``a`` bounded below by the weight-streaming floor (8.03e9 parameters x 1 byte / 3.35 TB/s H100
HBM3 = 2.4 ms), where it lands: saturated runs cannot pin ``a`` down. The residual of
every row is tabulated in docs/simulator.md (all within 10.7%; nine within 4.7%).

Real engines add CUDA-graph padding, sampling and scheduling overheads; use ``LatencyModel(a, b,
c)`` (or ``stepplanner calibrate`` on a runtime's step timings) for anything that matters.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from .._errors import StepPlannerTypeError, StepPlannerValueError

__all__ = [
    "COEFFICIENTS",
    "DEFAULT_LATENCY",
    "EnginePace",
    "LatencyModel",
    "TRTLLM_H100_LLAMA31_8B_FP8",
]

COEFFICIENTS = ("a", "b", "c", "d", "e", "f")
# How each coefficient is printed: the unit it multiplies.
TERMS = {
    "a": " s",
    "b": " s/token",
    "c": " s/context position",
    "d": " s/(token x context)",
    "e": " s/attention pair",
    "f": " s/row",
}

# (ISL, OSL, total output tokens/s, requests in the benchmark's dataset): Llama 3.1 8B, H100 TP1
# (FP8), TensorRT-LLM perf overview ("Throughput Measurements" and "$num_requests").
TRTLLM_H100_LLAMA31_8B_FP8: tuple[tuple[int, int, int, int], ...] = (
    (128, 128, 28312, 30000),
    (128, 2048, 22714, 3000),
    (128, 4096, 14325, 1500),
    (500, 2000, 17660, 3000),
    (1000, 1000, 15220, 3000),
    (1000, 2000, 13899, 1500),
    (2048, 128, 3450, 3000),
    (2048, 2048, 9305, 1500),
    (5000, 500, 3459, 1500),
    (20000, 2000, 1351, 1000),
)


@dataclasses.dataclass(frozen=True, slots=True)
class LatencyModel:
    """Seconds one engine step takes: ``a + b * tokens + c * context + d * tokens * context +
    e * attention + f * rows`` (see the module doc). ``d``, ``e``, ``f`` come after ``name`` so
    ``LatencyModel(a, b, c, name)`` keeps its meaning."""

    a: float = 2.4e-3  # tools/fit_latency.py
    b: float = 1.45e-5
    c: float = 2.19e-8
    name: str = "Llama-3.1-8B FP8 on H100 SXM (TensorRT-LLM, approximate)"
    d: float = 0.0
    e: float = 0.0
    f: float = 0.0

    def __post_init__(self) -> None:
        for field in COEFFICIENTS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise StepPlannerTypeError(
                    f"LatencyModel.{field} must be a number of seconds, "
                    f"got {type(value).__name__} {value!r}"
                )
            if not math.isfinite(value) or value < 0:
                raise StepPlannerValueError(
                    f"LatencyModel.{field}={value!r} is out of range; allowed: a finite number >= 0"
                )
        if self.a + self.b + self.c + self.d + self.e + self.f <= 0:
            raise StepPlannerValueError(
                "LatencyModel coefficients are all 0; allowed: at least one > 0, "
                "or simulated time never advances"
            )

    def step_seconds(self, tokens: int, context: int, rows: int = 0, attention: int = 0) -> float:
        """A step's seconds; ``attention`` is read only when ``e`` is not 0 (the simulator
        computes it only then: it is the one term that needs a pass over the rows)."""
        return (
            self.a
            + self.b * tokens
            + self.c * context
            + self.d * tokens * context
            + self.e * attention
            + self.f * rows
        )

    def coefficients(self) -> dict[str, float]:
        """Every coefficient by its letter (what model files and reports hold)."""
        return {k: getattr(self, k) for k in COEFFICIENTS}

    def formula(self) -> str:
        """The model as text, with only the terms it has."""
        return " + ".join(
            f"{k}={v:.6g}{TERMS[k]}" for k, v in self.coefficients().items() if v or k in "abc"
        )

    @classmethod
    def parse(cls, text: str) -> LatencyModel:
        """``"a=0.003,b=1.5e-5,c=2e-8"``: any subset overrides the defaults."""
        values = parse_coefficients(text)
        if not values:
            return cls()
        return dataclasses.replace(cls(), name="custom", **values)


def parse_coefficients(text: str) -> dict[str, float]:
    """``"a=0.003,c=2e-8"`` -> ``{"a": 0.003, "c": 2e-08}``: the coefficients ``text`` gives
    (unchecked until they are put in a ``LatencyModel``)."""
    values: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in COEFFICIENTS:
            raise StepPlannerValueError(
                f"latency item {item!r} is not known; allowed: a=SECONDS, "
                "b=SECONDS_PER_TOKEN, c=SECONDS_PER_CONTEXT_POSITION, "
                "d=SECONDS_PER_TOKEN_X_CONTEXT, e=SECONDS_PER_ATTENTION_PAIR, f=SECONDS_PER_ROW"
            )
        try:
            values[key] = float(raw)
        except ValueError:
            raise StepPlannerValueError(f"latency {key}={raw.strip()!r} is not a number") from None
    return values


DEFAULT_LATENCY = LatencyModel()


@dataclasses.dataclass(frozen=True, slots=True)
class EnginePace:
    """How fast an engine ran, window by window, against a step model: a step starting ``t``
    seconds after the run's first arrival takes the model's seconds x ``factors[k]`` for
    ``k = t // window`` (the last factor after the last window).

    A diagnostic, not a prediction: it comes from the very run it is replayed against
    (``latency_models.measured_pace``: that run's measured over modelled step seconds per
    window), and says how much of a simulation's error is the engine's speed changing while the
    run went on (a shared machine, thermal limits, a noisy neighbour) rather than the scheduling
    or the model's shape (docs/simulator.md, "Fidelity")."""

    window: float
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, (int, float)):
            raise StepPlannerTypeError(
                f"EnginePace.window must be a number of seconds, got "
                f"{type(self.window).__name__} {self.window!r}"
            )
        if not math.isfinite(self.window) or self.window <= 0:
            raise StepPlannerValueError(
                f"EnginePace.window={self.window!r} is out of range; "
                "allowed: a finite number of seconds > 0"
            )
        given: object = self.factors  # checked as what a caller may pass, not as annotated
        if not isinstance(given, Sequence) or isinstance(given, (str, bytes)):
            raise StepPlannerTypeError(
                f"EnginePace.factors must be a sequence of numbers, got {type(given).__name__}"
            )
        if not given:
            raise StepPlannerValueError(
                "EnginePace.factors is empty; allowed: one factor per window, at least one"
            )
        factors: list[float] = []
        for k, value in enumerate(given):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise StepPlannerTypeError(
                    f"EnginePace.factors[{k}] must be a number, got "
                    f"{type(value).__name__} {value!r}"
                )
            if not math.isfinite(value) or value <= 0:
                raise StepPlannerValueError(
                    f"EnginePace.factors[{k}]={value!r} is out of "
                    "range; allowed: a finite number > 0"
                )
            factors.append(float(value))
        object.__setattr__(self, "factors", tuple(factors))

    def at(self, t: float) -> float:
        """The factor of a step starting ``t`` seconds after the first arrival."""
        k = int(t // self.window) if t > 0 else 0
        return self.factors[min(k, len(self.factors) - 1)]
