#!/usr/bin/env bash
# valgrind memcheck over a long plan()/apply_to() loop (tools/plan_loop.py: array and list
# paths, MIXED+PRIORITY+PAUSE and PREFILL_FIRST, reasons, copy), at N and at 10·N iterations.
#
#   tools/valgrind_plan.sh            # N=50: a few minutes on a quiet machine
#   N=300 PYTHON=.venv/bin/python tools/valgrind_plan.sh
#
# Passes when (1) no memcheck error has a stack frame in stepplanner's compiled core, (2) no
# block is definitely lost from stepplanner code, and (3) the heap in use at exit does not grow
# with the iteration count (10·N ends within SLACK bytes of N). PYTHONMALLOC=malloc makes every
# Python object a malloc block that memcheck can see; CPython's own one-time allocations at exit
# are the same for both runs, so only a per-step leak shows as growth.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
n=${N:-50}
slack=${SLACK:-65536}
out=$(mktemp -d /tmp/stepplanner-valgrind.XXXXXX)
echo "valgrind: logs in $out"

run() {  # run ITERATIONS -> writes $out/vg-ITERATIONS.log and .json
  PYTHONMALLOC=malloc valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite \
    --num-callers=40 --error-limit=no --log-file="$out/vg-$1.log" \
    "$python" "$repo/tools/plan_loop.py" --iterations "$1" --warmup 10 --no-trace >"$out/loop-$1.json"
}

in_use() {  # bytes "in use at exit" from a memcheck log
  sed -n 's/.*in use at exit: \([0-9,]*\) bytes.*/\1/p' "$1" | tr -d ,
}

core_errors() {  # memcheck error blocks with a stack frame in the compiled core's code
  awk '/^==[0-9]+== ([A-Z].*(Invalid|uninitialised|Mismatched|overlap)|[0-9,]+ bytes in [0-9,]+ blocks are definitely lost)/{blk=$0; keep=0; next}
       blk!="" && /(_core\.c:|_core\.pyx|_core\.cpython)/ {keep=1}
       blk!="" && /^==[0-9]+== $/ {if (keep) print blk; blk=""; keep=0}' "$1"
}

status=0
for iters in "$n" $((10 * n)); do
  echo "valgrind: $iters iterations ..."
  run "$iters"
  echo "  loop: $(cat "$out/loop-$iters.json")"
  echo "  $(grep -m1 'ERROR SUMMARY' "$out/vg-$iters.log" | sed 's/^==[0-9]*== //')"
  echo "  $(grep -m1 'definitely lost' "$out/vg-$iters.log" | sed 's/^==[0-9]*== //' || echo 'definitely lost: 0')"
  echo "  in use at exit: $(in_use "$out/vg-$iters.log") bytes"
  found=$(core_errors "$out/vg-$iters.log")
  if [ -n "$found" ]; then
    echo "valgrind: memcheck errors in stepplanner code:" >&2
    echo "$found" >&2
    status=1
  fi
done

small=$(in_use "$out/vg-$n.log")
large=$(in_use "$out/vg-$((10 * n)).log")
growth=$((large - small))
echo "valgrind: heap in use at exit grows by $growth bytes from $n to $((10 * n)) iterations" \
     "(allowed: <= $slack)"
[ "$growth" -le "$slack" ] || status=1
[ "$status" = 0 ] && echo "valgrind: PASS" || echo "valgrind: FAIL"
exit "$status"
