"""The simulator's deadline tables of docs/scheduling.md, reproduced with the shipped CLI.

    python tools/slo_experiments.py OUT [--loads 0.6,0.8,1.0,1.1,1.2,1.3] [--burstiness 1 0.5]
                                        [--requests 6000]

For each burstiness (1: Poisson; 0.5: bursty, vLLM's ``--burstiness``) it runs, each command
printed before it runs:

1. **aligned**: the embedded workload with its three default SLO classes, the priorities
   aligned with them (urgent -1, interactive 0, batch 1):
   ``stepplanner compare --burstiness B --load LOADS --format json``;
2. **flat**: the same requests carrying the same objectives as their own (trace columns
   ``ttft_slo_ms``/``tpot_slo_ms``) but every priority 0, so that PRIORITY+PAUSE is FCFS:
   the trace is written to OUT, then ``stepplanner compare --trace OUT/flat-B.csv --load ...``.

``compare`` runs its four baselines (FCFS, PRIORITY+PAUSE, EDF+PAUSE, DEADLINE+PAUSE) at every
load, relative to the engine's saturation throughput. Then the tables: attainment of all
arrivals per policy and load, the urgent class's, P99 inter-token latency, and each issue-28
target with what was reached. About a minute per compare on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import subprocess
import sys
import time

import numpy as np

from stepplanner.sim.workloads import DEFAULT_SLO_CLASSES, Workload, synthetic

POLICIES = ("fcfs", "priority+pause", "edf+pause", "deadline+pause")


def run(out: pathlib.Path, name: str, *args: str, command: str = "compare") -> dict:
    """``stepplanner COMMAND ARGS --format json``, printed before it runs; its report is kept
    as ``OUT/NAME.json`` and returned (tools/overload_experiments.py runs its commands so too)."""
    command_line = ["stepplanner", command, *args, "--format", "json", "--no-progress"]
    print("+ " + " ".join(shlex.quote(a) for a in command_line), flush=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "stepplanner", *command_line[1:]], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    (out / f"{name}.json").write_text(done.stdout)
    print(f"  {time.perf_counter() - started:.0f} s", flush=True)
    return json.loads(done.stdout)


def flat_trace(path: pathlib.Path, requests: int, burstiness: float) -> None:
    """The embedded workload's requests with their classes' objectives as their own, priority 0."""
    w = synthetic(requests, burstiness=burstiness).with_objectives(DEFAULT_SLO_CLASSES)
    ttft, tpot = w.objectives()
    Workload(
        w.arrival_time,
        w.prompt_tokens,
        w.output_tokens,
        np.zeros(len(w), dtype=np.int32),
        source=f"flat({w.source})",
        ttft_slo=ttft,
        tpot_slo=tpot,
    ).to_csv(path)


def cell(report: dict, klass: str = "all") -> float:
    return float(report["slo_attainment"]["classes"][klass]["attainment"])


def tables(name: str, data: dict) -> list[str]:
    loads = data["loads"]
    names = [r["name"] for r in loads[0]["reports"]]
    lines = [
        f"### {name}: saturation {data['saturation_rps']:.2f} req/s",
        "",
        "| load | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for entry in loads:
        cells = []
        for r in entry["reports"]:
            classes = r["slo_attainment"]["classes"]
            urgent = f" (urgent {100 * cell(r, '-1'):.1f}%)" if "-1" in classes else ""
            itl = classes["all"]["p99_itl_ms"]
            cells.append(f"{100 * cell(r):.1f}%{urgent}, ITL p99 {itl:.0f} ms")
        lines.append(f"| {entry['load']:g}x | " + " | ".join(cells) + " |")
    return lines


def by_policy(entry: dict) -> dict[str, dict]:
    return {r["name"]: r for r in entry["reports"]}


def targets(flat: dict, aligned: dict, burstiness: float) -> list[str]:
    out = [f"#### targets, burstiness {burstiness:g}"]
    for entry in flat["loads"]:
        if entry["load"] in (1.1, 1.2):
            p = by_policy(entry)
            ratio = cell(p["deadline+pause"]) / max(cell(p["fcfs"]), 1e-9)
            out.append(
                f"- flat {entry['load']:g}x: DEADLINE/FCFS attainment {ratio:.2f}x "
                f"(target >= 1.5): {100 * cell(p['deadline+pause']):.1f}% vs "
                f"{100 * cell(p['fcfs']):.1f}%"
            )
    worst = min(
        (
            cell(by_policy(e)["deadline+pause"]) / max(cell(by_policy(e)["priority+pause"]), 1e-9),
            e["load"],
        )
        for e in aligned["loads"]
    )
    out.append(
        f"- aligned: DEADLINE/PRIORITY+PAUSE at its lowest {worst[0]:.3f}x at "
        f"{worst[1]:g}x (target >= 0.98 at every load)"
    )
    for entry in aligned["loads"]:
        p = by_policy(entry)
        d, fcfs, edf = (cell(p[k]) for k in ("deadline+pause", "fcfs", "edf+pause"))
        note = []
        if entry["load"] == 1.2:
            note.append(f"DEADLINE/FCFS {d / max(fcfs, 1e-9):.2f}x (target >= 1.5)")
        if edf < 0.9:
            note.append(
                f"EDF collapses ({100 * edf:.1f}%): DEADLINE/EDF {d / max(edf, 1e-9):.2f}x "
                "(target >= 1.1)"
            )
        if entry["load"] <= 1.2:
            note.append(f"urgent {100 * cell(p['deadline+pause'], '-1'):.1f}% (target >= 99%)")
        out.append(f"- aligned {entry['load']:g}x: " + "; ".join(note))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--loads", default="0.6,0.8,1.0,1.1,1.2,1.3")
    parser.add_argument("--burstiness", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--requests", type=int, default=6000)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: list[str] = []
    for b in args.burstiness:
        aligned = run(
            args.out,
            f"aligned-{b:g}",
            "--requests",
            str(args.requests),
            "--burstiness",
            f"{b:g}",
            "--load",
            args.loads,
        )
        trace = args.out / f"flat-{b:g}.csv"
        flat_trace(trace, args.requests, b)
        flat = run(args.out, f"flat-{b:g}", "--trace", str(trace), "--load", args.loads)
        report += tables(f"aligned, burstiness {b:g}", aligned) + [""]
        report += tables(f"flat (every priority 0), burstiness {b:g}", flat) + [""]
        report += targets(flat, aligned, b) + [""]
    text = "\n".join(report)
    print(text)
    (args.out / "tables.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
