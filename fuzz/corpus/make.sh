#!/usr/bin/env bash
# Remakes the committed seeds that no fixture provides: small dkit training checkpoints (Adam, SGD, AdamW) and
# their data.pkl, the data.pkl of a few tests/fixtures files, a resolved config and a config with --set overrides,
# and safetensors files of the shapes the fixtures lack (no tensor, a 0-dim one, empty ones, a header not in offset
# order, escaped strings).
#   fuzz/corpus/make.sh [BUILD_DIR]      # BUILD_DIR holds the dkit command (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
dkit="${1:-build}/dkit"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

common='device: cpu
threads: 1
seed: 1
data: {source: synthetic, samples: 40, features: 3, classes: 2}'
printf '%s\nmodel: {hidden: [4], dropout: 0.1}\ntrain: {epochs: 1, batch_size: 8, max_steps: 2, checkpoint_every: 0}\n' \
  "$common" >"$work/adam.yaml"
printf '%s\nmodel: {hidden: [2, 3], activation: tanh}\ntrain: {epochs: 1, batch_size: 8, max_steps: 2, optimizer: sgd}\n' \
  "$common" >"$work/sgd.yaml"
printf '%s\nmodel: {hidden: [4], dropout: 0.1}\ntrain: {epochs: 1, batch_size: 8, max_steps: 2, optimizer: adamw}\n' \
  "$common" >"$work/adamw.yaml"
for name in adam sgd adamw; do
  "$dkit" train --config "$work/$name.yaml" --out "$work/$name" --no-progress >/dev/null 2>&1
done

python3 - "$work" <<'PY'
import json, os, shutil, struct, sys, zipfile
work = sys.argv[1]
def data_pkl(archive, out):
    with zipfile.ZipFile(archive) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        open(out, "wb").write(z.read(name))
for name in ("adam", "sgd", "adamw"):
    data_pkl(f"{work}/{name}/checkpoints/last.pt", f"fuzz/corpus/training_checkpoint/{name}.pkl")
for name in ("adam", "sgd"):
    shutil.copy(f"{work}/{name}/checkpoints/last.pt", f"fuzz/corpus/training_checkpoint/{name}.pt")
for name in ("state_dict", "general_checkpoint", "os_system", "nested_state_dict", "dtype_bfloat16", "data_parallel"):
    data_pkl(f"tests/fixtures/{name}.pt", f"fuzz/corpus/torch_file/{name}.pkl")
shutil.copy(f"{work}/adam/config.yaml", "fuzz/corpus/config/resolved.yaml")

def safetensors(name, header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    open(f"fuzz/corpus/safetensors/{name}", "wb").write(struct.pack("<Q", len(text)) + text + data)
os.makedirs("fuzz/corpus/safetensors", exist_ok=True)
safetensors("no_tensors.safetensors", {"__metadata__": {"format": "pt"}}, b"")
safetensors("shapes.safetensors", {
    "scalar": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},
    "empty": {"dtype": "I32", "shape": [0, 3], "data_offsets": [8, 8]},
    "mask": {"dtype": "BOOL", "shape": [2, 0, 2], "data_offsets": [8, 8]},
    "bytes": {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]}}, struct.pack("<d", 2.5) + b"\x01\x02\x03")
safetensors("unordered.safetensors", {
    "b": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 8]},
    "__metadata__": {"k\"ey": "v\nal\u00e9"},
    "a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, bytes(range(8)))
open("fuzz/corpus/config/overrides.yaml", "wb").write(
    b"data: {source: synthetic}\nmodel:\n  hidden: [8]\n\x00train.lr=0.5\nmodel.hidden=[3, 3]\nseed=7\ndata.path=rel/x.csv\n")
PY
echo "remade the seeds in fuzz/corpus/"
