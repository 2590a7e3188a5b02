#!/usr/bin/env bash
# vLLM's own tests/v1/core scheduler tests against StepPlannerScheduler, on one venv's vLLM
# (docs/integrations.md, "vLLM's own scheduler tests"; tools/vllm_conformance/conformance.py).
#   .ci/integration_vllm_conformance.sh --prepare VERSION   download and extract that vLLM's tests
#                                                          (its sdist; no venv needed)
#   .ci/integration_vllm_conformance.sh VENV [ARGS...]      run them on VENV's vLLM, ARGS passed
#                                                          to `conformance.py run`
# VENV must hold vLLM, pytest and the package (.ci/integration_vllm.sh installs all three); a
# missing venv, vLLM or package fails the run, never skips it. The run fails when a test outside
# tools/vllm_conformance/expected-X.Y.toml fails or a listed one passes.
set -euo pipefail
cd "$(dirname "$0")/.."
conformance=tools/vllm_conformance/conformance.py

if [ "${1:-}" = "--prepare" ]; then
  version=${2:?".ci/integration_vllm_conformance.sh --prepare VERSION"}
  start=$SECONDS
  python3 "$conformance" fetch "$version"
  echo "+ .ci/integration_vllm_conformance.sh: vLLM $version's tests in $((SECONDS - start)) s"
  exit 0
fi

venv=${1:?".ci/integration_vllm_conformance.sh VENV [ARGS...]"}
shift
python=$venv/bin/python
if [ ! -x "$python" ]; then
  echo ".ci/integration_vllm_conformance.sh: no venv at $venv" >&2
  exit 1
fi
# Absolute: the runner starts pytest in the extracted tests' directory, not here.
python=$(cd "$venv/bin" && pwd)/python
# The package as the venv has it installed (not this checkout's src/, which is not built here).
"$python" -c 'import stepplanner.integrations.vllm' || {
  echo ".ci/integration_vllm_conformance.sh: StepPlannerScheduler does not import in $venv" >&2
  exit 1
}
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
"$python" -m pytest --version > /dev/null
python3 "$conformance" run --python "$python" "$@"
