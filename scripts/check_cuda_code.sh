#!/usr/bin/env bash
# Compiles (syntax only) every source that has CUDA-only code as if the found LibTorch had CUDA, against Debian's
# LibTorch headers and a local CUDA toolkit. For machines without a CUDA LibTorch: it catches CUDA code that no
# longer compiles, though only against LibTorch 1.13's API; a real CUDA build (docs/gpu.md) is the full check.
#
#   scripts/check_cuda_code.sh [BUILD_DIR]      # BUILD_DIR: a configured build tree, default build
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cuda_include=${CUDA_HOME:-/usr/local/cuda}/include
if [ ! -f "$cuda_include/cuda_runtime_api.h" ]; then
  echo "check_cuda_code: no CUDA toolkit headers under $cuda_include (set CUDA_HOME)" >&2
  exit 1
fi
if [ ! -f "$build/generated/dkit/config.h" ]; then
  echo "check_cuda_code: configure first: cmake -S . -B $build" >&2
  exit 1
fi
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/dkit" "$shim/c10/cuda/impl"
# DataParallel comes with CUDA. NCCL stays as configured: its nccl.h is not part of the CUDA toolkit, so the NCCL
# sections are checked only where NCCL's headers are (a real CUDA build).
sed -e 's/#define DKIT_WITH_CUDA 0/#define DKIT_WITH_CUDA 1/' \
    -e 's/#define DKIT_WITH_DATA_PARALLEL 0/#define DKIT_WITH_DATA_PARALLEL 1/' \
    "$build/generated/dkit/config.h" >"$shim/dkit/config.h"
# Debian's CPU-only package leaves out this generated header that c10/cuda's headers include.
if [ ! -f /usr/include/c10/cuda/impl/cuda_cmake_macros.h ]; then
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$shim/c10/cuda/impl/cuda_cmake_macros.h"
fi
status=0
for source in $(grep -rl --include='*.cpp' 'DKIT_WITH_CUDA' lib app tests bench 2>/dev/null | sort); do
  echo "check_cuda_code: $source"
  if ! g++ -std=c++17 -fsyntax-only -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO -DDKIT_FIXTURES_DIR='""' -DDKIT_BENCH_SOURCE_DIR='""' \
      -I"$shim" -I"$build/include" -Itests -I/usr/include/torch/csrc/api/include -I"$cuda_include" \
      "$source"; then
    status=1
  fi
done
exit $status
