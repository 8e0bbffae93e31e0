#!/usr/bin/env bash
# Reading a mapped data set from a cold page cache: the rate dkit's Loader reads a GIB GiB .npy file of inputs
# (scripts/make_npy_dataset.py) at, in file order, shuffled by blocks of BLOCK samples and fully shuffled, beside the
# rate `dd` reads the same file at in order; the page cache is dropped before each read, so it needs root. Then the
# same passes from the page cache. Last, one epoch of training on a 0.25 GiB file, read into memory or mapped from the
# page cache, in turns.
#
#   OMP_WAIT_POLICY=PASSIVE bash bench/mapped_read.sh [BUILD_DIR] [GIB] [BLOCK] [DATA_DIR]   # build 1 1024 /var/tmp/dkit-npy
set -euo pipefail
build=${1:-build}
gib=${2:-1}
block=${3:-1024}
data=${4:-/var/tmp/dkit-npy}
program="$build/bench/dkit_mapped_train"
[ -x "$program" ] || { echo "mapped_read: no $program; build the target dkit_mapped_train" >&2; exit 1; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
[ -f "$data/$gib/x.npy" ] || /usr/bin/python3 scripts/make_npy_dataset.py "$data/$gib" "$gib"
x=$data/$gib/x.npy
y=$data/$gib/y.npy

cold() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
}

echo "machine: $(nproc) CPUs, OMP_WAIT_POLICY=$OMP_WAIT_POLICY; file: $(du -h "$x" | cut -f1) of inputs, cold page cache"
cold
echo "dd in order: $(dd if="$x" of=/dev/null bs=1M 2>&1 | tail -1)"
for order in "read-in-order 256 0" "read 256 $block" "read 256 0"; do
  set -- $order
  cold
  "$program" "$1" "$x" "$y" "$2" "$3"
done
echo "the same passes with the file in the page cache"
cat "$x" "$y" >/dev/null
for order in "read-in-order 256 0" "read 256 $block" "read 256 0"; do
  set -- $order
  "$program" "$1" "$x" "$y" "$2" "$3"
done

[ -f "$data/small/x.npy" ] || /usr/bin/python3 scripts/make_npy_dataset.py "$data/small" 0.25
echo "one epoch of training on 0.25 GiB, in memory and mapped from the page cache, in turns"
cat "$data/small/x.npy" "$data/small/y.npy" >/dev/null
for round in 1 2 3; do
  "$program" memory "$data/small/x.npy" "$data/small/y.npy"
  "$program" mapped "$data/small/x.npy" "$data/small/y.npy"
done
