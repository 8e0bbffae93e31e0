#!/usr/bin/env bash
# Reading a mapped data set from a cold page cache: the rate dkit's Loader reads a GIB GiB .npy file of inputs
# (scripts/make_npy_dataset.py) at, in file order, shuffled by blocks of BLOCK samples and fully shuffled, beside the
# rate `dd` reads the same file at in order; the page cache is dropped before each read, so it needs root. Then the
# same passes from the page cache. Last, one epoch of training on a 0.25 GiB file, read into memory or mapped from the
# page cache, in turns, five rounds shuffled by blocks and five by single samples.
# DISK (BYTES_PER_S:IOPS, e.g. 125M:3000, a cloud disk's baseline) throttles reads from the file's block device with
# the cgroup v1 blkio controller, so that dd and the Loader read from a disk of known speed whatever caches the
# machine's own disk; LIMIT (e.g. 1G) runs the cold passes in a cgroup v1 memory group of that size, and SECONDS
# stops each cold pass after that long (0: no limit).
#
#   OMP_WAIT_POLICY=PASSIVE bash bench/mapped_read.sh [BUILD_DIR] [GIB] [BLOCK] [DATA_DIR] [DISK] [LIMIT] [SECONDS]
#   # defaults: build 1 1024 /var/tmp/dkit-npy (no throttle) (no limit) 0
set -euo pipefail
build=${1:-build}
gib=${2:-1}
block=${3:-1024}
data=${4:-/var/tmp/dkit-npy}
disk=${5:-}
limit=${6:-}
seconds=${7:-0}
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

groups=()
trap 'for g in "${groups[@]}"; do rmdir "$g" 2>/dev/null || true; done' EXIT
conditions="cold page cache"
if [ -n "$disk" ]; then
  g=/sys/fs/cgroup/blkio/dkit-read-$$
  mkdir "$g"
  groups+=("$g")
  device=$(stat -c '%Hd:%Ld' "$x")
  echo "$device $(numfmt --from=iec "${disk%%:*}")" >"$g/blkio.throttle.read_bps_device"
  echo "$device ${disk##*:}" >"$g/blkio.throttle.read_iops_device"
  conditions+=", reads from device $device throttled to ${disk%%:*}B/s and ${disk##*:} IOPS"
fi
if [ -n "$limit" ]; then
  g=/sys/fs/cgroup/memory/dkit-read-$$
  mkdir "$g"
  groups+=("$g")
  echo "$limit" >"$g/memory.limit_in_bytes"
  conditions+=", memory limited to $limit"
fi
# Runs a command inside the groups above.
grouped() {
  bash -c 'for g in "${@:2:$1}"; do echo $$ >"$g/cgroup.procs"; done; shift $(($1 + 1)); exec "$@"' \
    grouped "${#groups[@]}" "${groups[@]}" "$@"
}

echo "machine: $(nproc) CPUs, OMP_WAIT_POLICY=$OMP_WAIT_POLICY; file: $(du -h "$x" | cut -f1) of inputs, $conditions"
cold
echo "dd in order: $(grouped dd if="$x" of=/dev/null bs=1M 2>&1 | tail -1)"
for order in "read-in-order 256 0" "read 256 $block" "read 256 0"; do
  set -- $order
  cold
  grouped "$program" "$1" "$x" "$y" "$2" "$3" "$seconds"
done
echo "the same passes with the file in the page cache"
cat "$x" "$y" >/dev/null
for order in "read-in-order 256 0" "read 256 $block" "read 256 0"; do
  set -- $order
  "$program" "$1" "$x" "$y" "$2" "$3"
done
[ -n "$disk$limit" ] && exit 0

[ -f "$data/small/x.npy" ] || /usr/bin/python3 scripts/make_npy_dataset.py "$data/small" 0.25
echo "one epoch of training on 0.25 GiB, in memory and mapped from the page cache, in turns"
cat "$data/small/x.npy" "$data/small/y.npy" >/dev/null
for shuffle in "$block" 0; do
  for round in 1 2 3 4 5; do
    "$program" memory "$data/small/x.npy" "$data/small/y.npy" 256 "$shuffle"
    "$program" mapped "$data/small/x.npy" "$data/small/y.npy" 256 "$shuffle"
  done
done
