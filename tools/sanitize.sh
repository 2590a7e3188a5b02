#!/usr/bin/env bash
# Build the compiled extensions (every .pyx) with AddressSanitizer + UndefinedBehaviorSanitizer
# and run the test suite against that build. Nothing outside a fresh temp dir is touched: the
# source is copied, built and installed into a throwaway venv (never the developer's venv).
#
#   tools/sanitize.sh                 # the working tree as it is (tracked + untracked files)
#   tools/sanitize.sh --head          # the last commit instead
#   tools/sanitize.sh -- -k hostile   # extra pytest arguments after --
#
# Env: PYTHON (interpreter for the venv, default python3), KEEP=1 keeps the temp dir.
# CPython is not built with ASan, so the ASan runtime is LD_PRELOADed into the python process;
# detect_leaks=0 because CPython frees little at exit by design; PYTHONMALLOC=malloc routes
# Python objects through malloc so ASan sees them too. Exit status: pytest's, or 3 when a
# sanitizer report appears in the log even though pytest passed (e.g. in a subprocess).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
use_head=0
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --head) use_head=1 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "sanitize.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

work=$(mktemp -d /tmp/stepplanner-sanitize.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
echo "sanitize: work dir $work"

mkdir -p "$work/src"
if [ "$use_head" = 1 ]; then
  git -C "$repo" archive HEAD | tar -x -C "$work/src"
else
  (cd "$repo" && git ls-files -co --exclude-standard -z | grep -zv '\.so$' |
    xargs -0 cp --parents -t "$work/src")
fi
find "$work"/src/src/stepplanner -name "*.c" -delete  # regenerate every extension from the .pyx being tested

"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "numpy>=2.0" "pytest>=8" "hypothesis>=6.100" "pytest-benchmark>=4" \
  "click>=8.1" "rich>=13"  # the cli extra, so the CLI tests run too

san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
echo "sanitize: building with CC=gcc CFLAGS=\"$san -g -O1\""
CC=gcc CFLAGS="$san -g -O1" LDFLAGS="-fsanitize=address,undefined" \
  "${pip[@]}" install --no-cache-dir "$work/src"

asan_rt=$(gcc -print-file-name=libasan.so)
ubsan_rt=$(gcc -print-file-name=libubsan.so)
# Every extension (one per .pyx) must be built and carry the sanitizers. ldd's output goes to a
# variable first: `ldd | grep -q` under pipefail fails falsely when grep exits early and ldd
# gets SIGPIPE.
for pyx in "$work"/src/src/stepplanner/*.pyx "$work"/src/src/stepplanner/*/*.pyx; do
  ext=${pyx#"$work"/src/src/stepplanner/}; ext=${ext%.pyx}   # e.g. _core, kv/_kv
  so=$(ls "$work"/venv/lib/python3*/site-packages/stepplanner/"$ext".*.so 2>/dev/null || true)
  if [ -z "$so" ]; then
    echo "sanitize: the extension $ext was not built; refusing to report a pass" >&2
    exit 2
  fi
  linked=$(ldd "$so")
  if [[ "$linked" != *libasan* ]]; then
    echo "sanitize: the built $ext is not linked against libasan; refusing to report a pass" >&2
    exit 2
  fi
done

log="$work/pytest.log"
status=0
(
  cd "$work/src"
  env LD_PRELOAD="$asan_rt:$ubsan_rt" \
      ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:print_stacktrace=1" \
      UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
      PYTHONMALLOC=malloc STEPPLANNER_REQUIRE_COMPILED=1 \
      "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "${pytest_args[@]}"
) 2>&1 | tee "$log" || status=${PIPESTATUS[0]}

if grep -qE "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer" "$log"; then
  echo "sanitize: SANITIZER REPORTS (first ones below; full log $log)" >&2
  grep -nE -A12 "ERROR: AddressSanitizer|runtime error:" "$log" | head -80 >&2
  [ "$status" != 0 ] || status=3
else
  echo "sanitize: no AddressSanitizer/UBSan report in the run"
fi
exit "$status"
