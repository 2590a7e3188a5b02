"""Fit the default step-latency model (a, b, c) jointly to the published saturated-throughput rows.

    python tools/fit_latency.py           # fit, then print the model and the residual table
    python tools/fit_latency.py --check   # also exit 1 unless LatencyModel() is this fit

Each published row (stepplanner.latency.TRTLLM_H100_LLAMA31_8B_FP8) becomes a saturated run in
the simulator (stepplanner.calibration.saturated_run: its requests at t=0 on trtllm-bench's
engine). A saturated run's plans do not depend on time, so its simulated span is
``a * steps + b * tokens + c * context`` over its steps, and its output tokens/s is
``output_tokens / span``. The fit minimises the sum over rows of (simulated span / published span
- 1)^2 with b, c >= 0 and a >= A_FLOOR: a linear least-squares problem, solved exactly by trying
every set of free coefficients (numpy only; deterministic). The coefficients are rounded to three
significant digits, and the residuals printed are those of the rounded model, re-simulated end to
end.

A_FLOOR is physics, not data: no step can be shorter than streaming the weights once (8.03e9
parameters x 1 byte / 3.35 TB/s H100 HBM3 = 2.4 ms). Saturated rows cannot pin a down (it is
shared by hundreds of sequences per step; unbounded, least squares makes it negative), and
without the floor a lightly loaded simulation would decode a token in microseconds.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np

from stepplanner.calibration import residuals, simulate_row, step_sums
from stepplanner.latency import TRTLLM_H100_LLAMA31_8B_FP8, LatencyModel

A_FLOOR = 8.03e9 / 3.35e12  # seconds to stream Llama-3.1-8B's FP8 weights from H100 HBM3 once


def nonnegative_least_squares(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """argmin ||matrix @ x - target|| over x >= 0, by trying every support (3 columns: 7)."""
    best, best_x = np.inf, np.zeros(matrix.shape[1])
    for size in range(1, matrix.shape[1] + 1):
        for support in itertools.combinations(range(matrix.shape[1]), size):
            sol, *_ = np.linalg.lstsq(matrix[:, support], target, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(matrix.shape[1])
            x[list(support)] = sol
            err = float(np.sum((matrix @ x - target) ** 2))
            if err < best:
                best, best_x = err, x
    return best_x


def significant(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits - 1}e}")


def fit(sums: list[tuple[int, int, int, int]]) -> LatencyModel:
    """The rounded fit, from each row's (steps, tokens, context, output tokens)."""
    rows = [(steps, tokens, context) for steps, tokens, context, _ in sums]
    spans = [output / tok_s  # the published run's span, seconds
             for (_, _, _, output), (_, _, tok_s, _) in zip(sums, TRTLLM_H100_LLAMA31_8B_FP8)]
    features = np.array(rows, dtype=np.float64) / np.array(spans)[:, None]
    free, *_ = np.linalg.lstsq(features, np.ones(len(spans)), rcond=None)
    print("least squares, unbounded: a={:.4g} s, b={:.4g} s/token, c={:.4g} s/position".format(
        *free))
    # a = A_FLOOR + a' with a' >= 0: the floor's share of each span moves to the target
    above, b, c = nonnegative_least_squares(features, 1 - A_FLOOR * features[:, 0])
    a = A_FLOOR + above
    print(f"least squares, a >= {A_FLOOR:.4g}: a={a:.6g} s, b={b:.6g} s/token, "
          f"c={c:.6g} s/position")
    return LatencyModel(significant(a), significant(b), significant(c))


def saturated_sums() -> list[tuple[int, int, int, int]]:
    """Each row's saturated-run sums; the plans, hence the sums, do not depend on the model."""
    return [step_sums(simulate_row(isl, osl, requests, LatencyModel()))
            for isl, osl, _, requests in TRTLLM_H100_LLAMA31_8B_FP8]


def table(model: LatencyModel) -> float:
    print(f"model: a={model.a:g} s, b={model.b:g} s/token, c={model.c:g} s/position\n")
    print("| ISL/OSL | requests | concurrency | max_num_tokens | published tok/s "
          "| simulated tok/s | residual |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = 0.0
    for r in residuals(model):
        print(f"| {r.isl}/{r.osl} | {r.requests:,} | {r.concurrency:,} | {r.max_num_tokens:,} "
              f"| {r.published:,.0f} | {r.simulated:,.0f} | {100 * r.relative:+.1f}% |")
        worst = max(worst, abs(r.relative))
    print(f"\nlargest |residual|: {100 * worst:.2f}%")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless stepplanner's default LatencyModel is this fit")
    args = parser.parse_args(argv)
    model = fit(saturated_sums())
    table(model)
    default = LatencyModel()
    if args.check and (default.a, default.b, default.c) != (model.a, model.b, model.c):
        print(f"LatencyModel() is a={default.a:g}, b={default.b:g}, c={default.c:g}: "
              "not this fit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
