"""What a commit costs the host with MLX's attention in it (issue 13): a decode step under
``SEGC_LIVE_ATTENTION`` commits stretches that hold MLX's one-token attention over the
live keys, which MLX's CUDA build runs as a cuDNN graph, added to its CUDA graph as a
child graph. MLX updates a cached executable graph at each commit only where every node
is updatable, and instantiates a new one otherwise (``CommandEncoder::commit``), so
this measures, for ``--kernels`` elementwise kernels alone and with one or two
attentions (over a bf16 buffer of 1,280 positions sliced to ``--context`` + 1, the
reference llama's shapes), how long building the graph, ``mx.async_eval`` (encoding,
the commit) and the whole call take: the median of ``--repeats`` calls each.

    python benchmarks/commit_sdpa.py [--kernels 16] [--repeats 300]
    MLX_CUDA_USE_CUDNN_SDPA=0 python benchmarks/commit_sdpa.py   # MLX's own attention kernel

A form ``apart`` commits each attention by itself (a commit before it and after it)."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import mlx.core as mx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--context", type=int, default=1024)
    a = ap.parse_args()
    dt = mx.bfloat16
    q = mx.random.normal((1, 32, 1, 64)).astype(dt)
    kb = mx.random.normal((1, 8, 1280, 64)).astype(dt)
    vb = mx.random.normal((1, 8, 1280, 64)).astype(dt)
    x0 = mx.random.normal((1, 2048)).astype(dt)
    mx.eval(q, kb, vb, x0)
    n = a.context + 1

    def attend() -> mx.array:
        return mx.fast.scaled_dot_product_attention(q, kb[:, :, :n], vb[:, :, :n], scale=0.125)

    def call(att: int, apart: bool) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        x = x0
        outs = []
        half = a.kernels // 2
        for i in range(a.kernels):
            x = mx.sin(x)  # a kernel each (no fusion outside mx.compile)
            if i == half - 1 and att:
                if apart:
                    mx.async_eval(x)
                outs.extend(attend() for _ in range(att))
                if apart:
                    mx.async_eval(outs)
        outs.append(x)
        t1 = time.perf_counter()
        mx.async_eval(outs)
        t2 = time.perf_counter()
        mx.eval(outs)
        return t1 - t0, t2 - t1, time.perf_counter() - t0

    forms = [(0, False), (1, False), (2, False), (1, True), (2, True)]
    print(
        f"MLX {mx.__version__} on {mx.default_device()}; MLX_CUDA_USE_CUDNN_SDPA="
        f"{os.environ.get('MLX_CUDA_USE_CUDNN_SDPA', '(unset)')}; {a.kernels} kernels, context {a.context}"
    )
    print(f"{'form':22s} {'build':>9s} {'async_eval':>11s} {'call':>9s}  (medians, us)")
    for att, apart in forms:
        for _ in range(20):
            call(att, apart)
        rows = [call(att, apart) for _ in range(a.repeats)]
        med = [statistics.median(r[i] for r in rows) * 1e6 for i in range(3)]
        name = f"{att} attention{'s' if att != 1 else ''}" + (", apart" if apart else "")
        print(f"{name:22s} {med[0]:9.1f} {med[1]:11.1f} {med[2]:9.1f}")


if __name__ == "__main__":
    main()
