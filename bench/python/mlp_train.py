#!/usr/bin/python3
"""Trains dkit's MLP in real PyTorch, the two idiomatic ways, and prints the steady-state throughput.

This is the Python side of dkit's training comparisons (bench/compare_python.sh, `dkit bench train`). It builds
the same model dkit builds (nn.Sequential of Linear and ReLU, nn.Dropout after each ReLU with --dropout, PyTorch's
default initialisation), the same optimizer (Adam by default; --optimizer sgd|adam|adamw with --lr, --momentum,
--nesterov, --weight-decay, as the `optimizers` suite passes them) and the same cross-entropy loss, and feeds it the
same data: a CSV of numbers with the label last (data/digits.csv by default, standardised), or synthetic data of a
given width: Gaussian blobs by the recipe of dkit's make_synthetic, as dkit's benchmark suites train on (blobs:...),
or random features with random labels (random:...). --precision bf16|fp16 runs the forward pass and the loss under
torch.autocast, fp16 with a GradScaler, as PyTorch's AMP recipe does (the `precision` suite); a precision this
PyTorch cannot autocast to on the device is an error.

Two loops, as PyTorch users write them:
  dataloader  for x, y in DataLoader(TensorDataset(X, y), batch_size=B, shuffle=True)
  slicing     perm = torch.randperm(n); x, y = X[perm[i:i+B]], y[perm[i:i+B]]
Both accumulate the loss with `loss.item()` every step, as the PyTorch tutorials do.

Warm-up steps run first and are not timed; on CUDA the clock is read after torch.cuda.synchronize(). Then
--repeat timed runs of --steps steps each continue the same training (steady state). A last partial batch of an
epoch counts its own samples. --compile MODE wraps the model in torch.compile (PyTorch 2.x; reduce-overhead replays
CUDA graphs); compilation happens in the warm-up. Prints one JSON object per loop on stdout: ms_per_step and
samples_per_second of the median run, and every run's seconds.

    /usr/bin/python3 bench/python/mlp_train.py --steps 3000 --batch 64 --hidden 256,256 --threads 2
"""
import argparse
import contextlib
import json
import math
import sys
import time
import warnings

import torch
from torch import nn


def load_csv(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append([float(v) for v in line.split(",")])
    data = torch.tensor(rows, dtype=torch.float32)
    features, labels = data[:, :-1], data[:, -1].to(torch.int64)
    mean, std = features.mean(0), features.std(0)
    std[std == 0] = 1
    return (features - mean) / std, labels


def blobs(n, features, classes, noise):
    """Gaussian blobs by dkit::make_synthetic's recipe, from PyTorch's generator: a centre per class from N(0, 1),
    the n labels spread evenly over the classes and shuffled, each sample its centre plus N(0, noise^2) noise."""
    centres = torch.randn(classes, features)
    labels = (torch.arange(n) % classes)[torch.randperm(n)]
    return centres[labels] + noise * torch.randn(n, features), labels


def build_model(in_features, hidden, out_features, dropout=0.0):
    layers, width = [], in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout > 0 else [])
        width = h
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Amp:
    """--precision: the autocast dtype (None for fp32) and, for fp16, a GradScaler."""

    def __init__(self, precision, device):
        self.device_type = device.type
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.scaler = None
        if self.dtype is None:
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with self.autocast():
                    try:
                        enabled = torch.is_autocast_enabled(device.type)
                    except TypeError:  # PyTorch before 2.4
                        enabled = (torch.is_autocast_cpu_enabled() if device.type == "cpu"
                                   else torch.is_autocast_enabled())
        except RuntimeError:
            enabled = False
        if not enabled:
            raise SystemExit(f"error: PyTorch {torch.__version__} cannot autocast to {precision} on {device.type}")
        if precision == "fp16":
            self.scaler = (torch.amp.GradScaler(device.type) if hasattr(torch.amp, "GradScaler")
                           else torch.cuda.amp.GradScaler())

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def train_step(model, opt, xb, yb, amp):
    """One step as PyTorch's tutorials (and its AMP recipe, under --precision) write it; returns loss.item()."""
    opt.zero_grad()
    with amp.autocast():
        loss = nn.functional.cross_entropy(model(xb), yb)
    if amp.scaler is None:
        loss.backward()
        opt.step()
    else:
        amp.scaler.scale(loss).backward()
        amp.scaler.step(opt)
        amp.scaler.update()
    return loss.item()


def train_dataloader(model, opt, X, y, batch, steps, device, amp):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=batch, shuffle=True)
    done, samples, running_loss = 0, 0, 0.0
    while True:
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            running_loss += train_step(model, opt, xb, yb, amp)
            done += 1
            samples += xb.shape[0]
            if done == steps:
                return running_loss / steps, samples


