"""A prefill's expert products on the device: MLX's sorted ``gather_mm`` against forms
that could keep its bytes faster (issue 13: the mixtral prefill target).

mlx-lm's ``SwitchGLU`` sorts a prefill's (token, expert) rows by expert and runs each
expert product as ``gather_mm(x, W.swapaxes(-1, -2), rhs_indices=idx,
sorted_indices=True)`` of one row a slot. MLX 0.32's CUDA build runs that as CUTLASS's
grouped GEMM (``cutlass_grouped_gemm_unaligned``: one problem per expert, operands
loaded one element at a time). The forms measured here, each compared byte for byte
with it:

- ``dense``: every expert's product over every token (``x @ W.swapaxes``, one batched
  cuBLAS product, ``E / top_k`` times the work), then each row's expert picked;
- ``blocks:B``: each expert's rows padded to a multiple of ``B`` rows (on the device:
  counts, offsets, a scatter), one ``gather_mm`` of ``B`` rows a slot with the block's
  expert as its index (MLX's tiled gather GEMM), then the rows gathered back.

For each of the mixtral preset's expert products (gate and up: 2048 to 8192; down: 8192
to 2048; 8 experts, 2 a token) and each of ``--tokens``: the device's time of each form
(between two stamp kernels reading the GPU's clock) and whether its bytes are the
sorted ``gather_mm``'s, on a normal draw and on a draw of mixed powers of two (where a
change of summation order shows).

    python benchmarks/prefill_moe.py [--tokens 512,2048] [--repeats 10] [--blocks 64,128] [--bits 4] [--dtype float32] [--peak 512]

With ``--bits``: quantized experts (mlx-lm's ``QuantizedSwitchLinear``, ``gather_qmm``), and
the forms ``dense`` (the dequantized weights' product over every token) and ``grouped``
(the sorted ``gather_mm`` of the dequantized weights).

With ``--peak N``: the mixtral preset's prefill of N tokens, eager's and segc's peak memory
(``mx.get_peak_memory``; segc's defaults, concatenated and frozen, and that with the
rewrite off) and segc's bytes against eager's.

The rows a sorted ``gather_mm`` reads must be an array of their own (as mlx-lm's are, a
gather's output): MLX 0.32's CUDA grouped GEMM steps from one row to the next by the
stride of the rows' axis of one element (``(R, 1, K)``'s middle axis), so rows made by
``x[tok][:, None, :]`` (a view whose middle stride is not ``K``) give wrong sums there.

On a machine without CUDA the times are the host's and device's together.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

from device_time import stamped
from prefill_qmm import peak_of

from segc.dtypes import to_bytes
from segc.lower import checked, experts

SHAPES = "gate:2048:8192,down:8192:2048"  # name:inputs:outputs, the mixtral preset's


def routing(tokens: int, experts: int, top: int, seed: int) -> tuple[mx.array, mx.array]:
    """mlx-lm's sorted rows: each row's token and its expert, sorted by expert."""
    logits = mx.random.normal((tokens, experts), key=mx.random.key(seed))
    inds = mx.argpartition(-logits, kth=top - 1, axis=-1)[:, :top].flatten()
    order = mx.argsort(inds)
    return (order // top).astype(mx.uint32), inds[order].astype(mx.uint32)


def draw(shape: tuple[int, ...], seed: int, powers: bool, dtype: mx.Dtype = mx.bfloat16) -> mx.array:
    k = mx.random.split(mx.random.key(seed), 2)
    if not powers:
        return mx.random.normal(shape, key=k[0]).astype(dtype)
    e = mx.random.randint(0, 7, shape, key=k[0]).astype(mx.float32)
    sign = mx.where(mx.random.bernoulli(0.5, shape, key=k[1]), 1.0, -1.0)
    return (sign * mx.power(2.0, e) / 64).astype(dtype)


Weights = tuple[list[mx.array], experts.Quant]  # the product's weight inputs as segc's rewrite takes them


def eager(x: mx.array, tok: mx.array, idx: mx.array, w: Weights) -> mx.array:
    """MLX's sorted product (``gather_mm``, or ``gather_qmm`` with ``--bits``)."""
    rows = x[:, None, :][tok]  # as mlx-lm's rows: a gather's own (R, 1, K) array (see the module's note)
    return experts.reference(rows, idx, *w).reshape(tok.size, -1)


def dense(x: mx.array, tok: mx.array, idx: mx.array, w: Weights) -> mx.array:
    """segc's rewrite (``segc.lower.experts.leaf``): every token's product, picked."""
    ws, quant = w
    return experts.leaf(x[:, None, :], idx, tok, ws, quant, (tok.size, -1))[0]


def grouped(x: mx.array, tok: mx.array, idx: mx.array, w: Weights) -> mx.array:
    """The sorted ``gather_mm`` of the dequantized weights (MLX's grouped GEMM)."""
    return eager(x, tok, idx, ([experts.weight(*w, x.dtype)], None))


