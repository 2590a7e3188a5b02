#!/usr/bin/env bash
# Check what we ship, the way a user gets it (docs/distribution.md). Rerunnable; touches nothing
# outside a fresh temporary directory (override with CHECK_DIST_DIR), never an existing venv.
#
#   1. python -m build: the sdist, then the wheel built *from the sdist*, in the sdist extracted
#      to $WORK/sdist-src (as cibuildwheel builds from it; `python -m build` alone does the same
#      in a temporary directory);
#   2. twine check --strict on both;
#   3. contents (tools/ci/dist_contents.py, which the workflows run too): the sdist has the
#      .pyx/.pxd/.pyi sources and no generated C; the wheel has the compiled modules, each with
#      its .pxd and .pyi, and py.typed, and no .pyx/.c;
#   4. the wheel in a fresh venv passes its tests in exactly cibuildwheel's layout: the sdist
#      extracted, only [tool.cibuildwheel] test-sources copied to an empty directory, test-command
#      run there with test-environment (tools/cibw_test.py reads all of it from pyproject.toml);
#   5. cibuildwheel --print-build-identifiers for linux, macos and windows lists the release matrix.
#
# Usage: tools/check_dist.sh [--sdist | --wheel | --test] [python]
#   python: default python3; the wheel is built and tested with it.
#   Without an option: all five steps. With one, only a part, each on what the part before left in
#   CHECK_DIST_DIR: --sdist the tools venv and the sdist (the only part that reads this checkout),
#   --wheel the rest of steps 1-3, --test steps 4-5. (.ci/run builds the sdist before the README's
#   install writes build products into the checkout, then runs the rest beside that install.)
set -euo pipefail

part=all
case ${1:-} in --sdist|--wheel|--test) part=${1#--}; shift ;; esac
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "$part" != all ] && [ "$part" != sdist ] && [ -z "${CHECK_DIST_DIR:-}" ]; then
  echo "tools/check_dist.sh --$part: set CHECK_DIST_DIR to the directory the part before filled" >&2
  exit 2
fi
WORK=${CHECK_DIST_DIR:-$(mktemp -d -t stepplanner-dist.XXXXXX)}
mkdir -p "$WORK"
TOOLS="$WORK/tools/bin"
export PIP_DISABLE_PIP_VERSION_CHECK=1
step() { printf '\n=== %s\n' "$*"; }

build_sdist() {
  step "tools venv ($WORK/tools): build, twine, cibuildwheel from pyproject's 'dist' group"
  "$PY" -m venv "$WORK/tools"
  "$TOOLS/python" -m pip install -q --upgrade "pip>=25.1"
  (cd "$ROOT" && "$TOOLS/python" -m pip install -q --group dist)

  step "python -m build --sdist -> $WORK/dist"
  "$TOOLS/python" -m build --sdist --outdir "$WORK/dist" "$ROOT" > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log"; exit 1; }
  ls -l "$WORK/dist"
}

build_wheel() {
  local sdist project wheel
  sdist=$(ls "$WORK"/dist/*.tar.gz)
  step "python -m build --wheel, in the sdist extracted -> $WORK/dist"
  mkdir -p "$WORK/sdist-src"
  tar -xzf "$sdist" -C "$WORK/sdist-src"
  project=$(ls -d "$WORK"/sdist-src/*/)
  "$TOOLS/python" -m build --wheel --outdir "$WORK/dist" "$project" >> "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log"; exit 1; }
  ls -l "$WORK/dist"
  wheel=$(ls "$WORK"/dist/*.whl)

  step "twine check --strict"
  "$TOOLS/python" -m twine check --strict "$sdist" "$wheel"

  step "contents (tools/ci/dist_contents.py)"
  "$TOOLS/python" "$ROOT/tools/ci/dist_contents.py" "$sdist" "$wheel"
}

test_wheel() {
  local project wheel tests_ok=1
  project=$(ls -d "$WORK"/sdist-src/*/)
  wheel=$(ls "$WORK"/dist/*.whl)
  step "the wheel in a fresh venv, tested in cibuildwheel's layout (tools/cibw_test.py)"
  # The release build tests each wheel from the *sdist*: cibuildwheel extracts it, copies only the
  # `test-sources` into an empty directory and runs `test-command` there with `test-environment`
  # (all from [tool.cibuildwheel]). Do exactly that, so a test that needs a file outside
  # test-sources fails here and not in the release.
  "$PY" -m venv "$WORK/wheel-venv"
  # The full log stays in $WORK/pytest.log; a failure is reported at the end, after step 5.
  "$PY" "$ROOT/tools/cibw_test.py" "$project" "$WORK/run" "$WORK/wheel-venv/bin/python" \
    --install "$wheel" > "$WORK/pytest.log" 2>&1 || tests_ok=0
  head -1 "$WORK/pytest.log"
  ls -A "$WORK/run"
  (cd "$WORK/run" && STEPPLANNER_REQUIRE_COMPILED=1 "$WORK/wheel-venv/bin/python" -c \
    "import stepplanner, stepplanner._core as c; print('imported', stepplanner.IMPLEMENTATION, 'from', c.__file__)")
  grep -E '^(FAILED|ERROR) ' "$WORK/pytest.log" || true
  tail -1 "$WORK/pytest.log"

  step "cibuildwheel --print-build-identifiers (all runners of .github/workflows/wheels.yml)"
  for platform in linux macos windows; do
    case $platform in
      linux) archs="x86_64 aarch64" ;;   # ubuntu-24.04 + ubuntu-24.04-arm
      macos) archs="x86_64 arm64" ;;     # macos-15-intel + macos-14
      windows) archs="AMD64" ;;          # windows-2022
    esac
    echo "--- $platform ($archs)"
    (cd "$ROOT" && CIBW_ARCHS="$archs" "$TOOLS/cibuildwheel" --print-build-identifiers \
      --platform "$platform")
  done

  if [ "$tests_ok" = 1 ]; then
    step "done: all checks passed; artifacts in $WORK/dist"
  else
    step "FAILED: the test suite failed against the installed wheel (see $WORK/pytest.log)"
    exit 1
  fi
}

case $part in
  sdist) build_sdist ;;
  wheel) build_wheel ;;
  test) test_wheel ;;
  all) build_sdist; build_wheel; test_wheel ;;
esac
