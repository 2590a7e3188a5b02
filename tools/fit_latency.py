"""Fit the default step-latency model (a, b, c) jointly to the published saturated-throughput rows.

    python tools/fit_latency.py           # fit, then print the model and the residual table
    python tools/fit_latency.py --check   # also exit 1 unless LatencyModel() is this fit

Each published row (stepplanner.sim.latency.TRTLLM_H100_LLAMA31_8B_FP8) becomes a saturated run in
the simulator (stepplanner.sim.calibration.saturated_run: its requests at t=0 on trtllm-bench's
engine). A saturated run's plans do not depend on time, so its simulated span is
``a * steps + b * tokens + c * context`` over its steps. stepplanner.sim.calibration.fit minimises
the sum over rows of (simulated span / published span - 1)^2 with b, c >= 0 and a at least the
weight-streaming floor (calibration.A_FLOOR): linear least squares, solved exactly (numpy only;
deterministic). The coefficients are rounded to three significant digits, and the residuals
printed are those of the rounded model, re-simulated end to end: the table docs/simulator.md
publishes.
"""

from __future__ import annotations

import argparse
import sys

from stepplanner.sim.calibration import A_FLOOR, fit, residuals, simulate_row, step_sums
from stepplanner.sim.latency import TRTLLM_H100_LLAMA31_8B_FP8, LatencyModel


def table(model: LatencyModel) -> None:
    print(f"model: a={model.a:g} s, b={model.b:g} s/token, c={model.c:g} s/position\n")
    print(
        "| ISL/OSL | requests | concurrency | max_num_tokens | published tok/s "
        "| simulated tok/s | residual |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = {}
    for r in residuals(model):
        print(
            f"| {r.isl}/{r.osl} | {r.requests:,} | {r.concurrency:,} | {r.max_num_tokens:,} "
            f"| {r.published:,.0f} | {r.simulated:,.0f} | {100 * r.relative:+.1f}% |"
        )
        worst[f"{r.isl}/{r.osl}"] = abs(r.relative)
    top = max(worst, key=worst.__getitem__)
    rest = max(v for k, v in worst.items() if k != top)
    print(
        f"\nlargest |residual|: {100 * worst[top]:.2f}% ({top}); the other rows: {100 * rest:.2f}%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless stepplanner's default LatencyModel is this fit",
    )
    args = parser.parse_args(argv)
    # the plans, hence the sums, do not depend on the model a saturated run is simulated with
    sums = [
        step_sums(simulate_row(isl, osl, requests, LatencyModel()))
        for isl, osl, _, requests in TRTLLM_H100_LLAMA31_8B_FP8
    ]
    model, unbounded, bounded = fit(sums)
    print(
        "least squares, unbounded: a={:.4g} s, b={:.4g} s/token, c={:.4g} s/position".format(
            *unbounded
        )
    )
    print(
        f"least squares, a >= {A_FLOOR:.4g}: a={bounded[0]:.6g} s, b={bounded[1]:.6g} s/token,"
        f" c={bounded[2]:.6g} s/position"
    )
    table(model)
    default = LatencyModel()
    if args.check and (default.a, default.b, default.c) != (model.a, model.b, model.c):
        print(
            f"LatencyModel() is a={default.a:g}, b={default.b:g}, c={default.c:g}: not this fit",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