def blocks(b: int) -> Callable[[mx.array, mx.array, mx.array, Weights], mx.array]:
    def form(x: mx.array, tok: mx.array, idx: mx.array, w: Weights) -> mx.array:
        bt = w[0][0]  # (E, K, N)
        e, r = bt.shape[0], tok.size
        nb = -(-r // b) + e  # enough blocks for any routing
        experts = mx.arange(e, dtype=mx.uint32)
        counts = (idx[:, None] == experts[None]).sum(0).astype(mx.int32)
        per = (counts + b - 1) // b  # blocks an expert takes
        end_pad = mx.cumsum(per) * b
        start_pad = end_pad - per * b
        start = mx.cumsum(counts) - counts
        pos = start_pad[idx] + mx.arange(r, dtype=mx.int32) - start[idx]
        padded = mx.zeros((nb * b, x.shape[-1]), x.dtype).at[pos].add(x[tok])
        first = mx.arange(nb, dtype=mx.int32) * b
        block_expert = mx.minimum((end_pad[None] <= first[:, None]).sum(1), e - 1).astype(mx.uint32)
        out = mx.gather_mm(padded.reshape(nb, b, -1), bt, rhs_indices=block_expert)
        return out.reshape(nb * b, -1)[pos]

    return form


def device_s(x: mx.array, body: Callable[[mx.array], list[mx.array]], repeats: int) -> float:
    for _ in range(2):
        stamped(x, body)
    return statistics.median(stamped(x, body) for _ in range(repeats))


def model_peak(tokens: int) -> None:
    """The mixtral preset's prefill of ``tokens``: the peak memory (``mx.get_peak_memory``)
    of eager, segc's defaults and segc concatenated and frozen (a segment per layer each),
    the last also with the rewrite off; whether each gave eager's bytes."""
    from bench_llama import make_model

    import segc

    model = make_model("reference", arch="mixtral")
    prompt = mx.random.randint(0, 32000, (1, tokens))
    variants: dict[str, Callable[[mx.array], mx.array]] = {
        "eager": model,
        "segc": segc.jit(model, boundaries="layers.*"),
        "frozen": segc.jit(model, boundaries="layers.*", concat_projections=True, freeze_params=True),
        "eager again": model,
    }
    peaks, outs = {}, {}
    for name, f in [*variants.items(), ("frozen, rewrite off", variants["frozen"])]:
        if name == "frozen, rewrite off":
            experts.DENSE_EXPERTS = "never"
            f = segc.jit(model, boundaries="layers.*", concat_projections=True, freeze_params=True)
        outs[name], peaks[name] = peak_of(f, prompt)
    experts.DENSE_EXPERTS = "auto"
    for name, peak in peaks.items():
        same = to_bytes(outs[name]) == to_bytes(outs["eager"])
        print(f"prefill {tokens}, {name:<20} peak {peak / 1e9:7.3f} GB, eager's bytes {same}")
    print(f"the checks took {checked.SPENT:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--blocks", default="64,128")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--top", type=int, default=2)
    ap.add_argument("--peak", type=int, default=0, help="the mixtral preset's prefill of this many tokens: peak memory")
    ap.add_argument("--bits", type=int, default=0, help="quantized experts (gather_qmm), 4 or 8")
    ap.add_argument("--dtype", default="bfloat16", help="float32 on the CPU (its gather_mm takes no other)")
    a = ap.parse_args()
    dt = getattr(mx, a.dtype)
    forms: dict[str, Callable[..., mx.array]] = {"eager": eager, "dense": dense}
    if a.bits:
        forms["grouped"] = grouped
    else:
        forms.update({f"blocks:{b}": blocks(int(b)) for b in a.blocks.split(",") if b})

    def weights(seed: int, n: int, k: int, powers: bool) -> Weights:
        w = draw((a.experts, n, k), seed, powers, dt) * (k**-0.5 if not powers else 1)
        return (
            (list(mx.quantize(w, group_size=64, bits=a.bits)), (64, a.bits)) if a.bits else ([w.swapaxes(-1, -2)], None)
        )

    print(f"{'product':>7} {'tokens':>6} " + "  ".join(f"{n:>22}" for n in forms), flush=True)
    for tokens in (int(t) for t in a.tokens.split(",")):
        tok, idx = routing(tokens, a.experts, a.top, seed=tokens)
        for spec in a.shapes.split(","):
            name, k, n = spec.split(":")[0], int(spec.split(":")[1]), int(spec.split(":")[2])
            w = weights(1, n, k, False)
            x = draw((tokens, k), 2, False, dt)
            mx.eval(tok, idx, w[0], x)
            cells = []
            for f in forms.values():
                t = device_s(x, lambda y, f=f, tok=tok, idx=idx, w=w: [f(y, tok, idx, w)], a.repeats)
                same = []
                for powers in (False, True):
                    xd, wd = draw((tokens, k), 3, powers, dt), weights(4, n, k, powers)
                    ref, got = eager(xd, tok, idx, wd), f(xd, tok, idx, wd)
                    mx.eval(ref, got)
                    same.append(to_bytes(ref) == to_bytes(got))
                cells.append(f"{1e6 * t:9.1f} us {'/'.join('same' if s else 'DIFF' for s in same):>10}")
            print(f"{name:>7} {tokens:6d} " + "  ".join(f"{c:>22}" for c in cells), flush=True)
    if a.peak:
        model_peak(a.peak)


if __name__ == "__main__":
    main()
