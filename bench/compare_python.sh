#!/usr/bin/env bash
# dkit's full trainer against real PyTorch on the CPU, measured in the same run.
#
#   bench/compare_python.sh [--dkit BUILD/dkit] [--python /usr/bin/python3] [--rounds 3] [--steps 3000]
#                           [--batch 64] [--threads 2] [--out DIR] [--no-matmul] [--baseline OTHER/dkit]
#
# Both sides train the MLP [64, 256, 256, 10] with Adam (lr 1e-3) on data/digits.csv (standardised), batch 64,
# the same number of steps and the same number of threads:
#   dkit     `dkit train --config configs/digits.yaml` with threads, device=cpu and train.max_steps set: the whole
#            trainer (loader, on-device metrics flushed every 20 steps, checkpoints every 200 steps, validation
#            after each epoch); its figure is summary.json's samples_per_second, whose clock runs over the training
#            steps only (no start-up, data reading, validation or checkpoint writing) but includes the first steps,
#            and, beside it, the steady state from metrics.csv's windows after the first 100 steps.
#   PyTorch  bench/python/mlp_train.py: a DataLoader(TensorDataset) loop and a tensor-slicing loop, each timed
#            after 100 untimed warm-up steps (steady state); the faster loop is the one compared.
# Each round runs both (their order alternating from round to round, so that a drift in the machine's load hits
# them alike) and records the load average; the summary gives every round, the median and the spread.
# It also gives the ratio of each side's fastest round, which a burst of load from elsewhere touches least.
#
# It also runs `dkit bench matmul` on the CPU with the same threads and reports the training step's arithmetic
# rate, FLOPs per step = 6 * B * sum(in * out) + 13 per parameter (Adam), over the measured step time, as a
# fraction of the best matmul rate of the same run and of the rate at n = 256.
#
# --baseline runs a second dkit command (another build, e.g. of an older commit) the same way in every round, to
# measure a change of dkit's speed against the same PyTorch figures.
#
# Outputs go to DIR (default: a new folder under /tmp): every raw output, results.json and summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

dkit=build/dkit
python=/usr/bin/python3
rounds=3
steps=3000
batch=64
threads=2
out=""
matmul=1
baseline=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dkit) dkit=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-matmul) matmul=0; shift ;;
    --baseline) baseline=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_python: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$dkit" ] || { echo "compare_python: no dkit command at '$dkit' (build it, or give --dkit)" >&2; exit 1; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "compare_python: no dkit command at '$baseline'" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null || { echo "compare_python: '$python' cannot import torch" >&2; exit 1; }
[ -n "$out" ] || out=$(mktemp -d /tmp/dkit-compare-XXXXXX)
mkdir -p "$out"

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
log() { echo "$*" | tee -a "$out/session.txt"; }

log "== $(date -u +%Y-%m-%dT%H:%M:%SZ) | loadavg $(loadavg) | $(nproc) CPUs | $("$dkit" --version)"
log "   PyTorch $("$python" -c 'import torch; print(torch.__version__)') ($python); batch $batch, $steps steps, $threads threads, $rounds rounds"

run_python() {
  local round=$1
  log "-- round $round PyTorch | $(date -u +%H:%M:%S) | loadavg $(loadavg)"
  "$python" bench/python/mlp_train.py --data data/digits.csv --hidden 256,256 --batch "$batch" --steps "$steps" \
    --warmup 100 --threads "$threads" --loops dataloader,slicing >"$out/python-$round.jsonl"
  echo "{\"round\": $round, \"loadavg\": \"$(loadavg)\"}" >"$out/python-$round.load"
}

run_dkit() {
  local round=$1 name=${2:-dkit} command=${3:-$dkit}
  log "-- round $round $name ($command) | $(date -u +%H:%M:%S) | loadavg $(loadavg)"
  rm -rf "$out/$name-$round"
  "$command" train --config configs/digits.yaml --set device=cpu --set threads="$threads" \
    --set train.batch_size="$batch" --set train.max_steps="$steps" --set train.epochs=100000 \
    --out "$out/$name-$round" --no-progress >"$out/$name-$round.out" 2>&1
  echo "{\"round\": $round, \"loadavg\": \"$(loadavg)\"}" >"$out/$name-$round.load"
}

