"""How far segc's decode logits and eager mlx-lm's each are from a float32 run of the
same weights and caches: whether a difference between the two (on a GPU, where segc's
dynamic KV cache is not bit-identical to eager, docs/models.md) is rounding or error.

``bench_llama.py``'s decode set-up (its preset's llama, caches filled with random K/V
to ``--context`` + 1 positions, one token at offset ``--context``): eager, segc's
defaults (a segment per layer) and ``freeze_params=True``, all in the preset's dtype;
then the model's floating parameters and the caches cast to float32 and eager run
again as the reference. Per run: ``max |d| / (1 + |ref|)`` (the measure
``VALIDATE_TOL`` bounds), ``max |d|``, and the greedy token.

    python benchmarks/decode_truth.py --preset reference --context 1024   # on the H200
    python benchmarks/decode_truth.py --preset tiny --context 64          # a smoke run
"""

from __future__ import annotations

import argparse
from typing import Any

import mlx.core as mx
import numpy as np
from bench_llama import PRESETS, FixedContext, make_model, rel_diff
from mlx.utils import tree_map

import segc


def f32(y: mx.array) -> np.ndarray:
    return np.array(y.astype(mx.float32))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--context", type=int, default=64)
    a = ap.parse_args()
    model = make_model(a.preset)
    fc = FixedContext(model, a.context)
    mx.random.seed(2)
    x = mx.random.randint(0, model.args.vocab_size, (1, 1))
    runs: dict[str, Any] = {"eager": model(x, cache=fc.reset())}
    mx.eval(runs["eager"])
    for name, kw in {"segc": {}, "frozen": {"freeze_params": True}}.items():
        step = segc.jit(model, boundaries="layers.*", validate=False, **kw)
        for _ in range(2):  # the second call is the cached graph a decode loop runs
            runs[name] = step(x, cache=fc.reset())
            mx.eval(runs[name])
    wide = [(c.keys.astype(mx.float32), c.values.astype(mx.float32)) for c in fc.cache]
    cast = tree_map(lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p, model.parameters())
    model.update(cast)
    for c, (k, v) in zip(fc.cache, wide):
        c.keys, c.values = k, v
    ref = model(x, cache=fc.reset())
    mx.eval(ref)
    t = f32(ref)
    print(f"device {mx.default_device()}, preset {a.preset}, context {a.context}; reference: float32 eager")
    print(
        f"  {'run':<8} {'max|d|/(1+|ref|)':>17} {'max|d|':>10} {'vs eager':>10}  token (reference {int(np.argmax(t))})"
    )
    for name, y in runs.items():
        print(
            f"  {name:<8} {rel_diff(f32(y), t):17.4f} {float(np.max(np.abs(f32(y) - t))):10.4f} "
            f"{rel_diff(f32(y), f32(runs['eager'])):10.4f}  {int(np.argmax(f32(y)))}"
        )


if __name__ == "__main__":
    main()
