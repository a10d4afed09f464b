"""How many kernels MLX's CPU build lets the host queue ahead of the device.

MLX (``mlx/transforms.cpp``, ``mlx/backend/cpu/encoder.h``): the CPU encoder counts
every dispatch and makes every 10th a scheduler task; the eval loop waits while more
than 10 tasks are outstanding. A primitive dispatches its kernel and a closure that
holds its buffers: about 2 dispatches each, so some 50-55 primitives. This times
``mx.async_eval`` of a chain of ``n`` slow kernels (large matmuls, each ``t`` s): it
returns once the host has dispatched the last one, when the device is about
``queue`` kernels from the end, so ``queue = n - returned / t``.

    python benchmarks/cpu_queue.py [--size 384] [--n 120]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=384)
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    w = mx.random.normal((args.size, args.size)) / args.size**0.5
    x = mx.random.normal((args.size, args.size))
    mx.eval(w, x)
    for kind in ("matmul", "matmul+exp"):

        def chain(y: mx.array, kind: str = kind) -> mx.array:
            for _ in range(args.n):
                y = y @ w
                if kind == "matmul+exp":
                    y = mx.tanh(y)
            return y

        kernels = args.n * (2 if kind == "matmul+exp" else 1)
        for _ in range(args.reps):
            y = chain(x)  # the graph is built before the timer: only dispatch is timed
            t0 = time.perf_counter()
            mx.async_eval(y)
            t1 = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            per = (t2 - t0) / kernels
            print(
                f"{kind:11s} kernels {kernels:4d}  async_eval returned {1e3 * (t1 - t0):7.2f} ms of "
                f"{1e3 * (t2 - t0):7.2f} ms: {(t2 - t1) / per:5.1f} kernels outstanding"
            )


if __name__ == "__main__":
    main()
