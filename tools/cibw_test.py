"""Test a built wheel the way cibuildwheel tests it, from pyproject.toml's [tool.cibuildwheel].

cibuildwheel installs the wheel with ``test-extras`` and ``test-requires`` into a fresh venv,
copies only the ``test-sources`` (relative to the project directory, which for the release build
is the extracted sdist) into an empty temporary directory, and runs ``test-command`` there with
``test-environment`` set. A test that reads anything else from the source tree passes in a
checkout and fails the release build; running the same layout here (``tools/check_dist.sh``)
is what keeps that from coming back. Everything is read from the project's pyproject.toml, so
this script and the release build cannot disagree about the layout.

Usage: python tools/cibw_test.py PROJECT_DIR TEST_DIR VENV_PYTHON [--install WHEEL]
  PROJECT_DIR   the project the sources are copied from (check_dist.sh: the extracted sdist)
  TEST_DIR      must not exist yet; becomes the directory holding only the test sources
  VENV_PYTHON   the python of the venv the wheel is (or, with --install, gets) installed in
Exit status: the test command's.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any


def config(project: Path) -> dict[str, Any]:
    with open(project / "pyproject.toml", "rb") as f:
        table: dict[str, Any] = tomllib.load(f).get("tool", {}).get("cibuildwheel", {})
    return table


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return value.split() if isinstance(value, str) else list(value)


def environment(cfg: dict[str, Any]) -> dict[str, str]:
    """test-environment as a table (the form this project uses), or, as in cibuildwheel, the
    ``CIBW_TEST_ENVIRONMENT`` variable in its place: plain ``NAME=value`` words only (expansions
    would need cibuildwheel's own shell-like parser, so they are refused rather than
    half-understood)."""
    override = os.environ.get("CIBW_TEST_ENVIRONMENT")
    if override is not None:
        pairs = {}
        for word in shlex.split(override):
            name, sep, value = word.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or "$" in value:
                raise SystemExit(
                    f"cibw_test: CIBW_TEST_ENVIRONMENT={override!r}: {word!r} is not NAME=value "
                    "(no expansions)"
                )
            pairs[name] = value
        return pairs
    env = cfg.get("test-environment", {})
    if not isinstance(env, dict):
        raise SystemExit(f"cibw_test: test-environment must be a TOML table here, got {env!r}")
    return {str(k): str(v) for k, v in env.items()}


def stage(project: Path, dest: Path, sources: list[str]) -> None:
    """Copy each source to the same relative place under dest, as cibuildwheel does."""
    dest.mkdir(parents=True)  # refuses an existing directory: only the sources may be there
    for source in sources:
        src = project / source
        if not src.exists():
            raise SystemExit(f"cibw_test: test source {source} does not exist in {project}")
        target = dest / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("project", type=Path)
    parser.add_argument("test_dir", type=Path)
    parser.add_argument("python", type=Path)
    parser.add_argument("--install", metavar="WHEEL", type=Path)
    args = parser.parse_args(argv)
    project = args.project.resolve()
    cfg = config(project)
    command = cfg.get("test-command")
    if not command:
        raise SystemExit(f"cibw_test: no [tool.cibuildwheel] test-command in {project}")
    command = " && ".join(_as_list(command)) if isinstance(command, list) else command

    if args.install is not None:
        extras = ",".join(_as_list(cfg.get("test-extras")))
        wheel = str(args.install.resolve()) + (f"[{extras}]" if extras else "")
        subprocess.run(
            [
                str(args.python),
                "-m",
                "pip",
                "install",
                "-q",
                wheel,
                *_as_list(cfg.get("test-requires")),
            ],
            check=True,
        )
    for name, value in (
        ("{project}", project),
        ("{package}", project),
        ("{wheel}", args.install.resolve() if args.install else None),
    ):
        if name in command:
            if value is None:
                raise SystemExit(f"cibw_test: test-command uses {name}; pass --install WHEEL")
            command = command.replace(name, str(value))

    sources = _as_list(cfg.get("test-sources"))
    stage(project, args.test_dir, sources)
    # cibuildwheel runs the command with the test venv first on PATH, so `python` is the venv's;
    # the venv is not "activated" further than that.
    venv_bin = str(Path(os.path.abspath(args.python)).parent)
    env = dict(
        os.environ,
        PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""),
        VIRTUAL_ENV=str(Path(venv_bin).parent),
    )
    env.pop("PYTHONPATH", None)  # nothing but the staged sources and the installed wheel
    env.update(environment(cfg))
    shown = " ".join(f"{k}={v}" for k, v in environment(cfg).items())
    print(f"cibw_test: {args.test_dir} holds {sources}; running: {shown} {command}", flush=True)
    return subprocess.run(["sh", "-c", command], cwd=args.test_dir, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
