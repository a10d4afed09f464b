"""What moving host bytes into MLX costs on a GPU (issue 16: paging's transfer).

The pager hands each page to MLX as ``mx.array(numpy_array)``. On MLX's CUDA build an
array made on the host lives in CUDA managed memory (``cudaMallocManaged``,
``mlx/backend/cuda/allocator.cpp``): the host writes it, and the GPU's first kernel to
read it migrates its pages on demand. This times, for a buffer of ``--mb`` megabytes,
the host copy (``mx.array``), the first GPU read (a sum: migration and compute), a
second read (resident) and, for comparison, the host copy alone with numpy; as GB/s.

    python benchmarks/managed_memory.py --mb 256 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    n = a.mb * 2**20 // 2
    host = np.random.default_rng(0).standard_normal(n, dtype=np.float32).astype(np.float16)
    gb = host.nbytes / 1e9
    rows: dict[str, list[float]] = {
        "numpy copy": [],
        "mx.array (host copy)": [],
        "first GPU read": [],
        "second read": [],
    }
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        host.copy()
        t1 = time.perf_counter()
        x = mx.array(host)
        t2 = time.perf_counter()
        mx.eval(x.sum())
        t3 = time.perf_counter()
        mx.eval(x.sum())
        t4 = time.perf_counter()
        for k, t in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            rows[k].append(t)
        del x
    print(f"{a.mb} MB on {mx.default_device()}, median of {a.repeats}:")
    for k, ts in rows.items():
        m = statistics.median(ts)
        print(f"  {k:<22} {1e3 * m:8.2f} ms  {gb / m:7.1f} GB/s")


if __name__ == "__main__":
    main()
