#!/usr/bin/env bash
# Builds dkit's libFuzzer targets (fuzz/) with clang, AddressSanitizer and UndefinedBehaviorSanitizer, and runs each
# one for a bounded time. Fails when a target reports a crash, a leak, undefined behaviour, an input slower than
# FUZZ_TIMEOUT seconds or an allocation over FUZZ_MALLOC_LIMIT_MB; the input that did it is kept in
# BUILD/fuzz/findings/TARGET/ (replay it with BUILD/fuzz/fuzz_TARGET FILE).
#
#   scripts/fuzz.sh                          # every target, 60 s each, in build-fuzz/
#   FUZZ_SECONDS=600 scripts/fuzz.sh csv     # some targets, for another time
#   scripts/fuzz.sh --replay                 # run the seeds and the kept corpus once, no fuzzing
#
# Settings: FUZZ_SECONDS (60), FUZZ_JOBS (targets fuzzed at once, one core each; default the number of CPUs),
# FUZZ_BUILD_DIR (build-fuzz; an existing clang build configured with DKIT_SANITIZE, such as scripts/sanitize.sh's,
# is reused: only the fuzz targets are added to it), FUZZ_TIMEOUT (20), FUZZ_MALLOC_LIMIT_MB (2048).
#
# Targets: torch_file, training_checkpoint, config, csv, safetensors, npy (see fuzz/CMakeLists.txt). Seeds:
# fuzz/corpus/TARGET (committed, small), the project's real fixtures and the inputs earlier runs found
# (tests/fixtures/fuzz/TARGET-*, each with a regression test), copied into BUILD/fuzz/seeds/TARGET at each run. What
# the fuzzer finds beyond them accumulates in BUILD/fuzz/corpus/TARGET. Needs clang, libclang-rt-dev and llvm
# (scripts/setup.sh --sanitizers installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-$(nproc)}
timeout=${FUZZ_TIMEOUT:-20}
malloc_limit_mb=${FUZZ_MALLOC_LIMIT_MB:-2048}
replay=0
targets=()
for arg in "$@"; do
  case "$arg" in
    --replay) replay=1 ;;
    torch_file | training_checkpoint | config | csv | safetensors | npy) targets+=("$arg") ;;
    *)
      echo "fuzz: unknown target or option '$arg' (targets: torch_file training_checkpoint config csv safetensors npy; option: --replay)" >&2
      exit 2
      ;;
  esac
done
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(torch_file training_checkpoint config csv safetensors npy)
fi

if [ -f "$build/CMakeCache.txt" ]; then
  if ! grep -q '^DKIT_SANITIZE:STRING=.' "$build/CMakeCache.txt" || ! grep -q '^CMAKE_CXX_COMPILER:.*clang' "$build/CMakeCache.txt"; then
    echo "fuzz: $build is not a clang build with DKIT_SANITIZE; choose another FUZZ_BUILD_DIR" >&2
    exit 1
  fi
  echo "fuzz: using $build"
  configure=(-DDKIT_FUZZ=ON)
else
  cxx=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
  if [ -z "$cxx" ]; then
    echo "fuzz: clang++ not found; install it with scripts/setup.sh --sanitizers" >&2
    exit 1
  fi
  echo "fuzz: configuring $build with $cxx"
  configure=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DDKIT_FUZZ=ON -DDKIT_BUILD_TESTS=OFF
             -DDKIT_BUILD_APP=OFF -DDKIT_INSTALL=OFF -DDKIT_WARNINGS=OFF)
  if command -v ninja >/dev/null; then
    configure+=(-G Ninja)
  fi
fi
mkdir -p "$build"
cmake -S . -B "$build" "${configure[@]}" >"$build/fuzz-configure.log" 2>&1 || { cat "$build/fuzz-configure.log" >&2; exit 1; }
start=$(date +%s)
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]/#/fuzz_}"
echo "fuzz: built in $(($(date +%s) - start)) s"

