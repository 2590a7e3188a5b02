#!/usr/bin/env bash
# Docs: build the documentation site (mkdocs.yml: docs/ and the API reference generated from the
# code) with `mkdocs build --strict`, so a broken link, anchor or API reference fails.
# The site goes to a temporary directory and is thrown away: this is a check, not a deploy.
#
# Usage: tools/ci/docs.sh [VENV]   (default .venv-ci, created when it does not exist)
# VENV may also be a Python interpreter (VENV/bin/python is used otherwise). The docs extra's
# requirements are installed into it; so is the package when it is not installed yet, since
# the API reference takes the compiled modules' docstrings from the built modules. A venv that
# already has the package (.ci/run's, after the README's test command) is not rebuilt.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
export NO_MKDOCS_2_WARNING=1  # Material's banner about its successor, on every build

target=${1:-.venv-ci}
if [ -f "$target" ] && [ -x "$target" ]; then
  py=$target
else
  [ -x "$target/bin/python" ] || python3 -m venv "$target"
  py=$target/bin/python
fi

if "$py" -c "import stepplanner._core, stepplanner.kv._kv, stepplanner.ledger._ledger" 2>/dev/null; then
  # Only the extra's own requirements, read from pyproject.toml: the package stays as built.
  mapfile -t reqs < <("$py" -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
  "$py" -m pip install -q "${reqs[@]}"
else
  "$py" -m pip install -q ".[docs]"
fi

site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
echo "+ mkdocs build --strict --site-dir $site"
start=$SECONDS
"$py" -m mkdocs build --strict --site-dir "$site"
echo "docs: built in $((SECONDS - start)) s, $(find "$site" -name index.html | wc -l) pages"
