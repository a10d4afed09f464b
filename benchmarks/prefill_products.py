"""How much of a prefill the matrix products alone take on the device (issue 13: the
4-bit and MoE prefill targets).

segc keeps eager's bits by running MLX's own product kernels unchanged in prefill (its
CUDA kernels are for one-row products); so if the products alone take a share ``p`` of
eager's prefill, no segc plan can do better than about ``p`` x eager without other
kernels. This times, in one process, eager mlx-lm's prefill of ``--tokens`` tokens and
the same model's products alone on the same input: every layer's linear layers
(quantized with ``--bits``), for a mixture of experts each layer's router and expert
block (``switch_mlp``, MLX's gathered products, with the router's own choice of
experts), and the output head (the embedding's weight where the two are tied) --
each product's output evaluated, the products of all layers in one graph, waited for.

No data passes between these products, and MLX's CUDA graphs take their edges from the
data, so the device may run them side by side; in a prefill each waits for the one
before it. The share is therefore a lower bound: for the 4-bit llama, whose quantized
products leave most of the GPU idle, far below their cost in the prefill
(``prefill_qmm.py`` times each product alone and side by side).

    python benchmarks/prefill_products.py [--arch mixtral] [--bits 4] [--tokens 512] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).parent))


def timed(f: Callable[[], Any], repeats: int) -> float:
    for _ in range(3):
        mx.eval(f())
    ts = []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(f())
        mx.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def in_dims(mod: nn.Module) -> int:
    w = mod.weight
    return w.shape[-1] * 32 // mod.bits if isinstance(mod, nn.QuantizedLinear) else w.shape[-1]


def products(model: Any, x: mx.array) -> Callable[[], list[mx.array]]:
    """Every layer's products on ``x``, or an input of the product's own width drawn
    like it (a product's time depends on the shapes, not the values)."""
    calls: list[Callable[[], mx.array]] = []
    inputs = {x.shape[-1]: x}
    for layer in model.model.layers:
        for name, mod in layer.named_modules():
            if "switch_mlp" in name or "block_sparse_moe" in name:
                continue  # the experts and their router: below
            if isinstance(mod, nn.Linear | nn.QuantizedLinear):
                d = in_dims(mod)
                if d not in inputs:
                    inputs[d] = mx.random.normal((*x.shape[:-1], d)).astype(x.dtype)
                calls.append(lambda m=mod, xi=inputs[d]: m(xi))
        moe = getattr(layer, "block_sparse_moe", None)
        if moe is not None:
            gates = moe.gate(x)
            k = moe.num_experts_per_tok
            inds = mx.argpartition(-gates, kth=k - 1, axis=-1)[..., :k]
            mx.eval(inds)
            calls.append(lambda moe=moe: moe.gate(x))
            calls.append(lambda moe=moe, inds=inds: moe.switch_mlp(x, inds))
    if hasattr(model, "lm_head"):
        calls.append(lambda: model.lm_head(x))
    else:  # tied: the embedding's weight as the output head (a quantized product if quantized)
        calls.append(lambda: model.model.embed_tokens.as_linear(x))
    return lambda: [c() for c in calls]


def main() -> None:
    from bench_llama import make_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="reference")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--bits", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    model = make_model(a.preset, arch=a.arch, bits=a.bits)
    mx.random.seed(0)
    tokens = mx.random.randint(0, model.args.vocab_size, (1, a.tokens))
    hidden = model.model.embed_tokens(tokens)
    mx.eval(hidden)
    eager = timed(lambda: model(tokens), a.repeats)
    prods = timed(products(model, hidden), a.repeats)
    what = f"{a.arch}{f' {a.bits}-bit' if a.bits else ''}, {a.preset}, {a.tokens} tokens, {mx.default_device()}"
    print(f"{what}: eager prefill {1e3 * eager:.3f} ms; its products alone {1e3 * prods:.3f} ms ({prods / eager:.3f}x)")


if __name__ == "__main__":
    main()
