"""A layer's MLP as one kernel (``segc.lower.cuda_chain``) against the three product
kernels it stands for and against eager MLX, on the GPU's own clock and on the host's.

Device: ``R`` MLPs of the reference llama's sizes (distinct weights, so that L2 serves
none of them) between two stamp kernels (``device_time.stamped``): microseconds an MLP.
Host: the same ``R`` MLPs built and committed one at a time (``mx.async_eval`` after
each, as the executor commits a segment), the host's seconds an MLP, then a wait.
Each variant's output is compared with eager's byte for byte (the last column). Two
probes follow: the chain's tickets and waits alone (its three stages with no rows to
compute) and three empty kernels of the three kernels' grids: what the chain's
machinery costs on the device against what three launches cost. The ``+ next`` rows:
the MLP and the next layer's normed q, k and v product (``--next`` rows), as four
kernels and as the chain of four stages, compared with eager's product. The ``+ layer``
rows: a decode layer from its attention on (``--context`` positions), as the rotated
write with its attention then that chain (two kernels) and as the layer's one kernel
(``cuda_layer.py``), compared with each other.

    python benchmarks/chain_device.py [--reps 8] [--repeats 10] [--blocks 1024,528,264] [--only layer,probe]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

from device_time import CUDA, stamped

from segc.lower import cuda_chain, cuda_tickets, products
from segc.lower.products import ProductMatch

EPS = 1e-5


def resident(make: Callable[..., mx.array], pool: int = 8) -> Callable[..., mx.array]:
    """``make`` (a kernel's fresh state: counters and rows, made at each traced call, as
    numpy zeros) as a pool of ``pool`` states per shape made once, by the GPU, and handed
    out in turn. A state made on the host lives in CUDA managed memory and migrates to
    the GPU at its kernel's first touch, a cost a traced segment pays once (its state is
    a constant of the compiled call) but a launch here would pay every time; ``pool``
    consecutive launches (a measurement's independent MLPs, which may run together)
    never share one. The kernels leave their counters at zero for the next launch."""
    states: dict[tuple[Any, ...], list[mx.array]] = {}
    calls: dict[tuple[Any, ...], int] = {}

    def made(*args: Any) -> mx.array:
        i = calls.get(args, 0)
        calls[args] = i + 1
        have = states.setdefault(args, [])
        if len(have) <= i % pool:
            a = mx.zeros_like(make(*args))
            mx.eval(a)
            have.append(a)
        return have[i % pool]

    return made


def keep_states_resident() -> None:
    """Every chain, layer and attention kernel launched from here on takes its state
    from a :func:`resident` pool (the benchmarks' launches are outside any traced
    segment)."""
    from segc.lower import cuda_kvattention, cuda_layer

    cuda_chain.state = resident(cuda_chain.state)  # type: ignore[assignment]
    cuda_layer.state = resident(cuda_layer.state)  # type: ignore[assignment]
    cuda_layer.counter = resident(cuda_layer.counter)  # type: ignore[assignment]
    cuda_kvattention.counter = resident(cuda_kvattention.counter)  # type: ignore[assignment]


def _match(h: int, n: int, nq: int = 0) -> ProductMatch:
    """The chain of a llama MLP over concatenated gate and up weights (gate rows first);
    with ``nq``, and the next layer's normed q, k and v product of ``nq`` rows."""
    a = ProductMatch("add", ("o", "wo", "r"), (0,), h, (False,), "h", (1, 1, h), 0, frozenset())
    b = ProductMatch("glu", ("h", "wgu", "nw"), (0, n), n, (True, True), "a", (1, 1, n), 1, frozenset(), EPS)
    c = ProductMatch("add", ("a", "wd", "h"), (0,), h, (True,), "out", (1, 1, h), 2, frozenset())
    d = ProductMatch("gemv", ("out", "wq", "nw2"), (0,), nq, (), "q", (1, nq), 3, frozenset(), EPS)
    parts, ins = ((a, b, c, d), ("o", "wo", "r", "wgu", "nw", "wd", "wq", "nw2")) if nq else ((a, b, c), ())
    return ProductMatch(
        "chain", ins, (0, n), n, (False, True, True, True), "out", (1, 1, h), 2, frozenset(), EPS, None, parts
    )


def variants(h: int, n: int, nq: int, blocks: list[int]) -> dict[str, Callable[..., mx.array]]:
    """Each way to run one MLP: ``f(o, r, wo, wgu, nw, wd, wq, nw2)``, its output; those
    named ``+ next`` also the next normed product (``wq``, ``nw2``), its output."""
    m, m4 = _match(h, n), _match(h, n, nq)
    a, b, c, d = m4.parts

    def eager(o, r, wo, wgu, nw, wd, *_):
        hh = r + (o @ wo.T).reshape(1, 1, h)
        y = mx.fast.rms_norm(hh, nw, EPS).reshape(1, h) @ wgu.T
        g, u = y[:, :n].reshape(1, 1, n), y[:, n:].reshape(1, 1, n)
        act = (g * mx.sigmoid(g)) * u
        return hh + (act.reshape(1, n) @ wd.T).reshape(1, 1, h)

    def eager_next(o, r, wo, wgu, nw, wd, wq, nw2):
        return mx.fast.rms_norm(eager(o, r, wo, wgu, nw, wd), nw2, EPS).reshape(1, h) @ wq.T

    out: dict[str, Callable[..., mx.array]] = {"eager": eager}
    kernel = products.product_kernel("auto")
    if kernel is not None:

        def three(o, r, wo, wgu, nw, wd, *_):
            hh = kernel(a, [o, wo, r])
            act = kernel(b, [hh, wgu, nw])
            return kernel(c, [act.reshape(1, n), wd, hh])

        out["segc, 3 kernels"] = three
        out["segc, chain"] = lambda o, r, wo, wgu, nw, wd, *_: cuda_chain.chain(m, [o, wo, r, wgu, nw, wd])
        for g in blocks:
            out[f"segc, chain, {g} blocks"] = lambda o, r, wo, wgu, nw, wd, *_, g=g: cuda_chain.chain(
                m, [o, wo, r, wgu, nw, wd], blocks=g
            )
    out["eager + next"] = eager_next
    if kernel is not None:
        out["segc, 4 kernels + next"] = lambda o, r, wo, wgu, nw, wd, wq, nw2: kernel(
            d, [three(o, r, wo, wgu, nw, wd), wq, nw2]
        )
        out["segc, chain + next"] = lambda *w: cuda_chain.chain(m4, [w[0], w[2], w[1], *w[3:]])[1]
    return out


# the chain's ticket loop with no rows to compute: the first stage's first ticket writes
# the output (a kernel must write one)
_PROBE = cuda_tickets.tickets(
    [
        ("(H + RPB - 1) / RPB", "", "if (tk == 0 && threadIdx.x == 0 && threadIdx.y == 0) { out[0] = x[0]; }"),
        ("(NI + RPB - 1) / RPB", "", ""),
        ("(H + RPB - 1) / RPB", "", ""),
    ]
)


def probes(h: int, n: int) -> dict[str, Callable[..., mx.array]]:
    """The chain's tickets and waits alone (no products: what its three stages cost
    beyond their rows), against three empty kernels of the three kernels' grids."""
    if not CUDA:
        return {}
    rpb = 8
    ta, tb = -(-h // rpb), -(-n // rpb)
    probe = mx.fast.cuda_kernel(
        name="segc_chain_probe",
        input_names=["x", "ctlin"],
        output_names=["out"],
        source=_PROBE,
        header=cuda_tickets.CHAIN_HEADER,
    )
    empty = mx.fast.cuda_kernel(
        name="segc_chain_empty",
        input_names=["x"],
        output_names=["out"],
        source="if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) { out[0] = x[0]; }\n",
    )

    counters = resident(lambda: mx.array([0] * cuda_tickets.COUNTERS, dtype=mx.uint32))

    def tickets(o, *_):
        # counters of its own a launch, as the chain's state is: the launches of a timed
        # batch are independent, so MLX's CUDA graph may run them together (one shared
        # array is the likely cause of the thirty-fifth session's failed probe)
        ctl = counters()
        (y,) = probe(
            inputs=[o, ctl],
            template=[("H", h), ("NI", n), ("RPB", rpb)],
            grid=(32 * max(ta, tb), 8, 1),
            threadgroup=(32, 8, 1),
            output_shapes=[(1,)],
            output_dtypes=[o.dtype],
        )
        return y

    def three_empty(o, *_):
        y = o
        for blocks in (ta, tb, ta):
            (y,) = empty(
                inputs=[y],
                grid=(32 * blocks, 8, 1),
                threadgroup=(32, 8, 1),
                output_shapes=[(1,)],
                output_dtypes=[o.dtype],
            )
        return y

    return {"probe: tickets alone": tickets, "probe: 3 empty kernels": three_empty}


HQ, HKV, D = 32, 8, 64  # the reference llama's query and KV heads, and their size


def mlp_inputs(h: int, n: int, nq: int, sets: int) -> tuple[mx.array, mx.array, list[list[mx.array]]]:
    """An MLP's row and residual, and ``sets`` copies of its weights (distinct, so that
    L2 serves none of them): Wo, the gate's and up's rows concatenated, the norm's
    weight, Wd, and the next product's ``nq`` rows with its norm's weight; evaluated."""
    dt = mx.bfloat16
    o = (mx.random.normal((1, h)) * 0.5).astype(dt)
    r = (mx.random.normal((1, 1, h)) * 0.5).astype(dt)
    ws = []
    for i in range(sets):
        key = mx.random.split(mx.random.key(i), 4)
        ws.append(
            [
                (mx.random.normal((h, h), key=key[0]) * 0.02).astype(dt),
                (mx.random.normal((2 * n, h), key=key[1]) * 0.02).astype(dt),
                mx.random.uniform(0.5, 1.5, (h,), key=key[2]).astype(dt),
                (mx.random.normal((h, n), key=key[3]) * 0.02).astype(dt),
                (mx.random.normal((nq, h), key=key[0]) * 0.02).astype(dt),
                mx.random.uniform(0.5, 1.5, (h,), key=key[1]).astype(dt),
            ]
        )
    mx.eval(o, r, ws)
    return o, r, ws


def layer_inputs(h: int, n: int, nq: int, context: int) -> tuple[ProductMatch, list[mx.array]]:
    """A decode layer's match (the rotated write and its attention, then the chain of
    four stages) and its write's and attention's inputs but the queries: the key
    buffer, the new key, the value buffer, the new value, the offset, the mask
    (``context`` positions written of a buffer of ``context + 1``); evaluated."""
    from segc.lower.attention import AttentionMatch
    from segc.lower.kvwrite import KVWriteMatch

    dt, cap = mx.bfloat16, context + 1
    kb, vb = ((mx.random.normal((1, HKV, cap, D)) * 0.5).astype(dt) for _ in range(2))
    k, v = ((mx.random.normal((1, HKV, 1, D)) * 0.5).astype(dt) for _ in range(2))
    off, mask = mx.array(context, dtype=mx.int32), mx.arange(cap)[None] <= context
    w = KVWriteMatch(("kb", "k", "vb", "v", "off", "q"), ("ko", "vo", "qr"), D, False, 10000.0, 1.0, True, False, ())
    att = AttentionMatch("qr", "ko", "vo", "mask", D**-0.5, "att", 0, frozenset())
    mx.eval(kb, vb, k, v, mask)
    return replace(_match(h, n, nq), kind="layer", pair=(w, att)), [kb, k, vb, v, off, mask]


def layers(h: int, n: int, nq: int, context: int) -> dict[str, Callable[..., mx.array]]:
    """A decode layer from its attention on (:func:`layer_inputs`): the rotated write with
    its attention then the chain of four stages (two kernels), and the layer as one
    kernel (``cuda_layer.py``); each gives the next product's row."""
    hq, d = HQ, D
    if products.product_kernel("auto") is None or h != hq * d:
        return {}
    from segc.lower import cuda_kvattention, cuda_layer

    layer, (kb, k, vb, v, off, mask) = layer_inputs(h, n, nq, context)
    m4 = replace(layer, kind="chain", pair=None)

    def apart(o, r, wo, wgu, nw, wd, wq, nw2):
        q = o.reshape(1, hq, 1, d)  # (the step's queries: any row of the right size)
        _, _, a = cuda_kvattention.kv_attention([kb, k, vb, v, off, q], mask, d, False, 10000.0, 1.0, False, d**-0.5)
        return cuda_chain.chain(m4, [a.reshape(1, hq * d), wo, r, wgu, nw, wd, wq, nw2])[1]

    def one(o, r, wo, wgu, nw, wd, wq, nw2):
        q = o.reshape(1, hq, 1, d)
        return cuda_layer.layer(layer, [kb, k, vb, v, off, q, mask, wo, r, wgu, nw, wd, wq, nw2])[3]

    return {"segc, write+attention, chain + layer": apart, "segc, layer kernel + layer": one}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--next", type=int, default=3072, help="rows of the next product (q, k and v)")
    ap.add_argument("--reps", type=int, default=8, help="MLPs between the stamps (distinct weights)")
    ap.add_argument("--repeats", type=int, default=10, help="measurements per figure (the median)")
    ap.add_argument("--blocks", default="528,256,132", help="grids to try besides the default")
    ap.add_argument("--context", type=int, default=1024, help="positions the layer rows' attention reads")
    ap.add_argument("--only", default="", help="comma-separated words: the rows whose name holds one (and eager's)")
    args = ap.parse_args()
    h, n = args.hidden, args.intermediate
    o, r, ws = mlp_inputs(h, n, args.next, args.reps)
    blocks = [int(b) for b in args.blocks.split(",") if b]
    if CUDA:
        keep_states_resident()
    print(
        f"segc chain_device: MLP of hidden {h}, intermediate {n}, bf16, {args.reps} MLPs a measurement, device {mx.default_device()}"
    )
    if not CUDA:
        print("  (no CUDA: device figures are host and device together)")
    print(f"  {'variant':<28}{'device us/MLP':>15}{'host us/MLP':>13}  same as eager")
    want: dict[str, bytes] = {}
    every = {**variants(h, n, args.next, blocks), **layers(h, n, args.next, args.context), **probes(h, n)}
    words = [w for w in args.only.split(",") if w]
    if words:  # eager's rows stay: each row's bytes are compared with its group's first
        every = {k: f for k, f in every.items() if k.startswith("eager") or any(w in k for w in words)}
    for name, f in every.items():
        got = bytes(memoryview(f(o, r, *ws[0])))
        group = name.rsplit("+ ", 1)[-1] if "+ " in name else ""  # "next" rows with eager's, "layer" rows together
        want.setdefault(group, got)
        same = "" if name.startswith("probe") else str(got == want[group])

        def body(y: mx.array, f=f) -> list[mx.array]:
            return [f(y, r, *w) for w in ws]

        for _ in range(2):
            stamped(o, body)
        dev = statistics.median(stamped(o, body) for _ in range(args.repeats)) / len(ws)
        hosts = []
        for _ in range(args.repeats):
            mx.synchronize()
            t = time.perf_counter()
            for w in ws:
                mx.async_eval(f(o, r, *w))
            hosts.append((time.perf_counter() - t) / len(ws))
            mx.synchronize()
        print(f"  {name:<28}{dev * 1e6:>15.1f}{statistics.median(hosts) * 1e6:>13.1f}  {same}")


if __name__ == "__main__":
    main()
