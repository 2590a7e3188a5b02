"""The overload measurements of docs/scheduling.md ("Overload"), reproduced with the shipped CLI.

    python tools/overload_experiments.py OUT [--loads 0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2]
                                             [--requests 1500] [--open-ended-requests 6000]

A small engine (B = 8, ``max_step_tokens`` 256, P = 16, a step of t tokens 8 ms + 25 µs x t),
the embedded workload's three classes with the urgent one tightened to 200 ms / 50 ms, each
command printed before it runs:

1. ``stepplanner compare --load LOADS`` (FCFS, PRIORITY+PAUSE, EDF+PAUSE, DEADLINE+PAUSE), with
   the relegation defaults, and again with the behaviour before them (nothing protected, no
   relegated request handed back: ``--never-relegate-below -2147483648 --relegated-wait 1e9``);
2. an open-ended overload: ``stepplanner simulate`` at 1.5x the saturation throughput the first
   compare measured, ``--max-waiting 128``, under DEADLINE+PAUSE (defaults, and handing
   relegated requests back at once) and PRIORITY+PAUSE. (The behaviour before cannot be run
   here: a relegated request now always gives its queue place up to a viable one.)

Then the tables: per load and policy, attainment of every arrival, the urgent class's TTFT p50
and p99, and the requests handed back; the issue-32 targets with what was reached; the
open-ended runs' queue: 429s (and those given while a relegated request held a place), handed
back, the longest wait of a request relegated in the queue, the longest wait of any.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from slo_experiments import run  # noqa: E402  (a sibling script: one CLI runner for both)

ENGINE = (
    "--max-batch-size", "8", "--max-step-tokens", "256", "--kv-page-size", "16",
    "--latency", "a=0.008,b=0.000025",
    "--slo-class=-1=ttft:200ms,tpot:50ms",
    "--slo-class=0=ttft:250ms,tpot:100ms",
    "--slo-class=1=ttft:2s,tpot:250ms",
)  # fmt: skip
BEFORE = ("--never-relegate-below=-2147483648", "--relegated-wait", "1e9")
POLICIES = ("fcfs", "priority+pause", "edf+pause", "deadline+pause")
PAUSE = ("--preemption", "pause", "--max-pause-steps", "64")


def by_load(data: dict) -> dict[float, dict[str, dict]]:
    return {d["load"]: {r["name"]: r for r in d["reports"]} for d in data["loads"]}


def cell(r: dict) -> str:
    classes = r["slo_attainment"]["classes"]
    ttft = r["latency_s"]["-1"]["ttft"]
    shed = r.get("queue", {}).get("shed", 0)
    return (
        f"{classes['all']['attainment']:.1%}; urgent TTFT {ttft['p50'] * 1e3:.0f} / "
        f"{ttft['p99'] * 1e3:.0f} ms" + (f"; {shed} handed back" if shed else "")
    )


def table(title: str, loads: dict[float, dict[str, dict]]) -> str:
    lines = [f"#### {title}", "", "| load | " + " | ".join(POLICIES) + " |", "|---" * 5 + "|"]
    for load, runs in loads.items():
        lines.append(f"| {load:g}x | " + " | ".join(cell(runs[p]) for p in POLICIES) + " |")
    return "\n".join(lines)


def targets(loads: dict[float, dict[str, dict]]) -> str:
    rows = ["| load | urgent p99 vs P+P (≤ 2×) | urgent p50 (≤ 1.5×) | vs FCFS | vs P+P |"]
    rows.append("|---|---|---|---|---|")
    for load, runs in loads.items():
        d, p = runs["deadline+pause"], runs["priority+pause"]
        dt, pt = d["latency_s"]["-1"]["ttft"], p["latency_s"]["-1"]["ttft"]
        att = {k: v["slo_attainment"]["classes"]["all"]["attainment"] for k, v in runs.items()}
        rows.append(
            f"| {load:g}x | {dt['p99'] / pt['p99']:.2f}× | {dt['p50'] / pt['p50']:.2f}× | "
            f"{att['deadline+pause'] / max(att['fcfs'], 1e-9):.2f}× | "
            f"{att['deadline+pause'] / max(att['priority+pause'], 1e-9):.2f}× |"
        )
    return "\n".join(rows)


def queue_row(name: str, r: dict) -> str:
    q, done = r["queue"], r["requests"]
    wait = q["longest_relegated_wait_s"]
    return (
        f"| {name} | {r['throughput']['simulated_seconds'] / 60:.0f} min | "
        f"{r['slo_attainment']['classes']['all']['attainment']:.1%} | {q['queue_full']:,} | "
        f"{q['queue_full_beside_relegated']:,} | {q['shed']:,} | "
        f"{'-' if wait is None else f'{wait:.2f} s'} | {q['longest_wait_s']:.2f} s | "
        f"{done['completed']:,} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--loads", default="0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--open-ended-requests", type=int, default=6000)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    common = (*ENGINE, "--requests", str(args.requests), "--load", args.loads)
    now = by_load(run(args.out, "small", *common))
    before = by_load(run(args.out, "small-before", *common, *BEFORE))
    saturation = json.loads((args.out / "small.json").read_text())["saturation_rps"]
    rate = f"{1.5 * saturation:.4f}"
    stream = (
        *ENGINE,
        "--requests",
        str(args.open_ended_requests),
        "--rate",
        rate,
        "--max-waiting",
        "128",
        *PAUSE,
    )
    open_ended = {
        "deadline+pause": run(args.out, "open-deadline", *stream, "--policy", "deadline",
                              command="simulate"),
        "deadline+pause, handed back at once": run(
            args.out, "open-deadline-shed", *stream, "--policy", "deadline",
            "--relegated-wait", "0", command="simulate",
        ),
        "priority+pause": run(args.out, "open-priority", *stream, "--policy", "priority",
                              command="simulate"),
    }  # fmt: skip
    print()
    print(f"saturation {saturation:.3f} req/s\n")
    print(table("relegation defaults", now), "\n")
    print(table("before: nothing protected, nothing handed back", before), "\n")
    print(targets(now), "\n")
    print(f"open-ended: {args.open_ended_requests:,} requests at {rate} req/s (1.5x)\n")
    print(
        "| run | span | attainment | 429s | 429s beside a relegated | handed back | "
        "longest relegated wait | longest wait | completed |"
    )
    print("|---" * 9 + "|")
    for name, report in open_ended.items():
        print(queue_row(name, report))


if __name__ == "__main__":
    main()
