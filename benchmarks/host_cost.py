"""What MLX's host spends per kernel and per commit, with no model and no segc: a chain of
``--kernels`` kernels run eagerly, as one ``mx.compile``d function, and as ``--segments``
compiled functions with an ``mx.async_eval`` after each (segc's decode step: 83 kernels in
17 segments on the H200).

Kinds of kernel: ``builtin`` (a one-row product, MLX's own ``gemv``: one kernel that
compilation cannot fuse), ``custom`` (an ``mx.fast.cuda_kernel`` adding one to a
vector, as segc's kernels are made; CUDA only) and ``custom+2`` (the same with two more
outputs it leaves unwritten: what two outputs cost, as the attention's partial results
handed back as one output instead of three save). For each: the host time from the call to
the return of its ``mx.async_eval`` (building, then encoding and launching), and the
wall time to the end of the work, medians over ``--repeats`` calls. On the H200 a segc
decode step of 83 kernels spends about 2.3 ms of host time (docs/performance-log.md, fifteenth
session), about 25 us a kernel, where eager's kernels cost about 8 us: this separates the
kernel's kind, compilation and the commits (sixteenth session: 6 us a custom kernel, 34
us a segment of five with its commit; ``segment_host.py`` times segc's own segments).
Every variant's result is compared byte for byte with the eager chain's. Then, on the
segments, what the KV write in place (``SEGC_KV_IN_PLACE=1``) adds around each kernel:
two KV-like buffers made contiguous and ordered after it by ``mx.depends`` (host time
without and with, and the difference a kernel; ``inplace`` rows).

    python benchmarks/host_cost.py [--kernels 83] [--segments 17] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

ADD_ONE = """
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < x_shape[0]) {
        out[i] = x[i] + static_cast<T>(1);
    }
