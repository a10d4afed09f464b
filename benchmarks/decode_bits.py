"""Where segc's decode logits equal eager mlx-lm's, token by token (issue 13's
reconciliation of docs/models.md's GPU bound with a benchmark that printed
``bit-identical True``).

Two set-ups, the reference llama's layer sizes (bf16) with ``--layers`` layers:

* **generation**: a ``--context``-token prompt prefilled by each (eager and segc, own
  caches), then ``--tokens`` greedy decode steps, each fed the same token; per step:
  whether the logits are byte-identical, the largest difference, the cache's offset
  and buffer capacity;
* **fixed**: ``bench_llama.py``'s set-up: caches filled with random K/V to ``context + 1``
  positions, offset ``context``, one decode call.

    python benchmarks/decode_bits.py --layers 4 --context 1024 --tokens 40
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np

import segc
from segc.models import tiny_llama


def raw(y: mx.array) -> bytes:
    return bytes(np.array(mx.contiguous(y).reshape(-1).view(mx.uint8)))


def main() -> None:
    from mlx_lm.models.cache import make_prompt_cache

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=2048)
    a = ap.parse_args()
    model = tiny_llama(
        num_hidden_layers=a.layers,
        hidden_size=a.hidden,
        intermediate_size=4 * a.hidden,
        num_attention_heads=a.hidden // 64,
        num_key_value_heads=max(1, a.hidden // 256),
        vocab_size=32000,
        dtype=mx.bfloat16,
    )
    step = segc.jit(model, boundaries="layers.*", validate=False)
    print(f"device {mx.default_device()}, {a.layers} layers, hidden {a.hidden}, bf16")
    prompt = mx.array([[(7 * i + 3) % 32000 for i in range(a.context)]])
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    ye, ys = model(prompt, cache=ce), step(prompt, cache=cs)
    mx.eval(ye, ys)
    print(f"prefill {a.context}: identical {raw(ye) == raw(ys)}")
    same = 0
    for t in range(a.tokens):
        tok = mx.argmax(ye[:, -1:], axis=-1)
        ye, ys = model(tok, cache=ce), step(tok, cache=cs)
        mx.eval(ye, ys)
        eq = raw(ye) == raw(ys)
        same += eq
        diff = float(mx.abs(ye.astype(mx.float32) - ys.astype(mx.float32)).max().item())
        print(
            f"  decode {t:2d}: offset {ce[0].offset}, capacity {cs[0].keys.shape[2]}: identical {eq}, max diff {diff:.3g}"
        )
    print(f"generation: {same} of {a.tokens} decode steps identical; traces {step.cache_info().traces}")
    # bench_llama's fixed context
    for cache_set in (ce, cs):
        mx.random.seed(1)
        for c in cache_set:
            kvh, hd = c.keys.shape[1], c.keys.shape[3]
            c.keys = c.values = None
            c.offset = 0
            k = mx.random.normal((1, kvh, a.context + 1, hd)).astype(mx.bfloat16)
            v = mx.random.normal((1, kvh, a.context + 1, hd)).astype(mx.bfloat16)
            c.update_and_fetch(k, v)
            c.offset = a.context
    x = mx.array([[5]])
    ye, ys = model(x, cache=ce), step(x, cache=cs)
    mx.eval(ye, ys)
    diff = float(mx.abs(ye.astype(mx.float32) - ys.astype(mx.float32)).max().item())
    print(
        f"fixed context {a.context} (capacity {cs[0].keys.shape[2]}): identical {raw(ye) == raw(ys)}, max diff {diff:.3g}"
    )


if __name__ == "__main__":
    main()
