"""Where a decode call's host time goes with the attention over the live keys
(``SEGC_LIVE_ATTENTION=1``, ``segc.lower.live``) and without: the reference llama at a
fixed context (``bench_llama.FixedContext``), ``frozenhead`` (or ``--variant wholefrozen``:
one segment, committed every ``SEGC_LIVE_COMMITS`` live steps) in place, ``--calls`` calls
under ``cProfile`` after five to warm up; the functions with the most own time, how often
``mx.array.item`` ran (a wait for the device) and the host time a call.

    SEGC_LIVE_ATTENTION=1 SEGC_KV_IN_PLACE=1 python benchmarks/live_host.py [--calls 30] [--context 1024]

Needs a GPU for the live attention to be taken (on the CPU nothing is paired)."""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

from bench_llama import FixedContext, boundaries_of, make_model

import segc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--preset", default="reference")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--variant", choices=("frozenhead", "wholefrozen"), default="frozenhead")
    args = ap.parse_args()
    model = make_model(args.preset)
    fc = FixedContext(model, args.context)
    x = mx.array([[7]])
    step = segc.jit(
        model,
        boundaries=boundaries_of(args.variant, model),
        validate=False,
        concat_projections=True,
        freeze_params=True,
    )
    for _ in range(5):
        mx.eval(step(x, cache=fc.reset()), fc.arrays())
    items = [0]
    real = mx.array.item

    def counted(a: mx.array) -> object:
        items[0] += 1
        return real(a)

    mx.array.item = counted  # type: ignore[method-assign]
    prof = cProfile.Profile()
    host = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        prof.enable()
        out = step(x, cache=fc.reset())
        prof.disable()
        host.append(time.perf_counter() - t0)
        mx.eval(out, fc.arrays())
    mx.array.item = real  # type: ignore[method-assign]
    host.sort()
    print(
        f"host a call: median {host[len(host) // 2] * 1e3:.3f} ms (profiled); item() calls a call: {items[0] / args.calls}"
    )
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
    print(s.getvalue())


if __name__ == "__main__":
    main()
