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
from stepplanner.sim.latency import EnginePace, LatencyModel
from stepplanner.sim.latency_models import fit_step_latency, measured_pace, read_step_timings
from stepplanner.sim.simulator import policy_from_dict, simulate
from stepplanner.sim.traces import read_trace

METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (50, 90)
LOADS = ("30", "60", "85")
POLICIES = (("fcfs", "FCFS"), ("pp", "PRIORITY+PAUSE"))
# One step priced by each run's calibrated model, to show how fast the machine was during that
# run: 8 decode rows at 250 positions of past each (tokens, context, rows, attention).
REFERENCE_STEP = (8, 8 * 251, 8, 8 * 251)
PACE_WINDOW = 1.0  # seconds: --pace-window's default
LABELS = {"own": "the run's own timings",
          "pace": "the run's own timings, its pace replayed (diagnostic)",
          "other": "the other repeat's timings"}


def real_latencies(results: dict[str, Any]) -> dict[str, np.ndarray]:
    ttft, e2e = np.array(results["ttfts"]), np.array(results["latencies"])
    out = np.array(results["output_lens"])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), np.nan)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def simulated(results: dict[str, Any], model: LatencyModel, pace: EnginePace | None = None
              ) -> Any:
    run = results["stepplanner"]
    limits = StepPlannerLimits(**run["limits"])
    if run["options"] is None:  # transformers' own scheduler: FCFS at its step budget is closest
        options: Any = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED,
                                         max_num_tokens=limits.max_step_tokens)
    else:
        options = policy_from_dict(run["options"])
    return simulate(read_trace(run["trace"]), limits, options, model, pace=pace)


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values[~np.isnan(values)], q))


def figures(lat: dict[str, np.ndarray]) -> dict[str, float]:
    return {f"{m} p{q}": percentile(lat[m], q) for m in METRICS for q in QUANTILES}


def calibrated(timings: pathlib.Path, terms: str | None = None) -> LatencyModel:
    return fit_step_latency(read_step_timings(timings), str(timings), terms).model


def timings_of(pricing: str, folder: pathlib.Path, key: str, load: str, rep: str,
               reps: list[str]) -> pathlib.Path:
    """The timings file a run is priced by: its own (``own``; ``pace``: its own, with its
    measured pace replayed), the other repeat's of the same trace and policy (``other``: minutes
    apart on the same machine), or a fixed file."""
    if pricing in ("own", "pace"):
        return folder / f"{key}-{load}-{rep}.csv"
    if pricing == "other":
        return folder / f"{key}-{load}-{reps[(reps.index(rep) + 1) % len(reps)]}.csv"
    return pathlib.Path(pricing)


def agreement(folder: pathlib.Path, reps: list[str], terms: str | None, pricing: str,
              show: bool) -> dict[str, np.ndarray]:
    """Every run's figures, real and simulated; the table when ``show``; the errors per repeat."""
    label = LABELS.get(pricing, pricing)
    if show:
        print(f"\n### Agreement: model terms {terms or 'all'}, calibrated on {label}\n")
        head = " | ".join(f"real {r} | sim {r} | error {r}" for r in reps)
        spread = " | ".join(f"real {r} vs {reps[0]}" for r in reps[1:])
        print(f"| load | policy | figure | {head} | {spread} |")
        print("| --- | --- | --- |" + " ---: |" * (3 * len(reps) + len(reps) - 1))
    errors: dict[str, list[float]] = {rep: [] for rep in reps}
    for load in LOADS:
        for key, name in POLICIES:
            real, sim = {}, {}
            for rep in reps:
                results = json.loads((folder / f"{key}-{load}-{rep}.json").read_text())
                timings = timings_of(pricing, folder, key, load, rep, reps)
                model = calibrated(timings, terms)
                pace = (measured_pace(read_step_timings(timings), model, PACE_WINDOW, str(timings))
                        if pricing == "pace" else None)
                real[rep] = figures(real_latencies(results))
                sim[rep] = figures(simulated(results, model, pace).latencies())
            for fig in real[reps[0]]:
                cells = []
                for rep in reps:
                    err = sim[rep][fig] / real[rep][fig] - 1
                    errors[rep].append(err)
                    cells += [f"{real[rep][fig] * 1e3:,.1f}", f"{sim[rep][fig] * 1e3:,.1f}",
                              f"{err:+.1%}"]
                cells += [f"{real[rep][fig] / real[reps[0]][fig] - 1:+.1%}" for rep in reps[1:]]
                if show:
                    print(f"| {load}% | {name} | {fig} ms | " + " | ".join(cells) + " |")
    return {rep: np.abs(errs) for rep, errs in errors.items()}


def spreads(folder: pathlib.Path, reps: list[str]) -> np.ndarray:
    """|real r / real first - 1| of every figure of every later repeat: the machine's own noise."""
    out = []
    for load in LOADS:
        for key, _ in POLICIES:
            first = figures(real_latencies(json.loads(
                (folder / f"{key}-{load}-{reps[0]}.json").read_text())))
            for rep in reps[1:]:
                later = figures(real_latencies(json.loads(
                    (folder / f"{key}-{load}-{rep}.json").read_text())))
                out += [later[f] / first[f] - 1 for f in first]
    return np.abs(out)


def summary(e: np.ndarray) -> str:
    return f"{np.median(e):.1%} / {e.max():.1%} / {int((e > 0.25).sum())} of {e.size}"


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
    parser.add_argument("--repeats", nargs="+", default=["a", "b"],
                        help="The repeats' names in the file names (default: a b).")
    parser.add_argument("--calibrate-on", action="append", default=[],
                        help="Also price every run by a model calibrated on this timings file "
                             "(a --profile grid, a closed-loop burst).")
    args = parser.parse_args(argv)
    reps = args.repeats
    rows = []
    for pricing in ["own", "pace", *(["other"] if len(reps) > 1 else []), *args.calibrate_on]:
        for terms in (None, "abc"):
            errors = agreement(args.folder, reps, terms, pricing,
                               show=pricing in ("own", "pace") and terms is None)
            name = LABELS.get(pricing, pathlib.Path(pricing).name)
            rows.append(f"| {name} | {terms or 'all'} | " +
                        " | ".join(summary(errors[r]) for r in reps) + " |")
    print("\n### Summary: median / worst |error| / figures over 25%\n")
    print("| model calibrated on | terms | " + " | ".join(f"run {r}" for r in reps) + " |")
    print("| --- | --- |" + " --- |" * len(reps))
    print("\n".join(rows))
    if len(reps) > 1:
        print(f"\nreal vs real ({', '.join(reps[1:])} against {reps[0]}): "
              f"{summary(spreads(args.folder, reps))}")
    policies(args.folder)


if __name__ == "__main__":
    main(sys.argv[1:])
