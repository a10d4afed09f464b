"""What the host pays per segment, per product kernel and per elementwise kernel (issue
15: the cost model's host figures measured apart from the plans under study;
docs/experiments-log.md, "The eighth and ninth runs").

``S`` compiled functions, each committed (``mx.async_eval``) as segc runs a call; each
makes ``P`` one-row products of a bf16 vector, the first ``E`` of them followed by an
elementwise kernel (``x * sigmoid(x) * 1.5``: MLX fuses it into one kernel, and into no
product). Over a grid of ``(S, P, E)`` the host's time until the last commit is fitted
as ``S * (segment + P * product + E * elementwise)`` (least squares, no constant), the
three figures printed in microseconds: ``segc calibrate``'s measurement on a GPU
(``segc.research.calibrate.host_kinds``), with its table. Every variant's bytes are
compared with the same functions run eagerly. ``--machine-out FILE`` saves the
built-in ``H200`` model with the three figures in it (``with_host_kinds``), for
``bench_experiment.py --machine FILE --overheads device``.

    python benchmarks/host_kinds.py [--segments 5,9,17] [--products 2,4] [--repeats 40] [--machine-out FILE]
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from segc.errors import ScheduleError
from segc.passes.costmodel import H200, with_source
from segc.research.calibrate import host_kinds, with_host_kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", default="5,9,17")
    ap.add_argument("--products", default="2,4")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--machine-out", metavar="FILE", help="save the H200 model with these figures here")
    a = ap.parse_args()
    print(f"mlx {mx.__version__}, {mx.default_device()}, vectors of {a.size}, {a.repeats} calls a variant")
    print(f"{'S':>3} {'P':>3} {'E':>3} {'host':>10} {'per segment':>12}  same bytes as eager")
    hk = host_kinds(
        size=a.size,
        segments=[int(v) for v in a.segments.split(",")],
        products=[int(v) for v in a.products.split(",")],
        repeats=a.repeats,
    )
    for (s, p, e, host), ok in zip(hk.rows, hk.same):
        print(f"{s:>3} {p:>3} {e:>3} {host * 1e3:>7.3f} ms {host / s * 1e6:>9.2f} us  {ok}")
    seg, prod, elem = hk.segment * 1e6, hk.product * 1e6, hk.elementwise * 1e6
    print(f"host per segment {seg:.2f} us, per product kernel {prod:.2f} us, per elementwise kernel {elem:.2f} us")
    same = all(hk.same)
    print(f"every variant gave the eager functions' bytes: {same}")
    if a.machine_out and same:
        try:
            with_source(with_host_kinds(H200, hk), "host_kinds.py").save(a.machine_out)
            print(f"saved {a.machine_out}")
        except ScheduleError as exc:
            print(f"not saved: {exc}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
