"""Which primitives one decode layer becomes under segc on this device.

A 2-layer llama with the reference model's head size (64) and dtype (bf16), a KV cache
at context 1024, one token: prints each segment's size and a histogram of the first
layer segment's primitives (on the GPU, whether attention stays one fused
``ScaledDotProductAttention`` or is decomposed, for example).

    python benchmarks/decode_ir.py
"""

from __future__ import annotations

import argparse
import collections

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.ir import segment_header
from segc.models import tiny_llama
from segc.passes.analysis import header_annotator


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()  # --help; no options
    model = tiny_llama(
        hidden_size=512,
        num_hidden_layers=2,
        intermediate_size=1024,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1024,
        dtype=mx.bfloat16,
    )
    cache = make_prompt_cache(model)
    step = segc.jit(model, boundaries="layers.*")
    step(mx.random.randint(0, 1024, (1, 1024)), cache=cache)
    x = mx.array([[1]])
    lowered = step.lower(x, cache=cache)
    g = lowered.graph
    print(f"device {mx.default_device()}: decode graph, {len(g.eqns)} equations")
    segs = lowered.segments
    cost = header_annotator(g)  # the cost model's figures (an H200 roofline) in each header
    for s in segs:
        print(segment_header(g, s, cost))
    first = segs[0]
    hist = collections.Counter(e.prim for e in first.eqns(g))
    print(f"segment {first.name!r} primitives:")
    for prim, n in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:4d}  {prim}")


if __name__ == "__main__":
    main()
