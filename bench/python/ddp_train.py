#!/usr/bin/python3
"""Trains dkit's MLP in real PyTorch with one process, or several under DistributedDataParallel (Gloo), and prints
the throughput: the PyTorch side of bench/scaling.sh.

The same model (mlp_train.py's build_model: nn.Sequential of Linear and ReLU, PyTorch's default initialisation), the
same optimizer (SGD with --lr and --momentum), the same cross-entropy loss and the same shapes as scaling.sh's dkit
runs: random data of --samples rows and --features columns (resident, standard normal) with --classes labels, a
global batch of --batch rows, shuffled each epoch, of which rank r takes the r-th share, as dkit's ranks do. Each rank
divides its loss by its own rows and DDP averages the ranks' gradients, which for equal shares is the gradient of the
global batch's mean, as in dkit. The loss is read back every 20 steps (dkit's log_every in scaling.sh), not each step.

Ranks come from the environment torchrun or scaling.sh sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); without
WORLD_SIZE, or with 1, the model is trained as is, without DDP. --warmup steps run first and are not timed; rank 0
then times --steps steps and prints one JSON object: samples_per_second (the global batch's samples) and seconds.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 /usr/bin/python3 bench/python/ddp_train.py --threads 1 &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 /usr/bin/python3 bench/python/ddp_train.py --threads 1
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlp_train import build_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=40000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--hidden", default="1024,1024")
    parser.add_argument("--batch", type=int, default=256, help="the global batch, shared equally by the ranks")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.batch % world_size != 0:
        sys.exit(f"ddp_train: --batch {args.batch} does not split equally over {world_size} processes")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    features = torch.randn(args.samples, args.features)
    labels = torch.randint(0, args.classes, (args.samples,))
    model = build_model(args.features, [int(h) for h in args.hidden.split(",")], args.classes)
    if world_size > 1:
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    share = args.batch // world_size
    order = torch.randperm(args.samples)
    position = 0
    loss_sum = torch.zeros(())

    def step(index):
        nonlocal order, position, loss_sum
        if position + args.batch > args.samples:
            order = torch.randperm(args.samples)
            position = 0
        rows = order[position + rank * share:position + (rank + 1) * share]
        position += args.batch
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(features[rows]), labels[rows])
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach()
        if (index + 1) % 20 == 0:
            loss_sum.item()

    for i in range(args.warmup):
        step(i)
    if world_size > 1:
        dist.barrier()
    start = time.perf_counter()
    for i in range(args.steps):
        step(i)
    seconds = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"processes": world_size, "threads": args.threads,
                          "samples_per_second": args.steps * args.batch / seconds, "seconds": seconds}))
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
