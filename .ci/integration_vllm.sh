#!/usr/bin/env bash
# The vLLM integration tests against the pinned vLLM, in their own venv (.venv-vllm).
# vLLM brings a CUDA build of torch (about 9 GB); the tests run on the CPU with fake model
# outputs, no GPU and no network beyond PyPI. A skipped test fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export STEPPLANNER_REQUIRE_INTEGRATIONS=1 HF_HUB_OFFLINE=1

venv=${VLLM_VENV:-.venv-vllm}
start=$SECONDS
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
# --no-compile: byte-compiling all of vLLM and torch up front costs minutes on 2 cores; Python
# compiles the few modules the tests import on first use instead.
"$venv/bin/pip" install -q --no-compile "vllm==0.33.0"
"$venv/bin/pip" install -q --no-compile ".[test,vllm]"
echo "+ .ci/integration_vllm.sh: venv ready in $((SECONDS - start)) s"
# --prepare: only build the venv (.ci/run does that in the background, beside the main suite).
[ "${1:-}" = "--prepare" ] && exit 0

log=$(mktemp)
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_vllm.py "$@" \
  2>&1 | tee "$log"
if grep -qE "^=*.*[0-9]+ skipped" "$log"; then
  echo ".ci/integration_vllm.sh: a vLLM integration test was skipped" >&2
  exit 1
fi
echo "+ .ci/integration_vllm.sh: done in $((SECONDS - start)) s"