"""


def step_of(kind: str, size: int) -> Callable[[mx.array], mx.array]:
    """One kernel of ``kind``, as a function of the running vector."""
    if kind == "builtin":  # (scaled so that the chain's values stay finite)
        w = mx.random.normal((size, size), key=mx.random.key(0)).astype(mx.bfloat16) * (size**-0.5)
        mx.eval(w)
        return lambda x: (x[None] @ w)[0]
    extra = 2 if kind == "custom+2" else 0  # outputs the kernel leaves unwritten, as scratch
    names = ["out", *(f"scratch{i}" for i in range(extra))]
    kernel = mx.fast.cuda_kernel(
        name=f"host_cost_add_one_{extra}", input_names=["x"], output_names=names, source=ADD_ONE
    )

    def add_one(x: mx.array) -> mx.array:
        return kernel(
            inputs=[x],
            template=[("T", x.dtype)],
            grid=(size, 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[x.shape, *[(1024,)] * extra],
            output_dtypes=[x.dtype, *[mx.float32] * extra],
        )[0]

    return add_one


def chain(step: Callable[[mx.array], mx.array], n: int) -> Callable[[mx.array], mx.array]:
    def f(x: mx.array) -> mx.array:
        for _ in range(n):
            x = step(x)
        return x

    return f


def variants(kind: str, kernels: int, segments: int, size: int) -> dict[str, list[Callable[[mx.array], mx.array]]]:
    """Each variant as the functions a call runs in turn, an ``mx.async_eval`` after each."""
    step = step_of(kind, size)
    sizes = [kernels // segments + (i < kernels % segments) for i in range(segments)]
    return {
        "eager": [chain(step, kernels)],
        "compiled": [mx.compile(chain(step, kernels))],
        "segments": [mx.compile(chain(step, k)) for k in sizes],
    }


def timed(parts: list[Callable[[mx.array], mx.array]], x: mx.array, repeats: int) -> tuple[float, float, mx.array]:
    hosts, walls = [], []
    y = x
    for i in range(repeats + 3):
        mx.synchronize()
        t0 = time.perf_counter()
        y = x
        for f in parts:
            y = f(y)
            mx.async_eval(y)
        t1 = time.perf_counter()
        mx.eval(y)
        t2 = time.perf_counter()
        if i >= 3:  # warm-up: tracing, compiling, the kernels' first launch
            hosts.append(t1 - t0)
            walls.append(t2 - t0)
    return statistics.median(hosts), statistics.median(walls), y


def operands(size: int) -> tuple[mx.array, mx.array]:
    """A bf16 weight (scaled so that a chain's values stay finite) and a bf16 vector,
    evaluated: what the chains of this script and its neighbours run on."""
    w = mx.random.normal((size, size), key=mx.random.key(0)).astype(mx.bfloat16) * (size**-0.5)
    x = mx.random.normal((size,), key=mx.random.key(1)).astype(mx.bfloat16)
    mx.eval(w, x)
    return w, x


def raw(y: mx.array) -> bytes:
    """A bf16 array's bytes (compared raw: bit-identity, not closeness)."""
    return np.array(y.view(mx.uint16)).tobytes()


def bound(f: Callable[..., mx.array], extra: Sequence[mx.array]) -> Callable[[mx.array], mx.array]:
    """``f`` as a function of the running vector alone, its extra inputs bound."""
    return lambda y: f(y, *extra)


def compiled_against_eager(
    fns: list[Callable[..., mx.array]], x: mx.array, repeats: int, extra: Sequence[mx.array] = ()
) -> tuple[float, bool]:
    """``fns`` run one after another from ``x`` (each also given ``extra``), each
    ``mx.compile``d and committed (``timed``): the host's seconds, and whether the bytes
    are those of the same functions run eagerly."""
    want = x
    for f in fns:
        want = f(want, *extra)
    mx.eval(want)
    parts = [bound(mx.compile(f), extra) for f in fns]
    host, _, got = timed(parts, x, repeats)
    return host, raw(got) == raw(want)


def held(step: Callable[[mx.array], mx.array], n: int, wrap: bool) -> Callable[..., list[mx.array]]:
    """``n`` steps, each with a pair of KV-like buffers (``2 * n`` inputs after the
    vector) handed back as outputs: as they are, or (``wrap``) as the write in place
    hands them back (``SEGC_KV_IN_PLACE=1``: each made contiguous, then ordered after the
    step by one ``mx.depends``), so the difference is what those three primitives cost
    the host a step."""

    def f(x: mx.array, *bufs: mx.array) -> list[mx.array]:
        out = []
        for i in range(n):
            k, v = bufs[2 * i], bufs[2 * i + 1]
            if wrap:
                k, v = mx.contiguous(k), mx.contiguous(v)
            x = step(x)
            out += mx.depends([k, v], [x]) if wrap else [k, v]
        return [x, *out]

    return f


def in_place_cost(kind: str, kernels: int, segments: int, size: int, repeats: int) -> tuple[float, float, bool]:
    """The host's seconds a call of ``kernels`` steps in ``segments`` compiled functions
    (an ``mx.async_eval`` after each) without and with the in-place write's wrapping
    (:func:`held`), and whether both give the eager chain's bytes and hand back the
    buffers unchanged."""
    step = step_of(kind, size)
    sizes = [kernels // segments + (i < kernels % segments) for i in range(segments)]
    bufs = [mx.random.normal((1, 8, 64, 64), key=mx.random.key(2 + i)).astype(mx.bfloat16) for i in range(2 * kernels)]
    x = mx.random.normal((size,), key=mx.random.key(1)).astype(mx.bfloat16)
    mx.eval(bufs, x)
    want = chain(step, kernels)(x)
    mx.eval(want)
    hosts, same = [], True
    for wrap in (False, True):
        fns = [mx.compile(held(step, k, wrap)) for k in sizes]
        starts = [sum(sizes[:i]) for i in range(segments)]
        times = []
        for r in range(repeats + 3):
            mx.synchronize()
            t0 = time.perf_counter()
            y, kept = x, []
            for f, k, a in zip(fns, sizes, starts):
                y, *b = f(y, *bufs[2 * a : 2 * (a + k)])
                kept += b
                mx.async_eval(y, *b)
            t1 = time.perf_counter()
            mx.eval(y, *kept)
            if r >= 3:
                times.append(t1 - t0)
        same &= raw(y) == raw(want) and all(raw(a) == raw(b) for a, b in zip(kept, bufs))
        hosts.append(statistics.median(times))
    return hosts[0], hosts[1], same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=83)
    ap.add_argument("--segments", type=int, default=17)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument(
        "--kinds", default="builtin,custom,custom+2",
        help="custom (and custom+2: the same kernel with two more outputs) need MLX's CUDA backend",
    )  # fmt: skip
    ap.add_argument("--size", type=int, default=2048, help="the vector's length and the product's width")
    a = ap.parse_args()
    cuda = mx.default_device() == mx.gpu and mx.cuda.is_available()
    kinds = [k for k in a.kinds.split(",") if not k.startswith("custom") or cuda]
    print(f"mlx {mx.__version__}, {mx.default_device()}, {a.kernels} kernels, {a.segments} segments")
    print(f"{'kind':<8} {'variant':<9} {'host':>10} {'wall':>10} {'host/kernel':>12}  same bytes as eager")
    same_everywhere = True
    for kind in kinds:
        x = mx.random.normal((a.size,), key=mx.random.key(1)).astype(mx.bfloat16)
        want = None
        for name, parts in variants(kind, a.kernels, a.segments, a.size).items():
            host, wall, y = timed(parts, x, a.repeats)
            got = raw(y)
            want = got if want is None else want
            same_everywhere &= got == want
            per = host / a.kernels * 1e6
            print(f"{kind:<8} {name:<9} {host * 1e3:>7.3f} ms {wall * 1e3:>7.3f} ms {per:>9.2f} us  {got == want}")
    print("the write in place's wrapping (two mx.contiguous and one mx.depends a kernel), the segments' host time:")
    print(f"{'kind':<8} {'variant':<9} {'without':>10} {'with':>10} {'more/kernel':>12}  same bytes as eager")
    for kind in kinds:
        off, on, same = in_place_cost(kind, a.kernels, a.segments, a.size, a.repeats)
        same_everywhere &= same
        per = (on - off) / a.kernels * 1e6
        print(f"{kind:<8} {'inplace':<9} {off * 1e3:>7.3f} ms {on * 1e3:>7.3f} ms {per:>9.2f} us  {same}")
    print(f"every variant gave the eager chain's bytes: {same_everywhere}")
    raise SystemExit(0 if same_everywhere else 1)


if __name__ == "__main__":
    main()
