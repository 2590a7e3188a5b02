"""The simulator's step-latency model: ``t_step = a + b * tokens + c * context``.

``tokens`` is the plan's ``total_tokens``; ``context`` is ``sum(past_length + query_length)`` over
the planned rows: the KV positions attention reads. ``a`` is the fixed cost of one forward pass
(streaming the weights once), ``b`` the per-token cost of the dense layers, ``c`` the per-position
cost of attention over the KV cache.

Default coefficients: Llama-3.1-8B-Instruct, FP8 weights, one H100 SXM 80GB, TensorRT-LLM.
This is an approximation derived from public figures, not a measurement of ours. They come from
``tools/fit_latency.py``, which fits (a, b, c) jointly so that the simulator itself reproduces
the ten "Llama 3.1 8B / H100 TP1 (FP8)" rows of NVIDIA's TensorRT-LLM performance overview
(docs/source/performance/perf-overview.md, "Throughput Measurements": total output tokens/s at
maximum load for ISL/OSL 128/128 ... 20000/2000, :data:`TRTLLM_H100_LLAMA31_8B_FP8`): each row
is simulated as a saturated run (:mod:`stepplanner.sim.calibration`: the benchmark's requests, all at
t=0, on the engine trtllm-bench configures), and the fit is least squares in relative run time
with ``a`` bounded below by the weight-streaming floor (8.03e9 parameters x 1 byte / 3.35 TB/s
H100 HBM3 = 2.4 ms), where it lands: saturated runs cannot pin ``a`` down. The residual of
every row is tabulated in docs/simulator.md (all within 10.7%; nine within 4.7%).

Real engines add CUDA-graph padding, sampling and scheduling overheads; use ``LatencyModel(a, b,
c)`` with your own measurements for anything that matters.
"""

from __future__ import annotations

import dataclasses
import math

from .._errors import StepPlannerTypeError, StepPlannerValueError

__all__ = ["DEFAULT_LATENCY", "LatencyModel", "TRTLLM_H100_LLAMA31_8B_FP8"]

# (ISL, OSL, total output tokens/s, requests in the benchmark's dataset): Llama 3.1 8B, H100 TP1
# (FP8), TensorRT-LLM perf overview ("Throughput Measurements" and "$num_requests").
TRTLLM_H100_LLAMA31_8B_FP8: tuple[tuple[int, int, int, int], ...] = (
    (128, 128, 28312, 30000), (128, 2048, 22714, 3000), (128, 4096, 14325, 1500),
    (500, 2000, 17660, 3000), (1000, 1000, 15220, 3000), (1000, 2000, 13899, 1500),
    (2048, 128, 3450, 3000), (2048, 2048, 9305, 1500), (5000, 500, 3459, 1500),
    (20000, 2000, 1351, 1000),
)


@dataclasses.dataclass(frozen=True, slots=True)
class LatencyModel:
    """Seconds one engine step takes: ``a + b * tokens + c * context`` (see the module doc)."""

    a: float = 2.4e-3  # tools/fit_latency.py
    b: float = 1.45e-5
    c: float = 2.19e-8
    name: str = "Llama-3.1-8B FP8 on H100 SXM (TensorRT-LLM, approximate)"

    def __post_init__(self) -> None:
        for field in ("a", "b", "c"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise StepPlannerTypeError(
                    f"LatencyModel.{field} must be a number of seconds, "
                    f"got {type(value).__name__} {value!r}")
            if not math.isfinite(value) or value < 0:
                raise StepPlannerValueError(
                    f"LatencyModel.{field}={value!r} is out of range; "
                    "allowed: a finite number >= 0")
        if self.a + self.b + self.c <= 0:
            raise StepPlannerValueError(
                "LatencyModel a, b and c are all 0; allowed: at least one > 0, "
                "or simulated time never advances")

    def step_seconds(self, tokens: int, context: int) -> float:
        return self.a + self.b * tokens + self.c * context

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
        if not sep or key not in ("a", "b", "c"):
            raise StepPlannerValueError(
                f"latency item {item!r} is not known; allowed: a=SECONDS, "
                "b=SECONDS_PER_TOKEN, c=SECONDS_PER_CONTEXT_POSITION")
        try:
            values[key] = float(raw)
        except ValueError:
            raise StepPlannerValueError(
                f"latency {key}={raw.strip()!r} is not a number") from None
    return values


DEFAULT_LATENCY = LatencyModel()
