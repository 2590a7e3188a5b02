"""Interleaved A/B timing of the host step at one B (issue 41, item 7; docs/performance.md).

    python tools/loop_ab.py --rounds 6 A_PYTHON B_PYTHON   # each a venv python of a built tree

Each round runs one fresh process per build, in turn (A B A B ...); each process times batches
of ``ledger.step`` and of ``plan()`` alone (``stepplanner.bench.loop``), taking turns, and prints
their medians. Only ratios within a round count on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pythons", nargs=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--batches", type=int, default=40)
    args = ap.parse_args()
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
