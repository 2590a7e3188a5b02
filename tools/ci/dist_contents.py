"""What the sdist and the wheels hold (docs/distribution.md): one check for every place that builds
them, so tools/check_dist.sh (.ci/run) and the workflows (test.yml's sdist job, wheels.yml) cannot
disagree about it.

- an sdist (.tar.gz) has each compiled module's .pyx, .pxd and .pyi, py.typed, the build files
  and the tests, and no generated C or binaries;
- a wheel (.whl) has each compiled module built (.so or .pyd) with its .pxd and .pyi beside it,
  py.typed, and no .pyx or .c.

Usage: python tools/ci/dist_contents.py FILE...   (each FILE an sdist or a wheel; standard library
only, so any Python runs it). Exit status 1 names every file that fails and what it lacks.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile

# Each compiled module: its .pyx ships in the sdist only; its .pxd and .pyi in both.
MODULES = ["_core", "kv/_kv", "ledger/_ledger", "ledger/_step_time"]


def sdist_problems(path: str) -> dict[str, list[str]]:
    with tarfile.open(path) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    need = [f"src/stepplanner/{m}.{ext}" for m in MODULES for ext in ("pyx", "pxd", "pyi")]
    need += [
        "src/stepplanner/py.typed",
        "pyproject.toml",
        "setup.py",
        "README.md",
        "tests/conftest.py",
    ]
    return {
        "lacks": [n for n in need if n not in names],
        "has generated": [n for n in names if n.endswith((".c", ".so", ".pyd", ".html"))],
    }


def wheel_problems(path: str) -> dict[str, list[str]]:
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
    need = [f"stepplanner/{m}.{ext}" for m in MODULES for ext in ("pxd", "pyi")]
    need += ["stepplanner/py.typed", "stepplanner/__init__.py"]
    compiled = [n for n in names if n.endswith((".so", ".pyd"))]
    return {
        "lacks": [n for n in need if n not in names],
        "has no compiled module": [
            m for m in MODULES if not any(n.startswith(f"stepplanner/{m}.") for n in compiled)
        ],
        "ships sources": [n for n in names if n.endswith((".pyx", ".c"))],
    }


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        if path.endswith(".tar.gz"):
            problems = sdist_problems(path)
        elif path.endswith(".whl"):
            problems = wheel_problems(path)
        else:
            print(f"{path}: neither an sdist (.tar.gz) nor a wheel (.whl)", file=sys.stderr)
            return 2
        bad = {k: v for k, v in problems.items() if v}
        if bad:
            failed += 1
            print(f"{path}: FAILED {bad}")
        else:
            print(f"{path}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
