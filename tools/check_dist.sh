#!/usr/bin/env bash
# Check what we ship, the way a user gets it (docs/distribution.md). Rerunnable; touches nothing
# outside a fresh temporary directory (override with CHECK_DIST_DIR), never an existing venv.
#
#   1. python -m build: the sdist, then the wheel built *from the sdist*;
#   2. twine check --strict on both;
#   3. contents: the sdist has the .pyx/.pxd/.pyi sources and no generated C; the wheel has the
#      compiled modules, each with its .pxd and .pyi, and py.typed, and no .pyx/.c;
#   4. the wheel in a fresh venv passes its tests in exactly cibuildwheel's layout: the sdist
#      extracted, only [tool.cibuildwheel] test-sources copied to an empty directory, test-command
#      run there with test-environment (tools/cibw_test.py reads all of it from pyproject.toml);
#   5. cibuildwheel --print-build-identifiers for linux, macos and windows lists the release matrix.
#
# Usage: tools/check_dist.sh [python]   (default python3; the wheel is built and tested with it)
set -euo pipefail

PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${CHECK_DIST_DIR:-$(mktemp -d -t stepplanner-dist.XXXXXX)}
mkdir -p "$WORK"
export PIP_DISABLE_PIP_VERSION_CHECK=1
step() { printf '\n=== %s\n' "$*"; }

step "tools venv ($WORK/tools): build, twine, cibuildwheel from pyproject's 'dist' group"
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/python" -m pip install -q --upgrade "pip>=25.1"
(cd "$ROOT" && "$WORK/tools/bin/python" -m pip install -q --group dist)

step "python -m build (sdist, then the wheel from the sdist) -> $WORK/dist"
"$WORK/tools/bin/python" -m build --outdir "$WORK/dist" "$ROOT" > "$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
ls -l "$WORK/dist"
SDIST=$(ls "$WORK"/dist/*.tar.gz)
WHEEL=$(ls "$WORK"/dist/*.whl)

step "twine check --strict"
"$WORK/tools/bin/python" -m twine check --strict "$SDIST" "$WHEEL"

step "contents"
"$WORK/tools/bin/python" - "$SDIST" "$WHEEL" <<'PY'
import sys, tarfile, zipfile
sdist, wheel = sys.argv[1:]
s = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
w = zipfile.ZipFile(wheel).namelist()
MODULES = ["_core", "kv/_kv", "ledger/_ledger"]  # each compiled module: .pyx in the sdist; .pxd + .pyi in both
need_s = [f"src/stepplanner/{m}.{ext}" for m in MODULES for ext in ("pyx", "pxd", "pyi")]
need_s += ["src/stepplanner/py.typed", "pyproject.toml", "setup.py", "README.md", "tests/conftest.py"]
missing = [n for n in need_s if n not in s]
generated = [n for n in s if n.endswith((".c", ".so", ".pyd", ".html"))]
need_w = [f"stepplanner/{m}.{ext}" for m in MODULES for ext in ("pxd", "pyi")]
need_w += ["stepplanner/py.typed", "stepplanner/__init__.py"]
missing_w = [n for n in need_w if n not in w]
compiled = [n for n in w if n.endswith((".so", ".pyd"))]
missing_w += [m for m in MODULES if not any(n.startswith(f"stepplanner/{m}.") for n in compiled)]
leaked = [n for n in w if n.endswith((".pyx", ".c"))]
print(f"sdist: {len(s)} files; wheel: {len(w)} files; compiled module: {compiled}")
problems = {"sdist lacks": missing, "sdist has generated": generated, "wheel lacks": missing_w,
            "wheel ships sources": leaked, "wheel has no compiled module": [] if compiled else [wheel]}
bad = {k: v for k, v in problems.items() if v}
if bad:
    sys.exit(f"contents check failed: {bad}")
print("ok: .pyx in the sdist only; each compiled module with its .pxd and stub in the wheel")
PY

step "the wheel in a fresh venv, tested in cibuildwheel's layout (tools/cibw_test.py)"
# The release build tests each wheel from the *sdist*: cibuildwheel extracts it, copies only the
# `test-sources` into an empty directory and runs `test-command` there with `test-environment`
# (all from [tool.cibuildwheel]). Do exactly that, so a test that needs a file outside
# test-sources fails here and not in the release.
"$PY" -m venv "$WORK/wheel-venv"
mkdir -p "$WORK/sdist-src"
tar -xzf "$SDIST" -C "$WORK/sdist-src"
PROJECT=$(ls -d "$WORK"/sdist-src/*/)
# The full log stays in $WORK/pytest.log; a failure is reported at the end, after step 5.
tests_ok=1
"$PY" "$ROOT/tools/cibw_test.py" "$PROJECT" "$WORK/run" "$WORK/wheel-venv/bin/python" \
  --install "$WHEEL" > "$WORK/pytest.log" 2>&1 || tests_ok=0
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
  (cd "$ROOT" && CIBW_ARCHS="$archs" "$WORK/tools/bin/cibuildwheel" --print-build-identifiers \
    --platform "$platform")
done

if [ "$tests_ok" = 1 ]; then
  step "done: all checks passed; artifacts in $WORK/dist"
else
  step "FAILED: the test suite failed against the installed wheel (see $WORK/pytest.log)"
  exit 1
fi
