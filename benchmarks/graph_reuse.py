"""Does MLX's CUDA build make the host wait when consecutive commits have the same shape?
(issue 13: the default commit schedule's slow mode, where a decode step's host time
becomes the step's).

MLX keys its cache of executable CUDA graphs on the kinds of a commit's nodes and their
edges, not on the kernels (``CommandEncoder::commit``): consecutive commits of the same
shape (a decode step's groups of layers) update and relaunch one executable graph, the
one the device may still be running. This times ``--groups`` commits of ``--kernels``
elementwise kernels each over ``--size`` floats (one commit per group, by
``mx.async_eval``), in four forms:

- ``one``: every kernel in one commit (no reuse within a call);
- ``same``: each group a chain of kernels, all groups the same shape (one cached graph,
  updated at every commit);
- ``distinct``: the same kernels, each group's extra edge (an ``add`` of its first
  kernel's output) at another place in its chain, so that no two neighbouring groups
  share a key (``--kernels`` - 2 shapes in turn, each its own cached graph);
- ``pairs``: two shapes alternating (a graph updated every second commit).

and reports the host's time until the last ``mx.async_eval`` returned, the longest
single commit, and the call's wall time (medians over ``--repeats`` calls). If an update
waits for the graph's running launch, ``same``'s host time approaches its wall time when
the device is the slower side (``--size`` large) and ``distinct``'s does not.

    python benchmarks/graph_reuse.py [--size 8388608] [--kernels 8] [--groups 8] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, nargs="+", default=[1 << 14, 1 << 21, 1 << 23])
    ap.add_argument("--kernels", type=int, default=8)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args()
    if a.kernels < 4 or a.groups < 2:
        ap.error("--kernels must be at least 4 and --groups at least 2")
    print(f"MLX {mx.__version__} on {mx.default_device()}; {a.groups} groups of {a.kernels} kernels")
    print(f"{'size':>9s} {'form':9s} {'host':>9s} {'commit max':>11s} {'wall':>9s} {'host/wall':>9s}  (medians, us)")
    for size in a.size:
        x0 = mx.random.normal((size,))
        mx.eval(x0)

        def group(x: mx.array, edge: int) -> mx.array:
            x = h = mx.sin(x)  # an edge to h from a later kernel shapes the group's graph
            for i in range(1, a.kernels):
                x = x + h if i == edge else mx.sin(x)  # a kernel each (no fusion outside mx.compile)
            return x

        def call(form: str, x0: mx.array = x0) -> tuple[float, float, float]:
            t0 = time.perf_counter()
            x = x0
            longest = 0.0
            for j in range(a.groups):
                edge = {"same": 2, "distinct": 2 + j % (a.kernels - 2), "pairs": 2 + j % 2, "one": 2}[form]
                x = group(x, edge)
                if form != "one" or j == a.groups - 1:
                    c = time.perf_counter()
                    mx.async_eval(x)
                    longest = max(longest, time.perf_counter() - c)
            t1 = time.perf_counter()
            mx.eval(x)
            return t1 - t0, longest, time.perf_counter() - t0

        forms = ("one", "same", "distinct", "pairs")
        rows: dict[str, list[tuple[float, float, float]]] = {f: [] for f in forms}
        for _ in range(5):
            for f in forms:
                call(f)
        for _ in range(a.repeats):  # interleaved: a drift of the host or the device hits every form alike
            for f in forms:
                rows[f].append(call(f))
        for f in forms:
            host, longest, wall = (statistics.median(r[i] for r in rows[f]) * 1e6 for i in range(3))
            print(f"{size:9d} {f:9s} {host:9.1f} {longest:11.1f} {wall:9.1f} {host / wall:9.2f}")


if __name__ == "__main__":
    main()
