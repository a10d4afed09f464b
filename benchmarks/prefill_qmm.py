"""A prefill's quantized products on the device: one at a time, side by side, as the
product of the dequantized weight, and split into pieces (issue 13: the 4-bit prefill
target).

``prefill_products.py`` timed a model's products alone with no data between them, so
MLX's CUDA graph (whose edges are the data's) ran them side by side; in a prefill most
of them wait for each other. MLX's sm90 quantized product tiles its output 128 features
by 256 tokens (the token tile chosen from the number of features, 256 past 128 of them),
so a 512-token product of 2048 features is 32 tiles on 132 SMs. Each output element's
sum over the inner dimension does not depend on the tile that computes it, so a product
split into pieces of 128 features (token tile 128: four times the tiles, each half the
work) or of fewer tokens should keep its bytes; this measures whether it does and what
it saves.

For each of the reference llama's products (``--bits``, each of ``--tokens``): the
device's time for one product alone (between two stamp kernels reading the GPU's clock,
the stamps' own time subtracted), per product when ``--side`` independent products run
in one graph; ``deq``: MLX's product of the dequantized weight (what segc lowers such a
product to where its check, ``segc.lower.dequantized.same_bits``, finds the same bytes:
its answer and a comparison on a normal draw are printed); with ``--splits``, pieces:
``f128`` (of 128 output features, concatenated), ``f64``, ``t<half>`` (two halves of
the tokens), each compared byte for byte with the product in one piece.

With ``--peak N``: the reference llama's prefill of N tokens, eager's and segc's peak
memory (``mx.get_peak_memory``) and segc's bytes against eager's.

    python benchmarks/prefill_qmm.py [--bits 4] [--tokens 16,128,512,2048] [--repeats 15] [--side 8] [--splits] [--peak 512]

On a machine without CUDA the times are the host's and device's together (a synchronous
evaluation); the byte comparisons hold on any device.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

from device_time import CUDA, stamped

from segc.dtypes import to_bytes
from segc.lower import dequantized as segc_dequantized

Weights = tuple[mx.array, ...]


def weights(n: int, k: int, bits: int, count: int) -> list[Weights]:
    out = []
    for _ in range(count):
        w = (mx.random.normal((n, k)) * k**-0.5).astype(mx.bfloat16)
        out.append(tuple(mx.quantize(w, group_size=64, bits=bits)) if bits else (w,))
    mx.eval(out)
    return out


def product(x: mx.array, w: Weights, bits: int) -> mx.array:
    if not bits:
        return x @ w[0].T
    return mx.quantized_matmul(x, *w, transpose=True, group_size=64, bits=bits)


def rows(w: Weights, a: int, b: int) -> Weights:
    return tuple(p[a:b] for p in w)


def split_features(x: mx.array, w: Weights, bits: int, piece: int) -> mx.array:
    n = w[0].shape[0]
    return mx.concatenate([product(x, rows(w, a, min(a + piece, n)), bits) for a in range(0, n, piece)], axis=-1)


def split_tokens(x: mx.array, w: Weights, bits: int, piece: int) -> mx.array:
    m = x.shape[-2]
    return mx.concatenate([product(x[..., a : a + piece, :], w, bits) for a in range(0, m, piece)], axis=-2)


def device_s(x: mx.array, body: Callable[[mx.array], list[mx.array]], repeats: int) -> float:
    for _ in range(2):
        stamped(x, body)
    return statistics.median(stamped(x, body) for _ in range(repeats))


def dequantized(x: mx.array, w: Weights, bits: int) -> mx.array:
    """The form segc lowers such a product to (``segc.lower.dequantized.product``)."""
    if not bits:
        return product(x, w, bits)
    return segc_dequantized.product(x, *w, 64, bits, True)


def same(a: mx.array, b: mx.array) -> bool:
    mx.eval(a, b)
    return to_bytes(a) == to_bytes(b)


def row(spec: str, tokens: int, a: argparse.Namespace, empty: dict[tuple[int, int], float]) -> tuple[str, float, float]:
    name, k, n = spec.split(":")[0], int(spec.split(":")[1]), int(spec.split(":")[2])
    if (tokens, k) not in empty:
        x0 = mx.random.normal((1, tokens, k)).astype(mx.bfloat16)
        empty[tokens, k] = device_s(x0, lambda y: [y], a.repeats)
    x = mx.random.normal((1, tokens, k)).astype(mx.bfloat16)
    ws = weights(n, k, a.bits, a.side)
    alone = device_s(x, lambda y: [product(y, ws[0], a.bits)], a.repeats) - empty[tokens, k]
    side = (device_s(x, lambda y: [product(y, w, a.bits) for w in ws], a.repeats) - empty[tokens, k]) / a.side
    whole = product(x, ws[0], a.bits)
    deq = device_s(x, lambda y: [dequantized(y, ws[0], a.bits)], a.repeats) - empty[tokens, k]
    cells = [f"deq {1e6 * deq:7.1f} (draw {same(dequantized(x, ws[0], a.bits), whole)}"]
    if a.bits:
        key = ((1, tokens, k), tuple(ws[0][0].shape), "bf16", "u32", 64, a.bits, True)
        cells[0] += f", check {segc_dequantized.same_bits(key)}"
    cells[0] += ")"
    if a.splits:
        splits = {
            "f128": lambda y: split_features(y, ws[0], a.bits, 128),
            "f64": lambda y: split_features(y, ws[0], a.bits, 64),
            f"t{tokens // 2}": lambda y: split_tokens(y, ws[0], a.bits, tokens // 2),
        }
        for label, f in splits.items():
            t = device_s(x, lambda y, f=f: [f(y)], a.repeats) - empty[tokens, k]
            cells.append(f"{label} {1e6 * t:7.1f} ({same(f(x), whole)})")
    line = f"{name:>6} {tokens:6d} {k:5d} {n:6d} {1e6 * alone:9.1f} {1e6 * side:8.1f}  " + "  ".join(cells)
    return line, alone, deq


def peak_of(f: Callable[[mx.array], mx.array], prompt: mx.array) -> tuple[mx.array, int]:
    """``f(prompt)`` once to warm up, then its output and peak memory (bytes) in a second
    call (``mx.get_peak_memory`` from a reset)."""
    mx.eval(f(prompt))
    mx.synchronize()
    mx.reset_peak_memory()
    out = f(prompt)
    mx.eval(out)
    mx.synchronize()
    return out, mx.get_peak_memory()


def model_peak(bits: int, tokens: int) -> None:
    """The reference llama's prefill (``bits``): eager's and segc's (a segment per layer,
    concatenated, frozen) peak memory and whether segc gave eager's bytes."""
    from bench_llama import make_model

    import segc

    model = make_model("reference", bits=bits or None)
    prompt = mx.random.randint(0, 32000, (1, tokens))
    jitted = segc.jit(model, boundaries="layers.*", concat_projections=True, freeze_params=True)
    peaks, outs = {}, {}
    for name, f in (("eager", model), ("segc", jitted), ("eager again", model)):
        outs[name], peaks[name] = peak_of(f, prompt)
    gb = ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in peaks.items())
    print(f"prefill {tokens}, peak memory: {gb}; segc eager's bytes: {same(outs['segc'], outs['eager'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", type=int, default=4, help="0: bf16 products (MLX's matmul)")
    ap.add_argument("--tokens", default="512", help="comma-separated row counts")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--side", type=int, default=8, help="independent products in one graph")
    ap.add_argument("--splits", action="store_true", help="also time the product split into pieces")
    ap.add_argument(
        "--peak", type=int, default=0, help="also the reference model's prefill peak memory at this many tokens"
    )
    ap.add_argument(
        "--shapes", default="q:2048:2048,kv:2048:512,o:2048:2048,gate:2048:8192,down:8192:2048,head:2048:32000"
    )
    a = ap.parse_args()
    mx.random.seed(0)
    print(f"{a.bits or 16}-bit products, {mx.default_device()}, device clock {CUDA}")
    print(f"{'name':>6} {'rows':>6} {'k':>5} {'n':>6} {'alone us':>9} {'side us':>8}  deq us (same bytes)")
    empty: dict[tuple[int, int], float] = {}
    for tokens in (int(t) for t in a.tokens.split(",")):
        alone = deq = 0.0
        for spec in a.shapes.split(","):
            line, t_alone, t_deq = row(spec, tokens, a, empty)
            print(line, flush=True)
            alone, deq = alone + t_alone, deq + t_deq
        print(f"{tokens} rows, one product of each: {1e6 * alone:.1f} us, dequantized {1e6 * deq:.1f} us")
    if a.peak:
        model_peak(a.bits, a.peak)


if __name__ == "__main__":
    main()
