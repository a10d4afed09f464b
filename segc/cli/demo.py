"""Trace a tiny mlx-lm llama, cut it per layer, run it segmented and eagerly, compare."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=positive_int(), default=4, help="number of decoder layers (default 4)")
    p.add_argument("--hidden", type=positive_int(), default=128, help="hidden size (default 128)")
    p.add_argument("--tokens", type=positive_int(), default=32, help="prompt length (default 32)")
    p.add_argument("--repeats", type=positive_int(), default=20, help="timed calls of each (default 20)")
    p.add_argument(
        "--decode",
        type=positive_int(2),
        default=16,
        help="greedy decode steps with a KV cache (default 16, at least 2)",
    )
    p.add_argument("--ir", action="store_true", help="print the whole segmented IR")


def _time(fn: Any, x: Any, repeats: int) -> float:
    import mlx.core as mx

    mx.eval(fn(x))
    t0 = time.perf_counter()
    for _ in range(repeats):
        mx.eval(fn(x))
    return (time.perf_counter() - t0) / repeats


def run(args: argparse.Namespace) -> int:
    import mlx.core as mx

    import segc
    from segc.ir import segment_header
    from segc.models import tiny_llama
    from segc.passes.analysis import header_annotator

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
    annotate = header_annotator(g)
    print(f"{len(lowered.segments)} segments (boundary after every layers.*):")
    for s in lowered.segments:
        print(segment_header(g, s, annotate))
    if args.ir:
        print(lowered.as_text())
    y_seg = step(x)
    y_eager = model(x)
    same = bool(mx.array_equal(y_seg, y_eager).item())
    print(f"segmented output bit-identical to eager mlx-lm: {same}")
    t_eager = _time(model, x, args.repeats)
    t_segc = _time(step, x, args.repeats)
    print(f"prefill: eager mlx-lm : {t_eager * 1e3:8.3f} ms/call")
    print(f"prefill: segc         : {t_segc * 1e3:8.3f} ms/call  (time ratio segc/eager {t_segc / t_eager:.2f})")
    info = step.cache_info()
    print(f"trace cache: {info.hits} hits, {info.misses} traces ({'; '.join(info.retraces)})")
    same_decode = _decode(model, x, args.decode)
    return 0 if same and same_decode else 1


def _decode(model: Any, prompt: Any, steps: int) -> bool:
    """Greedy decode with mlx-lm KV caches, eagerly and through segc, side by side."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    import segc

    step = segc.jit(model, boundaries="layers.*")
    caches = {"eager": make_prompt_cache(model), "segc": make_prompt_cache(model)}
    fns = {"eager": model, "segc": step}
    toks = {k: prompt for k in fns}
    seconds = {k: 0.0 for k in fns}
    same = True
    for i in range(steps + 1):
        outs = {}
        for k, fn in fns.items():
            t0 = time.perf_counter()
            logits = fn(toks[k], cache=caches[k])
            mx.eval(logits)
            if i > 1:  # the prefill and the first decode call trace and compile
                seconds[k] += time.perf_counter() - t0
            outs[k] = logits
            toks[k] = mx.argmax(logits[:, -1:], axis=-1)
        same = same and bool(mx.array_equal(outs["eager"], outs["segc"]).item())
    for a, b in zip(caches["eager"], caches["segc"]):
        same = same and a.offset == b.offset and bool(mx.array_equal(a.state[0], b.state[0]).item())
    info = step.cache_info()
    print(f"decode: prefill + {steps} greedy tokens with mlx-lm KV caches (timed: the {steps - 1} after the first)")
    print(f"  logits and KV caches bit-identical to eager mlx-lm: {same}")
    print(f"  traces: {info.misses} ({'; '.join(info.retraces)})")
    print(f"  eager mlx-lm : {seconds['eager'] / (steps - 1) * 1e3:8.3f} ms/token")
    print(
        f"  segc         : {seconds['segc'] / (steps - 1) * 1e3:8.3f} ms/token  (time ratio segc/eager {seconds['segc'] / seconds['eager']:.2f})"
    )
    return same