for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then
    run_python "$round"; run_dkit "$round"
    [ -z "$baseline" ] || run_dkit "$round" baseline "$baseline"
  else
    [ -z "$baseline" ] || run_dkit "$round" baseline "$baseline"
    run_dkit "$round"; run_python "$round"
  fi
done

if [ "$matmul" -eq 1 ]; then
  log "-- matmul | $(date -u +%H:%M:%S) | loadavg $(loadavg)"
  "$dkit" bench matmul --device cpu --threads "$threads" --sizes 64,128,256,512,1024,2048,4096 --repeat 5 \
    --quiet --csv "$out/matmul.csv" >"$out/matmul.txt"
fi
log "== end $(date -u +%Y-%m-%dT%H:%M:%SZ) | loadavg $(loadavg)"

"$python" - "$out" "$rounds" "$batch" <<'PYTHON' | tee "$out/summary.txt"
import csv, json, os, statistics, sys

out, rounds, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SUM_IN_OUT = 64 * 256 + 256 * 256 + 256 * 10
PARAMETERS = SUM_IN_OUT + 256 + 256 + 10
ADAM_FLOPS = 13


def gflops(samples_per_second, samples_per_step):
    steps_per_second = samples_per_second / samples_per_step
    return (6 * SUM_IN_OUT * samples_per_second + ADAM_FLOPS * PARAMETERS * steps_per_second) / 1e9


def dkit_steady(folder, samples_per_step, skip=100):
    """Samples/s over metrics.csv's training windows that start after step `skip`."""
    samples = seconds = 0.0
    previous = 0
    with open(os.path.join(folder, "metrics.csv")) as f:
        for row in csv.DictReader(f):
            if not row["samples_per_second"]:
                continue
            step, rate = int(row["step"]), float(row["samples_per_second"])
            if previous >= skip and rate > 0:
                window = (step - previous) * samples_per_step
                samples += window
                seconds += window / rate
            previous = step
    return samples / seconds if seconds else float("nan")


rows = []
for r in range(1, rounds + 1):
    loops = [json.loads(line) for line in open(os.path.join(out, f"python-{r}.jsonl")) if line.startswith("{")]
    best = max(loops, key=lambda loop: loop["samples_per_second"])
    summary = json.load(open(os.path.join(out, f"dkit-{r}", "summary.json")))
    per_step = summary["samples"] / summary["steps"]
    steady = dkit_steady(os.path.join(out, f"dkit-{r}"), per_step)
    rows.append({
        "round": r,
        "python_loop": best["loop"],
        "python": best["samples_per_second"],
        "python_ms_per_step": best["ms_per_step"],
        "python_loops": {loop["loop"]: loop["samples_per_second"] for loop in loops},
        "python_samples_per_step": best["samples"] / best["steps"],
        "python_load": json.load(open(os.path.join(out, f"python-{r}.load")))["loadavg"],
        "dkit_whole": summary["samples_per_second"],
        "dkit_steady": steady,
        "dkit_ms_per_step": 1e3 * summary["train_seconds"] / summary["steps"],
        "dkit_samples_per_step": per_step,
        "dkit_host_syncs": summary["host_syncs"],
        "dkit_val_accuracy": summary["val_accuracy"],
        "dkit_load": json.load(open(os.path.join(out, f"dkit-{r}.load")))["loadavg"],
    })
    rows[-1]["ratio_steady"] = steady / best["samples_per_second"]
    rows[-1]["ratio_whole"] = summary["samples_per_second"] / best["samples_per_second"]
    if os.path.exists(os.path.join(out, f"baseline-{r}", "summary.json")):
        base = json.load(open(os.path.join(out, f"baseline-{r}", "summary.json")))
        base_steady = dkit_steady(os.path.join(out, f"baseline-{r}"), base["samples"] / base["steps"])
        rows[-1]["baseline_whole"] = base["samples_per_second"]
        rows[-1]["baseline_steady"] = base_steady
        rows[-1]["baseline_ratio_steady"] = base_steady / best["samples_per_second"]
        rows[-1]["speedup_over_baseline"] = steady / base_steady
        rows[-1]["baseline_load"] = json.load(open(os.path.join(out, f"baseline-{r}.load")))["loadavg"]

