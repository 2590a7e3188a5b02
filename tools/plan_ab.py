"""plan() of two builds side by side: interleaved rounds of CPU time, and callgrind's count of
instructions per call, which the machine's noise does not move.

Each build is a source tree with its extensions built in place (``python setup.py build_ext
--inplace`` in a checkout of that commit); every round runs each in a fresh process, A then B,
so a drift of the machine's speed falls on both. It prints each round's medians and the ratio
B/A per round, then their medians; with ``--callgrind`` (valgrind on PATH) also instructions
per ``plan()`` call, read from the inclusive cost of ``StepPlanner.plan``.

    python tools/plan_ab.py --a ../old/src --b src --rounds 8
    python tools/plan_ab.py --a ../old/src --b src --rounds 0 --callgrind
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

# Run in the child: the benchmark's steady ledger, one scenario, 15 samples of CALLS plans.
CHILD = """
import sys, time, statistics
from stepplanner import _core
from stepplanner.bench import planner as bench
from stepplanner.testing import as_resident_array
scenario, b, calls, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
planner = bench.make_planner(_core, scenario, b)
rows = as_resident_array(bench.steady_ledger(b))
planner.plan(rows)
times = []
for _ in range(samples):
    t0 = time.thread_time_ns()
    for _ in range(calls):
        planner.plan(rows)
    times.append((time.thread_time_ns() - t0) / max(calls, 1))
print(statistics.median(times) if times else 0)
"""


def run(tree: str, args: argparse.Namespace, prefix: list[str], calls: int, samples: int) -> str:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [*prefix, sys.executable, "-c", CHILD, args.scenario, str(args.batch), str(calls)]
    out = subprocess.run([*cmd, str(samples)], env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def instructions(tree: str, args: argparse.Namespace) -> float:
    """Instructions per plan() call: callgrind's inclusive count of StepPlanner.plan."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        run(tree, args, ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"], 2000, 1)
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", out],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    for line in report.splitlines():
        if "StepPlanner_9plan [" in line:  # the Python-visible wrapper: the whole call
            return int(re.match(r"\s*([\d,]+)", line).group(1).replace(",", "")) / 2001
    raise SystemExit(f"plan_ab: no StepPlanner.plan in callgrind's report for {tree}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="source tree of build A (its src/)")
    parser.add_argument("--b", required=True, help="source tree of build B")
    parser.add_argument("--scenario", default="priority_pause")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    ratios, a_ns, b_ns = [], [], []
    for k in range(args.rounds):
        a = float(run(args.a, args, [], 2000, 15))
        b = float(run(args.b, args, [], 2000, 15))
        a_ns.append(a)
        b_ns.append(b)
        ratios.append(b / a)
        print(f"round {k + 1}: A {a:,.0f} ns  B {b:,.0f} ns  B/A {b / a:.3f}", flush=True)
    if ratios:
        med = statistics.median
        print(
            f"medians: A {med(a_ns):,.0f} ns  B {med(b_ns):,.0f} ns  "
            f"B/A per round {min(ratios):.3f}-{max(ratios):.3f}, median {med(ratios):.3f}"
        )
    if args.callgrind:
        ia, ib = instructions(args.a, args), instructions(args.b, args)
        print(f"instructions per plan(): A {ia:,.0f}  B {ib:,.0f}  B/A {ib / ia:.4f}")


if __name__ == "__main__":
    main()
