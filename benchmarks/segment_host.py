"""Where a cached segc decode call's host time goes, segment by segment (issue 13): the
reference llama (``--bits 4`` quantized, ``--arch mixtral``), one token at context
``--context``, segc's ``frozen`` variant (a segment per layer, ``concat_projections``,
``freeze_params``), and for each segment:

* ``call``: the compiled segment call (MLX replays the segment's tape: every primitive
  of it becomes a lazy array),
* ``commit``: its ``mx.async_eval`` (MLX encodes each primitive into a CUDA graph,
  then instantiates or updates and launches it),
* ``nodes``: the primitives of the segment's lazy graph (``mx.export_to_dot`` of its
  outputs before the commit, in the first call), and the kinds among them (``--kinds``).

Medians over ``--calls`` calls, timed by the executor's own timer
(``Executor.timed()``: each step's compiled call and the step with its commit); the
logits of a timed call are checked byte for byte against an untimed one's, and a
difference exits 1. ``host_cost.py`` times bare kernels for comparison.

    python benchmarks/segment_host.py [--calls 50] [--bits 4] [--kinds]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import tempfile
import time
from typing import Any

import mlx.core as mx
import numpy as np

import segc

NODE = re.compile(r'label ="([^"]+)", shape=rectangle')


def graph_dot(outs: Any) -> str:
    """``outs``' lazy graph as Graphviz text (no primitives once they are evaluated)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "g.dot")
        mx.export_to_dot(path, *outs)
        with open(path) as f:
            return f.read()


def kinds_of(dot: str) -> collections.Counter[str]:
    """The primitives of a graph's Graphviz text, by kind (a custom kernel's hash dropped)."""
    return collections.Counter(re.sub(r"_[0-9a-f]{6,}.*$", "", k) for k in NODE.findall(dot))


def main() -> None:
    from bench_llama import FixedContext, make_model  # this directory is on sys.path when run as a script

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="reference")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--bits", type=int, default=None)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--kinds", action="store_true", help="list each segment's primitives by kind")
    ap.add_argument("--dot", default=None, help="write each segment's lazy graph to DOT_<k>.dot")
    a = ap.parse_args()
    model = make_model(a.preset, arch=a.arch, bits=a.bits)
    fc = FixedContext(model, a.context)
    x = mx.array([[7]])
    step = segc.jit(model, boundaries="layers.*", validate=False, concat_projections=True, freeze_params=True)
    for _ in range(3):
        mx.eval(step(x, cache=fc.reset()), fc.arrays())
    (entry,) = step.entries()
    want = _bytes(step(x, cache=fc.reset()))  # logits of a call outside the timer
    dots: list[str] = []

    def count(k: int, outs: Any) -> None:
        if len(dots) == k:  # the first timed call's graphs
            dots.append(graph_dot(outs))

    wall, host = [], []
    with entry.executor.timed() as times:
        times.inspect = count
        for _ in range(a.calls + 5):
            mx.synchronize()
            t0 = time.perf_counter()
            y = step(x, cache=fc.reset())
            t1 = time.perf_counter()
            mx.eval(y, fc.arrays())
            t2 = time.perf_counter()
            host.append(t1 - t0)
            wall.append(t2 - t0)
            if len(dots) == len(times.steps[0]):
                times.inspect = None  # counted: the calls after are timed alone
    same = _bytes(y) == want  # the last timed call's logits
    # per call, per step: (the compiled call, its commit); the first five calls apart
    per_call = [[[b, s - b] for b, s in zip(bs, ss)] for bs, ss in zip(times.built, times.steps)]
    runs = per_call[5:]
    n = len(runs[0])
    counted = [kinds_of(d) for d in dots]
    print(
        f"mlx {mx.__version__}, {mx.default_device()}, {a.arch} {a.preset}"
        f"{f' {a.bits}-bit' if a.bits else ''}, context {a.context}, {len(runs)} calls, {n} segments"
    )
    print(f"call: host {statistics.median(host[5:]) * 1e6:.0f} us, wall {statistics.median(wall[5:]) * 1e6:.0f} us")
    print(f"{'segment':>8} {'call us':>8} {'commit us':>10} {'nodes':>6}  kinds")
    tot = [0.0, 0.0, 0]
    for k in range(n):
        c = statistics.median(r[k][0] for r in runs) * 1e6
        m = statistics.median(r[k][1] for r in runs) * 1e6
        nodes = sum(counted[k].values())
        tot[0] += c
        tot[1] += m
        tot[2] += nodes
        kinds = ", ".join(f"{name} {v}" for name, v in counted[k].most_common()) if a.kinds or k < 2 else ""
        print(f"{k:>8} {c:8.1f} {m:10.1f} {nodes:6d}  {kinds}")
    print(f"{'total':>8} {tot[0]:8.1f} {tot[1]:10.1f} {tot[2]:6d}")
    if a.dot:
        for k, text in enumerate(dots):
            with open(f"{a.dot}_{k}.dot", "w") as f:
                f.write(text)
    every = sum(counted, collections.Counter())
    print("every segment's primitives:", ", ".join(f"{name} {v}" for name, v in every.most_common()))
    print(f"a timed call gave an untimed call's bytes: {same}")
    if not same:
        raise SystemExit(1)


def _bytes(y: mx.array) -> bytes:
    mx.eval(y)
    return bytes(np.array(y.view(mx.uint8)))


if __name__ == "__main__":
    main()
