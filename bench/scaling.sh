#!/usr/bin/env bash
# Training throughput of `dkit train` on this machine's CPU with one process and with two processes over loopback
# (Gloo), at the same global batch, model and number of steps. The figure is samples/s from summary.json: samples
# of the training steps over their wall time (no start-up, validation or checkpoint writing); in a two-process run,
# rank 0's, which counts every rank's samples. Each configuration runs --repeat times; the median is reported, with
# the machine's load average before each run (other work on a shared machine slows every figure). Beside each dkit
# run, in turns, PyTorch trains the same model, optimizer and shapes the same way (bench/python/ddp_train.py: one
# process, or DistributedDataParallel over Gloo), timed over the same number of steps after 20 warm-up steps;
# --python none leaves it out.
#
#   bench/scaling.sh [--dkit build/dkit] [--python /usr/bin/python3] [--steps 60] [--repeat 3] [--batch 256]
#                    [--hidden 1024,1024] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

dkit=build/dkit
python=/usr/bin/python3
steps=60
repeat=3
batch=256
hidden=1024,1024
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dkit) dkit=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "scaling: unknown option '$1' (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$dkit" ] || { echo "scaling: no dkit at '$dkit': build first, or pass --dkit" >&2; exit 1; }
if [ "$python" != none ] && ! "$python" -c 'import torch' 2>/dev/null; then
  echo "scaling: '$python' cannot import torch: pass --python PATH, or --python none to leave PyTorch out" >&2
  exit 1
fi
if [ $((batch % 2)) -ne 0 ]; then
  echo "scaling: --batch must be even (two processes take half each)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -n "$out" ] && mkdir -p "$out"

cat >"$work/config.yaml" <<EOF
device: cpu
seed: 1
data: {source: synthetic, samples: 40000, features: 256, classes: 10, val_fraction: 0.0}
model: {hidden: [$hidden], dropout: 0.0}
train: {epochs: 100, max_steps: $steps, optimizer: sgd, momentum: 0.9, lr: 0.01, log_every: 20, checkpoint_every: 0}
EOF

free_port() {
  # A port the kernel picks for a socket bound to port 0; free a moment later.
  perl -MIO::Socket::INET -e 'print IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1", LocalPort => 0)->sockport'
}

rate() {
  sed -n 's/.*"samples_per_second":\([0-9.e+-]*\).*/\1/p' "$1"
}

# run LABEL PROCESSES THREADS_PER_PROCESS: prints the samples/s of one run.
run() {
  local label=$1 processes=$2 threads=$3 dir="$work/$1-$RANDOM"
  local per_rank=$((batch / processes))
  if [ "$processes" -eq 1 ]; then
    "$dkit" train --config "$work/config.yaml" --out "$dir" --no-progress \
      --set threads="$threads" --set train.batch_size="$per_rank" >"$dir.out" 2>"$dir.err"
  else
    local port pids=() r
    port=$(free_port)
    for ((r = 0; r < processes; ++r)); do
      RANK=$r WORLD_SIZE=$processes LOCAL_RANK=$r LOCAL_WORLD_SIZE=$processes MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port "$dkit" train --config "$work/config.yaml" --out "$dir" --no-progress \
        --set threads="$threads" --set train.batch_size="$per_rank" >"$dir.out$r" 2>"$dir.err$r" &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do
      wait "$pid"
    done
  fi
  rate "$dir/summary.json"
}

# run_pytorch PROCESSES THREADS_PER_PROCESS: prints the samples/s of one PyTorch run.
run_pytorch() {
  local processes=$1 threads=$2 dir="$work/pytorch-$RANDOM" port pids=() r
  local args=(bench/python/ddp_train.py --samples 40000 --features 256 --classes 10 --hidden "$hidden"
    --batch "$batch" --steps "$steps" --lr 0.01 --momentum 0.9 --threads "$threads")
  port=$(free_port)
  for ((r = 0; r < processes; ++r)); do
    RANK=$r WORLD_SIZE=$processes MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$python" "${args[@]}" >"$dir.out$r" 2>"$dir.err$r" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { echo "scaling: PyTorch rank failed:" >&2; cat "$dir".err* >&2; exit 1; }
  done
  sed -n 's/.*"samples_per_second": \([0-9.e+-]*\).*/\1/p' "$dir.out0"
}

median() {
  sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

configs=("1 1" "1 2" "2 1")
echo "dkit scaling on $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
echo "model 256 -> [$hidden] -> 10, global batch $batch, $steps steps, SGD; median of $repeat runs"
[ -n "$out" ] && echo "processes,threads_per_process,run,samples_per_second,pytorch_samples_per_second,load_before" \
  >"$out/scaling.csv"
declare -A medians
for config in "${configs[@]}"; do
  read -r processes threads <<<"$config"
  values=()
  pytorch_values=()
  loads=()
  for ((i = 1; i <= repeat; ++i)); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    value=$(run "p${processes}t${threads}" "$processes" "$threads")
    pytorch_value=""
    [ "$python" != none ] && pytorch_value=$(run_pytorch "$processes" "$threads")
    values+=("$value")
    pytorch_values+=("$pytorch_value")
    loads+=("$load")
    [ -n "$out" ] && echo "$processes,$threads,$i,$value,$pytorch_value,$load" >>"$out/scaling.csv"
  done
  medians[$config]=$(printf '%s\n' "${values[@]}" | median)
  printf '%d process(es) x %d thread(s): %10.1f samples/s  (runs: %s; load averages before: %s)\n' \
    "$processes" "$threads" "${medians[$config]}" "${values[*]}" "${loads[*]}"
  if [ "$python" != none ]; then
    pytorch_median=$(printf '%s\n' "${pytorch_values[@]}" | median)
    printf '  PyTorch, the same:      %10.1f samples/s  (runs: %s); dkit %.2fx PyTorch\n' "$pytorch_median" \
      "${pytorch_values[*]}" "$(awk -v a="${medians[$config]}" -v b="$pytorch_median" 'BEGIN { print a / b }')"
  fi
done
awk -v a="${medians[1 2]}" -v b="${medians[2 1]}" -v c="${medians[1 1]}" 'BEGIN {
  printf "2 processes x 1 thread vs 1 process x 2 threads: %.2fx; vs 1 process x 1 thread: %.2fx\n", b / a, b / c }'
