"""Run the long soak: tests/test_soak.py::test_soak with a step count of your choice.

    python tools/soak.py --steps 1000000            # about 10-20 minutes on 2 cores
    python tools/soak.py --steps 200000 --seed 7

It is the same test the normal run executes with 3000 steps (STEPPLANNER_SOAK_STEPS), so the
long soak can never check less than the short one. Prints the test's summary line (steps, runs,
seconds); exits with pytest's status.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument(
        "--seed", type=int, default=None, help="default: the test's own seed (tests/test_soak.py)"
    )
    args = parser.parse_args()
    env = {**os.environ, "STEPPLANNER_SOAK_STEPS": str(args.steps)}
    if args.seed is not None:
        env["STEPPLANNER_SOAK_SEED"] = str(args.seed)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        "tests/test_soak.py::test_soak",
    ]
    return subprocess.call(cmd, cwd=REPO, env=env)


if __name__ == "__main__":
    sys.exit(main())