def train_slicing(model, opt, X, y, batch, steps, device, amp):
    X, y = X.to(device), y.to(device)
    n, done, samples, running_loss = X.shape[0], 0, 0, 0.0
    while True:
        perm = torch.randperm(n, device=device)
        for i in range(0, n, batch):
            idx = perm[i:i + batch]
            xb, yb = X[idx], y[idx]
            running_loss += train_step(model, opt, xb, yb, amp)
            done += 1
            samples += xb.shape[0]
            if done == steps:
                return running_loss / steps, samples


LOOPS = {"dataloader": train_dataloader, "slicing": train_slicing}


def make_optimizer(args, params):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                               weight_decay=args.weight_decay)
    if args.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.Adam(params, lr=args.lr, weight_decay=args.weight_decay)


def warmed_up(name, args, X, y, hidden, classes, device):
    """The loop called `name`, a fresh model and optimizer, after --warmup untimed steps."""
    loop = LOOPS[name]
    torch.manual_seed(args.seed)
    model = build_model(X.shape[1], hidden, classes, args.dropout).to(device)
    opt = make_optimizer(args, model.parameters())
    amp = Amp(args.precision, device)
    if args.compile:
        model = torch.compile(model, mode=args.compile)
    if args.warmup > 0:
        loop(model, opt, X, y, args.batch, args.warmup, device, amp)
    return loop, model, opt, amp


def serve(args, X, y, hidden, classes, device):
    """--serve: prints {"ready": ...} after the warm-up, then {"seconds": ..., "samples": ..., "steps": N} per line N."""
    name = args.loops.split(",")[0]
    loop, model, opt, amp = warmed_up(name, args, X, y, hidden, classes, device)
    print(json.dumps({"ready": True, "loop": name, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        steps = int(line)
        sync(device)
        start = time.perf_counter()
        _, samples = loop(model, opt, X, y, args.batch, steps, device, amp)
        sync(device)
        print(json.dumps({"seconds": time.perf_counter() - start, "samples": samples, "steps": steps}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/digits.csv",
                        help="CSV, label last; 'random:N:F:C' for random data (random labels); 'blobs:N:F:C:NOISE' "
                             "for Gaussian blobs drawn as dkit's make_synthetic draws them")
    parser.add_argument("--hidden", default="256,256")
    parser.add_argument("--dropout", type=float, default=0.0, help="nn.Dropout after each hidden ReLU, as dkit's Mlp")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3000, help="timed steps")
    parser.add_argument("--warmup", type=int, default=100, help="untimed steps first")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs of --steps steps, one after the other")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 leaves PyTorch's default")
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD only")
    parser.add_argument("--nesterov", action="store_true", help="SGD only")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                        help="bf16/fp16: the forward pass and loss under torch.autocast (fp16 with a GradScaler)")
    parser.add_argument("--loops", default="dataloader,slicing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", default="", metavar="MODE",
                        help="torch.compile the model with this mode (e.g. reduce-overhead: CUDA graphs); PyTorch 2.x")
    parser.add_argument("--serve", action="store_true",
                        help="after the warm-up of the first of --loops, time one run of N steps for each line N read "
                             "from stdin and answer each with a JSON line (for a caller that takes turns with it)")
    args = parser.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.data.startswith("random:"):
        _, n, f, c = args.data.split(":")
        X, y = torch.randn(int(n), int(f)), torch.randint(0, int(c), (int(n),))
    elif args.data.startswith("blobs:"):
        _, n, f, c, noise = args.data.split(":")
        X, y = blobs(int(n), int(f), int(c), float(noise))
    else:
        X, y = load_csv(args.data)
    hidden = [int(h) for h in args.hidden.split(",") if h]
    classes = int(y.max()) + 1

    if args.serve:
        serve(args, X, y, hidden, classes, device)
        return
    for name in args.loops.split(","):
        loop, model, opt, amp = warmed_up(name, args, X, y, hidden, classes, device)
        runs = []
        for _ in range(args.repeat):
            sync(device)
            start = time.perf_counter()
            loss, samples = loop(model, opt, X, y, args.batch, args.steps, device, amp)
            sync(device)
            runs.append((time.perf_counter() - start, samples))
        seconds, samples = sorted(runs)[(len(runs) - 1) // 2]
        print(json.dumps({
            "impl": "pytorch" + ("/compile-" + args.compile if args.compile else ""), "loop": name,
            "torch": torch.__version__, "device": str(device),
            "optimizer": repr(opt).splitlines()[0].strip(" ("),
            "threads": torch.get_num_threads(), "precision": args.precision, "batch": args.batch, "hidden": hidden,
            "dropout": args.dropout,
            "steps": args.steps, "warmup": args.warmup, "repeat": args.repeat, "seconds": seconds, "samples": samples,
            "ms_per_step": 1e3 * seconds / args.steps, "samples_per_second": samples / seconds,
            "runs_seconds": [run[0] for run in runs], "runs_samples": [run[1] for run in runs],
            "mean_loss": loss if math.isfinite(loss) else None,
        }, allow_nan=False), flush=True)


if __name__ == "__main__":
    main()
