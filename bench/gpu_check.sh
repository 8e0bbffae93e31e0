#!/usr/bin/env bash
# Every CUDA path of dkit run and measured on a lent GPU machine in one call (docs/benchmarks.md has the results:
# "Training on a GPU: no step waits" and the H200 rows of each suite): builds dkit against python3's LibTorch with
# scripts/offline_deps.sh, then runs `dkit devices`, the whole
# CTest suite (the CUDA tests first), training on cuda:0 (digits and Fashion-MNIST, pinned and device placements,
# fp32/bf16/fp16, under --check-syncs), torchrun with NCCL, DataParallel, checkpoints and files across C++ and
# Python, compute-sanitizer, and last the GPU's own ceilings and the GPU benchmarks (fp32, bf16 and fp16 among them)
# with PyTorch (eager and torch.compile) beside them.
#
#   bench/gpu_check.sh DEPS [FASHION_MNIST_DIR]
#
# DEPS is the folder `scripts/offline_deps.sh download DEPS` filled; FASHION_MNIST_DIR holds Fashion-MNIST's IDX
# files (Debian's dataset-fashion-mnist: /usr/share/datasets/fashion-mnist), left out when not given. Everything is
# written into one archive, $OUT/gpu-check.tar.gz (OUT defaults to out/gpu-check), renewed after every step, so a
# call stopped at its limit still brings back what ran; the steps' table is printed last. Steps run in order of
# importance within DKIT_GPU_CHECK_SECONDS (default 540): one that would start with under 15 s left is skipped.
# Run it with the device tool as: OUT=$OUT bash bench/gpu_check.sh .deps/debs .deps/fashion-mnist, carrying .deps
# (made here by scripts/offline_deps.sh download .deps/debs, plus a copy of the Fashion-MNIST files).
# DKIT_GPU_CHECK_BUILD=DIR uses a build that exists instead of building (a dry run on any machine).
set -uo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { echo "usage: $0 DEPS [FASHION_MNIST_DIR]" >&2; exit 2; }
deps=$1
fashion=${2:-}
out=${OUT:-out/gpu-check}
budget=${DKIT_GPU_CHECK_SECONDS:-540}
mkdir -p "$out"
root=$(pwd)
work=$(mktemp -d)
logs=$work/gpu-check
runs=$logs/runs
mkdir -p "$runs"
steps=$logs/steps.tsv
printf 'step\trc\tseconds\tnote\n' >"$steps"

export PATH=$PATH:/usr/local/cuda/bin
export PYTHONUNBUFFERED=1
python=$(command -v python3)
build=${DKIT_GPU_CHECK_BUILD:-$root/build-gpu}
dkit=$build/dkit
export python build dkit runs fashion root

archive() {
  tar czf "$out/gpu-check.tar.gz.part" -C "$work" gpu-check && mv "$out/gpu-check.tar.gz.part" "$out/gpu-check.tar.gz"
}

# step NAME SECONDS COMMAND: runs COMMAND (bash) with its output in NAME.log, for at most SECONDS and what is left.
step() {
  local name=$1 limit=$2 command=$3
  local left=$((budget - SECONDS))
  if ((left < 15)); then
    printf '%s\tskipped\t0\tno time left\n' "$name" >>"$steps"
    return 1
  fi
  ((limit > left)) && limit=$left
  local start=$SECONDS rc
  echo "== $name (at ${SECONDS}s, limit ${limit}s)"
  timeout -k 5 "$limit" bash -c "$command" >"$logs/$name.log" 2>&1
  rc=$?
  local note=""
  ((rc == 124 || rc == 137)) && note="stopped at its ${limit}s limit"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$note" >>"$steps"
  archive
  return $rc
}

step environment 30 '
  nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE | head -60
  nproc; free -g; uname -a; cat /etc/os-release | head -3
  "$python" -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name(0), torch.backends.cudnn.version())"
  command -v nvcc cmake ninja gcc g++ compute-sanitizer torchrun; nvcc --version | tail -2; g++ --version | head -1
  cmake --version | head -1'

