"""Serve docs/simulator.md's fidelity matrix for real on this machine, then print its tables.

    python tools/fidelity_matrix.py OUT [--repeats a b] [--capacity R]

Every real run is the shipped command ``stepplanner serve-trace`` (the ``transformers`` extra),
so each can be rerun by hand from the command line this prints before it. In order:

1. two closed-loop bursts (``docs/fidelity/burst.csv``: 150 requests at t=0): the engine's
   capacity on this machine is their mean completed requests per second (``--capacity`` skips
   them and takes the figure given);
2. ``docs/fidelity/trace-{30,60,85}.csv`` with their time axes scaled so that each arrives at
   30/60/85% of that capacity (the same requests in the same order: only the gaps between
   arrivals change), written to OUT;
3. the ``--profile`` grid;
4. per repeat: each scaled trace under stepplanner FCFS and PRIORITY+PAUSE, and the 85% trace
   under transformers' own ``fifo``;
5. ``tools/fidelity_tables.py OUT``'s tables, printed and written to OUT/tables.md.

Loads are relative to the machine at hand, so a faster or slower machine runs the same
experiment. Nothing else should run on the machine meanwhile: the engine's step times are the
measurement. About 10 minutes on 2 cores for two repeats (each run takes its trace's span plus
the queue's drain, and ~7 s to build and warm the model).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
TRACES = HERE.parent / "docs" / "fidelity"
LOADS = (30, 60, 85)
ENGINE = ["--mode", "mixed", "--max-num-tokens", "256"]
PRIORITY_PAUSE = [
    "--policy",
    "priority",
    "--preemption",
    "pause",
    "--max-pause-steps",
    "8",
    "--priority-reserved-slots",
    "1",
]


def serve(out: pathlib.Path, *args: str) -> None:
    command = [sys.executable, "-m", "stepplanner", "serve-trace", *args]
    shown = " ".join(shlex.quote(a) for a in ["stepplanner", *command[3:]])
    started, load = time.perf_counter(), os.getloadavg()[0]
    print(f"+ {shown}", flush=True)
    done = subprocess.run(command, cwd=out, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{shown}: exit {done.returncode}\n{done.stderr[-3000:]}")
    print(
        f"  {time.perf_counter() - started:.0f} s, load average {load:.2f} -> "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )


def capacity(out: pathlib.Path) -> float:
    rates = []
    for rep in "ab":
        serve(
            out,
            str(TRACES / "burst.csv"),
            *ENGINE,
            "--results",
            f"burst-{rep}.json",
            "--timings",
            f"burst-{rep}.csv",
        )
        run = json.loads((out / f"burst-{rep}.json").read_text())
        rates.append(run["completed"] / run["duration"])
    print(
        f"capacity: bursts at {' and '.join(f'{r:.2f}' for r in rates)} requests/s -> "
        f"{sum(rates) / len(rates):.2f}"
    )
    return sum(rates) / len(rates)


def scaled_trace(load: int, requests_per_s: float, out: pathlib.Path) -> pathlib.Path:
    """docs' trace-LOAD.csv with its arrivals scaled to arrive at LOAD% of ``requests_per_s``."""
    path = out / f"trace-{load}.csv"
    rows, factor = scaled_rows(TRACES / f"trace-{load}.csv", load / 100 * requests_per_s)
    write_rows(path, rows)
    print(
        f"{path.name}: {len(rows)} requests at {load / 100 * requests_per_s:.2f} requests/s "
        f"(time axis x {factor:.3f})"
    )
    return path


def scaled_rows(source: pathlib.Path, requests_per_s: float) -> tuple[list[dict[str, str]], float]:
    """A trace's rows with their time axis scaled (about the first arrival) so that they arrive
    at ``requests_per_s``: the same requests in the same order, only the gaps change; and the
    factor."""
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    arrivals = [float(r["arrival_time"]) for r in rows]
    factor = (len(rows) - 1) / (arrivals[-1] - arrivals[0]) / requests_per_s
    scaled = [
        {**row, "arrival_time": f"{(at - arrivals[0]) * factor:.6f}"}
        for row, at in zip(rows, arrivals)
    ]
    return scaled, factor


def write_rows(path: pathlib.Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument(
        "--repeats",
        nargs="+",
        default=["a", "b"],
        help="Names of the repeats (each serves the whole matrix once).",
    )
    parser.add_argument(
        "--capacity", type=float, help="Requests/s to take as capacity instead of measuring bursts."
    )
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    rate = args.capacity if args.capacity else capacity(out)
    traces = {load: scaled_trace(load, rate, out) for load in LOADS}
    serve(out, "--profile", *ENGINE, "--timings", "profile.csv")
    for rep in args.repeats:
        for load in LOADS:
            serve(
                out,
                str(traces[load]),
                *ENGINE,
                "--results",
                f"fcfs-{load}-{rep}.json",
                "--timings",
                f"fcfs-{load}-{rep}.csv",
            )
            serve(
                out,
                str(traces[load]),
                *ENGINE,
                *PRIORITY_PAUSE,
                "--results",
                f"pp-{load}-{rep}.json",
                "--timings",
                f"pp-{load}-{rep}.csv",
            )
        serve(
            out,
            str(traces[85]),
            "--scheduler",
            "fifo",
            "--results",
            f"fifo-85-{rep}.json",
            "--timings",
            f"fifo-85-{rep}.csv",
        )
    print(f"served in {(time.perf_counter() - began) / 60:.1f} minutes", flush=True)
    sys.path.insert(0, str(HERE))
    import fidelity_tables

    table_args = [
        str(out),
        "--repeats",
        *args.repeats,
        "--calibrate-on",
        str(out / "profile.csv"),
        "--pace-windows",
        "0.25",
        "1",
        "2",
    ]
    if args.capacity is None:
        table_args += ["--calibrate-on", str(out / "burst-a.csv")]
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        fidelity_tables.main(table_args)
    (out / "tables.md").write_text(text.getvalue())
    print(text.getvalue())


if __name__ == "__main__":
    main(sys.argv[1:])
