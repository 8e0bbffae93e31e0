#!/usr/bin/env bash
# Data bigger than memory: trains one epoch of an MLP on a .npy data set of GIB GiB (scripts/make_npy_dataset.py)
# inside a cgroup v1 memory group limited to LIMIT, mapped from a cold page cache and shuffled by blocks of BLOCK
# samples (0: single samples), for at most SECONDS (0: no limit); then, for the baseline, the same model on a small
# data set read into memory. Prints each run's samples/s and peak anonymous memory. Needs root (to drop the page
# cache) and the cgroup v1 memory controller at /sys/fs/cgroup/memory.
#
#   OMP_WAIT_POLICY=PASSIVE bash bench/mapped_memory.sh [BUILD_DIR] [GIB] [LIMIT] [DATA_DIR] [BLOCK] [SECONDS]
#   # defaults: build 4 1G /var/tmp/dkit-npy 1024 0
set -euo pipefail
build=${1:-build}
gib=${2:-4}
limit=${3:-1G}
data=${4:-/var/tmp/dkit-npy}
block=${5:-1024}
seconds=${6:-0}
program="$build/bench/dkit_mapped_train"
[ -x "$program" ] || { echo "mapped_memory: no $program; build the target dkit_mapped_train" >&2; exit 1; }
group=/sys/fs/cgroup/memory/dkit-mapped-$$
[ -d /sys/fs/cgroup/memory ] || { echo "mapped_memory: no cgroup v1 memory controller" >&2; exit 1; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

[ -f "$data/$gib/x.npy" ] || /usr/bin/python3 scripts/make_npy_dataset.py "$data/$gib" "$gib"
[ -f "$data/small/x.npy" ] || /usr/bin/python3 scripts/make_npy_dataset.py "$data/small" 0.25

mkdir "$group"
trap 'rmdir "$group" 2>/dev/null || true' EXIT
echo "$limit" >"$group/memory.limit_in_bytes"
echo "machine: $(nproc) CPUs, OMP_WAIT_POLICY=$OMP_WAIT_POLICY, cgroup limit $limit"
echo "file: $(du -h "$data/$gib/x.npy" | cut -f1) of inputs, cold page cache, shuffled by blocks of $block"
sync
echo 3 >/proc/sys/vm/drop_caches
bash -c "echo \$\$ >$group/cgroup.procs; exec $program mapped $data/$gib/x.npy $data/$gib/y.npy 256 $block $seconds"
echo "the cgroup's peak usage (page cache included): $(($(cat "$group/memory.max_usage_in_bytes") / 1048576)) MiB;" \
  "OOM kills: $(grep -c . "$group/memory.oom_control" >/dev/null && awk '/oom_kill /{print $2}' "$group/memory.oom_control")"
"$program" memory "$data/small/x.npy" "$data/small/y.npy"
"$program" mapped "$data/small/x.npy" "$data/small/y.npy"