# Seeds from the real fixtures: every torch.save and safetensors file the tests read, the configs, the CSV files (the
# first byte of a CSV input picks the reader's options: \003 means labels in the last column, \200 no labels).
seeds="$build/fuzz/seeds"
rm -rf "$seeds"
mkdir -p "$seeds"/{torch_file,training_checkpoint,config,csv,safetensors,npy}
cp tests/fixtures/*.pt "$seeds/torch_file/"
cp tests/fixtures/*.safetensors "$seeds/safetensors/"
cp tests/fixtures/npy/*.npy "$seeds/npy/"
cp fuzz/corpus/training_checkpoint/* "$seeds/torch_file/"
cp configs/*.yaml tests/fixtures/*.yaml "$seeds/config/"
for csv in tests/fixtures/*.csv; do
  { printf '\003'; cat "$csv"; } >"$seeds/csv/$(basename "$csv")"
  { printf '\200'; cat "$csv"; } >"$seeds/csv/unlabelled-$(basename "$csv")"
done
{ printf '\003'; head -n 20 data/digits.csv; } >"$seeds/csv/digits-head.csv"
# What earlier runs found, kept as regression tests (tests/fixtures/fuzz/TARGET-*), is replayed every time.
for target in torch_file training_checkpoint config csv safetensors npy; do
  for finding in tests/fixtures/fuzz/"$target"-*; do
    if [ -e "$finding" ]; then
      cp "$finding" "$seeds/$target/"
    fi
  done
done

root=$(pwd)
suppressions="$root/scripts/sanitizers"
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$suppressions/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$suppressions/ubsan.supp"
symbolizer=$(command -v llvm-symbolizer || ls /usr/lib/llvm-*/bin/llvm-symbolizer 2>/dev/null | head -n1 || true)
if [ -n "$symbolizer" ]; then
  export ASAN_SYMBOLIZER_PATH="$symbolizer"
fi
# One thread in LibTorch: the fuzzer runs one input at a time, and OpenMP's threads would only add noise.
export OMP_NUM_THREADS=1

# Runs one target; its exit status goes to BUILD/fuzz/TARGET.status, its output to BUILD/fuzz/TARGET.log.
fuzz_one() {
  local target=$1
  local findings="$build/fuzz/findings/$target"
  local corpus="$build/fuzz/corpus/$target"
  mkdir -p "$corpus" "$findings"
  local inputs=("$corpus" "$seeds/$target")
  if [ -d "fuzz/corpus/$target" ]; then
    inputs+=("fuzz/corpus/$target")
  fi
  local flags=(-timeout="$timeout" -rss_limit_mb=4096 -malloc_limit_mb="$malloc_limit_mb" -print_final_stats=1
               -artifact_prefix="$findings/")
  case "$target" in
    torch_file | training_checkpoint) flags+=(-dict=fuzz/dict/pickle.dict) ;;
    config) flags+=(-dict=fuzz/dict/config.dict) ;;
    safetensors) flags+=(-dict=fuzz/dict/safetensors.dict) ;;
  esac
  if [ "$replay" -eq 1 ]; then
    flags+=(-runs=0)
  else
    flags+=(-max_total_time="$seconds")
  fi
  local status=0
  "$build/fuzz/fuzz_$target" "${flags[@]}" "${inputs[@]}" >"$build/fuzz/$target.log" 2>&1 || status=$?
  echo "$status" >"$build/fuzz/$target.status"
}

if [ "$replay" -eq 1 ]; then
  echo "fuzz: replaying the corpus of ${targets[*]}"
else
  echo "fuzz: fuzzing ${targets[*]} for $seconds s each, $jobs at a time"
fi
running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$target" &
  running=$((running + 1))
done
wait

failed=()
summary=()
for target in "${targets[@]}"; do
  log="$build/fuzz/$target.log"
  status=$(cat "$build/fuzz/$target.status")
  runs=$(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  units=$(grep -o 'corp: [0-9]*' "$log" | tail -n1 | grep -o '[0-9]*$' || echo "?")
  if [ "$status" -ne 0 ]; then
    failed+=("$target")
    summary+=("$(printf '%-20s %10s runs  %6s corpus  FAILED (exit %d), see %s' "$target" "$runs" "$units" "$status" "$log")")
    echo "fuzz: $target FAILED; the end of $log:" >&2
    tail -n 60 "$log" >&2
  else
    summary+=("$(printf '%-20s %10s runs  %6s corpus  ok' "$target" "$runs" "$units")")
  fi
done

if [ "$replay" -eq 1 ]; then
  echo "fuzz: summary (corpus replayed once)"
else
  echo "fuzz: summary (${seconds} s per target)"
fi
printf '  %s\n' "${summary[@]}"
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz: findings in ${failed[*]}: inputs kept in $build/fuzz/findings/" >&2
  exit 1
fi
