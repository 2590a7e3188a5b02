# Sourced by every tools/ci/*.sh check: the Python it runs with, the paths ruff reads, and the
# installation of a pyproject [dependency-groups] group into that Python's environment.
#
# Each check takes the Python to run with as its first argument: a venv's directory or a python
# executable; else $CI_PYTHON; else python3. .ci/run passes its .venv-ci, .pre-commit-config.yaml
# the README's .venv, the workflows nothing (setup-python's python3).
set -euo pipefail

PY=${1:-${CI_PYTHON:-python3}}
[ -d "$PY" ] && PY=$PY/bin/python
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac  # before the cd
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# What ruff checks and formats: every Python file the project writes.
PYTHON_PATHS=(src tests tools benchmarks examples)

# install_group NAME: pip-installs the group's requirements, read from pyproject.toml (not
# `pip install --group`, which needs pip >= 25.1: a venv of Python 3.11 starts with pip 23).
# (A read loop, not mapfile: macOS ships bash 3.2.)
install_group() {
  local reqs=() req
  while IFS= read -r req; do reqs+=("$req"); done < <("$PY" -c 'import sys, tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["dependency-groups"][sys.argv[1]]))' "$1")
  [ ${#reqs[@]} -gt 0 ] || { echo "tools/ci: pyproject.toml has no group $1" >&2; return 1; }
  "$PY" -m pip install -q "${reqs[@]}"
}

# scripts_dir: where the environment's console scripts are (actionlint and zizmor are binaries
# with no `python -m` entry).
scripts_dir() {
  "$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'
}

# run CMD...: print the command, as the workflow log and .ci/run's log show it, then run it.
run() {
  echo "+ $*"
  "$@"
}
