"""What the host pays per segment, per product kernel and per elementwise kernel (issue
15: the cost model's host figures measured apart from the plans under study;
docs/experiments.md, "The eighth and ninth runs").

``S`` compiled functions, each committed (``mx.async_eval``) as segc runs a call; each
makes ``P`` one-row products of a bf16 vector, the first ``E`` of them followed by an
elementwise kernel (``x * sigmoid(x) * 1.5``: MLX fuses it into one kernel, and into no
product). Over a grid of ``(S, P, E)`` the host's time until the last commit is fitted
as ``S * (segment + P * product + E * elementwise)`` (least squares, no constant), the
three figures printed in microseconds. Every variant's bytes are compared with the same
functions run eagerly. ``--machine-out FILE`` saves the built-in ``H200`` model with the
three figures in it (``dispatch_s``: a segment's less the model's commit, ``host_op_s``:
a product's, ``elementwise_host``: an elementwise kernel's share of it), for
``bench_experiment.py --machine FILE --overheads device``.

    python benchmarks/host_kinds.py [--segments 5,9,17] [--products 2,4] [--repeats 40] [--machine-out FILE]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from segc.passes.costmodel import H200, with_source
from segc.research.calibrate import fit_host_kinds, host_segment

sys.path.insert(0, str(Path(__file__).parent))
# host_cost.py's timed loop (each part called, an mx.async_eval after each), against eager
from host_cost import compiled_against_eager, operands


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", default="5,9,17")
    ap.add_argument("--products", default="2,4")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--machine-out", metavar="FILE", help="save the H200 model with these figures here")
    a = ap.parse_args()
    w, x = operands(a.size)
    print(f"mlx {mx.__version__}, {mx.default_device()}, vectors of {a.size}, {a.repeats} calls a variant")
    print(f"{'S':>3} {'P':>3} {'E':>3} {'host':>10} {'per segment':>12}  same bytes as eager")
    same, rows = True, []
    for s in (int(v) for v in a.segments.split(",")):
        for p in (int(v) for v in a.products.split(",")):
            for e in (0, p):
                host, ok = compiled_against_eager([host_segment(w, p, e) for _ in range(s)], x, a.repeats)
                same &= ok
                rows.append((s, p, e, host))
                print(f"{s:>3} {p:>3} {e:>3} {host * 1e3:>7.3f} ms {host / s * 1e6:>9.2f} us  {ok}")
    seg, prod, elem = (c * 1e6 for c in fit_host_kinds(rows))
    print(f"host per segment {seg:.2f} us, per product kernel {prod:.2f} us, per elementwise kernel {elem:.2f} us")
    print(f"every variant gave the eager functions' bytes: {same}")
    if a.machine_out and same and min(seg - H200.commit_s * 1e6, prod, elem) > 0:
        m = replace(
            H200,
            dispatch_s=seg * 1e-6 - H200.commit_s,
            host_op_s=prod * 1e-6,
            elementwise_host=elem / prod,
        )
        with_source(m, "host_kinds.py").save(a.machine_out)
        print(f"saved {a.machine_out}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
