"""A decode layer's KV write and attention on the GPU's clock, each form apart (issue 13:
segc's step as one CUDA graph costs the device more than eager's, and more than the same
step with MLX's rotations and a select write, ``segcnokv``: is it the kernel?).

Each form runs over ``--layers`` distinct buffer sets (the reference llama's: 32 query
heads over 8 KV heads of 64, a 1,280-position buffer written at 1,024, bf16), between
``device_time.py``'s two stamp kernels, the median over ``--repeats`` stamped runs,
per layer:

- ``eager``: mlx-lm's step as eager MLX runs it: ``mx.fast.rope`` of the queries and keys,
  the row written into the buffer (donated: MLX writes it in place), MLX's fused
  attention over the live positions;
- ``select``: ``segcnokv``'s form, compiled as a segment runs it: the rotations, the
  row written by a select against the offset, segc's attention kernel over the buffer
  with a mask;
- ``write, attention``: segc's rotated write kernel (copying the buffers), then its
  attention kernel (``SEGC_FUSED_KV_ATTENTION=0``);
- ``fused, copying`` and ``fused, in place``: the write with its attention as one kernel
  (segc's default, and ``kv_in_place=True``);
- ``attention``: segc's attention kernel alone over buffers already written (the floor
  of every form above but eager's);
- ``fused, copying, st``, ``fused, in place, st`` and ``attention, staged``: the same
  with ``SEGC_ATTENTION_STAGE=1`` (each block's chunk read into shared memory first).

Every form hands its new buffers to the next run, as a cache does, so the allocator sees
what a decode sees. Each call of a segc form makes its kernel's counter (a copy of a zero,
``segc.lower.scratch``; before the forty-fourth session the sixteen calls shared one, and
MLX could run them at once), and its time is counted with the form's. Alone, a form finds its buffers in L2 (16 layers' are 42 MB); inside a
step the weights read since the last layer have pushed them out to HBM. ``--flush MB``
times every form again with a sum over MB megabytes read before each layer (the layer's
queries wait on it), so that its buffers come from HBM as in a step, and the sum alone
(``flush``): a form's own time is its row less the sum's. The attention outputs of the segc forms are compared byte for byte
(the fused kernel must give the two kernels' bytes). With ``--step-layers N`` it also
lowers a reference llama of N layers with ``kv_in_place=True`` and prints, per segment,
the writes paired with their attention and how many are written in place (a layer whose
old buffers have another reader copies).

With ``--device-offset`` the segc forms read an offset made on the device (16 bytes, a
kernel's: device memory; the forty-fifth session's experiment, not kept); without, one
made on the host, as segc's steps make it (a scalar in MLX's managed pool, which the
device may read across the bus).

    python benchmarks/kvattn_device.py [--layers 16] [--repeats 30] [--step-layers 16] [--flush 96] [--device-offset]

Needs MLX's CUDA build and a GPU for segc's kernels; on the CPU only ``eager`` runs, on
the wall clock.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

from device_time import CUDA, stamped

HQ, HKV, D, CAP, POS = 32, 8, 64, 1280, 1024
BASE, DIMS = 10000.0, 64
SCALE = D**-0.5
Body = Callable[[mx.array], list[mx.array]]


def _state(layers: int) -> list[list[Any]]:
    """Per layer: key buffer, value buffer, new key, new value (bf16)."""
    out = []
    for i in range(layers):
        ks = mx.random.split(mx.random.key(i), 4)
        kb, vb = (mx.random.normal((1, HKV, CAP, D), key=ks[j]).astype(mx.bfloat16) for j in (0, 1))
        k, v = (mx.random.normal((1, HKV, 1, D), key=ks[j]).astype(mx.bfloat16) for j in (2, 3))
        out.append([kb, vb, k, v])
    mx.eval(out)
    return out


def _eager(q: mx.array, kb: mx.array, k: mx.array, vb: mx.array, v: mx.array) -> list[mx.array]:
    """A layer as eager mlx-lm runs it (not compiled; the buffers donated, as a cache's are)."""
    qr = mx.fast.rope(q, DIMS, traditional=False, base=BASE, scale=1.0, offset=POS)
    kr = mx.fast.rope(k, DIMS, traditional=False, base=BASE, scale=1.0, offset=POS)
    kb = mx.slice_update(kb, kr, mx.array([POS]), (2,))
    vb = mx.slice_update(vb, v, mx.array([POS]), (2,))
    o = mx.fast.scaled_dot_product_attention(qr, kb[:, :, : POS + 1], vb[:, :, : POS + 1], scale=SCALE)
    return [o, kb, vb]


def _segc_forms(device_offset: bool = False) -> dict[str, Callable[..., list[mx.array]]]:
    from segc.lower.cuda_attention import cuda_attention
    from segc.lower.cuda_kvattention import kv_attention
    from segc.lower.cuda_kvwrite import kv_write

    mask = (mx.arange(CAP) <= POS)[None]
    off = mx.array(POS, dtype=mx.int32)
    if device_offset:  # 16 bytes made by a kernel: device memory, not MLX's managed scalar pool
        off = mx.full((4,), off)[0]
        mx.eval(off)
    pos = mx.arange(CAP)[None, None, :, None] == off

    def select(q, kb, k, vb, v):
        qr = mx.fast.rope(q, DIMS, traditional=False, base=BASE, scale=1.0, offset=off)
        kr = mx.fast.rope(k, DIMS, traditional=False, base=BASE, scale=1.0, offset=off)
        kb, vb = mx.where(pos, kr, kb), mx.where(pos, v, vb)
        return [cuda_attention(qr, kb, vb, mask, SCALE, kernels=1), kb, vb]

    def apart(q, kb, k, vb, v):
        ko, vo, qo = kv_write([kb, k, vb, v, off, q], DIMS, False, BASE, 1.0, True, False)
        return [cuda_attention(qo, ko, vo, mask, SCALE, kernels=1), ko, vo]

    def fused(in_place: bool) -> Callable[..., list[mx.array]]:
        def f(q, kb, k, vb, v):
            ko, vo, o = kv_attention([kb, k, vb, v, off, q], mask, DIMS, False, BASE, 1.0, False, SCALE, in_place)
            return [o, ko, vo]

        return f

    def attention(q, kb, k, vb, v):
        return [cuda_attention(q, kb, vb, mask, SCALE, kernels=1), kb, vb]

    forms = {
        "select": select,
        "write, attention": apart,
        "fused, copying": fused(False),
        "fused, in place": fused(True),
        "attention": attention,
        # each block's chunk read into shared memory first (SEGC_ATTENTION_STAGE=1)
        "fused, copying, st": _staged(fused(False)),
        "fused, in place, st": _staged(fused(True)),
        "attention, staged": _staged(attention),
    }
    return forms


def _staged(f: Callable[..., list[mx.array]]) -> Callable[..., list[mx.array]]:
    """``f`` with ``SEGC_ATTENTION_STAGE=1`` while it runs: its kernels are made when the
    compiled function first traces it."""
    from bench_llama import first_call_with

    return lambda *args: first_call_with(lambda: f(*args), env={"SEGC_ATTENTION_STAGE": "1"})


def _threaded(f: Callable[..., list[mx.array]], st: list[list[Any]], flush: mx.array | None = None) -> Body:
    """``f`` over every layer, its new buffers the next run's (the old ones let go);
    ``flush``: an array summed before each layer, after the last layer's output (MLX's
    CUDA graph runs what does not depend on something beside it or before it), the
    layer's queries waiting on the sum (plus zero times it: the same values), so that the
    layer's buffers leave L2."""

    def body(q: mx.array) -> list[mx.array]:
        outs: list[mx.array] = []
        for s in st:
            kb, vb = s[0], s[1]
            s[0] = s[1] = None
            if flush is None:
                qq = q
            else:
                (fl,) = mx.depends([flush], [outs[-3] if outs else q])
                qq = q + (mx.sum(fl) * 0).astype(q.dtype)
            o, kb, vb = f(qq, kb, s[2], vb, s[3])
            s[0], s[1] = kb, vb
            outs += [o, kb, vb]
        return outs

    return body


def _in_place_census(layers: int) -> None:
    """Per segment of a reference llama's decode step lowered with ``kv_in_place=True``:
    the writes paired with their attention, and how many are written in place."""
    from bench_llama import FixedContext, make_model

    import segc
    from segc.ir import segments
    from segc.lower.fused import cuda_defaults, find_all
    from segc.lower.kvwrite import written_in_place

    model = make_model("reference", layers=layers)
    fc = FixedContext(model, POS)
    for kw in ({}, {"concat_projections": True, "freeze_params": True}):
        step = segc.jit(model, validate=False, kv_in_place=True, **kw)
        g = step.lower(mx.array([[1]]), cache=fc.reset()).graph
        avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
        consts = {c.var.name: c.value for c in g.consts}
        for i, s in enumerate(segments(g)):
            found = find_all(s.eqns(g), s.outputs, consts, avals, g.eqns, g.outputs, **cuda_defaults())
            pairs = [w for w, _ in found.pairs]
            kept = sum(written_in_place(w, True) for w in pairs)
            print(
                f"  {kw or 'plain'}, segment {i}: {len(found.writes)} writes alone, {len(pairs)} with their attention, "
                f"{kept} in place",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16, help="buffer sets between the stamps")
    ap.add_argument("--repeats", type=int, default=30, help="stamped runs per form (the median)")
    ap.add_argument("--step-layers", type=int, default=0, help="also count in-place writes in a lowered step")
    ap.add_argument(
        "--device-offset", action="store_true", help="the offset made on the device, not the host (an experiment)"
    )
    ap.add_argument("--flush", type=int, default=0, help="also every form after a sum over this many MB a layer")
    args = ap.parse_args()
    what = "device time (the GPU's clock)" if CUDA else "wall-clock time (no CUDA: host and device together)"
    print(f"{what} on {mx.default_device()}, mlx {mx.__version__}; {HQ}/{HKV} heads of {D}, buffer {CAP} at {POS}")
    q = mx.random.normal((1, HQ, 1, D)).astype(mx.bfloat16)
    fs: dict[str, Callable[..., list[mx.array]]] = {"eager": _eager}
    if CUDA:
        fs.update({name: mx.compile(f) for name, f in _segc_forms(args.device_offset).items()})
    forms = {name: _threaded(f, _state(args.layers)) for name, f in fs.items()}
    if args.flush:
        big = mx.ones((args.flush * 2**18,), dtype=mx.float32)
        forms["flush"] = _threaded(lambda q, kb, k, vb, v: [q, kb, vb], _state(args.layers), big)
        forms.update({f"{name} +fl": _threaded(f, _state(args.layers), big) for name, f in fs.items()})
    firsts: dict[str, bytes] = {}
    print(
        f"{'form':<22}{'median us':>10}{'min us':>9}  per layer; bytes as 'write, attention' (the staged attention's as 'attention')"
    )
    for name, body in forms.items():
        firsts[name] = bytes(memoryview(body(q)[0]))
        for _ in range(2):
            stamped(q, body)
        spans = [1e6 * stamped(q, body) / args.layers for _ in range(args.repeats)]
        base = name.removesuffix(" +fl")
        ref = firsts.get("attention" if base.startswith("attention") else "write, attention")
        same = (
            ""
            if base in ("eager", "select", "attention", "write, attention", "flush") or ref is None
            else str(firsts[name] == ref)
        )
        print(f"{name:<22}{statistics.median(spans):>10.2f}{min(spans):>9.2f}  {same}", flush=True)
    if args.step_layers and CUDA:
        print(f"\nin-place writes in a {args.step_layers}-layer reference step:")
        _in_place_census(args.step_layers)


if __name__ == "__main__":
    main()