if [ -z "${DKIT_GPU_CHECK_BUILD:-}" ]; then
  site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
  nccl_h=$(find "$site/nvidia" -name nccl.h 2>/dev/null | head -1)
  cudnn_h=$(find "$site/nvidia" -name cudnn.h 2>/dev/null | head -1)
  cudnn_so=$(find "$site/nvidia" -name 'libcudnn.so*' 2>/dev/null | sort | head -1)
  args="-DTORCH_CUDA_ARCH_LIST=9.0"
  [ -n "$nccl_h" ] && args+=" -DDKIT_NCCL_INCLUDE_DIR=$(dirname "$nccl_h")"
  [ -n "$cudnn_h" ] && args+=" -DCUDNN_INCLUDE_PATH=$(dirname "$cudnn_h")"
  [ -n "$cudnn_so" ] && args+=" -DCUDNN_LIBRARY_PATH=$cudnn_so"
  export DKIT_CMAKE_ARGS="$args" deps
  step build 420 'echo "DKIT_CMAKE_ARGS=$DKIT_CMAKE_ARGS"; bash scripts/offline_deps.sh build "$deps" "$build"' || {
    cp "$build/CMakeFiles/CMakeError.log" "$build/CMakeFiles/CMakeConfigureLog.yaml" "$logs/" 2>/dev/null
    archive
  }
fi

step devices 30 '"$dkit" devices && "$dkit" devices --json'

# The suite: the CUDA tests first (a short log of their own), then every other test. The GPU is visible to all of
# them, so `device: auto` tests train on it too.
step cuda_tests 120 'ctest --test-dir "$build" -R _CUDA -j8 --timeout 100 --output-on-failure'
step ctest 300 'ctest --test-dir "$build" -E _CUDA -j16 --timeout 200 --output-on-failure'

# Training on the GPU: digits (the README's job) and Fashion-MNIST, each placement and precision. --check-syncs
# turns every synchronisation inside a step or batch hand-over into an error, so these runs finishing is the proof.
train() { # NAME CONFIG ARGS...
  local name=$1 config=$2
  shift 2
  step "train_$name" 90 "\"\$dkit\" train --config $config --no-progress --out \"\$runs/$name\" --set device=cuda:0 $*"
}
train digits_pinned configs/digits.yaml --set loader.placement=pinned --set train.tensorboard=true --check-syncs
train digits_device configs/digits.yaml --set loader.placement=device --check-syncs
train digits_bf16 configs/digits.yaml --set loader.placement=pinned --set train.precision=bf16 --check-syncs
train digits_fp16 configs/digits.yaml --set loader.placement=pinned --set train.precision=fp16
# The check's positive control: pageable batches are copied to the GPU the blocking way, which it must catch.
train digits_pageable configs/digits.yaml --set loader.placement=pageable --check-syncs
if [ -n "$fashion" ]; then
  f="configs/fashion_mnist.yaml --set data.path=$fashion"
  train fashion_pinned "$f" --set loader.placement=pinned --check-syncs
  train fashion_device "$f" --set loader.placement=device --check-syncs
  train fashion_bf16 "$f" --set loader.placement=pinned --set train.precision=bf16 --check-syncs
  train fashion_fp16 "$f" --set loader.placement=pinned --set train.precision=fp16
fi

step torchrun_nccl 90 'torchrun --standalone --nproc-per-node=1 --no-python "$dkit" train --config configs/digits.yaml \
  --no-progress --out "$runs/torchrun" --set device=cuda --set train.max_steps=200 && grep -i nccl "$runs/torchrun/train.log"'
step data_parallel 60 '"$dkit" train --config configs/digits.yaml --no-progress --out "$runs/data_parallel" \
  --set device=cuda --set dist.data_parallel=true --set train.max_steps=200'

