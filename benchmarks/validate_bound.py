"""Can a tolerance tell a GPU's rounding from a wrong position? (issue 13: validation)

Off the CPU, ``validate=True`` compares the first call of a dynamic decode graph with
eager mlx-lm within a tolerance, because segc's masked decode attention rounds
otherwise there (float32 throughout, one rounding at the end). This measures, on this
machine, at the reference llama's sizes with random weights, two differences of the
decode logits from eager's:

- ``rounding``: segc with the GPU kernel's arithmetic (``attention=`` the kernel's
  MLX-ops reference, ``reference_attention``), i.e. what a correct dynamic graph
  differs by on a GPU;
- ``off by one``: eager itself with every cache's write one position late (a zero key
  attended, RoPE one step on), i.e. a model whose positions a dynamic cache got wrong.

Printed per decode step: the largest |difference|, the largest |difference| / (1 +
|eager|) (what ``VALIDATE_TOL`` bounds) and the median |difference|.

    python benchmarks/validate_bound.py [--layers 16] [--prompt 300] [--steps 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def _diff(a: mx.array, b: mx.array) -> tuple[float, float, float]:
    x, y = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    d = np.abs(x - y)
    return float(d.max()), float((d / (1 + np.abs(x))).max()), float(np.median(d))


def main() -> None:
    from bench_llama import make_model
    from mlx_lm.models.cache import make_prompt_cache

    import segc
    from segc.lower.attention import reference_attention

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    model = make_model("reference", layers=a.layers)  # bfloat16, bench_llama.py's reference sizes
    step = segc.jit(model, attention=reference_attention, validate=False)
    ce, cs, cl = (make_prompt_cache(model) for _ in range(3))
    prompt = mx.array([[(7 * i + 3) % 32000 for i in range(a.prompt)]])
    for c in (ce, cs, cl):
        mx.eval(model(prompt, cache=c) if c is not cs else step(prompt, cache=c))
    print(f"{mx.default_device()}, the reference llama, {a.layers} layers, after {a.prompt} tokens")
    print(f"{'step':>4}  {'what':<10} {'max |d|':>9} {'max rel':>9} {'median':>9}")
    t = mx.array([[5]])
    for k in range(a.steps):
        want = model(t, cache=ce)
        got = step(t, cache=cs)
        for c in cl:
            c.offset += 1  # one position late
        late = model(t, cache=cl)
        for c in cl:
            c.offset -= 1
        for what, y in (("rounding", got), ("off by one", late)):
            print(f"{k:>4}  {what:<10} " + " ".join(f"{v:9.4f}" for v in _diff(want, y)))
        t = mx.argmax(want[:, -1:], -1)


if __name__ == "__main__":
    main()
