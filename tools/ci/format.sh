#!/usr/bin/env bash
# Format: ruff format --check over the same paths as lint.sh, with pyproject.toml
# [tool.ruff.format]; fails, listing the files, when `ruff format` would change any.
# Called by .ci/run, .github/workflows/test.yml (job `lint`) and .pre-commit-config.yaml.
# Usage: tools/ci/format.sh [VENV | PYTHON]
source "$(dirname "$0")/_common.sh"
install_group lint
run "$PY" -m ruff format --check "${PYTHON_PATHS[@]}"
