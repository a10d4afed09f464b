"""segc's call path against the number of layers (issue 13: "a call path for many KV
caches that does not scale with their number").

A cached decode call does, before and after the executor's compiled calls, segc's own
work: the parameter check (``ParamGatherer.gather``: every container of the module and
every parameter looked up), one slot per KV cache, the commit of the caches' new
buffers and offsets. This times that part (``bench_llama.host_split``: the call's host
time less the executor's) for narrow llamas of several depths, one KV cache a layer, in
a decode loop where the device's work between calls evicts the host's caches, as in
real use; then the same one-token step without caches (the parameter check, the
arguments, no slots). Prints the call path per call and per layer; at 16 layers, the
parameter check alone after a call, right after that, and after a short sleep.

    python benchmarks/call_path.py [--layers 4,16,64] [--calls 200]

``--stub``: segc's own work alone, for a decode step as the fastest GPU variant runs it
(``freeze_params=True``, ``concat_projections=True``, one KV cache a layer): the
executor replaced by a stand-in that hands back one real call's outputs, so that no
MLX work runs; medians of ``--calls`` calls, seven times, with the host's caches
evicted (a 4 MiB array written) before each call.

    python benchmarks/call_path.py --stub --layers 16 --calls 400
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from bench_llama import FixedContext, host_split

    import segc
    from segc.models import tiny_llama

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="4,16,64")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--stub", action="store_true", help="segc's own work alone (the executor a stand-in)")
    a = ap.parse_args()
    if a.stub:
        for layers in map(int, a.layers.split(",")):
            stub(layers, a.hidden, a.calls)
        return
    print(f"segc's call path on {mx.default_device()}, hidden {a.hidden}, best of 3 x {a.calls}")
    x = mx.array([[1]])
    for layers in map(int, a.layers.split(",")):
        model = tiny_llama(
            num_hidden_layers=layers,
            hidden_size=a.hidden,
            intermediate_size=2 * a.hidden,
            num_attention_heads=max(1, a.hidden // 16),
            num_key_value_heads=max(1, a.hidden // 32),
            vocab_size=64,
            dtype=mx.float32,
        )
        fc = FixedContext(model, 32)
        step = segc.jit(model, validate=False, commit="fences")
        bare = segc.jit(model, validate=False, commit="fences")  # the same step without caches
        out: dict[str, float] = {}
        for name, st, call, sync in (
            ("with caches", step, lambda st=step, fc=fc: st(x, cache=fc.reset()), fc.arrays),
            ("without", bare, lambda st=bare: st(x), lambda: []),
        ):
            for _ in range(3):
                mx.eval(call(), sync())
            out[name] = min(host_split(st, call, sync, a.calls)["call_path_s"] for _ in range(3))
        w, wo = out["with caches"], out["without"]
        print(
            f"  {layers:3d} layers: call path {1e6 * w:7.1f} us ({1e6 * w / layers:5.1f} us a layer); "
            f"without KV caches {1e6 * wo:7.1f} us ({1e6 * wo / layers:5.1f} us a layer)"
        )

        if layers == 16:
            walk(model, step, fc, x, a.calls)


def walk(model: Any, step: Any, fc: Any, x: mx.array, calls: int) -> None:
    """The parameter check alone (``ParamGatherer.gather``: the module tree walked and
    every parameter looked up) inside the decode loop: right after a call, a second time
    right after that, and after a call and a 0.5 ms sleep."""
    from segc.trace.params import ParamGatherer

    g = ParamGatherer(model)
    g.gather()
    first, second, slept = [], [], []
    for _ in range(calls):
        mx.eval(step(x, cache=fc.reset()), fc.arrays())
        t0 = time.perf_counter()
        g.gather()
        t1 = time.perf_counter()
        g.gather()
        second.append(time.perf_counter() - t1)
        first.append(t1 - t0)
    for _ in range(calls):
        mx.eval(step(x, cache=fc.reset()), fc.arrays())
        time.sleep(0.0005)
        t0 = time.perf_counter()
        g.gather()
        slept.append(time.perf_counter() - t0)
    med = statistics.median
    print(
        f"       the parameter check alone: {1e6 * med(first):6.1f} us after a call, {1e6 * med(second):6.1f} us "
        f"right after that, {1e6 * med(slept):6.1f} us after a call and a 0.5 ms sleep"
    )


def stub(layers: int, hidden: int, calls: int) -> None:
    import numpy as np
    from bench_llama import FixedContext

    import segc
    from segc.models import tiny_llama

    model = tiny_llama(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=max(1, hidden // 16),
        num_key_value_heads=max(1, hidden // 32),
        vocab_size=64,
        dtype=mx.float32,
    )
    fc = FixedContext(model, 32)
    x = mx.array([[1]])
    step = segc.jit(model, validate=False, concat_projections=True, freeze_params=True)
    for _ in range(3):
        mx.eval(step(x, cache=fc.reset()), fc.arrays())
    (entry,) = step.entries()
    real = entry.executor
    call = type(real).__call__
    outs: list[mx.array] | None = None

    def stand(self: Any, inputs: list[mx.array], consume: bool = False, **_: Any) -> list[mx.array]:
        """The executor's call: one real call's outputs, every time."""
        nonlocal outs
        if outs is None:
            outs = call(self, list(inputs))
            mx.eval(outs)
        if consume:
            del inputs[:]
        return list(outs)

    type(real).__call__ = stand  # (put back below: the next model's executor is a real one)
    junk = np.ones(4 << 20, np.uint8)
    runs = []
    try:
        for _ in range(7):
            ts = []
            for _ in range(calls):
                junk += 1  # evict the host's caches, as the device's work between calls does
                t0 = time.perf_counter()
                step(x, cache=fc.reset())
                ts.append(time.perf_counter() - t0)
            runs.append(1e6 * statistics.median(ts))
    finally:
        type(real).__call__ = call
    print(
        f"segc's own work of a cached decode call, {layers} layers, the executor a stand-in: "
        f"{statistics.median(runs):.1f} us (runs {', '.join(f'{r:.0f}' for r in sorted(runs))})"
    )


if __name__ == "__main__":
    main()
