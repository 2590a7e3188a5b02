#!/usr/bin/env bash
# The vLLM integration tests against the pinned vLLM, in their own venv (.venv-vllm).
# vLLM brings a CUDA build of torch (about 9 GB); the tests run on the CPU with fake model
# outputs, no GPU and no network beyond PyPI. A skipped test fails the run.
# The package is this checkout, built; or, with STEPPLANNER_WHEEL=PATH, that wheel (.ci/run passes
# the one tools/check_dist.sh built from the sdist, so the package is compiled once per run).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export STEPPLANNER_REQUIRE_INTEGRATIONS=1 HF_HUB_OFFLINE=1

venv=${VLLM_VENV:-.venv-vllm}
start=$SECONDS
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
# --no-compile: byte-compiling all of vLLM and torch up front costs minutes on 2 cores; Python
# compiles the few modules the tests import on first use instead.
# vLLM and the `test` extra's requirements (read from pyproject.toml: nothing is built yet).
mapfile -t test_requirements < <("$venv/bin/python" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))')
"$venv/bin/pip" install -q --no-compile "vllm==0.33.0" "${test_requirements[@]}"
echo "+ .ci/integration_vllm.sh: vLLM installed in $((SECONDS - start)) s"
# --prepare: only that (.ci/run does it in the background from its start, before the wheel exists).
[ "${1:-}" = "--prepare" ] && exit 0
"$venv/bin/pip" install -q --no-compile "${STEPPLANNER_WHEEL:-.}[test,vllm]"

log=$(mktemp)
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_vllm.py "$@" \
  2>&1 | tee "$log"
if grep -qE "^=*.*[0-9]+ skipped" "$log"; then
  echo ".ci/integration_vllm.sh: a vLLM integration test was skipped" >&2
  exit 1
fi
echo "+ .ci/integration_vllm.sh: done in $((SECONDS - start)) s"
