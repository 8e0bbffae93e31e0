#!/usr/bin/python3
"""Writes a classification data set of a given size as two .npy files, for the mapped-data benchmark:

    /usr/bin/python3 scripts/make_npy_dataset.py DIR GIB [FEATURES] [DTYPE]

DIR/x.npy: DTYPE inputs [N, FEATURES] (uint8 or uint16; 784 uint8 by default), GIB GiB of them; DIR/y.npy: int64
labels [N] in 0..9.
Each class has its own mean pixel value, so a model can learn it. Written in chunks through a memory map, so
the script needs little memory whatever the size.
"""
import os
import sys

import numpy as np
from numpy.lib import format as npformat


def main():
    folder, gib = sys.argv[1], float(sys.argv[2])
    features = int(sys.argv[3]) if len(sys.argv) > 3 else 784
    dtype = np.dtype(sys.argv[4] if len(sys.argv) > 4 else "uint8")
    if dtype not in (np.uint8, np.uint16):
        sys.exit(f"make_npy_dataset.py: DTYPE must be uint8 or uint16, got {dtype}")
    n = int(gib * 2**30) // (features * dtype.itemsize)
    os.makedirs(folder, exist_ok=True)
    x = npformat.open_memmap(os.path.join(folder, "x.npy"), mode="w+", dtype=dtype, shape=(n, features))
    y = npformat.open_memmap(os.path.join(folder, "y.npy"), mode="w+", dtype=np.int64, shape=(n,))
    rng = np.random.default_rng(0)
    chunk = 1 << 16
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        labels = rng.integers(0, 10, stop - start)
        noise = rng.integers(0, 128, (stop - start, features), dtype=np.uint8)
        x[start:stop] = noise.astype(dtype) + (labels[:, None] * 12).astype(dtype)
        y[start:stop] = labels
    x.flush()
    y.flush()
    print(f"{folder}: {n} samples of {features} {dtype} features ({n * features * dtype.itemsize / 2**30:.2f} GiB) "
          "and their labels")


if __name__ == "__main__":
    main()
