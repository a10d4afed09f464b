"""Greedy generation, eager mlx-lm against segc, side by side in one run.

    .venv/bin/python benchmarks/bench_generate.py                 # 256 tokens, CPU-sized llama
    .venv/bin/python benchmarks/bench_generate.py --tokens 512 --layers 16 --hidden 2048

Both run mlx-lm's own decode loop (``mlx_lm.generate.generate_step``: chunked prefill,
``async_eval`` of the next token before reading the current one); segc replaces the
model by ``segc.jit(model, boundaries=...)``. Rounds alternate between the variants and
the best round of each is reported. For segc it also reports every trace: why it
happened and what the call that traced cost (trace + lowering + MLX compilation +
dispatch) against a cached call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import mlx.core as mx


class Timed:
    """Wraps a jitted model: times every call, noting those that traced."""

    def __init__(self, jitted: Any):
        self.jitted = jitted
        self.calls: list[tuple[float, bool, str]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        info = self.jitted.cache_info()
        before = info.misses
        t0 = time.perf_counter()
        out = self.jitted(*args, **kwargs)
        dt = time.perf_counter() - t0
        traced = info.misses > before
        self.calls.append((dt, traced, info.retraces[-1] if traced else ""))
        return out


def run_variant(model: Any, prompt: list[int], n: int, variant: str, boundaries: Any) -> dict:
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    import segc

    fn: Any = model
    timed = None
    if variant != "eager":
        # segc: a segment per boundary; segc-1seg: one segment; segc-1seg-concat: one
        # segment with sibling products as one (concat_projections, docs/passes.md);
        # segc-frozen: a segment per boundary, concatenated, freeze_params=True (the
        # parameters captured by the compiled segments: docs/api.md); segc-best: one
        # segment, concatenated, frozen, the caches written in place (kv_in_place: the
        # fastest decode measured, docs/models.md)
        concat = variant in ("segc-1seg-concat", "segc-frozen", "segc-best")
        frozen = variant in ("segc-frozen", "segc-best")
        # validate=False as bench_llama.py: on a GPU the dynamic graph's logits are within
        # the bound of eager's, not equal, and validation would fall back to exact mode
        # (a trace per token up to segc.jit's exact_trace_limit, then eager calls)
        bounds = boundaries if variant in ("segc", "segc-frozen") else None
        step = segc.jit(
            model,
            boundaries=bounds,
            concat_projections=concat,
            freeze_params=frozen,
            kv_in_place=variant == "segc-best",
            validate=False,
        )
        timed = Timed(step)
        fn = timed
    cache = make_prompt_cache(model)
    toks: list[int] = []
    t0 = time.perf_counter()
    t_first = 0.0
    for tok, _ in generate_step(
        mx.array(prompt, dtype=mx.uint32), fn, max_tokens=n, sampler=lambda x: mx.argmax(x, -1), prompt_cache=cache
    ):
        toks.append(int(tok))
        if len(toks) == 1:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    res = {
        "tokens": toks,
        "first_s": t_first - t0,
        "decode_tps": (len(toks) - 1) / (t_end - t_first),
        "total_tps": len(toks) / (t_end - t0),
    }
    if timed is not None:
        info = timed.jitted.cache_info()
        hits = [dt for dt, traced, _ in timed.calls if not traced]
        res.update(
            traces=info.traces,
            trace_s=info.trace_seconds,
            traced_calls=[(why, dt) for dt, traced, why in timed.calls if traced],
            cached_call_s=statistics.median(hits) if hits else 0.0,
            segments=len(timed.jitted.entries()[0].segments),
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=32, help="prompt length")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--bits", type=int, default=None, help="quantize the weights (4 or 8)")
    ap.add_argument("--group-size", type=int, default=64, help="quantization group size (mlx-lm's default: 64)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--boundaries", default="auto")
    ap.add_argument("--variants", default="eager,segc,segc-1seg", help="also: segc-1seg-concat, segc-frozen, segc-best")
    args = ap.parse_args()

    from segc.models.zoo import build

    model = build(
        "llama",
        dtype=getattr(mx, args.dtype),
        bits=args.bits,
        group_size=args.group_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        intermediate_size=args.intermediate,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        vocab_size=args.vocab,
    )
    prompt = [(7 * i + 3) % args.vocab for i in range(args.prompt)]
    nparams = sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters()))
    print(
        f"llama {args.layers} layers, hidden {args.hidden}, {nparams / 1e6:.1f} M parameters, {args.dtype}"
        f"{f', {args.bits}-bit' if args.bits else ''}; prompt {args.prompt}, {args.tokens} greedy tokens; "
        f"MLX {mx.__version__} on {mx.default_device()}"
    )
    variants = args.variants.split(",")
    known = ("eager", "segc", "segc-1seg", "segc-1seg-concat", "segc-frozen", "segc-best")
    if variants[0] != "eager" or any(v not in known for v in variants):
        raise SystemExit(f"--variants: eager first, then any of {', '.join(known[1:])}; got {args.variants!r}")
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for v in variants:
            r = run_variant(model, prompt, args.tokens, v, args.boundaries)
            if v not in best or r["decode_tps"] > best[v]["decode_tps"]:
                best[v] = r
    ref = best["eager"]
    print(
        f"\n{'variant':18s} {'decode tok/s':>13s} {'vs eager':>9s} {'first token':>12s} {'traces':>7s}  tokens == eager"
    )
    for v in variants:
        r = best[v]
        print(
            f"{v:18s} {r['decode_tps']:13.1f} {r['decode_tps'] / ref['decode_tps']:8.2f}x "
            f"{r['first_s'] * 1e3:9.1f} ms {r.get('traces', 0):7d}  {r['tokens'] == ref['tokens']}"
        )
    for v in variants[1:]:
        r = best[v]
        print(
            f"\n{v}: {r['segments']} segments; median cached call {r['cached_call_s'] * 1e3:.2f} ms (wall; on the CPU it includes compute)"
        )
        print(f"  {r['traces']} traces, {r['trace_s'] * 1e3:.1f} ms of tracing in all; calls that traced:")
        for why, dt in r["traced_calls"]:
            print(f"    {dt * 1e3:8.1f} ms  {why}")


if __name__ == "__main__":
    main()
