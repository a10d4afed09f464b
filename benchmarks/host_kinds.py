"""What the host pays per segment, per product kernel and per elementwise kernel (issue
15: the cost model's host figures measured apart from the plans under study;
docs/experiments.md, "The eighth and ninth runs").

``S`` compiled functions, each committed (``mx.async_eval``) as segc runs a call; each
makes ``P`` one-row products of a bf16 vector, the first ``E`` of them followed by an
elementwise kernel (``x * sigmoid(x) * 1.5``: MLX fuses it into one kernel, and into no
product). Over a grid of ``(S, P, E)`` the host's time until the last commit is fitted
as ``S * (segment + P * product + E * elementwise)`` (least squares, no constant), the
three figures printed in microseconds. Every variant's bytes are compared with the same
functions run eagerly.

    python benchmarks/host_kinds.py [--segments 5,9,17] [--products 2,4] [--repeats 40]
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


def segment(w: mx.array, products: int, elementwise: int) -> Callable[[mx.array], mx.array]:
    def f(x: mx.array) -> mx.array:
        for i in range(products):
            x = (x[None] @ w)[0]
            if i < elementwise:
                x = x * mx.sigmoid(x) * 1.5
        return x

    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", default="5,9,17")
    ap.add_argument("--products", default="2,4")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--size", type=int, default=2048)
    a = ap.parse_args()
    w, x = operands(a.size)
    print(f"mlx {mx.__version__}, {mx.default_device()}, vectors of {a.size}, {a.repeats} calls a variant")
    print(f"{'S':>3} {'P':>3} {'E':>3} {'host':>10} {'per segment':>12}  same bytes as eager")
    same, rows = True, []
    for s in (int(v) for v in a.segments.split(",")):
        for p in (int(v) for v in a.products.split(",")):
            for e in (0, p):
                host, ok = compiled_against_eager([segment(w, p, e) for _ in range(s)], x, a.repeats)
                same &= ok
                rows.append((s, p, e, host))
                print(f"{s:>3} {p:>3} {e:>3} {host * 1e3:>7.3f} ms {host / s * 1e6:>9.2f} us  {ok}")
    design = np.array([[s, s * p, s * e] for s, p, e, _ in rows], float)
    coef, *_ = np.linalg.lstsq(design, np.array([r[3] for r in rows]), rcond=None)
    seg, prod, elem = (c * 1e6 for c in coef)
    print(f"host per segment {seg:.2f} us, per product kernel {prod:.2f} us, per elementwise kernel {elem:.2f} us")
    print(f"every variant gave the eager functions' bytes: {same}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
