#!/usr/bin/env bash
# Runs the whole test suite of a build folder as ctest does, without paying a LibTorch start-up (0.5-0.9 s, more
# sanitized) for each GoogleTest test: the GoogleTest program runs whole, split into 4 shards per job
# (GTEST_TOTAL_SHARDS), and ctest runs the tests that are not GoogleTest's (cli.*, docker.*, package.*) one at a
# time; JOBS of these run at once, the next starting as one ends, so that a long shard does not leave a CPU idle.
#
#   scripts/test_shards.sh BUILD [JOBS [CTEST_ARGUMENT...]]   # JOBS: $(nproc) by default
#
# CTEST_ARGUMENTs go to ctest for the other tests (scripts/libtorch_build.sh gives `-LE dockerfile`: the
# Dockerfile's static checks, which CI runs in its readme stage).
#
# Each shard's output goes to BUILD/test-shard-N.log and ctest's to BUILD/test-ctest.log; a failing shard's
# failures and ctest's whole output are printed. Exit status 0 when every shard and every other test passed.
# scripts/sanitize.sh and scripts/libtorch_build.sh run the suite this way; the README's test command is plain ctest,
# one process per GoogleTest suite (tests/gtest_suites.cmake).
set -uo pipefail
build=${1:?usage: scripts/test_shards.sh BUILD [JOBS [CTEST_ARGUMENT...]]}
jobs=${2:-$(nproc)}
ctest_arguments=("${@:3}")
shards=$((4 * jobs))

say() {
  echo "test_shards: $*"
}

# GoogleTest's tests are named Suite.Test with a capitalized suite; the others (cli.*, docker.*) are not.
run_task() {
  if [ "$1" = ctest ]; then
    ctest --test-dir "$build" --output-on-failure --parallel 1 -E '^[A-Z][A-Za-z0-9_/]*\.' "${ctest_arguments[@]}" \
      >"$build/test-ctest.log" 2>&1
  else
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$1 "$build/tests/dkit_tests" >"$build/test-shard-$1.log" 2>&1
  fi
}

report() {
  local task=$1 rc=$2
  if [ "$task" = ctest ]; then
    cat "$build/test-ctest.log"
    [ "$rc" -eq 0 ] || say "ctest FAILED" >&2
  elif [ "$rc" -eq 0 ]; then
    say "shard $task: $(grep -E '^\[  PASSED  \]' "$build/test-shard-$task.log" || echo 'no tests')"
  else
    say "shard $task FAILED:" >&2
    grep -E '^\[  FAILED  \]|Failure$' -A6 "$build/test-shard-$task.log" >&2 ||
      tail -n 40 "$build/test-shard-$task.log" >&2
  fi
}

say "dkit_tests in $shards shards and ctest for the tests that are not GoogleTest's, $jobs at a time"
tasks=(ctest $(seq 0 $((shards - 1))))
declare -A task_of=()
status=0
next=0
while [ "$next" -lt "${#tasks[@]}" ] || [ "${#task_of[@]}" -gt 0 ]; do
  if [ "$next" -lt "${#tasks[@]}" ] && [ "${#task_of[@]}" -lt "$jobs" ]; then
    run_task "${tasks[$next]}" &
    task_of[$!]=${tasks[$next]}
    next=$((next + 1))
    continue
  fi
  rc=0
  wait -n -p pid "${!task_of[@]}" || rc=$?
  report "${task_of[$pid]}" "$rc"
  [ "$rc" -eq 0 ] || status=1
  unset "task_of[$pid]"
done
exit "$status"
