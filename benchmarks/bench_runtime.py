"""The runtime's costs, side by side in one run (docs/runtime.md, docs/performance.md).

    .venv/bin/python benchmarks/bench_runtime.py                       # CPU-sized llama
    .venv/bin/python benchmarks/bench_runtime.py --layers 16 --hidden 2048 --intermediate 8192 \\
        --heads 32 --kv-heads 8 --vocab 32000 --dtype bfloat16 --prompt 2048 --chunk 512 --band 4

1. **Decode** (one token per call, a KV cache), round-robin: eager mlx-lm; segc with
   one segment per layer and no schedule (the stock path); the same under a boundary
   schedule with a signal after every layer and a wait before every layer (its events
   already reached, so the wait costs only its check); and a host drain after every
   layer (``drain=True``). Median per token; every variant's logits compared with eager's.
2. **Prefill** of ``--prompt`` tokens in chunks of ``--chunk``: ordinary chunked prefill
   (eager mlx-lm, and segc) against banded prefill (``--band`` layers a band): seconds,
   tokens/s, and MLX's peak memory for each; logits and caches compared bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx


def make_model(a: argparse.Namespace) -> Any:
    from segc.models import tiny_llama

    return tiny_llama(
        num_hidden_layers=a.layers,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        vocab_size=a.vocab,
        dtype=getattr(mx, a.dtype),
    )


def decode(a: argparse.Namespace, model: Any) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    import segc
    from segc.passes import Schedule
    from segc.passes.fences import CutNode, WaitNode

    prompt = mx.array([[(7 * i + 3) % a.vocab for i in range(a.context)]])
    variants: dict[str, Callable[..., Any]] = {"eager mlx-lm": model}
    # validate=False: off the CPU the dynamic cache's logits differ from eager's in the last
    # bits (docs/models.md), and the check would switch to exact mode, a trace per token
    stock = segc.jit(model, boundaries="auto", validate=False)
    variants["segc per layer"] = stock
    if mx.default_device() != mx.cpu:  # the GPU's default commits once; the CPU's per segment
        variants["segc, a commit per segment"] = segc.jit(model, boundaries="auto", validate=False, commit="segment")
    fenced = {
        mode: segc.jit(model, boundaries="auto", validate=False)
        for mode in (["eval"] if mx.default_device() == mx.cpu else []) + ["inline"]
    }
    for mode, f in fenced.items():
        variants[f"segc + signal/wait per layer ({mode})"] = f
    variants["segc host drain per layer"] = segc.jit(model, boundaries="auto", drain=True, validate=False)
    caches = {k: make_prompt_cache(model) for k in variants}
    toks = {}
    for k, f in variants.items():
        toks[k] = mx.argmax(f(prompt, cache=caches[k])[:, -1:], axis=-1)
    g = stock.trace(toks["eager mlx-lm"], cache=make_prompt_cache(model)).graph
    cuts = [k for k, e in enumerate(g.eqns) if e.prim == "segc.cut"]
    ends = [g.eqns[k - 1].id for k in cuts]
    starts = [g.eqns[k + 1].id for k in cuts]
    sched = Schedule(
        tuple(CutNode(i, ("done", n + 1)) for n, i in enumerate(ends)),
        tuple(WaitNode(i, "admit", 1) for i in starts),
        ("admit",),
    )
    for mode, f in fenced.items():
        done, admit = segc.Event(name="done"), segc.Event(2**40, name="admit")
        f.set_boundary_schedule(sched, {"done": done, "admit": admit}, stride=len(ends), completion=mode)
    times: dict[str, list[float]] = {k: [] for k in variants}
    host: dict[str, list[float]] = {k: [] for k in variants}
    same = {k: True for k in variants}
    diff = {k: 0.0 for k in variants}
    for r in range(a.warmup + a.tokens):
        logits = {}
        for k, f in variants.items():
            mx.synchronize()
            t0 = time.perf_counter()
            out = f(toks[k], cache=caches[k])
            t1 = time.perf_counter()
            mx.eval(out, [c.state for c in caches[k]])
            if r >= a.warmup:
                times[k].append(time.perf_counter() - t0)
                host[k].append(t1 - t0)
            logits[k] = out
        for k in variants:
            same[k] = same[k] and bool(mx.array_equal(logits[k], logits["eager mlx-lm"]).item())
            d = mx.abs(logits[k].astype(mx.float32) - logits["eager mlx-lm"].astype(mx.float32)).max().item()
            diff[k] = max(diff[k], float(d))
            toks[k] = mx.argmax(logits[k][:, -1:], axis=-1)
    base = statistics.median(times["eager mlx-lm"])
    stock_t = statistics.median(times["segc per layer"])
    print(f"## decode, context {a.context}, {a.tokens} tokens, {mx.default_device()}")
    print(
        "| variant | median per token | host per token | x eager | x segc stock "
        "| logits equal eager | max abs diff | traces |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for k, ts in times.items():
        m, h = statistics.median(ts), statistics.median(host[k])
        traces = variants[k].cache_info().traces if hasattr(variants[k], "cache_info") else "-"
        print(
            f"| {k} | {m * 1e3:.3f} ms | {h * 1e3:.3f} ms | {m / base:.2f} | {m / stock_t:.2f} "
            f"| {same[k]} | {diff[k]:.3g} | {traces} |"
        )


def prefill(a: argparse.Namespace, model: Any) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    import segc
    from segc.engine import banded_prefill

    prompt = mx.array([[(5 * i + 1) % a.vocab for i in range(a.prompt)]])

    def chunked(f: Any) -> tuple[Any, list]:
        cache = make_prompt_cache(model)
        for s in range(0, a.prompt, a.chunk):
            out = f(prompt[:, s : s + a.chunk], cache=cache)
            mx.eval(out, [c.state for c in cache])
        return out, cache

    banded_step = segc.jit(model, boundaries="auto", validate=False)
    step = segc.jit(model, boundaries="auto", validate=False)

    def banded(_: Any) -> tuple[Any, list]:
        cache = make_prompt_cache(model)
        out = banded_prefill(model, prompt, cache, band=a.band, chunk=a.chunk, step=banded_step)
        mx.eval(out, [c.state for c in cache])
        return out, cache

    runs = {"eager chunked": (chunked, model), "segc chunked": (chunked, step), "segc banded": (banded, None)}
    results: dict[str, dict[str, Any]] = {}
    for fn, f in runs.values():  # warm: traces and kernels
        fn(f)
    for _ in range(a.rounds):
        for name, (fn, f) in runs.items():
            mx.synchronize()
            mx.reset_peak_memory()
            t0 = time.perf_counter()
            out, cache = fn(f)
            dt = time.perf_counter() - t0
            r = results.setdefault(name, {"s": [], "peak": 0})
            r["s"].append(dt)
            r["peak"] = max(r["peak"], mx.get_peak_memory())
            r["out"], r["cache"] = out, cache
    ref = results["eager chunked"]
    print(f"\n## prefill {a.prompt} tokens, chunks of {a.chunk}, bands of {a.band} layers, {mx.default_device()}")
    print("| variant | best of rounds | tokens/s | x eager | MLX peak memory | logits and caches equal eager |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, r in results.items():
        same = bool(mx.array_equal(r["out"], ref["out"]).item()) and all(
            x.offset == y.offset and bool(mx.array_equal(x.state[0], y.state[0]).item())
            for x, y in zip(r["cache"], ref["cache"])
        )
        best = min(r["s"])
        print(
            f"| {name} | {best * 1e3:.1f} ms | {a.prompt / best:.0f} | {best / min(ref['s']):.2f} "
            f"| {r['peak'] / 2**20:.1f} MiB | {same} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--context", type=int, default=128, help="decode: prompt length before decoding")
    p.add_argument("--tokens", type=int, default=40, help="decode: timed tokens")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--prompt", type=int, default=512, help="prefill: prompt length")
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--band", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=["decode", "prefill"], default=None)
    a = p.parse_args()
    model = make_model(a)
    if a.only in (None, "decode"):
        decode(a, model)
    if a.only in (None, "prefill"):
        prefill(a, model)


if __name__ == "__main__":
    main()
