"""What a compiled segment's arguments cost the host (issues 13 and 15: a call's host
time grows by about 6 us per activation that crosses a cut, docs/experiments.md).

``host_cost.py``'s chain of one-row products in ``--segments`` compiled functions, each
committed (``mx.async_eval``), as segc runs a decode step; here every segment also reads
``N`` extra vectors, added into its result by one fused elementwise kernel (so the
kernels do not grow with ``N``), for each ``N`` of ``--inputs``. The slope of the host
time over ``N``, per segment, is what one more argument costs a compiled call and its
commit. Each variant's bytes are compared with the same functions run eagerly.

    python benchmarks/arg_cost.py [--inputs 0,1,2,4,8,16] [--segments 17] [--kernels 5]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
# host_cost.py's timed loop (each part called, an mx.async_eval after each), against eager
from host_cost import compiled_against_eager, operands


def segment(w: mx.array, kernels: int, n: int) -> Callable[..., mx.array]:
    def f(x: mx.array, *extra: mx.array) -> mx.array:
        for _ in range(kernels):
            x = (x[None] @ w)[0]
        if extra:
            acc = extra[0]
            for e in extra[1:]:
                acc = acc + e
            x = x + acc * 0.125
        return x

    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", default="0,1,2,4,8,16")
    ap.add_argument("--segments", type=int, default=17)
    ap.add_argument("--kernels", type=int, default=5, help="one-row products a segment")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--size", type=int, default=2048)
    a = ap.parse_args()
    w, x = operands(a.size)
    print(f"mlx {mx.__version__}, {mx.default_device()}, {a.segments} segments of {a.kernels} products")
    print(f"{'inputs':>6} {'host':>10} {'per segment':>12}  same bytes as eager")
    same, rows = True, []
    for n in [int(v) for v in a.inputs.split(",")]:
        extra = [mx.random.normal((a.size,), key=mx.random.key(2 + i)).astype(mx.bfloat16) for i in range(n)]
        mx.eval(extra)
        fns = [segment(w, a.kernels, n) for _ in range(a.segments)]
        host, ok = compiled_against_eager(fns, x, a.repeats, extra)
        same &= ok
        rows.append((n, host))
        print(f"{n:>6} {host * 1e3:>7.3f} ms {host / a.segments * 1e6:>9.2f} us  {ok}")
    if len(rows) >= 2:
        ns, hs = np.array([r[0] for r in rows], float), np.array([r[1] for r in rows])
        slope = np.polyfit(ns, hs / a.segments, 1)[0]
        print(f"host time per extra input, per segment: {slope * 1e6:.2f} us")
    print(f"every variant gave the eager functions' bytes: {same}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
