#!/usr/bin/env bash
# Peak resident memory of `dkit train` against the size of its data set.
#
#   bench/data_memory.sh [--dkit BUILD/dkit] [--mnist /usr/share/datasets/fashion-mnist] [--percent "10 25 50 75 100"]
#                        [--placement "device pinned pageable"]
#
# For each percentage, writes the first N% of Fashion-MNIST's training images and labels as gzipped IDX files (as
# Debian ships them), then runs `dkit train` on them for one step on the CPU under /usr/bin/time -v, once per
# loader placement, and prints the peak resident set size beside the data set's size as float32. The baseline is
# the same run on a data set of 600 images (1%): the process with LibTorch loaded and almost no data. The goal:
# peak <= baseline + 2 x the float32 data set. Needs /usr/bin/python3 (only its standard library) and Debian's
# dataset-fashion-mnist (apt-get install dataset-fashion-mnist).
set -euo pipefail
cd "$(dirname "$0")/.."

dkit=build/dkit
mnist=/usr/share/datasets/fashion-mnist
percents="10 25 50 75 100"
placements="device pinned pageable"
while [ $# -gt 0 ]; do
  case $1 in
    --dkit) dkit=$2; shift 2 ;;
    --mnist) mnist=$2; shift 2 ;;
    --percent) percents=$2; shift 2 ;;
    --placement) placements=$2; shift 2 ;;
    *) echo "data_memory: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$dkit" ] || { echo "data_memory: no dkit at $dkit (build first)" >&2; exit 1; }
[ -f "$mnist/train-images-idx3-ubyte.gz" ] || { echo "data_memory: no Fashion-MNIST in $mnist" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# make_subset PERCENT DIR: the first PERCENT% of the training set, as train-{images,labels} IDX .gz files.
make_subset() {
  /usr/bin/python3 - "$mnist" "$1" "$2" <<'EOF'
import gzip, os, struct, sys
source, percent, target = sys.argv[1], float(sys.argv[2]), sys.argv[3]
os.makedirs(target, exist_ok=True)
for name, header in (("train-images-idx3-ubyte", 16), ("train-labels-idx1-ubyte", 8)):
    data = gzip.open(os.path.join(source, name + ".gz")).read()
    count = struct.unpack(">I", data[4:8])[0]
    keep = max(1, int(count * percent / 100))
    item = (len(data) - header) // count
    head = data[:4] + struct.pack(">I", keep) + data[8:header]
    with gzip.open(os.path.join(target, name + ".gz"), "wb", compresslevel=1) as out:
        out.write(head + data[header:header + keep * item])
EOF
}

# peak_mb DIR PLACEMENT: peak RSS in MiB of a one-step run on the IDX folder DIR.
peak_mb() {
  local kb
  kb=$(/usr/bin/time -v "$dkit" train --config configs/fashion_mnist.yaml --set "data.path=$1" \
         --set train.max_steps=1 --set device=cpu --set "loader.placement=$2" --set train.checkpoint_every=0 \
         --out "$work/run-$RANDOM" --no-progress 2>&1 >/dev/null | awk '/Maximum resident set size/ { print $NF }')
  echo $((kb / 1024))
}

make_subset 1 "$work/p1"
echo "dkit: $("$dkit" --version)"
echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-9s %-9s %12s %12s %10s %16s\n' percent images "float32 MiB" placement "peak MiB" "over baseline"
for placement in $placements; do
  baseline=$(peak_mb "$work/p1" "$placement")
  printf '%-9s %-9s %12s %12s %10s %16s\n' 1 600 1.9 "$placement" "$baseline" "(baseline)"
  for percent in $percents; do
    [ -d "$work/p$percent" ] || make_subset "$percent" "$work/p$percent"
    images=$((60000 * percent / 100))
    float_mb=$(awk -v n="$images" 'BEGIN { printf "%.1f", n * 784 * 4 / 1048576 }')
    peak=$(peak_mb "$work/p$percent" "$placement")
    ratio=$(awk -v p="$peak" -v b="$baseline" -v f="$float_mb" 'BEGIN { printf "%.2f x data", (p - b) / f }')
    printf '%-9s %-9s %12s %12s %10s %16s\n' "$percent" "$images" "$float_mb" "$placement" "$peak" "$ratio"
  done
done
