"""The tables of docs/simulator.md "Fidelity", from the files ``stepplanner serve-trace`` wrote.

    python tools/fidelity_tables.py DIR [--calibrate-on DIR/profile.csv] [--calibrate-on ...]

DIR holds, per load L in 30/60/85 and repeat R in a/b, ``fcfs-L-R.json``/``.csv`` and
``pp-L-R.json``/``.csv`` (PRIORITY+PAUSE), and ``fifo-85-R.json``/``.csv``: the results and
timings files of docs/simulator.md's commands. Each run is simulated on its own trace with its
own limits and policy (read from the results file's ``stepplanner`` object) under a latency model
calibrated on the run's own timings file; the relative error of p50 and p90 of TTFT, TPOT and E2E
is printed beside the spread between the two real runs of the same trace and policy
(``real b / real a - 1``). The policy table simulates each run with the model calibrated on its
own timings too: on a shared machine the step costs differ more between runs minutes apart than
between policies (docs/simulator.md, "Fidelity"); its last column prices one reference step with
that run's model, which says how fast the machine was during the run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

import numpy as np

from stepplanner.core._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.core._types import IfbSchedulingMode
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.latency_models import fit_step_latency, read_step_timings
from stepplanner.sim.simulator import policy_from_dict, simulate
from stepplanner.sim.traces import read_trace

METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (50, 90)
LOADS = ("30", "60", "85")
POLICIES = (("fcfs", "FCFS"), ("pp", "PRIORITY+PAUSE"))
# One step priced by each run's calibrated model, to show how fast the machine was during that
# run: 8 decode rows at 250 positions of past each (tokens, context, rows, attention).
REFERENCE_STEP = (8, 8 * 251, 8, 8 * 251)


def real_latencies(results: dict[str, Any]) -> dict[str, np.ndarray]:
    ttft, e2e = np.array(results["ttfts"]), np.array(results["latencies"])
    out = np.array(results["output_lens"])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), np.nan)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def simulated(results: dict[str, Any], model: LatencyModel) -> Any:
    run = results["stepplanner"]
    limits = StepPlannerLimits(**run["limits"])
    if run["options"] is None:  # transformers' own scheduler: FCFS at its step budget is closest
        options: Any = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED,
                                         max_num_tokens=limits.max_step_tokens)
    else:
        options = policy_from_dict(run["options"])
    return simulate(read_trace(run["trace"]), limits, options, model)


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values[~np.isnan(values)], q))


def figures(lat: dict[str, np.ndarray]) -> dict[str, float]:
    return {f"{m} p{q}": percentile(lat[m], q) for m in METRICS for q in QUANTILES}


def calibrated(timings: pathlib.Path, terms: str | None = None) -> LatencyModel:
    return fit_step_latency(read_step_timings(timings), str(timings), terms).model


def agreement(folder: pathlib.Path, terms: str | None, profile: pathlib.Path | None) -> None:
    label = "the run's own timings" if profile is None else profile.name
    print(f"\n### Agreement: model terms {terms or 'all'}, calibrated on {label}\n")
    print("| load | policy | figure | real a | sim a | error a | real b | sim b | error b | "
          "real b vs a |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    errors: dict[str, list[float]] = {"a": [], "b": []}
    for load in LOADS:
        for key, name in POLICIES:
            real, sim = {}, {}
            for rep in "ab":
                stem = folder / f"{key}-{load}-{rep}"
                results = json.loads(stem.with_suffix(".json").read_text())
                model = calibrated(profile or stem.with_suffix(".csv"), terms)
                real[rep] = figures(real_latencies(results))
                sim[rep] = figures(simulated(results, model).latencies())
            for fig in real["a"]:
                cells = []
                for rep in "ab":
                    err = sim[rep][fig] / real[rep][fig] - 1
                    errors[rep].append(err)
                    cells += [f"{real[rep][fig] * 1e3:,.1f}", f"{sim[rep][fig] * 1e3:,.1f}",
                              f"{err:+.1%}"]
                spread = real["b"][fig] / real["a"][fig] - 1
                print(f"| {load}% | {name} | {fig} ms | " + " | ".join(cells) +
                      f" | {spread:+.1%} |")
    for rep, errs in errors.items():
        e = np.abs(errs)
        print(f"\nrun {rep}: median |error| {np.median(e):.1%}, worst {e.max():.1%}, "
              f"{int((e > 0.25).sum())} of {e.size} over 25%")


def policies(folder: pathlib.Path) -> None:
    print("\n### Policies at 85% (real; simulated with the model calibrated on each run)\n")
    print("| scheduler | run | urgent TTFT p99 ms | sim | all TPOT p99 ms | sim | "
          "output tok/s | sim | reference step ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    reps = sorted({p.stem.rsplit("-", 1)[1] for p in folder.glob("fifo-85-*.json")})
    for rep in reps:  # a and b, and any further repeat of the three at 85%
        for key, name in (("fifo", "transformers fifo"), *POLICIES):
            stem = folder / f"{key}-85-{rep}"
            results = json.loads(stem.with_suffix(".json").read_text())
            model = calibrated(stem.with_suffix(".csv"))
            real = real_latencies(results)
            urgent = np.array(results["priorities"]) < 0
            result = simulated(results, model)
            sim = result.latencies()
            tok_s = result.report()["throughput"]["output_tokens_per_s"]
            print(f"| {name} | {rep} | {percentile(real['ttft'][urgent], 99) * 1e3:,.0f} | "
                  f"{percentile(sim['ttft'][urgent], 99) * 1e3:,.0f} | "
                  f"{percentile(real['tpot'], 99) * 1e3:,.1f} | "
                  f"{percentile(sim['tpot'], 99) * 1e3:,.1f} | "
                  f"{results['output_throughput']:,.1f} | {tok_s:,.1f} | "
                  f"{model.step_seconds(*REFERENCE_STEP) * 1e3:.1f} |")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--calibrate-on", type=pathlib.Path, action="append", default=[],
                        help="Also the agreement with every run priced by a model calibrated on "
                             "this timings file (a --profile grid, a closed-loop burst), with "
                             "every term and with a, b, c only.")
    args = parser.parse_args(argv)
    agreement(args.folder, None, None)
    agreement(args.folder, "abc", None)
    for timings in args.calibrate_on:
        agreement(args.folder, None, timings)
        agreement(args.folder, "abc", timings)
    policies(args.folder)


if __name__ == "__main__":
    main(sys.argv[1:])
