#!/usr/bin/env bash
# The Trainer's own cost in instructions, which repeat exactly whatever else the machine is doing: callgrind counts
# the instructions of dkit_lenet_steps (the `lenet` suite's loops, one thread) for N and for 2N steps of each loop;
# the difference over N is each loop's instructions per step, the start-up and the data set cancelling out.
#
#   bash bench/lenet_callgrind.sh [BUILD_DIR] [N] [BATCH]      # defaults: build 50 64
set -euo pipefail
build=${1:-build}
steps=${2:-50}
batch=${3:-64}
program="$build/bench/dkit_lenet_steps"
[ -x "$program" ] || { echo "lenet_callgrind: no $program; build the target dkit_lenet_steps" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "lenet_callgrind: valgrind is not installed" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Debian 12's LibTorch loads libhwy (through OpenCV and libjxl), whose start-up reads the time stamp counter with
# RDTSCP, an instruction valgrind 3.19 does not know: a function of the same name, preloaded, answers instead.
printf '#include <stdint.h>\nuint64_t _ZN3hwy8platform15TimerResolutionEv(void) { return 100; }\n' >"$work/hwy.c"
cc -shared -fPIC -O2 -o "$work/hwy.so" "$work/hwy.c"

instructions() {
  OMP_NUM_THREADS=1 LD_PRELOAD="$work/hwy.so" valgrind --tool=callgrind --callgrind-out-file="$work/out" "$program" "$1" "$2" "$batch" synthetic \
    >/dev/null 2>"$work/err"
  sed -n 's/^summary: //p' "$work/out"
}

echo "instructions per LeNet step at batch $batch on one thread ($steps and $((2 * steps)) steps of each loop):"
declare -A per_step
for variant in loop trainer; do
  one=$(instructions "$variant" "$steps")
  two=$(instructions "$variant" $((2 * steps)))
  per_step[$variant]=$(((two - one) / steps))
  printf '  %-8s %14d\n' "$variant" "${per_step[$variant]}"
done
awk -v t="${per_step[trainer]}" -v l="${per_step[loop]}" \
  'BEGIN { printf "  trainer / loop: %.4f (%+.2f%%), %d instructions per step\n", t / l, 100 * (t / l - 1), t - l }'
