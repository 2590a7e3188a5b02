"""The simulator's step-latency model: ``t_step = a + b * tokens + c * context``.

``tokens`` is the plan's ``total_tokens``; ``context`` is ``sum(past_length + query_length)`` over
the planned rows: the KV positions attention reads. ``a`` is the fixed cost of one forward pass
(streaming the weights once), ``b`` the per-token cost of the dense layers, ``c`` the per-position
cost of attention over the KV cache.

Default coefficients: Llama-3.1-8B-Instruct, FP8 weights, one H100 SXM 80GB, TensorRT-LLM.
This is an approximation derived from public figures, not a measurement of ours:

* ``b`` and ``c`` are a least-squares fit (relative error) to the ten "Llama 3.1 8B / H100 TP1
  (FP8)" rows of NVIDIA's TensorRT-LLM performance overview
  (docs/source/performance/perf-overview.md, "Throughput Measurements": total output tokens/s
  at maximum load for ISL/OSL 128/128 ... 20000/2000). Each row gives the time per request,
  ``OSL / throughput``, which at maximum load is ``b * (ISL + OSL) + c * (ISL + OSL*ISL +
  OSL**2/2)``; the fit is b = 14.3 us/token, c = 25.6 ns/position and reproduces nine of the ten
  rows within 4% (the 20000/2000 row within 6%). See :data:`TRTLLM_H100_LLAMA31_8B_FP8`.
* ``a`` is not identifiable from maximum-load throughput (it is shared by hundreds of sequences
  per step), so it is the weight-streaming floor: 8.03e9 parameters x 1 byte (FP8) / 3.35 TB/s
  (H100 SXM HBM3 bandwidth, NVIDIA datasheet) = 2.4 ms.

Real engines add CUDA-graph padding, sampling and scheduling overheads; use ``LatencyModel(a, b,
c)`` with your own measurements for anything that matters.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["DEFAULT_LATENCY", "LatencyModel", "TRTLLM_H100_LLAMA31_8B_FP8"]

# (ISL, OSL, total output tokens/s): Llama 3.1 8B, H100 TP1 (FP8), TensorRT-LLM perf overview.
TRTLLM_H100_LLAMA31_8B_FP8: tuple[tuple[int, int, int], ...] = (
    (128, 128, 28312), (128, 2048, 22714), (128, 4096, 14325), (500, 2000, 17660),
    (1000, 1000, 15220), (1000, 2000, 13899), (2048, 128, 3450), (2048, 2048, 9305),
    (5000, 500, 3459), (20000, 2000, 1351),
)


@dataclasses.dataclass(frozen=True, slots=True)
class LatencyModel:
    """Seconds one engine step takes: ``a + b * tokens + c * context`` (see the module doc)."""

    a: float = 2.4e-3
    b: float = 14.3e-6
    c: float = 25.6e-9
    name: str = "Llama-3.1-8B FP8 on H100 SXM (TensorRT-LLM, approximate)"

    def __post_init__(self) -> None:
        for field in ("a", "b", "c"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"LatencyModel.{field} must be a number of seconds, "
                                f"got {type(value).__name__} {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"LatencyModel.{field}={value!r} is out of range; "
                                 "allowed: a finite number >= 0")
        if self.a + self.b + self.c <= 0:
            raise ValueError("LatencyModel a, b and c are all 0; allowed: at least one > 0, "
                             "or simulated time never advances")

    def step_seconds(self, tokens: int, context: int) -> float:
        return self.a + self.b * tokens + self.c * context

    @classmethod
    def parse(cls, text: str) -> LatencyModel:
        """``"a=0.003,b=1.5e-5,c=2e-8"``: any subset overrides the defaults."""
        values: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in ("a", "b", "c"):
                raise ValueError(f"latency item {item!r} is not known; allowed: a=SECONDS, "
                                 "b=SECONDS_PER_TOKEN, c=SECONDS_PER_CONTEXT_POSITION")
            try:
                values[key] = float(raw)
            except ValueError:
                raise ValueError(f"latency {key}={raw.strip()!r} is not a number") from None
        if not values:
            return cls()
        return dataclasses.replace(cls(), name="custom", **values)


DEFAULT_LATENCY = LatencyModel()
