"""Commits on a thread of their own, in plain MLX (issue 13, sixtieth session): ``L`` (16)
layers of the reference llama's sizes (bf16, one token; on the CPU smaller), each a
compiled stretch before and after MLX's attention over 1025 keys of a 1280-position
buffer (cuDNN's, as eager's decode at that length), committed every ``every`` layers by
the building thread (``serial``) or by a second thread (``thread``: ``mx.async_eval``
releases Python's GIL while MLX encodes), with Python's switch interval as it is or
short (``_si20``: 20 us). Per variant: the host's time until the call returns (the
thread's commits waited for) and until the result is ready, medians of ``R`` (60)
rounds, the variants interleaved; every variant's bytes are checked against
``serial2``'s (exit 1 on a difference).

    python benchmarks/commit_thread.py            # L=16 R=60 in the environment to change
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from segc.committer import Committer

GPU = mx.default_device() == mx.gpu
L = int(os.environ.get("L", 16))
D, F = (2048, 8192) if GPU else (256, 512)
NH, KVH, HD = (32, 8, 64) if GPU else (4, 2, 64)
CAP, N = (1280, 1025) if GPU else (256, 200)
DT = mx.bfloat16 if GPU else mx.float32


def _w(*shape: int) -> mx.array:
    return (mx.random.normal(shape) / 40).astype(DT)


def _pre(x: mx.array, p: dict[str, mx.array]) -> mx.array:  # the norm and the queries' product
    h = mx.fast.rms_norm(x, p["n1"], 1e-5) @ p["qkv"]
    return h[..., : NH * HD].reshape(1, 1, NH, HD).transpose(0, 2, 1, 3)


def _post(x: mx.array, a: mx.array, p: dict[str, mx.array]) -> mx.array:  # the output product and the MLP
    x = x + a.transpose(0, 2, 1, 3).reshape(1, 1, NH * HD) @ p["o"]
    gu = mx.fast.rms_norm(x, p["n2"], 1e-5) @ p["gu"]
    g, u = gu[..., :F], gu[..., F:]
    return x + (g * mx.sigmoid(g) * u) @ p["dn"]


def main() -> int:
    mx.random.seed(0)
    layers = [
        dict(n1=mx.ones((D,), DT), qkv=_w(D, NH * HD + 2 * KVH * HD), o=_w(NH * HD, D), n2=mx.ones((D,), DT),
             gu=_w(D, 2 * F), dn=_w(F, D))
        for _ in range(L)
    ]  # fmt: skip
    kb, vb = [_w(1, KVH, CAP, HD) for _ in range(L)], [_w(1, KVH, CAP, HD) for _ in range(L)]
    mx.eval(layers, kb, vb)
    pre = [mx.compile(lambda x, p=p: _pre(x, p)) for p in layers]
    post = [mx.compile(lambda x, a, p=p: _post(x, a, p)) for p in layers]
    com = Committer(mx.default_device())

    def step(x: mx.array, every: int, threaded: bool = False, switch: float | None = None) -> mx.array:
        old = sys.getswitchinterval()
        if switch is not None:
            sys.setswitchinterval(switch)
        try:
            with mx.stream(com.stream) if threaded else mx.stream(mx.default_stream(mx.default_device())):
                for i in range(L):
                    a = mx.fast.scaled_dot_product_attention(pre[i](x), kb[i][:, :, :N], vb[i][:, :, :N], scale=0.125)
                    x = post[i](x, a)
                    if every and (i + 1) % every == 0 and i + 1 < L:
                        com.submit([x]) if threaded else mx.async_eval(x)
                if threaded:
                    com.submit([x])
                    com.finish()
                else:
                    mx.async_eval(x)
        finally:
            sys.setswitchinterval(old)
        return x

    x0 = _w(1, 1, D)
    mx.eval(x0)
    variants: dict[str, Callable[[], Any]] = {
        "serial2": lambda: step(x0, 2),
        "serial0": lambda: step(x0, 0),
        "thread1": lambda: step(x0, 1, True),
        "thread2": lambda: step(x0, 2, True),
        "thread4": lambda: step(x0, 4, True),
        "thread1_si20": lambda: step(x0, 1, True, 2e-5),
        "thread2_si20": lambda: step(x0, 2, True, 2e-5),
        "thread4_si20": lambda: step(x0, 4, True, 2e-5),
        "thread2_si100": lambda: step(x0, 2, True, 1e-4),
    }
    ref = np.array(variants["serial2"]().astype(mx.float32)).tobytes()
    for name, f in variants.items():
        for _ in range(3):
            mx.eval(f())
        if np.array(f().astype(mx.float32)).tobytes() != ref:
            print(f"{name}: other bytes than serial2's")
            return 1
    host: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    rounds = int(os.environ.get("R", 60))
    for _ in range(rounds):
        for name, f in variants.items():
            mx.synchronize()
            t0 = time.perf_counter()
            y = f()
            t1 = time.perf_counter()
            mx.eval(y)
            host[name].append(t1 - t0)
            wall[name].append(time.perf_counter() - t0)
    print(f"MLX {mx.__version__} on {mx.default_device()}; {L} layers, {rounds} rounds; every variant serial2's bytes")
    for name in variants:
        h, w = statistics.median(host[name]) * 1e3, statistics.median(wall[name]) * 1e3
        print(f"{name:14s} host {h:7.3f} ms  step {w:7.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