matmul = {}
if os.path.exists(os.path.join(out, "matmul.csv")):
    with open(os.path.join(out, "matmul.csv")) as f:
        for row in csv.DictReader(f):
            if row["device"] == "cpu" and row["dtype"] == "float32":
                matmul[int(row["n"])] = float(row["gflops"])


def spread(key):
    values = [row[key] for row in rows]
    return statistics.median(values), min(values), max(values)


print(f"PyTorch vs dkit train, batch {batch}, {rounds} round(s) (samples/s; load = 1/5/15-minute load average at the start)")
print(f"{'round':>5}  {'PyTorch (faster loop)':>26}  {'dkit whole loop':>15}  {'dkit steady':>11}  {'ratio':>6}  {'ratio (whole)':>13}  load (py | dkit)")
for row in rows:
    print(f"{row['round']:>5}  {row['python']:>16.0f} ({row['python_loop']:>9})  {row['dkit_whole']:>15.0f}  "
          f"{row['dkit_steady']:>11.0f}  {row['ratio_steady']:>6.2f}  {row['ratio_whole']:>13.2f}  "
          f"{row['python_load']} | {row['dkit_load']}")
baseline = "baseline_steady" in rows[0]
if baseline:
    print("baseline (--baseline), steady samples/s per round: " +
          ", ".join(f"{row['baseline_steady']:.0f} (load {row['baseline_load'].split()[0]})" for row in rows))
result = {"rounds": rows}
keys = ["python", "dkit_whole", "dkit_steady", "ratio_steady", "ratio_whole", "python_ms_per_step", "dkit_ms_per_step"]
if baseline:
    keys += ["baseline_whole", "baseline_steady", "baseline_ratio_steady", "speedup_over_baseline"]
for key in keys:
    median, low, high = spread(key)
    result[key] = {"median": median, "min": low, "max": high}
    print(f"{key:>18}: median {median:.4g}  (min {low:.4g}, max {high:.4g})")
best_python = max(row["python"] for row in rows)
best_dkit = max(row["dkit_steady"] for row in rows)
result["best_of_rounds"] = {"python": best_python, "dkit_steady": best_dkit, "ratio": best_dkit / best_python}
print(f"     best of rounds: PyTorch {best_python:.4g}, dkit steady {best_dkit:.4g}, ratio {best_dkit / best_python:.3f}"
      " (each side's fastest round, as timeit's minimum: the estimate least touched by other load)")
if matmul:
    best_n = max(matmul, key=matmul.get)
    result["matmul_gflops"] = matmul
    steady = result["dkit_steady"]["median"]
    rate = gflops(steady, statistics.median(row["dkit_samples_per_step"] for row in rows))
    py_rate = gflops(result["python"]["median"], statistics.median(row["python_samples_per_step"] for row in rows))
    result["dkit_step_gflops"] = rate
    result["python_step_gflops"] = py_rate
    result["matmul_best"] = {"n": best_n, "gflops": matmul[best_n]}
    print(f"matmul (dkit bench matmul, same run): best {matmul[best_n]:.1f} GFLOP/s at n={best_n}; " +
          ", ".join(f"n={n}: {g:.1f}" for n, g in sorted(matmul.items())))
    print(f"dkit step (steady, median): {rate:.1f} GFLOP/s = {rate / matmul[best_n]:.3f} of the best matmul rate"
          + (f", {rate / matmul[256]:.3f} of the n=256 rate" if 256 in matmul else ""))
    print(f"PyTorch step (median):      {py_rate:.1f} GFLOP/s = {py_rate / matmul[best_n]:.3f} of the best matmul rate")
    print(f"(FLOPs per step = 6 * B * {SUM_IN_OUT} + {ADAM_FLOPS} * {PARAMETERS}, B the samples per step)")
json.dump(result, open(os.path.join(out, "results.json"), "w"), indent=1)
print(f"outputs in {out}")
PYTHON
