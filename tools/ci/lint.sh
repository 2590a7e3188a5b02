#!/usr/bin/env bash
# Lint: ruff check over src, tests, tools, benchmarks and examples, with the rules in
# pyproject.toml [tool.ruff.lint] and ruff from the `lint` dependency group.
# Called by .ci/run, .github/workflows/test.yml (job `lint`) and .pre-commit-config.yaml.
# Usage: tools/ci/lint.sh [VENV | PYTHON]
source "$(dirname "$0")/_common.sh"
install_group lint
run "$PY" -m ruff check "${PYTHON_PATHS[@]}"
