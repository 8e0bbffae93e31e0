#!/usr/bin/env python3
"""PyTorch's side of bench/gpu_check.sh: the GPU's own ceilings, files real PyTorch saves on the GPU for dkit, and
reads of every file dkit wrote there. Each command prints one JSON object on stdout.

  peaks                       device-to-device copy, pinned and pageable host-to-device copies, float32 and
                              bfloat16 8192^3 matrix products, each timed with CUDA events (median of the repeats)
  save DIR                    after 5 Adam steps on the GPU: DIR/state_dict.pt (the MLP's state dict, saved from
                              the GPU), DIR/general.pt (a general checkpoint with Adam's moments), DIR/rows.csv
                              (inputs) and DIR/logits.csv (the model's outputs for them)
  compare EXPECTED ACTUAL     two CSV tables of numbers agree to 1e-5 (exits non-zero when not)
  read RUN EXPORT.pt EXPORT.safetensors
                              torch.load of RUN/checkpoints/last.pt (weights_only) and of the export, the export's
                              safetensors file through the safetensors package, and RUN's TensorBoard event file
                              through tensorboard's EventAccumulator
"""
import glob
import json
import os
import statistics
import sys

import torch
from torch import nn


def timed(fn, repeat=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def peaks():
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    n = 1 << 30
    a = torch.randn(n // 4, device="cuda")
    b = torch.empty_like(a)
    out["d2d_copy_gb_s"] = 2 * n / timed(lambda: b.copy_(a)) / 1e9
    del a, b
    for size in (1 << 24, 1 << 28, 1 << 30):
        pinned = torch.full((size // 4,), 1.5).pin_memory()
        pageable = torch.full((size // 4,), 1.5)
        dst = torch.empty(size // 4, device="cuda")
        label = f"{size >> 20}MiB"
        out[f"h2d_pinned_gb_s.{label}"] = size / timed(lambda: dst.copy_(pinned, non_blocking=True), repeat=10) / 1e9
        out[f"h2d_pageable_gb_s.{label}"] = size / timed(lambda: dst.copy_(pageable), repeat=5) / 1e9
        out[f"d2h_pinned_gb_s.{label}"] = size / timed(lambda: pinned.copy_(dst, non_blocking=True), repeat=10) / 1e9
        del pinned, pageable, dst
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        m = 8192
        sets = [(torch.randn(m, m, device="cuda", dtype=dtype), torch.randn(m, m, device="cuda", dtype=dtype))
                for _ in range(3)]
        turn = [0]

        def product():
            x, y = sets[turn[0] % len(sets)]
            turn[0] += 1
            return x @ y

        out[f"matmul_8192_tflops.{name}"] = 2 * m ** 3 / timed(product, repeat=10) / 1e12
        out[f"matmul_8192_tf32_allowed.{name}"] = torch.backends.cuda.matmul.allow_tf32
    return out


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def save(folder):
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model = mlp([64, 32, 10]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 64, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    for _ in range(5):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    torch.save(model.state_dict(), os.path.join(folder, "state_dict.pt"))
    torch.save({"model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(), "epoch": 5},
               os.path.join(folder, "general.pt"))
    rows = torch.randn(4, 64)
    with torch.no_grad():
        logits = model(rows.cuda()).cpu()
    for name, table in (("rows.csv", rows), ("logits.csv", logits)):
        with open(os.path.join(folder, name), "w") as f:
            for row in table.tolist():
                f.write(",".join(repr(v) for v in row) + "\n")
    return {"saved": ["state_dict.pt", "general.pt", "rows.csv", "logits.csv"], "torch": torch.__version__,
            "adam_state_devices": sorted({str(t.device) for s in opt.state.values() for t in s.values()
                                          if torch.is_tensor(t)})}


def compare(expected, actual):
    def rows(path):
        with open(path) as f:
            return torch.tensor([[float(v) for v in line.split(",")] for line in f if line.strip()])
    a, b = rows(expected), rows(actual)
    difference = (a - b).abs().max().item() if a.shape == b.shape else float("inf")
    if not difference <= 1e-5:
        sys.exit(f"{actual} differs from {expected}: shapes {list(b.shape)} and {list(a.shape)}, largest "
                 f"difference {difference}")
    return {"expected": expected, "actual": actual, "largest_difference": difference}


def read(run, export_pt, export_safetensors):
    out = {"torch": torch.__version__}
    checkpoint = torch.load(os.path.join(run, "checkpoints", "last.pt"), weights_only=True)
    out["checkpoint_keys"] = sorted(checkpoint.keys())
    out["checkpoint_devices"] = sorted({str(t.device) for t in checkpoint["model_state_dict"].values()})
    out["checkpoint_step"] = checkpoint.get("step")
    state = torch.load(export_pt, weights_only=True)
    mean, std = state.pop("input_mean", None), state.pop("input_std", None)
    weights = [k for k in state if k.endswith(".weight")]
    sizes = [state[weights[0]].shape[1]] + [state[k].shape[0] for k in weights]
    net = mlp(sizes)
    net.load_state_dict(state)
    out["export_loaded_into"] = str(net).replace("\n", " ")
    out["export_normalization"] = mean is not None and std is not None
    from safetensors.torch import load_file
    tensors = load_file(export_safetensors)
    out["safetensors_equal_export"] = all(torch.equal(tensors[k], v) for k, v in state.items())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = glob.glob(os.path.join(run, "events.out.tfevents.*"))
    out["event_files"] = len(events)
    if events:
        acc = EventAccumulator(events[0])
        acc.Reload()
        out["tensorboard_scalars"] = {tag: len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}
    return out


def main():
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "peaks":
        result = peaks()
    elif command == "save" and len(sys.argv) == 3:
        result = save(sys.argv[2])
    elif command == "compare" and len(sys.argv) == 4:
        result = compare(sys.argv[2], sys.argv[3])
    elif command == "read" and len(sys.argv) == 5:
        result = read(*sys.argv[2:])
    else:
        sys.exit(__doc__)
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()
