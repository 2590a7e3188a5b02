"""The saturated runs the default latency model is fitted to, and how close the simulator gets.

NVIDIA's TensorRT-LLM performance overview gives, per ISL/OSL pair, the total output tokens/s
that ``trtllm-bench throughput`` measured at maximum load (every request queued at once) and the
number of requests in that benchmark's dataset (``latency.TRTLLM_H100_LLAMA31_8B_FP8``). A
*saturated run* replays one row in this simulator: that many identical requests, all arriving at
t=0, on the engine ``trtllm-bench`` configures for the pair (:func:`trtllm_bench_engine`). Its
simulated output tokens/s is what the model must reproduce.

With every request there at t=0 the plans never depend on time, so a saturated run's simulated
span is exactly ``a * steps + b * tokens + c * context`` summed over its steps
(:func:`step_sums`): linear in the coefficients, which makes the joint fit (:func:`fit`) a
linear least-squares problem, solved exactly and deterministically. ``tools/fit_latency.py``
runs it and prints the residual table docs/simulator.md publishes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ..planner._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    rd,
    resolve_scheduling_policy,
)
from ..planner._types import IfbSchedulingMode
from ._least_squares import nonnegative_least_squares
from .latency import TRTLLM_H100_LLAMA31_8B_FP8, LatencyModel
from .simulator import SimulationResult, simulate
from .workloads import Workload

__all__ = [
    "A_FLOOR",
    "H100_LLAMA31_8B_FP8",
    "EngineMemory",
    "Residual",
    "fit",
    "nonnegative_least_squares",
    "residual",
    "residuals",
    "saturated_run",
    "simulate_row",
    "step_sums",
    "trtllm_bench_engine",
]

KV_PAGE = 32  # TensorRT-LLM's default tokens_per_block
# No step is shorter than streaming the weights once: 8.03e9 FP8 parameters / 3.35 TB/s (H100
# SXM HBM3). Saturated rows cannot pin ``a`` down (it is shared by hundreds of sequences per step;
# unbounded, least squares makes it negative), and without this floor a lightly loaded
# simulation would decode a token in microseconds.
A_FLOOR = 8.03e9 / 3.35e12


@dataclasses.dataclass(frozen=True, slots=True)
class EngineMemory:
    """What bounds concurrency on the benchmarked GPU: KV-cache bytes per token and room."""

    device_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    kv_cache_fraction: float

    @property
    def kv_tokens(self) -> float:
        return (
            (self.device_bytes - self.weight_bytes)
            * self.kv_cache_fraction
            / self.kv_bytes_per_token
        )


# H100 SXM 80GB (81,559 MiB as the CUDA driver reports it); Llama-3.1-8B: 8.03e9 parameters in
# FP8 (1 byte), FP8 KV cache of 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 1 byte per token;
# the perf overview runs with --kv_cache_free_gpu_mem_fraction 0.95.
H100_LLAMA31_8B_FP8 = EngineMemory(
    device_bytes=81559 * 1024**2,
    weight_bytes=8_030_000_000,
    kv_bytes_per_token=2 * 32 * 8 * 128,
    kv_cache_fraction=0.95,
)


def _round_up(x: float, tiers: tuple[tuple[float, int], ...], least: int) -> int:
    """x rounded up to the step of the first tier whose bound exceeds it, and at least least."""
    step = next(step for bound, step in tiers if x < bound)
    return max(least, step * math.ceil(x / step))


def trtllm_bench_engine(
    isl: int, osl: int, memory: EngineMemory = H100_LLAMA31_8B_FP8
) -> tuple[int, int]:
    """(concurrent requests, max_num_tokens) of the engine ``trtllm-bench`` runs an ISL/OSL on.

    ``trtllm-bench`` sizes the engine from the KV cache: ``r = kv_tokens / (ISL + OSL)``
    requests fit, max_batch_size is ``min(r, 4096)`` rounded up (to 32 below 256, 128 below 1024,
    else 256; at least 64) and max_num_tokens ``min(r' * (1 + ISL/OSL), 32768)`` rounded up (to
    256 below 4096, 512 below 8192, else 1024; at least 2048), with r' the capped batch size
    before rounding (tensorrt_llm/bench/build/tuning.py). Its runtime reserves a request's
    whole ISL + OSL of KV cache on admission, so at most ``floor(r)`` run at once: the
    concurrency is ``min(max_batch_size, floor(r))``.
    """
    fits = memory.kv_tokens / (isl + osl)
    raw_batch = min(fits, 4096)
    max_batch = _round_up(raw_batch, ((256, 32), (1024, 128), (math.inf, 256)), 64)
    raw_tokens = min(raw_batch * (1 + isl / osl), 32768)
    max_tokens = _round_up(raw_tokens, ((4096, 256), (8192, 512), (math.inf, 1024)), 2048)
    return min(max_batch, math.floor(fits)), max_tokens


def saturated_run(
    isl: int, osl: int, requests: int
) -> tuple[Workload, StepPlannerLimits, ResolvedSchedulingPolicy]:
    """One published row as a simulation: ``requests`` x (ISL, OSL) at t=0 on its engine.

    The engine: B = the benchmark's concurrency, S_in = ISL, P = 32, every step capped at the
    benchmark's max_num_tokens (``max_step_tokens`` and the MIXED budget), and chunks as large
    as the budget allows (``max_num_tokens - B``), as TensorRT-LLM's chunked context fills it.
    """
    batch, max_tokens = trtllm_bench_engine(isl, osl)
    limits = StepPlannerLimits(batch, isl, KV_PAGE, max_step_tokens=max_tokens)
    policy = resolve_scheduling_policy(
        SchedulingOptions(
            ifb_scheduling_mode=IfbSchedulingMode.MIXED,
            max_num_tokens=max_tokens,
            max_chunk_tokens=rd(max_tokens - batch, KV_PAGE),
        ),
        limits,
    )
    workload = Workload(
        np.zeros(requests),
        np.full(requests, isl),
        np.full(requests, osl),
        np.zeros(requests, dtype=np.int32),
        source=f"saturated(ISL={isl}, OSL={osl}, requests={requests})",
    )
    return workload, limits, policy


def simulate_row(isl: int, osl: int, requests: int, model: LatencyModel) -> SimulationResult:
    """One published row's saturated run under ``model``."""
    return simulate(*saturated_run(isl, osl, requests), latency=model)


