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

On a GPU (``host="kinds"``, the default there) the host's three figures come instead
from :func:`host_kinds`: segments of one-row products, some followed by an elementwise
kernel, over a grid of segment, product and elementwise counts, fitted as ``S *
(segment + P * product + E * elementwise)``; ``dispatch_s`` is the segment's figure,
``host_op_s`` the product's and ``elementwise_host`` the elementwise kernel's share of
it. Measured apart from any plan, these let an experiment fit the device's figures
alone (``overheads="device"``; docs/experiments-log.md, "The tenth and eleventh runs"). On the CPU the
chain above stays the default: MLX's CPU build throttles the host to the device
(``queue_kernels``), so a grid of host times there measures the device.

Each figure is the median of ``repeats`` runs after a warm-up. ``encode_s`` (host time
per kernel that overlaps the device's work) and ``commit_s`` are 0 here;
``queue_kernels`` is the built-in model's (MLX's own limit, not measured);
:func:`fit_overheads` fits the overheads to whole calls of a real model (``fit.py``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import numpy as np

from ..dtypes import same_bytes
from ..errors import ScheduleError
from ..lower import product_kernel
from ..passes.costmodel import CPU, H200, MachineModel


def _median(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


@dataclass(frozen=True)
class HostKinds:
    """The host's seconds per committed segment, per product kernel and per elementwise
    kernel (:func:`host_kinds`), the grid they were fitted to (``(S, P, E, seconds)``)
    and, per grid point, whether the compiled segments gave eager MLX's bytes."""

    segment: float
    product: float
    elementwise: float
    rows: tuple[tuple[int, int, int, float], ...]
    same: tuple[bool, ...] = ()


def host_segment(w: mx.array, products: int, elementwise: int) -> Callable[[mx.array], mx.array]:
    """A segment of ``products`` one-row products by ``w``, the first ``elementwise`` of
    them followed by an elementwise kernel (MLX fuses ``x * sigmoid(x) * 1.5`` into one
    kernel, and into no product)."""

    def f(x: mx.array) -> mx.array:
        for i in range(products):
            x = (x[None] @ w)[0]
            if i < elementwise:
                x = x * mx.sigmoid(x) * 1.5
        return x

    return f


def fit_host_kinds(rows: Sequence[tuple[int, int, int, float]]) -> tuple[float, float, float]:
    """Least squares, no constant: ``seconds = S * (segment + P * product + E *
    elementwise)`` over rows ``(S, P, E, seconds)``."""
    design = np.array([[s, s * p, s * e] for s, p, e, _ in rows], float)
    coef, *_ = np.linalg.lstsq(design, np.array([r[3] for r in rows], float), rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2])


def host_kinds(
    *,
    dtype: mx.Dtype = mx.bfloat16,
    size: int = 2048,
    segments: Sequence[int] = (5, 9, 17),
    products: Sequence[int] = (2, 4),
    repeats: int = 40,
) -> HostKinds:
    """Time the host until the last commit of ``S`` compiled segments, each committed
    with ``mx.async_eval`` as segc's executor does, for every ``(S, P, E)`` of the grid
    (``E`` 0 or ``P``; the median of ``repeats`` calls after a warm-up), compare each
    grid point's result with the same segments run eagerly, and fit the three figures
    (:func:`fit_host_kinds`)."""
    w = (mx.random.normal((size, size), key=mx.random.key(0)) / size**0.5).astype(dtype)
    x = mx.random.normal((size,), key=mx.random.key(1)).astype(dtype)
    mx.eval(w, x)
    rows, same = [], []
    for s in segments:
        for p in products:
            for e in (0, p):
                want = x
                for _ in range(s):
                    want = host_segment(w, p, e)(want)
                mx.eval(want)
                fns = [mx.compile(host_segment(w, p, e)) for _ in range(s)]

                def call(fns: list = fns) -> mx.array:
                    y = x
                    for f in fns:
                        y = f(y)
                        mx.async_eval(y)
                    return y

                hs = []
                got = call()
                mx.synchronize()
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    call()
                    hs.append(time.perf_counter() - t0)
                    mx.synchronize()
                rows.append((s, p, e, statistics.median(hs)))
                same.append(same_bytes(got, want))  # bit-identity, not closeness
    return HostKinds(*fit_host_kinds(rows), tuple(rows), tuple(same))


def with_host_kinds(m: MachineModel, hk: HostKinds) -> MachineModel:
    """``m`` with the grid's figures as its host's: ``dispatch_s`` the segment's less
    ``m``'s commit (the grid commits every segment), ``host_op_s`` the product's,
    ``elementwise_host`` the elementwise kernel's share of it (at most 1). A figure at
    or below zero is refused: no cost model can hold it."""
    dispatch = hk.segment - m.commit_s
    if min(dispatch, hk.product, hk.elementwise) <= 0:
        raise ScheduleError(
            f"calibrate: the host's figures came out as {dispatch:.3g} s a segment, {hk.product:.3g} s a "
            f"product, {hk.elementwise:.3g} s an elementwise kernel: a noisy host (try more repeats), or MLX's "
            "CPU build, whose host waits for the device (use host='chain', --host chain, there)"
        )
    return replace(m, dispatch_s=dispatch, host_op_s=hk.product, elementwise_host=min(hk.elementwise / hk.product, 1.0))


def calibrate(
    name: str | None = None,
    *,
    dtype: mx.Dtype | None = None,
    repeats: int = 7,
    size: str = "auto",
    host: str = "auto",
) -> MachineModel:
    """A machine model measured here (module docstring). ``size``: ``auto`` (small on the
    CPU, large on a GPU), ``small`` or ``large``; ``host``: ``auto`` (``kinds`` on a GPU,
    ``chain`` on the CPU), ``kinds`` or ``chain``."""
    if host not in ("auto", "kinds", "chain"):
        raise ScheduleError(f"calibrate: host must be 'auto', 'kinds' or 'chain', not {host!r}")
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

    kinds = host == "kinds" or (host == "auto" and gpu)
    # the grid's figures replace the chain's and the trivial segments' below
    dispatch_s = 1e-9 if kinds else max((segments(32) - segments(1)) / 31, 1e-9)
    model = MachineModel(
        name,
        flops_per_s,
        bytes_per_s,
        launch_s,
        dispatch_s,
        host_op_s,
        f"calibrated on {mx.default_device()} ({dtype}), MLX {getattr(mx, '__version__', '?')}",
        device="gpu" if gpu else "cpu",
        fused_products=product_kernel() is not None,  # segc's CUDA product kernels lower here
        # MLX's CUDA build ends a command buffer past this many kernels on an H100/H200
        # (get_graph_limits; other GPUs differ): the memory prediction's buffers
        buffer_kernels=H200.buffer_kernels if gpu else 0,
        # the host's queue is MLX's own limit (about 50 kernels on its CPU build, none on
        # a GPU), not a figure measured here: the built-in model's, kept
        queue_kernels=(H200 if gpu else CPU).queue_kernels,
    )
    if kinds:
        hk = host_kinds(dtype=dtype, size=2048 if big else 256, repeats=max(repeats, 5))
        model = with_host_kinds(model, hk)
    return model


# --------------------------------------------------------------------------- fitting


def fit_overheads(
    machine: MachineModel,
    model: str = "small",
    workloads: tuple[str, ...] = ("decode:64", "prefill:32"),
    strategies: tuple[str, ...] = ("none", "markers", "every:2", "every:4", "balanced:2", "balanced:5"),
    repeats: int = 7,
    boundaries: str = "layers.*",
    commit: str = "auto",
) -> MachineModel:
    """``machine`` with its per-kernel (``launch_s``, ``host_op_s``), per-segment
    (``dispatch_s``) and per-commit (``commit_s``) figures and one factor on its rates
    fitted to whole calls of a real model under a few plans, timed in this process in
    rounds of short blocks (``timing.py``) under the runtime's ``commit`` policy
    (``fit.fit_machine``). Small kernels on a real model cost more than a chain of tiny
    products shows (on the CPU about ten times more). To fit to the model under study, with the fit's plans held apart from
    the ones evaluated, use ``Experiment(calibration=...)``."""
    from ..passes import make_plan
    from ..passes.costmodel import predict_time
    from ..passes.plan import apply_plan
    from ..runtime import resolve_commit
    from ..staging import jit
    from .fit import Observation, fit_machine
    from .models import load_model, make_workload
    from .timing import timed_calls, warm

    net = load_model(model)
    policy = resolve_commit(commit)
    obs: list[Observation] = []
    for w in workloads:
        wl = make_workload(w, net)
        wl.fresh = None
        a, k = wl.args()
        g = jit(net, boundaries=boundaries).trace(*a, **k).graph
        cuts, fns = [], []
        for spec in strategies:
            plan = make_plan(g, spec, model=machine)
            cuts.append(apply_plan(g, plan))
            fns.append(jit(net, boundaries=boundaries, strategy=plan, validate=False, commit=commit))
        for fn in fns:
            warm(fn, wl, 2)
        timed = timed_calls(fns, wl, repeats)
        for spec, cut, t in zip(strategies, cuts, timed):
            segs = predict_time(cut, machine, policy).segments
            obs.append(Observation(w, segs, statistics.median(t.times), spec))
    fit = fit_machine(machine, obs, scales="shared")  # one scale: the model it is used for is another
    src = f"{machine.source}; overheads fitted on {model} {', '.join(workloads)} ({len(obs)} plans)"
    return replace(fit.machine, source=src)
