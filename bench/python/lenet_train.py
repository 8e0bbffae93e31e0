#!/usr/bin/python3
"""Trains d2l's LeNet in real PyTorch eager, as dkit's `lenet` suite trains it, and times runs of steps.

The Python side of `dkit bench lenet`: the same model (nn.Sequential of Conv2d, ReLU, MaxPool2d, Flatten, Linear;
PyTorch's default initialisation), SGD with the same learning rate, cross-entropy, and the same images: Fashion-MNIST's
training set from --data DIR (the gzipped IDX files of Debian's dataset-fashion-mnist), or 'synthetic:N' random
28x28 images. The loop is the one a careful PyTorch user writes: a new random order each epoch, each batch gathered
from the uint8 images and divided by 255, zero_grad(set_to_none=True), forward, backward, step, the loss summed on
the device and read with .item() every 50 steps, as dkit's Trainer reads its metrics.

--serve prints {"ready": ...} after --warmup untimed steps, then for each line N on stdin times N steps and answers
{"seconds": ..., "steps": N}.

    /usr/bin/python3 bench/python/lenet_train.py --data /usr/share/datasets/fashion-mnist --batch 64 --serve
"""
import argparse
import gzip
import json
import os
import sys
import time

import torch
from torch import nn

FLUSH = 50


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)[offset:]


def load(data):
    if data.startswith("synthetic:"):
        n = int(data.split(":")[1])
        return torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8), torch.randint(0, 10, (n,))
    images = read_idx(os.path.join(data, "train-images-idx3-ubyte.gz"), 16).view(-1, 1, 28, 28)
    labels = read_idx(os.path.join(data, "train-labels-idx1-ubyte.gz"), 8).to(torch.int64)
    return images, labels


def lenet():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84),
                         nn.ReLU(), nn.Linear(84, 10))


class Loop:
    def __init__(self, images, labels, batch, lr):
        self.images, self.labels, self.batch = images, labels, batch
        self.model = lenet()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.order, self.position, self.steps = None, 0, 0
        self.loss_sum = torch.zeros(())

    def run(self, steps):
        n = self.images.shape[0]
        for _ in range(steps):
            if self.order is None or self.position >= n:
                self.order, self.position = torch.randperm(n), 0
            index = self.order[self.position:self.position + self.batch]
            self.position += self.batch
            x = self.images[index].float().div_(255)
            y = self.labels[index]
            self.opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.loss_sum += loss.detach()
            self.steps += 1
            if self.steps % FLUSH == 0:
                self.loss_sum.item()
                self.loss_sum.zero_()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    images, labels = load(args.data)
    loop = Loop(images, labels, args.batch, args.lr)
    loop.run(args.warmup)
    if args.serve:
        print(json.dumps({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
        for line in sys.stdin:
            steps = int(line)
            start = time.perf_counter()
            loop.run(steps)
            print(json.dumps({"seconds": time.perf_counter() - start, "steps": steps}), flush=True)
        return
    start = time.perf_counter()
    loop.run(args.steps)
    seconds = time.perf_counter() - start
    print(json.dumps({"ms_per_step": 1e3 * seconds / args.steps, "samples_per_second": args.steps * args.batch / seconds}))


if __name__ == "__main__":
    main()
