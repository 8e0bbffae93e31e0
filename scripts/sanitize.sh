#!/usr/bin/env bash
# Builds dkit's library, command and test suite with sanitizers (DKIT_SANITIZE, default address,undefined) in a
# build folder of their own, and runs the tests. Fails when a test fails or when any process of the run (the test
# program, the dkit commands it starts, the CLI tests) wrote a sanitizer report: every report goes to a file in
# BUILD/sanitizer-reports/, which this script prints.
#
#   scripts/sanitize.sh                          # the whole suite, in build-sanitize/, with clang when present
#   scripts/sanitize.sh -R 'Pickle|TorchFile'    # with arguments: plain ctest with them, one process per suite
#   SANITIZE_CXX=g++ DKIT_SANITIZE=address scripts/sanitize.sh
#
# Without arguments the suite runs through scripts/test_shards.sh: the GoogleTest program whole, in 4 shards per job
# (SANITIZE_JOBS, one per CPU by default), beside ctest for the other tests (the CLI tests); the same suite as
# ctest's, without paying a sanitized LibTorch start-up for each of its tests. With clang, the build also has the
# fuzz targets (DKIT_FUZZ), so that FUZZ_BUILD_DIR=build-sanitize scripts/fuzz.sh reuses it.
#
# LibTorch is not instrumented; scripts/sanitizers/*.supp would suppress reports from inside it (each entry says
# why; none is needed today). The packaging tests are left out (DKIT_INSTALL=OFF): they install and rebuild dkit
# as a package and test nothing a sanitizer looks at.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${SANITIZE_BUILD_DIR:-build-sanitize}
sanitizers=${DKIT_SANITIZE:-address,undefined}
cxx=${SANITIZE_CXX:-$(command -v clang++ || command -v g++)}
jobs=${SANITIZE_JOBS:-$(nproc)}

configure=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DDKIT_SANITIZE="$sanitizers" -DDKIT_INSTALL=OFF)
if "$cxx" --version | grep -q clang; then
  configure+=(-DDKIT_FUZZ=ON)
fi
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then
  configure+=(-G Ninja)
fi
echo "sanitize: configuring $build with $cxx, -fsanitize=$sanitizers"
mkdir -p "$build"
cmake -S . -B "$build" "${configure[@]}" >"$build/sanitize-configure.log" 2>&1 ||
  { cat "$build/sanitize-configure.log" >&2; exit 1; }
start=$(date +%s)
cmake --build "$build" --parallel "$(nproc)"
echo "sanitize: built in $(($(date +%s) - start)) s"

root=$(pwd)
reports="$root/$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
supp="$root/scripts/sanitizers"
# log_path sends each process's report to reports/KIND.PID instead of its stderr, so that a report from a child
# process (a dkit command a test runs and expects to fail) is not lost in a test that passes.
export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1:strict_string_checks=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
symbolizer=$(command -v llvm-symbolizer || ls /usr/lib/llvm-*/bin/llvm-symbolizer 2>/dev/null | head -n1 || true)
if [ -n "$symbolizer" ]; then
  export ASAN_SYMBOLIZER_PATH="$symbolizer"
fi

start=$(date +%s)
status=0
if [ "$#" -gt 0 ]; then
  ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" "$@" || status=$?
else
  bash scripts/test_shards.sh "$build" "$jobs" || status=$?
fi
echo "sanitize: tests ran in $(($(date +%s) - start)) s"

shopt -s nullglob
found=("$reports"/*)
if [ "${#found[@]}" -ne 0 ]; then
  echo "sanitize: ${#found[@]} sanitizer report(s):" >&2
  for report in "${found[@]}"; do
    echo "==== $report" >&2
    cat "$report" >&2
  done
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "sanitize: tests failed (no sanitizer reports)" >&2
  exit "$status"
fi
echo "sanitize: all tests passed, no sanitizer reports"