def step_sums(result: SimulationResult) -> tuple[int, int, int, int]:
    """(steps, tokens, context, output tokens) of a run, summed over its steps."""
    steps = result.steps
    return (
        result.num_steps,
        int(steps["tokens"].sum()),
        int(steps["context"].sum()),
        int(result.generated.sum()),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Residual:
    """One published row against its saturated run under a model."""

    isl: int
    osl: int
    requests: int
    concurrency: int
    max_num_tokens: int
    published: float
    simulated: float

    @property
    def relative(self) -> float:
        """simulated / published - 1 (output tokens/s)."""
        return self.simulated / self.published - 1


def residual(result: SimulationResult, published: float) -> Residual:
    """A saturated run's simulated output tokens/s against the published figure."""
    w = result.workload
    return Residual(
        int(w.prompt_tokens[0]),
        int(w.output_tokens[0]),
        len(w),
        result.limits.max_batch_size,
        result.policy.max_num_tokens,
        published,
        result.report()["throughput"]["output_tokens_per_s"],
    )


def residuals(model: LatencyModel) -> list[Residual]:
    """Every published row's saturated run, simulated under ``model``."""
    return [
        residual(simulate_row(isl, osl, requests, model), float(tok_s))
        for isl, osl, tok_s, requests in TRTLLM_H100_LLAMA31_8B_FP8
    ]


def _significant(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits - 1}e}")


def fit(sums: Sequence[tuple[int, int, int, int]]) -> tuple[LatencyModel, np.ndarray, np.ndarray]:
    """The default model from each published row's :func:`step_sums`, in table order.

    Least squares in relative span, ``sum((simulated span / published span - 1) ** 2)``, with
    b, c >= 0 and a >= :data:`A_FLOOR`; returns the model rounded to three significant digits,
    the unbounded solution and the bounded one.
    """
    features = np.array([s[:3] for s in sums], dtype=np.float64)
    spans = np.array(
        [
            output / tok_s  # the published run's span, seconds
            for (*_, output), (_, _, tok_s, _) in zip(sums, TRTLLM_H100_LLAMA31_8B_FP8, strict=True)
        ]
    )
    features /= spans[:, None]
    unbounded, *_ = np.linalg.lstsq(features, np.ones(len(spans)), rcond=None)
    # a = A_FLOOR + a' with a' >= 0: the floor's share of each span moves to the target
    bounded = nonnegative_least_squares(features, 1 - A_FLOOR * features[:, 0])
    bounded[0] += A_FLOOR
    a, b, c = (_significant(float(v)) for v in bounded)
    model = LatencyModel(a, b, c)
    return model, unbounded, bounded
