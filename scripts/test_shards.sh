#!/usr/bin/env bash
# Runs the whole test suite of a build folder as ctest does, without paying a LibTorch start-up (0.5 s here, 1.1 s
# sanitized) for each GoogleTest test: the GoogleTest program runs whole, in one shard per CPU
# (GTEST_TOTAL_SHARDS), then ctest runs the tests that are not GoogleTest's (cli.*, docker.*, package.*).
#
#   scripts/test_shards.sh BUILD [SHARDS]   # SHARDS: $(nproc) by default
#
# Each shard's output goes to BUILD/test-shard-N.log; a failing shard's failures are printed. Exit status 0 when
# every shard and every other test passed. scripts/sanitize.sh and scripts/libtorch_build.sh run the suite this way;
# the README's test command is plain ctest, one process per GoogleTest suite (tests/gtest_suites.cmake).
set -uo pipefail
build=${1:?usage: scripts/test_shards.sh BUILD [SHARDS]}
shards=${2:-$(nproc)}

say() {
  echo "test_shards: $*"
}

say "dkit_tests in $shards shards, then ctest for the tests that are not GoogleTest's"
status=0
pids=()
for ((shard = 0; shard < shards; ++shard)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard "$build/tests/dkit_tests" >"$build/test-shard-$shard.log" 2>&1 &
  pids+=($!)
done
for ((shard = 0; shard < shards; ++shard)); do
  if wait "${pids[$shard]}"; then
    say "shard $shard: $(grep -E '^\[  PASSED  \]' "$build/test-shard-$shard.log" || echo 'no tests')"
  else
    status=1
    say "shard $shard FAILED:" >&2
    grep -E '^\[  FAILED  \]|Failure$' -A6 "$build/test-shard-$shard.log" >&2 || tail -n 40 "$build/test-shard-$shard.log" >&2
  fi
done
# GoogleTest's tests are named Suite.Test with a capitalized suite; the others (cli.*, docker.*) are not.
ctest --test-dir "$build" --output-on-failure --parallel "$shards" -E '^[A-Z][A-Za-z0-9_/]*\.' || status=$?
exit "$status"
