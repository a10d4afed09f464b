"""segc's fused masked decode attention on a CUDA GPU: its error against the float32
reference and against eager MLX's fused kernel, and its time against the alternatives.

For each configuration (batch, query heads, KV heads, head size, buffer capacity,
query rows, dtype) it prints the largest difference from a float64 reference on the host and from ``mx.fast.scaled_dot_product_attention`` on the live keys only
(eager mlx-lm's call: cuDNN or the vector kernel); then, at the reference model's decode
sizes, the time of 16 attentions (one per layer) per evaluation for: eager's fused kernel
on the live slice, MLX's decomposition with the mask (what segc ran before, compiled),
and segc's kernel. Run on the GPU machine (docs/gpu.md):

    python benchmarks/attention_kernel.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from segc.lower.cuda_attention import cuda_attention


def _f64_reference(q: mx.array, k: mx.array, v: mx.array, mask: mx.array, scale: float) -> np.ndarray:
    """The attention in float64 on the host (MLX's float32 matmul on CUDA rounds its
    inputs like TF32, so it is no reference at this precision)."""
    qn, kn, vn = (np.array(x.astype(mx.float32)).astype(np.float64) for x in (q, k, v))
    _, hq, lq, _ = qn.shape
    hkv, cap = kn.shape[1], kn.shape[2]
    kn = np.repeat(kn, hq // hkv, axis=1)
    vn = np.repeat(vn, hq // hkv, axis=1)
    s = scale * qn @ kn.swapaxes(-1, -2)
    m = np.broadcast_to(np.array(mask).reshape(-1, cap), (lq, cap))
    s = np.where(m, s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return (s / s.sum(axis=-1, keepdims=True)) @ vn


def _mask(offset: int, lq: int, cap: int) -> mx.array:
    q = offset + mx.arange(lq)[:, None]
    return q >= mx.arange(cap)[None]


def _inputs(b: int, hq: int, hkv: int, d: int, cap: int, lq: int, dt: mx.Dtype, offset: int) -> tuple:
    q = mx.random.normal((b, hq, lq, d)).astype(dt)
    k = mx.random.normal((b, hkv, cap, d)).astype(dt)
    v = mx.random.normal((b, hkv, cap, d)).astype(dt)
    live = offset + lq
    k = mx.concatenate([k[:, :, :live], mx.zeros((b, hkv, cap - live, d), dt)], axis=2)
    v = mx.concatenate([v[:, :, :live], mx.zeros((b, hkv, cap - live, d), dt)], axis=2)
    return q, k, v, _mask(offset, lq, cap)


def check() -> bool:
    ok = True
    configs = [
        (1, 32, 8, 64, 1280, 1, mx.bfloat16, 1023),
        (1, 32, 8, 64, 256, 1, mx.bfloat16, 0),
        (2, 8, 8, 128, 512, 1, mx.float16, 300),
        (1, 16, 2, 128, 4096, 2, mx.float32, 4000),
        (1, 8, 4, 96, 384, 3, mx.bfloat16, 200),
        (1, 4, 1, 32, 130, 1, mx.float32, 129),
    ]
    for b, hq, hkv, d, cap, lq, dt, off in configs:
        q, k, v, m = _inputs(b, hq, hkv, d, cap, lq, dt, off)
        scale = d**-0.5
        got = cuda_attention(q, k, v, m, scale)
        ref = _f64_reference(q, k, v, m, scale)
        live = off + lq
        eager = mx.fast.scaled_dot_product_attention(
            q, k[:, :, :live], v[:, :, :live], scale=scale, mask="causal" if lq > 1 else None
        )
        e_ref = float(np.abs(np.array(got.astype(mx.float32)) - ref).max())
        e_eager = mx.abs(got.astype(mx.float32) - eager.astype(mx.float32)).max().item()
        tol = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}[dt]  # a rounding of the output
        good = e_ref <= tol
        ok &= good
        print(
            f"check B{b} Hq{hq} Hkv{hkv} D{d} C{cap} L{lq} {dt} off{off}: |kernel-ref| {e_ref:.3g} |kernel-eager| {e_eager:.3g} {'ok' if good else 'FAIL'}"
        )
    # a row whose mask hides every key: the mean of the values
    q, k, v, _ = _inputs(1, 4, 2, 64, 256, 1, mx.float32, 10)
    m = mx.zeros((1, 256), dtype=mx.bool_)
    got = cuda_attention(q, k, v, m, 0.125)
    want = mx.repeat(mx.mean(v, axis=2, keepdims=True), 2, axis=1)
    e = mx.abs(got - want).max().item()
    ok &= e <= 1e-5
    print(f"check all masked: |kernel-mean(v)| {e:.3g} {'ok' if e <= 1e-5 else 'FAIL'}")
    return ok


def _time(fn, n: int) -> float:
    mx.eval(fn())
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench(layers: int, n: int) -> None:
    b, hq, hkv, d, cap, off = 1, 32, 8, 64, 1280, 1024
    sets = [_inputs(b, hq, hkv, d, cap, 1, mx.bfloat16, off) for _ in range(layers)]
    scale = d**-0.5
    live = off + 1

    def eager():
        return [
            mx.fast.scaled_dot_product_attention(q, k[:, :, :live], v[:, :, :live], scale=scale) for q, k, v, _ in sets
        ]

    masked = mx.compile(lambda q, k, v, m: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=m))

    def decomposed():
        return [masked(q, k, v, m) for q, k, v, m in sets]

    def kernel():
        return [cuda_attention(q, k, v, m, scale) for q, k, v, m in sets]

    for name, fn in (
        ("eager fused (live slice)", eager),
        ("MLX decomposition + mask", decomposed),
        ("segc kernel", kernel),
    ):
        print(f"time {name:28s} {layers} layers: {_time(fn, n) * 1e3:.3f} ms per evaluation")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args()
    if not mx.cuda.is_available():
        ap.exit(2, "attention_kernel.py: segc's decode attention kernel needs MLX's CUDA build and a GPU\n")
    ok = check()
    bench(a.layers, a.repeats)
    print("all checks ok" if ok else "SOME CHECKS FAILED")


if __name__ == "__main__":
    main()
