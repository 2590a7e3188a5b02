#!/usr/bin/env bash
# Types, with mypy from the `typecheck` dependency group and pyproject.toml [tool.mypy]:
#   1. mypy --strict over the package's source, the examples and the README's first Python
#      example (extracted, after a stand-in for the engine it leaves to the reader);
#   2. stubtest: each compiled module's .pyi against the module installed in PYTHON's
#      environment, from an empty directory so the installed package is what imports, reading
#      pyproject's [tool.mypy] (its ignore_missing_imports for torch, transformers, vLLM and Ray,
#      which stubtest needs for fidelity/harness.py);
#   3. the README example run against the installed package.
# The package must be installed in PYTHON's environment (CI: a regular install, what a user's
# type checker sees). Called by .ci/run, .github/workflows/test.yml (job `typecheck`) and
# .pre-commit-config.yaml.
# Usage: tools/ci/types.sh [VENV | PYTHON]
source "$(dirname "$0")/_common.sh"
install_group typecheck

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The README's serving loop leaves the engine to the reader: a stand-in is put before it (every
# request then runs to its max_new_tokens), so the example type-checks and runs as printed.
"$PY" - "$scratch/readme_example.py" <<'PY'
import re, sys
text = open("README.md", encoding="utf-8").read()
blocks = re.findall(r"```python\n(.*?)```", text, re.S)
assert blocks, "README.md has no python example"
prelude = """\
import numpy as _np
import numpy.typing as _npt

import stepplanner as _sp


class _Engine:  # the reader's forward pass and sampler; here no sampled token ends a request
    def run(self, plan: _sp.StepPlan) -> _npt.NDArray[_np.bool_]:
        return _np.zeros(len(plan.sequences), dtype=bool)


engine = _Engine()
"""
open(sys.argv[1], "w", encoding="utf-8").write(prelude + blocks[0])
PY

run "$PY" -m mypy --strict src/stepplanner examples "$scratch/readme_example.py"
(cd "$scratch" && run "$PY" -m mypy.stubtest --mypy-config-file "$ROOT/pyproject.toml" \
  --allowlist "$ROOT/tools/stubtest-allowlist.txt" stepplanner)
(cd "$scratch" && run "$PY" readme_example.py)
