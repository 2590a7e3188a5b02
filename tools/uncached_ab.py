"""Host-step cost of uncached-first admission against the static step (issue 43; docs/scheduling.md,
"Uncached work first: cost").

    python tools/uncached_ab.py --batch 256 --rounds 8

One process builds two steady ledgers on ``stepplanner.bench.loop``'s stream (the static step,
and the same stream with a prefix hit per request admitted by ``AdmissionOrder.UNCACHED_FIRST``
with ``starvation_steps=64``) and times batches of fused ``ledger.step`` calls of each, taking
turns; each round prints both medians and their ratio, and the last line the median ratio over
the rounds (only ratios within a round count on a shared machine).
"""

from __future__ import annotations

import argparse
import statistics

from stepplanner.bench import loop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--policy", default="mixed", choices=sorted(loop.POLICIES))
    args = ap.parse_args()
    static = loop.fused_batch(args.batch, args.calls, policy=args.policy)
    uncached = loop.fused_batch(args.batch, args.calls, policy=args.policy, uncached=True)
    ratios = []
    for k in range(args.rounds):
        s, u = [], []
        for _ in range(args.batches):
            s.append(static())
            u.append(uncached())
        ms, mu = statistics.median(s), statistics.median(u)
        ratios.append(mu / ms)
        print(f"round {k}: static {ms / 1000:.2f} us, uncached {mu / 1000:.2f} us, {mu / ms:.3f}x")
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(
        f"B={args.batch} {args.policy}: median ratio {statistics.median(ratios):.3f}x "
        f"(quartiles {q[0]:.3f}-{q[2]:.3f}) over {args.rounds} rounds"
    )


if __name__ == "__main__":
    main()
