"""The tables of docs/simulator.md "Fidelity", from the files ``stepplanner serve-trace`` wrote.

    python tools/fidelity_tables.py DIR [--repeats a b] [--calibrate-on DIR/profile.csv ...]

DIR holds, per load L in 30/60/85 and repeat R, ``fcfs-L-R.json``/``.csv`` and ``pp-L-R.json``/
``.csv`` (PRIORITY+PAUSE), and ``fifo-85-R.json``/``.csv``: the results and timings files that
``tools/fidelity_matrix.py`` makes. Each run is simulated on its own trace with its own limits
and policy (read from the results file's ``stepplanner`` object) under a step model calibrated on
timings: the run's own (printed in full, with the spread between the real repeats of the same
trace and policy, ``real b / real a - 1``); the run's own with its measured pace replayed (a
diagnostic: ``fidelity --pace-from``); the other repeat's; every other run of the repeat pooled;
and each ``--calibrate-on`` file. A summary gives the median and worst relative error of p50 and
p90 of TTFT, TPOT and E2E per protocol and repeat. The policy table simulates each run at 85%
with the model calibrated on its own timings; its last column prices one reference step with that
run's model, which says how fast the machine was during the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from typing import Any

import numpy as np

from stepplanner.fidelity.compare import real_samples
from stepplanner.fidelity.results import read_results
from stepplanner.planner._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.planner._types import IfbSchedulingMode
from stepplanner.sim.latency import EnginePace, LatencyModel
from stepplanner.sim.latency_models import (
    PACE_WINDOW,
    StepTimings,
    fit_step_latency,
    measured_pace,
    read_step_timings,
)
from stepplanner.sim.simulator import policy_from_dict, simulate
from stepplanner.sim.traces import read_trace

METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (50, 90)
LOADS = ("30", "60", "85")
POLICIES = (("fcfs", "FCFS"), ("pp", "PRIORITY+PAUSE"))
# One step priced by each run's calibrated model, to show how fast the machine was during that
# run: 8 decode rows at 250 positions of past each (tokens, context, rows, attention).
REFERENCE_STEP = (8, 8 * 251, 8, 8 * 251)
LABELS = {
    "own": "the run's own timings",
    "pace": f"the run's own timings, pace replayed in {PACE_WINDOW:g}-s windows",
    "other": "the other repeat's timings",
    "others": "every other run of the repeat, pooled",
}


def real_latencies(path: pathlib.Path, cls: str = "all") -> dict[str, np.ndarray]:
    """The real run's TTFT, TPOT and E2E of class ``cls`` (``all``, ``-1``, ...), counted as
    ``stepplanner fidelity`` counts them (failed requests left out)."""
    sample = real_samples(read_results(path))[cls]
    return {"ttft": sample.ttft, "tpot": sample.tpot, "e2e": sample.e2e}


def simulated(results: dict[str, Any], model: LatencyModel, pace: EnginePace | None = None) -> Any:
    run = results["stepplanner"]
    limits = StepPlannerLimits(**run["limits"])
    if run["options"] is None:  # transformers' own scheduler: FCFS at its step budget is closest
        options: Any = SchedulingOptions(
            ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=limits.max_step_tokens
        )
    else:
        options = policy_from_dict(run["options"])
    return simulate(read_trace(run["trace"]), limits, options, model, pace=pace)


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values[~np.isnan(values)], q))


def figures(lat: dict[str, np.ndarray]) -> dict[str, float]:
    return {f"{m} p{q}": percentile(lat[m], q) for m in METRICS for q in QUANTILES}


def calibrated(
    timings: pathlib.Path | list[pathlib.Path], terms: str | None = None
) -> LatencyModel:
    """The step model fitted to one timings file, or to several pooled."""
    files = timings if isinstance(timings, list) else [timings]
    read = [read_step_timings(path) for path in files]
    pooled = {}
    for field in dataclasses.fields(StepTimings):
        columns = [getattr(one, field.name) for one in read]
        pooled[field.name] = None if any(c is None for c in columns) else np.concatenate(columns)
    return fit_step_latency(StepTimings(**pooled), str(files[0]), terms).model


def timings_of(
    pricing: str, folder: pathlib.Path, key: str, load: str, rep: str, reps: list[str]
) -> pathlib.Path | list[pathlib.Path]:
    """The timings file a run is priced by: its own (``own``; ``pace``: its own, with its
    measured pace replayed), the other repeat's of the same trace and policy (``other``: minutes
    apart on the same machine), every other run of the same repeat pooled (``others``: other
    loads, the other policy, transformers' fifo), or a fixed file."""
    if pricing in ("own", "pace"):
        return folder / f"{key}-{load}-{rep}.csv"
    if pricing == "others":
        own = folder / f"{key}-{load}-{rep}.csv"
        return sorted(
            p for p in folder.glob(f"*-*-{rep}.csv") if p != own and not p.name.startswith("burst")
        )
    if pricing == "other":
        return folder / f"{key}-{load}-{reps[(reps.index(rep) + 1) % len(reps)]}.csv"
    return pathlib.Path(pricing)


Figures = dict[tuple[str, str, str, str], tuple[float, float]]  # (load, key, figure, rep)


def simulated_figures(
    folder: pathlib.Path,
    reps: list[str],
    terms: str | None,
    pricing: str,
    window: float = PACE_WINDOW,
) -> Figures:
    """(real, simulated) of every figure of every run, each run priced as ``pricing`` says
    (``window``: the pace's, for ``pace``)."""
    out: Figures = {}
    for load in LOADS:
        for key, _ in POLICIES:
            for rep in reps:
                path = folder / f"{key}-{load}-{rep}.json"
                results = json.loads(path.read_text())
                timings = timings_of(pricing, folder, key, load, rep, reps)
                model = calibrated(timings, terms)
                pace = (
                    measured_pace(read_step_timings(timings), model, window, str(timings))
                    if pricing == "pace" and isinstance(timings, pathlib.Path)
                    else None
                )
                real = figures(real_latencies(path))
                sim = figures(simulated(results, model, pace).latencies())
                for fig in real:
                    out[load, key, fig, rep] = (real[fig], sim[fig])
    return out


def errors_of(data: Figures, reps: list[str]) -> dict[str, np.ndarray]:
    return {
        rep: np.abs([sim / real - 1 for (*_, r), (real, sim) in data.items() if r == rep])
        for rep in reps
    }


def agreement_table(own: Figures, paced: Figures, reps: list[str]) -> None:
    """Every figure: real, simulated with the run's own model and its error, the error with the
    run's pace replayed, per repeat; then how far each later real repeat landed from the first."""
    print(
        "\n### Agreement: each run priced by its own timings (all terms); paced = its pace "
        "replayed too\n"
    )
    head = " | ".join(f"real {r} | sim {r} | error {r} | paced {r}" for r in reps)
    spread = "".join(f" real {r} vs {reps[0]} |" for r in reps[1:])
    print(f"| load | policy | figure | {head} |{spread}")
    print("| --- | --- | --- |" + " ---: |" * (5 * len(reps) - 1))
    for load in LOADS:
        for key, name in POLICIES:
            for fig in (f"{m} p{q}" for m in METRICS for q in QUANTILES):
                cells = []
                for rep in reps:
                    real, sim = own[load, key, fig, rep]
                    cells += [
                        f"{real * 1e3:,.1f}",
                        f"{sim * 1e3:,.1f}",
                        f"{sim / real - 1:+.1%}",
                        f"{paced[load, key, fig, rep][1] / real - 1:+.1%}",
                    ]
                first = own[load, key, fig, reps[0]][0]
                cells += [f"{own[load, key, fig, rep][0] / first - 1:+.1%}" for rep in reps[1:]]
                print(f"| {load}% | {name} | {fig} ms | " + " | ".join(cells) + " |")


def spreads(folder: pathlib.Path, reps: list[str]) -> np.ndarray:
    """|real r / real first - 1| of every figure of every later repeat: the machine's own noise."""
    out = []
    for load in LOADS:
        for key, _ in POLICIES:
            first = figures(real_latencies(folder / f"{key}-{load}-{reps[0]}.json"))
            for rep in reps[1:]:
                later = figures(real_latencies(folder / f"{key}-{load}-{rep}.json"))
                out += [later[f] / first[f] - 1 for f in first]
    return np.abs(out)


def summary(e: np.ndarray) -> str:
    return f"{np.median(e):.1%} / {e.max():.1%} / {int((e > 0.25).sum())} of {e.size}"


def policies(folder: pathlib.Path) -> None:
    print(
        "\n### Policies at 85% (real; simulated with the model calibrated on each run, and "
        "with its pace replayed too)\n"
    )
    print(
        "| scheduler | run | urgent TTFT p99 ms | sim | paced | all TPOT p99 ms | sim | paced | "
        "output tok/s | sim | reference step ms |"
    )
    print("| --- | --- |" + " ---: |" * 9)
    reps = sorted({p.stem.rsplit("-", 1)[1] for p in folder.glob("fifo-85-*.json")})
    for rep in reps:  # a and b, and any further repeat of the three at 85%
        for key, name in (("fifo", "transformers fifo"), *POLICIES):
            stem = folder / f"{key}-85-{rep}"
            results = json.loads(stem.with_suffix(".json").read_text())
            timings = stem.with_suffix(".csv")
            model = calibrated(timings)
            pace = measured_pace(read_step_timings(timings), model, PACE_WINDOW, str(timings))
            real = real_latencies(stem.with_suffix(".json"))
            real_urgent = real_latencies(stem.with_suffix(".json"), "-1")
            urgent = np.array(results["priorities"]) < 0
            result = simulated(results, model)
            sim, paced = result.latencies(), simulated(results, model, pace).latencies()
            tok_s = result.report()["throughput"]["output_tokens_per_s"]
            print(
                f"| {name} | {rep} | {percentile(real_urgent['ttft'], 99) * 1e3:,.0f} | "
                f"{percentile(sim['ttft'][urgent], 99) * 1e3:,.0f} | "
                f"{percentile(paced['ttft'][urgent], 99) * 1e3:,.0f} | "
                f"{percentile(real['tpot'], 99) * 1e3:,.1f} | "
                f"{percentile(sim['tpot'], 99) * 1e3:,.1f} | "
                f"{percentile(paced['tpot'], 99) * 1e3:,.1f} | "
                f"{results['output_throughput']:,.1f} | {tok_s:,.1f} | "
                f"{model.step_seconds(*REFERENCE_STEP) * 1e3:.1f} |"
            )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument(
        "--repeats",
        nargs="+",
        default=["a", "b"],
        help="The repeats' names in the file names (default: a b).",
    )
    parser.add_argument(
        "--calibrate-on",
        action="append",
        default=[],
        help="Also price every run by a model calibrated on this timings file "
        "(a --profile grid, a closed-loop burst).",
    )
    parser.add_argument(
        "--pace-windows",
        nargs="*",
        type=float,
        default=[],
        help=f"Also replay each run's pace in windows of these seconds (the "
        f"table uses {PACE_WINDOW} s).",
    )
    args = parser.parse_args(argv)
    reps = args.repeats
    rows = []
    shown = {}
    for pricing in [
        "own",
        "pace",
        *(["other"] if len(reps) > 1 else []),
        "others",
        *args.calibrate_on,
    ]:
        for terms in (None, "abc"):
            data = simulated_figures(args.folder, reps, terms, pricing)
            if terms is None and pricing in ("own", "pace"):
                shown[pricing] = data
                if len(shown) == 2:
                    agreement_table(shown["own"], shown["pace"], reps)
            errors = errors_of(data, reps)
            name = LABELS.get(pricing, pathlib.Path(pricing).name)
            rows.append(
                f"| {name} | {terms or 'all'} | "
                + " | ".join(summary(errors[r]) for r in reps)
                + " |"
            )
    for window in args.pace_windows:
        errors = errors_of(simulated_figures(args.folder, reps, None, "pace", window), reps)
        rows.append(
            f"| the run's own timings, pace replayed in {window:g}-s windows | all | "
            + " | ".join(summary(errors[r]) for r in reps)
            + " |"
        )
    print("\n### Summary: median / worst |error| / figures over 25%\n")
    print("| model calibrated on | terms | " + " | ".join(f"run {r}" for r in reps) + " |")
    print("| --- | --- |" + " --- |" * len(reps))
    print("\n".join(rows))
    if len(reps) > 1:
        print(
            f"\nreal vs real ({', '.join(reps[1:])} against {reps[0]}): "
            f"{summary(spreads(args.folder, reps))}"
        )
    policies(args.folder)


if __name__ == "__main__":
    main(sys.argv[1:])
