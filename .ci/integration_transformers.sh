#!/usr/bin/env bash
# The transformers integration on a clean clone: its own venv, torch's CPU build first (a plain
# `torch` requirement pulls a CUDA build of several GB), then the package with the `test` and
# `transformers` extras, then the integration tests with skips turned into failures.
# The package is this checkout, built; or, with STEPPLANNER_WHEEL=PATH, that wheel (.ci/run passes
# the one tools/check_dist.sh built from the sdist, so the package is compiled once per run).
set -euo pipefail
cd "$(dirname "$0")/.."

export PIP_DISABLE_PIP_VERSION_CHECK=1
export STEPPLANNER_REQUIRE_COMPILED=1        # a missing compiled core fails, never skips
export STEPPLANNER_REQUIRE_INTEGRATIONS=1    # a missing torch/transformers fails, never skips
export STEPPLANNER_REQUIRE_TORCH=1           # (tests/integrations also holds the torch paged-attention test)

venv=.venv-transformers
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==2.13.0"
"$venv/bin/pip" install -q "${STEPPLANNER_WHEEL:-.}[test,cli,transformers]"  # cli: serve-trace
"$venv/bin/python" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_transformers.py \
  tests/integrations/test_transformers_harness.py tests/integrations/test_torch_paged_attention.py
