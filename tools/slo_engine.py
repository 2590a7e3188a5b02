"""The deadline policy in a running engine: transformers' continuous batching, judged by its
own clock, with the simulator's prediction for each run beside it (docs/scheduling.md).

    python tools/slo_engine.py OUT [--loads 70 100 120] [--capacity R] [--repeats a]

Every real run is the shipped command ``stepplanner serve-trace`` (the ``transformers`` extra),
printed before it runs. In order:

1. a closed-loop burst (``docs/fidelity/burst.csv``, 150 requests at t=0, FCFS): the engine's
   capacity on this machine is its completed requests per second, and its median step the
   unit of the objectives (``--capacity R --step S`` skip it);
2. the three objective classes, the embedded workload's defaults (docs/simulator.md) scaled
   from the simulator's full-batch step to this engine's: urgent (priority -1) first token in
   18.5 steps and a token every 3.7, interactive (0) 18.5 and 7.4, batch (1) 148 and 18.5;
3. ``docs/fidelity/trace-85.csv`` (150 requests, the three classes) rescaled to arrive at each
   load's share of the capacity (only the gaps change);
4. per repeat and load, back to back: FCFS, PRIORITY+PAUSE and DEADLINE+PAUSE, each with the
   objectives (``--slo-class``), writing results and step timings;
5. per run: attainment (every token by its deadline) and vLLM's goodput from the run's own
   token timestamps (``ttfts``, ``itls`` of its results file), and the simulator's prediction:
   ``stepplanner calibrate`` on the run's own timings, then ``stepplanner simulate`` of the
   same trace, engine and policy on that model; beside attainment, the urgent class's TTFT
   p50/p99 (its served requests, from the results file's own ``ttfts``) and how many requests
   the engine answered unserved (a request DEADLINE relegated and handed back, or any other
   failure: its ``errors`` entry).

Nothing else should run on the machine meanwhile: the engine's step times are the measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fidelity_matrix import scaled_rows, write_rows  # noqa: E402  (a sibling script)

TRACES = HERE.parent / "docs" / "fidelity"
ENGINE = ["--mode", "mixed", "--max-num-tokens", "256"]
SIM_ENGINE = [
    "-B",
    "8",
    "--kv-page-size",
    "16",
    "--max-step-tokens",
    "256",
    "--max-input-length",
    "512",
    *ENGINE,
]
POLICIES = {
    "fcfs": [],
    "priority+pause": ["--policy", "priority", "--preemption", "pause", "--max-pause-steps", "8"],
    "deadline+pause": ["--policy", "deadline", "--preemption", "pause", "--max-pause-steps", "8"],
}
# The default classes in steps of the simulator's full-batch step (13.5 ms): 250/50, 250/100,
# 2000/250 ms.
CLASS_STEPS = {-1: (18.5, 3.7), 0: (18.5, 7.4), 1: (148.0, 18.5)}


def stepplanner(out: pathlib.Path, *args: str, capture: bool = False) -> str:
    command = [sys.executable, "-m", "stepplanner", *args]
    shown = " ".join(shlex.quote(a) for a in ["stepplanner", *args])
    started, load = time.perf_counter(), os.getloadavg()[0]
    print(f"+ {shown}", flush=True)
    done = subprocess.run(command, cwd=out, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{shown}: exit {done.returncode}\n{done.stderr[-3000:]}")
    if not capture:
        print(
            f"  {time.perf_counter() - started:.0f} s, load average {load:.2f} -> "
            f"{os.getloadavg()[0]:.2f}",
            flush=True,
        )
    return done.stdout


def burst(out: pathlib.Path) -> tuple[float, float]:
    """(completed requests/s, median step seconds) of a closed-loop burst under FCFS."""
    stepplanner(
        out,
        "serve-trace",
        str(TRACES / "burst.csv"),
        *ENGINE,
        "--results",
        "burst.json",
        "--timings",
        "burst.csv",
    )
    run = json.loads((out / "burst.json").read_text())
    with open(out / "burst.csv", newline="") as f:
        step = statistics.median(float(r["seconds"]) for r in csv.DictReader(f))
    rate = run["completed"] / run["duration"]
    print(f"capacity {rate:.2f} requests/s, median step {step * 1e3:.1f} ms", flush=True)
    return rate, step


def scaled_trace(
    load: int, requests_per_s: float, out: pathlib.Path, step: float, flat: bool = False
) -> pathlib.Path:
    """The trace at ``load``% of the capacity (fidelity_matrix's scaling); ``flat``: every
    priority 0, each request carrying its class's objectives as its own columns (so
    PRIORITY+PAUSE is FCFS)."""
    rows, _ = scaled_rows(TRACES / "trace-85.csv", load / 100 * requests_per_s)
    if flat:
        for row in rows:
            ttft, tpot = CLASS_STEPS[int(row["priority"])]
            row |= {
                "priority": "0",
                "ttft_slo_ms": f"{ttft * step * 1e3:.1f}",
                "tpot_slo_ms": f"{tpot * step * 1e3:.1f}",
            }
    path = out / f"slo-trace-{load}{'-flat' if flat else ''}.csv"
    write_rows(path, rows)
    return path


def slo_args(step: float) -> list[str]:
    out = []
    for prio, (ttft, tpot) in CLASS_STEPS.items():
        out += [
            "--slo-class",
            f"{prio}=ttft:{ttft * step * 1e3:.1f}ms,tpot:{tpot * step * 1e3:.1f}ms",
        ]
    return out


def measured(results: pathlib.Path) -> dict[str, float]:
    """Attainment and vLLM goodput from a served run's own timestamps, over every request."""
    from stepplanner.sim.goodput import attained_from_gaps, good_by_vllm

    data = json.loads(results.read_text())
    n = len(data["ttfts"])
    ok = np.array([not e for e in data["errors"]])
    ttft = np.array([t if o else np.nan for t, o in zip(data["ttfts"], ok)], dtype=np.float64)
    itls = [np.asarray(g, dtype=np.float64) for g in data["itls"]]
    ttft_slo = np.array([np.nan if v is None else v for v in data["ttft_slos"]], dtype=np.float64)
    tpot_slo = np.array([np.nan if v is None else v for v in data["tpot_slos"]], dtype=np.float64)
    attained = attained_from_gaps(ttft, itls, ttft_slo, tpot_slo) & ok
    lens = np.asarray(data["output_lens"], dtype=np.float64)
    decode = np.array([g.sum() for g in itls])
    good = ok & good_by_vllm(ttft, decode, lens, ttft_slo, tpot_slo)
    prios = np.asarray(data["priorities"])
    gaps = np.concatenate([g for g in itls if g.size] or [np.zeros(1)])
    urgent_ttft = ttft[(prios == -1) & ok] if np.any(prios == -1) else ttft[ok]
    urgent_ttft = urgent_ttft[np.isfinite(urgent_ttft)]
    return {
        "attainment": float(attained.mean()),
        "urgent": float((attained[prios == -1] if np.any(prios == -1) else attained).mean()),
        "vllm": float(good.mean()),
        "goodput_rps": float(attained.sum() / data["duration"]),
        "p99_itl_ms": float(np.percentile(gaps, 99) * 1e3),
        "urgent_ttft_p50_ms": _percentile_ms(urgent_ttft, 50),
        "urgent_ttft_p99_ms": _percentile_ms(urgent_ttft, 99),
        "unserved": int((~ok).sum()),
        "requests": n,
    }


