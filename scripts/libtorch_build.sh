#!/usr/bin/env bash
# The build that scripts/check_libtorch.sh runs inside each Debian root (usable on any machine that has the
# packages):
#
#   scripts/libtorch_build.sh full SOURCE BUILD JOBS   # configure, build everything, run the whole suite (through
#                                                      # scripts/test_shards.sh: the GoogleTest program in
#                                                      # shards beside ctest for the other tests, JOBS at once)
#   scripts/libtorch_build.sh shared SOURCE BUILD JOBS # the same with -DBUILD_SHARED_LIBS=ON: libdkit.so, which the
#                                                      # packaging tests install and build the examples against
#   scripts/libtorch_build.sh cuda SOURCE BUILD JOBS   # CUDA LibTorch: configure (CUDA, NCCL and DataParallel must
#                                                      # be on), build everything, list the CUDA-gated sources
set -euo pipefail
mode=$1 source=$2 build=$3 jobs=$4
cd "$source"

say() {
  echo "libtorch_build: $*"
}

# Compiles through ccache where it is installed (scripts/check_libtorch.sh installs it in its roots), and says after
# the build how many compilations it took from the cache.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  ccache --zero-stats >/dev/null
fi
# Builds everything into BUILD, its output in BUILD.build.log (the end of it shown on failure), then the cache's line.
build_all() {
  cmake --build "$build" --parallel "$jobs" >"$build.build.log" 2>&1 || { tail -n 60 "$build.build.log"; exit 1; }
  if [ ${#launcher[@]} -gt 0 ]; then
    say "ccache: $(ccache --print-stats | awk -F'\t' '$1 ~ /^(direct|preprocessed)_cache_hit$/ { hits += $2 }
      $1 == "cache_miss" { misses = $2 } $1 == "could_not_use_precompiled_header" { pch = $2 }
      END { printf "%d compilations from the cache, %d compiled, %d without the precompiled header",
        hits, misses, pch }')"
  fi
}

case $mode in
  full | shared)
    kind=()
    [ "$mode" = shared ] && kind=(-DBUILD_SHARED_LIBS=ON)
    cmake -S . -B "$build" "${launcher[@]}" "${kind[@]}" | grep -E '^-- dkit:'
    say "building"
    build_all
    say "testing"
    bash scripts/test_shards.sh "$build" "$jobs" -LE dockerfile
    ;;
  cuda)
    # Without cuDNN, which libtorch_cuda.so needs, the linker is told to leave symbols of shared libraries
    # unresolved: the link checks dkit's own symbols, nothing is run (the test list too is read only when CTest
    # runs, not after the link, since the test program cannot start without cuDNN).
    # The sources are compiled in the batches of the other builds (DKIT_UNITY_BUILD); the list below finds every
    # CUDA-gated source's own object or the batch that includes it. Since nothing of it runs, it is optimized at -O1,
    # which compiles faster than Release's -O3 (docs/building.md); GCC's warnings that need optimization still run.
    cmake -S . -B "$build" "${launcher[@]}" -DCMAKE_CUDA_COMPILER=/usr/bin/nvcc \
      "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--unresolved-symbols=ignore-in-shared-libs \
      -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--unresolved-symbols=ignore-in-shared-libs | grep -E '^-- dkit:'
    for flag in CUDA NCCL DATA_PARALLEL; do
      if ! grep -q "#define DKIT_WITH_$flag 1" "$build/generated/dkit/config.h"; then
        say "DKIT_WITH_$flag is off: this LibTorch cannot check dkit's CUDA code"
        exit 1
      fi
    done
    say "building with CUDA, NCCL and DataParallel on"
    build_all
    missing=0
    for file in $(grep -rlE --include='*.cpp' 'DKIT_WITH_(CUDA|NCCL|DATA_PARALLEL)' lib app tests bench fuzz | sort); do
      found=$(find "$build" -name "$(basename "$file").o" -newer "$build/generated/dkit/config.h" | head -n 1)
      for batch in $(grep -rlF --include='unity_*.cxx' "#include \"$source/$file\"" "$build"); do
        if [ "$batch.o" -nt "$build/generated/dkit/config.h" ]; then
          found=$batch.o
        fi
      done
      if [ -n "$found" ]; then
        say "compiled with CUDA on: $file"
      else
        say "NOT compiled: $file"
        missing=1
      fi
    done
    [ "$missing" -eq 0 ] || exit 1
    say "cuda is a compile-and-link check: cuDNN is absent and there is no GPU, so nothing was run"
    ;;
  *)
    echo "usage: scripts/libtorch_build.sh full|cuda SOURCE BUILD JOBS" >&2
    exit 2
    ;;
esac
