"""Trace a tiny mlx-lm llama, cut it per layer, run it segmented and eagerly, compare."""

from __future__ import annotations

import argparse
import time

import mlx.core as mx


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=4, help="number of decoder layers (default 4)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (default 128)")
    p.add_argument("--tokens", type=int, default=32, help="prompt length (default 32)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls of each (default 20)")
    p.add_argument("--ir", action="store_true", help="print the whole segmented IR")


def _time(fn, x, repeats: int) -> float:
    mx.eval(fn(x))
    t0 = time.perf_counter()
    for _ in range(repeats):
        mx.eval(fn(x))
    return (time.perf_counter() - t0) / repeats


def run(args: argparse.Namespace) -> int:
    import segc
    from segc.ir import segment_header
    from segc.models import tiny_llama

    model = tiny_llama(hidden_size=args.hidden, num_hidden_layers=args.layers, intermediate_size=4 * args.hidden)
    x = mx.random.randint(0, 128, (1, args.tokens))
    step = segc.jit(model, boundaries="layers.*")
    t0 = time.perf_counter()
    lowered = step.lower(x)
    t_lower = time.perf_counter() - t0
    g = lowered.graph
    print(
        f"segc demo: mlx-lm llama, {args.layers} layers, hidden {args.hidden}, {args.tokens} tokens, {mx.default_device()}"
    )
    print(f"traced {len(g.eqns)} equations, {len(g.inputs)} inputs, in {t_lower * 1e3:.1f} ms")
    print(f"{len(lowered.segments)} segments (boundary after every layers.*):")
    for s in lowered.segments:
        print(segment_header(g, s))
    if args.ir:
        print(lowered.as_text())
    y_seg = step(x)
    y_eager = model(x)
    same = bool(mx.array_equal(y_seg, y_eager).item())
    print(f"segmented output bit-identical to eager mlx-lm: {same}")
    t_eager = _time(model, x, args.repeats)
    t_segc = _time(step, x, args.repeats)
    print(f"eager mlx-lm : {t_eager * 1e3:8.3f} ms/call")
    print(f"segc         : {t_segc * 1e3:8.3f} ms/call  ({t_eager / t_segc:.2f}x eager)")
    print(f"cache: {step.cache_info()}")
    return 0 if same else 1
