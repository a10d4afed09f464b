"""Calibrate a :class:`~segc.passes.costmodel.MachineModel` on this machine with a short
measurement (a few seconds), on MLX's default device:

- ``bytes_per_s``: a compiled ``x + 1`` over a large array (read and write);
- ``flops_per_s``: a square matrix product in the given dtype;
- ``host_op_s`` and ``launch_s``: a compiled chain of small matrix products (which MLX
  does not fuse), 64 against 1: the host's time to call it and commit it with
  ``mx.async_eval`` (on a GPU the host encodes every kernel; on the CPU ``async_eval``
  blocks once about ten tasks are in flight), per equation, and the rest of the whole
  call's time per equation;
- ``dispatch_s``: 32 trivial compiled segments each committed with ``mx.async_eval``
  against 1: the host's time per segment.

Each figure is the median of ``repeats`` runs after a warm-up. ``encode_s`` (host time
per kernel that overlaps the device's work) is 0 here; :func:`fit_overheads` fits it,
with the others, to whole calls of a real model.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from ..passes.costmodel import MachineModel


def _median(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def calibrate(
    name: str | None = None, *, dtype: mx.Dtype | None = None, repeats: int = 7, size: str = "auto"
) -> MachineModel:
    """A machine model measured here (module docstring). ``size``: ``auto`` (small on the
    CPU, large on a GPU), ``small`` or ``large``."""
    gpu = mx.default_device() == mx.gpu
    big = size == "large" or (size == "auto" and gpu)
    dtype = dtype or (mx.bfloat16 if gpu else mx.float32)
    name = name or ("gpu" if gpu else "cpu")

    n = (1 << 26) if big else (1 << 22)
    x = mx.random.uniform(shape=(n,)).astype(dtype)
    mx.eval(x)
    add = mx.compile(lambda a: a + 1)
    t = _median(lambda: mx.eval(add(x)), repeats)
    bytes_per_s = 2 * x.nbytes / t

    k = 4096 if big else 512
    a = mx.random.uniform(shape=(k, k)).astype(dtype)
    b = mx.random.uniform(shape=(k, k)).astype(dtype)
    mx.eval(a, b)
    t = _median(lambda: mx.eval(a @ b), repeats)
    flops_per_s = 2 * k**3 / t

    w = mx.random.uniform(shape=(8, 8)).astype(dtype)
    mx.eval(w)

    def chain(m: int) -> Callable[[mx.array], mx.array]:
        def f(v: mx.array) -> mx.array:
            for _ in range(m):
                v = v @ w
            return v

        return mx.compile(f)

    def host_and_total(f: Callable[[mx.array], mx.array]) -> tuple[float, float]:
        v = mx.ones((8, 8), dtype=dtype)
        mx.eval(f(v))
        hs, ts = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            y = f(v)
            mx.async_eval(y)
            t1 = time.perf_counter()
            mx.eval(y)
            hs.append(t1 - t0)
            ts.append(time.perf_counter() - t0)
        return statistics.median(hs), statistics.median(ts)

    h1, t1_ = host_and_total(chain(1))
    h64, t64 = host_and_total(chain(64))
    host_op_s = max((h64 - h1) / 63, 1e-9)
    launch_s = max((t64 - t1_) / 63 - host_op_s, 1e-9)

    seg = mx.compile(lambda v: v * 2 + 1)

    def segments(m: int) -> float:
        v = mx.ones((8,), dtype=dtype)
        mx.eval(seg(v))
        hs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            y = v
            for _ in range(m):
                y = seg(y)
                mx.async_eval(y)
            hs.append(time.perf_counter() - t0)
            mx.eval(y)
        return statistics.median(hs)

    dispatch_s = max((segments(32) - segments(1)) / 31, 1e-9)
    return MachineModel(
        name,
        flops_per_s,
        bytes_per_s,
        launch_s,
        dispatch_s,
        host_op_s,
        f"calibrated on {mx.default_device()} ({dtype}), MLX {getattr(mx, '__version__', '?')}",
    )


# --------------------------------------------------------------------------- fitting


def fit_overheads(
    machine: MachineModel,
    model: str = "small",
    workloads: tuple[str, ...] = ("decode:64", "prefill:32"),
    strategies: tuple[str, ...] = ("none", "markers", "every:2", "every:4", "balanced:2", "balanced:5"),
    repeats: int = 7,
    boundaries: str = "layers.*",
) -> MachineModel:
    """``machine`` with its per-kernel (``launch_s``, ``host_op_s``, ``encode_s``) and per-segment
    (``dispatch_s``) figures fitted to whole calls of a real model under a few plans,
    with one factor on the bandwidth and FLOP rate (real kernels reach less than the
    microbenchmarks): over a grid, the least squared log error of the pipeline's
    prediction, split per workload into the plans' differences from their mean (what
    ranks plans; weight 1) and the mean itself (the level; weight 0.1). Small kernels on a real model cost more than a chain of tiny
    products shows (on the CPU about ten times more)."""
    import dataclasses
    import math

    import numpy as np

    from ..passes import make_plan
    from ..passes.costmodel import predict_time
    from ..passes.plan import apply_plan
    from ..staging import jit
    from .models import load_model, make_workload

    net = load_model(model)
    cases: list[tuple[str, list, float]] = []
    for w in workloads:
        wl = make_workload(w, net)
        a, k = wl.args()
        g = jit(net, boundaries=boundaries).trace(*a, **k).graph
        runs = []
        for spec in strategies:
            plan = make_plan(g, spec)
            fn = jit(net, boundaries=boundaries, strategy=plan)
            runs.append((predict_time(apply_plan(g, plan), machine).segments, fn))
        times: list[list[float]] = [[] for _ in runs]
        for _ in range(repeats + 1):  # round-robin, so drift hits every plan alike; the first warms up
            for i, (_, fn) in enumerate(runs):
                a, k = wl.args()
                t0 = time.perf_counter()
                mx.eval(fn(*a, **k), wl.sync())
                times[i].append(time.perf_counter() - t0)
        cases += [(w, list(segs), statistics.median(ts[1:])) for (segs, _), ts in zip(runs, times)]
    # every combination of the grid at once: launch, host per kernel, dispatch, work scale
    grid = np.logspace(-7, -3, 17)  # 0.1 us .. 1 ms
    enc = np.concatenate([[0.0], np.logspace(-7, -4, 7)])
    L, H, D, W, E = (x.ravel() for x in np.meshgrid(grid, grid, grid, np.logspace(-0.5, 1.0, 10), enc, indexing="ij"))
    err = np.zeros_like(L)
    for w in dict.fromkeys(wk for wk, _, _ in cases):
        # per workload: the plans' differences (what ranks them) in full, the level at a tenth
        es = []
        for _, segs, t in (c for c in cases if c[0] == w):
            h = np.zeros_like(L)
            d = np.zeros_like(L)
            for sg in segs:
                start = np.maximum(d, h + D + H * sg.kernels)
                h = h + D + (H + E) * sg.kernels
                d = np.maximum(start + W * sg.work + L * sg.kernels, h)
            es.append(np.log(d) - math.log(t))
        mean = sum(es) / len(es)
        err += sum((e - mean) ** 2 for e in es) + 0.1 * len(es) * mean**2
    i = int(np.argmin(err))
    m = MachineModel(
        machine.name,
        machine.flops_per_s / float(W[i]),
        machine.bytes_per_s / float(W[i]),
        float(L[i]),
        float(D[i]),
        float(H[i]),
        machine.source,
        float(E[i]),
    )
    src = f"{machine.source}; overheads fitted on {model} {', '.join(workloads)} ({len(cases)} calls)"
    return dataclasses.replace(m, source=src)