# Files across devices and languages: PyTorch 2.x saves on the GPU, dkit reads on the CPU and the GPU and predicts
# what PyTorch did; dkit saved on the GPU, PyTorch and dkit read it back.
step interop 90 '
  set -e
  py=$runs/python; digits=$runs/digits_pinned
  "$python" bench/python/gpu_check.py save "$py"
  "$dkit" inspect "$py/state_dict.pt"; "$dkit" inspect "$py/general.pt"
  for d in cpu cuda:0; do
    for f in state_dict general; do
      "$dkit" predict --checkpoint "$py/$f.pt" --input "$py/rows.csv" --device $d --output "$py/$f-$d.csv"
      "$python" bench/python/gpu_check.py compare "$py/logits.csv" "$py/$f-$d.csv"
    done
  done
  "$dkit" inspect "$digits/checkpoints/last.pt"
  tail -n 3 data/digits.csv | cut -d, -f1-64 > "$runs/rows.csv"
  for d in cpu cuda:0; do "$dkit" predict --checkpoint "$digits/checkpoints/last.pt" --input "$runs/rows.csv" --device $d; done
  "$dkit" export --checkpoint "$digits/checkpoints/last.pt" --output "$runs/export.pt"
  "$dkit" export --checkpoint "$digits/checkpoints/last.pt" --output "$runs/export.safetensors"
  "$dkit" inspect "$runs/export.safetensors"
  "$python" bench/python/gpu_check.py read "$digits" "$runs/export.pt" "$runs/export.safetensors"'

# The pinned ring and the copy stream under compute-sanitizer: a short run on Fashion-MNIST (digits without it).
sanitized="--set loader.placement=pinned --set train.max_steps=40 --set train.log_every=10"
if [ -n "$fashion" ]; then
  sanitized="--config configs/fashion_mnist.yaml --set data.path=$fashion $sanitized"
else
  sanitized="--config configs/digits.yaml $sanitized"
fi
export sanitized
for tool in memcheck racecheck; do
  step "sanitizer_$tool" 120 "compute-sanitizer --tool $tool --error-exitcode 99 \"\$dkit\" train \$sanitized \
    --no-progress --out \"\$runs/sanitizer_$tool\" --set device=cuda:0"
done

# The GPU's ceilings as PyTorch reaches them, then dkit's benchmarks with PyTorch beside them, back to back (last:
# docs/benchmarks.md shows a full set: the H200 rows of each suite). The training suites' limits allow for PyTorch's
# processes, up to three per row, each a few seconds to start.
step peaks 60 '"$python" bench/python/gpu_check.py peaks'
bench() { # SUITE SECONDS ARGS...
  local suite=$1 limit=$2
  shift 2
  step "bench_$suite" "$limit" "\"\$dkit\" bench $suite --device cuda --python \"\$python\" --csv \"\$runs/bench_$suite.csv\" --json \"\$runs/bench_$suite.json\" $*"
}
bench matmul 60 --sizes 1000,4096,8192 --quick
bench train 150 --sizes 64,256,4096 --quick
bench optimizers 240 --sizes 64,256,4096 --quick
bench precision 150 --sizes 64,256,4096 --quick
bench transfer 60 --quick
bench logging 60 --quick
step compile 120 'for mode in "" reduce-overhead; do
    "$python" bench/python/mlp_train.py --device cuda --loops slicing --batch 64 --steps 2000 --warmup 300 \
      --repeat 3 --optimizer adam ${mode:+--compile $mode}
  done'

rm -rf "$runs/python" "$runs"/*/checkpoints "$runs"/*.pt "$runs"/*.safetensors
archive
echo
echo "== steps (logs in $out/gpu-check.tar.gz)"
cat "$steps"
for f in "$runs"/*/summary.json; do
  [ -f "$f" ] && echo "$(basename "$(dirname "$f")"): $(tr -d '\n' <"$f")"
done
grep -h "x PyTorch\|x its matrix\|GFLOP/s\|graph\|trains at" "$logs"/bench_*.log 2>/dev/null | cut -c1-220 | head -60
tail -n 12 "$logs/cuda_tests.log" "$logs/ctest.log" 2>/dev/null