def _percentile_ms(seconds: np.ndarray, q: float) -> float:
    return float(np.percentile(seconds, q) * 1e3) if seconds.size else float("nan")


def predicted(
    out: pathlib.Path, name: str, trace: pathlib.Path, policy: list[str], slos: list[str]
) -> dict[str, float]:
    """The simulator's figures for the same run, priced by the run's own step timings."""
    stepplanner(out, "calibrate", f"{name}.csv", "--out", f"{name}-model.json", capture=True)
    text = stepplanner(
        out,
        "simulate",
        "--trace",
        str(trace),
        *SIM_ENGINE,
        *policy,
        *slos,
        "--latency-model",
        f"{name}-model.json",
        "--format",
        "json",
        "--no-progress",
        capture=True,
    )
    report = json.loads(text)
    classes = report["slo_attainment"]["classes"]
    return {
        "attainment": classes["all"]["attainment"],
        "urgent": classes.get("-1", classes["all"])["attainment"],
        "vllm": classes["all"]["vllm_attainment"],
        "goodput_rps": classes["all"]["goodput_rps"],
        "relegated": classes["all"]["relegated"],
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--loads", type=int, nargs="+", default=[70, 100, 120])
    parser.add_argument("--repeats", nargs="+", default=["a"])
    parser.add_argument("--capacity", type=float)
    parser.add_argument(
        "--flat", action="store_true", help="every priority 0, objectives per request"
    )
    parser.add_argument("--step", type=float, help="median step seconds (with --capacity)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    rate, step = (args.capacity, args.step) if args.capacity and args.step else burst(out)
    slos = slo_args(step)
    print("objectives: " + " ".join(slos), flush=True)
    rows = []
    for rep in args.repeats:
        for load in args.loads:
            trace = scaled_trace(load, rate, out, step, args.flat)
            for policy, flags in POLICIES.items():
                if args.flat and policy == "priority+pause":
                    continue  # every priority 0: it is FCFS
                name = f"{policy.replace('+', '-')}-{load}{'-flat' if args.flat else ''}-{rep}"
                objectives = [] if args.flat else slos
                stepplanner(
                    out,
                    "serve-trace",
                    str(trace),
                    *ENGINE,
                    *flags,
                    *objectives,
                    "--results",
                    f"{name}.json",
                    "--timings",
                    f"{name}.csv",
                )
                rows.append(
                    (
                        rep,
                        load,
                        policy,
                        measured(out / f"{name}.json"),
                        predicted(out, name, trace, flags, objectives),
                    )
                )
    lines = [
        f"capacity {rate:.2f} req/s, step {step * 1e3:.1f} ms; objectives " + " ".join(slos),
        "",
        "| repeat | load | policy | attained (real / sim) | urgent (real / sim) | "
        "vLLM good (real / sim) | goodput req/s (real / sim) | ITL p99 ms (real) | "
        "urgent TTFT p50 / p99 ms (real) | unserved (real) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rep, load, policy, real, sim in rows:
        lines.append(
            f"| {rep} | {load}% | {policy} | {100 * real['attainment']:.1f}% / "
            f"{100 * sim['attainment']:.1f}% | {100 * real['urgent']:.1f}% / "
            f"{100 * sim['urgent']:.1f}% | {100 * real['vllm']:.1f}% / "
            f"{100 * sim['vllm']:.1f}% | {real['goodput_rps']:.2f} / "
            f"{sim['goodput_rps']:.2f} | {real['p99_itl_ms']:.0f} | "
            f"{real['urgent_ttft_p50_ms']:,.0f} / {real['urgent_ttft_p99_ms']:,.0f} | "
            f"{real['unserved']} |"
        )
    lines.append("")
    lines.append(f"served in {(time.perf_counter() - began) / 60:.1f} minutes")
    text = "\n".join(lines)
    print(text)
    with open(out / "slo-tables.md", "a") as f:
        f.write(text + "\n\n")


if __name__ == "__main__":
    main(sys.argv[1:])
