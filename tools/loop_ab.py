"""Interleaved A/B timing of the host step at one B (issue 41, item 7; docs/performance.md).

    python tools/loop_ab.py --rounds 6 A_PYTHON B_PYTHON   # each a venv python of a built tree
    python tools/loop_ab.py --callgrind A_PYTHON B_PYTHON  # instructions per step instead

Each round runs one fresh process per build, in turn (A B A B ...); each process times batches
of ``ledger.step`` and of ``plan()`` alone (``stepplanner.bench.loop``), taking turns, and prints
their medians. Only ratios within a round count on a shared machine.

``--callgrind`` counts instructions instead (valgrind's callgrind; a machine's load does not
change them): each build runs ``--callgrind-calls`` and 6 x that many fused steps, and the
difference of ``Ledger.step``'s inclusive count (and of the kernel's, ``plan_step``) over the
extra steps is its instructions per step. A PYTHON may be a wrapper script that execs a python.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, statistics, sys
from stepplanner.bench import loop
b, calls, batches = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
fused = loop.fused_batch(b, calls=calls)
plan = loop.plan_alone_batch(b, calls=calls)
f, p = [], []
for _ in range(batches):
    f.append(fused())
    p.append(plan())
print(json.dumps({"fused": statistics.median(f), "plan": statistics.median(p)}))
"""


CALLGRIND_CHILD = r"""
import sys
from stepplanner.bench import loop
loop.fused_batch(int(sys.argv[1]), calls=int(sys.argv[2]))()
"""

# callgrind_annotate's inclusive line of a function: "   49,766,875 (4.50%)  file:name [object]"
STEP = re.compile(r"^\s*([\d,]+) .*_ledger_6Ledger_\d+step \[")
KERNEL = re.compile(r"^\s*([\d,]+) .*_core_plan_step \[")


def callgrind_counts(python: str, batch: int, calls: int) -> tuple[int, int]:
    """(Ledger.step, plan_step) inclusive instructions over a run of ``calls`` fused steps."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.%p")
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}",
             python, "-c", CALLGRIND_CHILD, str(batch), str(calls)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        step = kernel = 0
        for name in os.listdir(tmp):
            text = subprocess.run(
                ["callgrind_annotate", "--inclusive=yes", os.path.join(tmp, name)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            for line in text.splitlines():
                if m := STEP.match(line):
                    step = max(step, int(m.group(1).replace(",", "")))
                elif m := KERNEL.match(line):
                    kernel = max(kernel, int(m.group(1).replace(",", "")))
        if not step:
            raise SystemExit(f"{python}: no Ledger.step in callgrind's output")
        return step, kernel


def callgrind_main(pythons: list[str], batch: int, calls: int) -> None:
    extra = 5 * calls
    for py in pythons:
        (s0, k0), (s1, k1) = (callgrind_counts(py, batch, n) for n in (calls, calls + extra))
        step, kernel = (s1 - s0) / extra, (k1 - k0) / extra
        print(f"{py}: Ledger.step {step:,.0f} instructions per step, of them plan_step "
              f"{kernel:,.0f}, the ledger's own {step - kernel:,.0f}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pythons", nargs=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--callgrind", action="store_true", help="count instructions per step")
    ap.add_argument("--callgrind-calls", type=int, default=100, help="the shorter run's steps")
    args = ap.parse_args()
    if args.callgrind:
        callgrind_main(args.pythons, args.batch, args.callgrind_calls)
        return
    rows: list[tuple[dict, dict]] = []
    for r in range(args.rounds):
        got = []
        for py in args.pythons:
            out = subprocess.run(
                [py, "-c", CHILD, str(args.batch), str(args.calls), str(args.batches)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            got.append(json.loads(out.strip().splitlines()[-1]))
        a, b = got
        rows.append((a, b))
        sides = " | ".join(
            f"{n} fused {x['fused']:.0f} plan {x['plan']:.0f} ({x['fused'] / x['plan']:.2f}x)"
            for n, x in (("A", a), ("B", b))
        )
        fused, plan = b["fused"] / a["fused"], b["plan"] / a["plan"]
        print(f"round {r}: {sides} | B/A fused {fused:.3f} plan {plan:.3f}", flush=True)
    for name, k in (("A", 0), ("B", 1)):
        f = statistics.median(x[k]["fused"] for x in rows)
        p = statistics.median(x[k]["plan"] for x in rows)
        print(f"{name}: median fused {f:.0f} ns, plan {p:.0f} ns, fused/plan {f / p:.2f}")
    for what in ("fused", "plan"):
        ratios = [x[1][what] / x[0][what] for x in rows]
        middle = statistics.median(ratios)
        print(f"B/A {what}: {min(ratios):.3f}..{max(ratios):.3f}, median {middle:.3f}")
    json.dump(rows, sys.stderr)


if __name__ == "__main__":
    main()
