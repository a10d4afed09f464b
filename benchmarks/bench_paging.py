"""Paging (docs/paging.md), side by side in one run: resident, paged with the host
draining after every band, and paged with segc's fences (a pager thread prefetching
while the bands compute), for decode and banded prefill, at several budgets and prompt
lengths (docs/performance.md, "Paging").

    .venv/bin/python benchmarks/bench_paging.py                       # CPU-sized llama
    .venv/bin/python benchmarks/bench_paging.py --out paging.json --plot docs/paging_budget.svg

The model (a random llama, ``--layers`` x ``--hidden`` ...) is saved to a local mlx-lm
directory first and read back from there. The *medium*'s read bandwidth is measured by
reading every tensor as the pager does (``DiskSource.read_bandwidth``: memory-mapped
files, warm in the page cache; ``--source host``: host memory; on CUDA, unless
``--transfer host``, by DMA into MLX's buffers, the road recycled pages take, with the
host-copy road's bandwidth reported beside it). Budgets are given as the
fraction ``f`` of the weights the pager may hold (``--weights``): the budget is then the
call's own working set (``PagedModel.min_budget`` less one page) plus ``f`` x the
weight bytes. Reported:

- decode tokens/s, as a ratio to resident and to the *transfer bound* (the weight bytes
  paged per token over the read bandwidth: no pager can go faster);
- banded prefill tokens/s per prompt length, as a ratio to resident (ordinary chunked
  prefill of the resident model through ``segc.jit``), and the prompt length from which
  resident prefill takes longer than reading the weights once (from there banded prefill
  is compute-bound, and paging it costs little);
- fenced / drain speedups. Logits of every paged run are compared bit for bit with the
  resident run's;
- KV paging at a long context (``--kv-context``, 0 skips it): decode after a prompt of
  that many tokens, banded and chunked prefill of it, resident against the KV caches
  paged with every weight resident and with the weights paged too, each at the smallest
  budget its calls need (measured by an untimed first round); the KV bytes moved per
  token and the time the KV store takes to move them (its measured bandwidth: write
  out, read back, copy in).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx


def build_dir(a: argparse.Namespace, path: Path) -> Path:
    from segc.engine.paging import save_model_dir
    from segc.models.zoo import build, tiny_config

    kw = dict(
        num_hidden_layers=a.layers,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.hidden // a.heads,
        vocab_size=a.vocab,
        tie_word_embeddings=False,
    )
    cfg = tiny_config("llama", **kw)
    model = build("llama", dtype=getattr(mx, a.dtype), **kw)
    cfg["torch_dtype"] = a.dtype
    return save_model_dir(model, cfg, path, shard_bytes=256 << 20)


def prompt(n: int, vocab: int) -> mx.array:
    return mx.array([[(7 * i + 3) % vocab for i in range(n)]], dtype=mx.uint32)


def bits(x: mx.array) -> bytes:
    mx.eval(x)
    return bytes(memoryview(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x))


class Variant:
    """One way of running the model: resident (``pm`` None) or a ``PagedModel``."""

    def __init__(
        self, name: str, a: argparse.Namespace, path: Path, pm: Any = None, limit: int = 0, settings: str = ""
    ):
        from bench_paging_kv import callables

        self.name, self.a, self.pm, self.limit, self.settings = name, a, pm, limit, settings
        self.decode_s: list[float] = []
        self.prefill_s: dict[int, list[float]] = {}
        self.logits: list[bytes] = []
        self.prefill_logits: dict[int, bytes] = {}
        self.budgets: dict[str, int] = {}
        self.loaded = 0  # weight bytes the decode rounds paged
        self.call, self.make_cache = callables(path, pm)

    def fit(self, x: mx.array, cache: list, chunks: int, what: str) -> None:
        """The budget for a call of ``x``'s shape: its working set, and ``limit`` for pages."""
        if self.pm is not None:
            self.pm.budget = self.pm.min_budget(x, cache, chunks) - max(self.pm.page_bytes) + self.limit
            self.budgets[what] = self.pm.budget

    def decode_round(self, timed: bool) -> None:
        a = self.a
        cache = self.make_cache()
        self.fit(prompt(a.context, a.vocab), cache, 1, "prompt")
        logits = self.call(prompt(a.context, a.vocab), cache)
        tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
        mx.eval(tok)
        self.fit(tok, cache, 1, "decode")
        before = self.pm.stats.loaded_bytes if self.pm is not None else 0
        out = []
        t0 = time.perf_counter()
        for _ in range(a.tokens):
            logits = self.call(tok, cache)
            tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
            mx.eval(tok)
            out.append(logits)
        if timed:
            self.decode_s.append((time.perf_counter() - t0) / a.tokens)
            self.loaded = (self.pm.stats.loaded_bytes - before) // a.tokens if self.pm is not None else 0
        self.logits = [bits(x) for x in out]

    def prefill_round(self, n: int, timed: bool) -> None:
        a = self.a
        x, cache = prompt(n, a.vocab), self.make_cache()
        self.fit(x[:, : a.chunk], cache, -(-n // a.chunk), f"prefill {n}")
        mx.synchronize()
        t0 = time.perf_counter()
        if self.pm is not None:
            logits = self.pm.prefill(x, cache, chunk=a.chunk)
        else:
            for s in range(0, n, a.chunk):
                logits = self.call(x[:, s : s + a.chunk], cache)
        mx.eval(logits)
        if timed:
            self.prefill_s.setdefault(n, []).append(time.perf_counter() - t0)
        self.prefill_logits[n] = bits(logits)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--weights", default="0.25,0.5,0.75,1.0", help="fractions of the weights the pager may hold")
    p.add_argument("--prompts", default="16,64,256", help="banded prefill prompt lengths")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--context", type=int, default=32, help="prompt before the decoded tokens")
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--band", type=int, default=1, help="layers per page (and per band call)")
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--evict", default="spread", help="spread (the default; the draining pager keeps mru), mru, lru")
    p.add_argument("--source", default="disk", choices=["disk", "host"])
    p.add_argument(
        "--transfer", default="auto", choices=["auto", "host", "direct", "cuda"], help="PagedModel's transfer"
    )
    p.add_argument("--piece", type=int, help="cudacopy.PIECE_BYTES: CUDA copies at most this long (0: a tensor)")
    p.add_argument("--settings", help="at this fraction, also run the other depths and the other eviction")
    p.add_argument("--dir", help="where to save the model (default: a temporary directory)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--plot", help="write decode tokens/s against the budget as SVG here")
    p.add_argument("--kv-context", type=int, default=1024, help="KV paging: the context (0: skip the case)")
    p.add_argument("--kv-chunk", type=int, default=256, help="KV paging: prefill chunk")
    p.add_argument("--kv-rounds", type=int, default=1, help="KV paging: timed rounds (after an untimed one)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_all(a, Path(a.dir) if a.dir else Path(tmp) / "model")


def run_all(a: argparse.Namespace, path: Path) -> None:
    from segc.engine.paging import DiskSource, HostSource, PagedModel, cudacopy

    build_dir(a, path)
    if a.piece is not None:
        cudacopy.PIECE_BYTES = a.piece
    src = (HostSource if a.source == "host" else DiskSource)(path)
    host_bw = bw = max(src.read_bandwidth() for _ in range(3))  # a host copy into MLX's memory
    if a.transfer == "cuda" or (a.transfer == "auto" and cudacopy.available()):
        src.attach(cudacopy.CudaCopier())  # the pager's road on CUDA: a DMA into MLX's buffers
        bw = max(src.read_bandwidth() for _ in range(3))
        print(f"host copy into MLX's memory: {host_bw / 1e9:.2f} GB/s; by DMA (the pager's road): {bw / 1e9:.2f} GB/s")
    weight_bytes = sum(i.nbytes for i in src.tensors.values())
    src.close()
    fractions = [float(f) for f in a.weights.split(",")]
    lengths = [int(n) for n in a.prompts.split(",")]
    print(f"device {mx.default_device()}, weights {weight_bytes / 1e6:.1f} MB, read bandwidth {bw / 1e9:.2f} GB/s")
    print(f"transfer bound: {weight_bytes / bw * 1e3:.1f} ms to read every weight once")
    variants = [Variant("resident", a, path)]
    refused = {}
    runs = [(f, mode, a.depth, a.evict, True) for f in fractions for mode in ("drain", "fenced")]
    if a.settings:  # the defaults measured: other depths, the other eviction, no recycling, at one budget
        f = float(a.settings)
        runs += [(f, "fenced", d, a.evict, True) for d in (0, 1, 2) if d != a.depth]
        runs += [(f, "fenced", a.depth, e, True) for e in ("spread", "lru", "mru") if e != a.evict]
        runs += [(f, "fenced", a.depth, a.evict, False)]
    for f, mode, depth, evict, recycle in runs:
        settings = "" if (depth, evict) == (a.depth, a.evict) else f"depth={depth} evict={evict}"
        settings += "" if recycle else "no recycling"
        name = f"{mode} f={f:g}" + (f" {settings}" if settings else "")
        # the caches stay in memory here: these rows page the weights (the KV case below pages both)
        pm = PagedModel(
            path,
            budget=1 << 50,
            mode=mode,
            band=a.band,
            depth=depth,
            evict=evict,
            source=a.source,
            kv_paging=False,
            recycle=recycle,
            transfer=a.transfer,
        )
        limit = int(f * weight_bytes)
        if limit < max(pm.page_bytes):
            refused[name] = f"one page needs {max(pm.page_bytes)} bytes"
            continue
        variants.append(Variant(name, a, path, pm, limit, settings))
    for r in range(a.rounds + 1):  # round-robin; the first round traces and compiles, untimed
        for v in variants:
            v.decode_round(r > 0)
            for n in lengths:
                v.prefill_round(n, r > 0)
    res = report(a, variants, refused, weight_bytes, bw, lengths)
    res["host_copy_bandwidth"] = host_bw
    for v in variants:
        if v.pm is not None:
            v.pm.close()
    del variants
    if a.kv_context:
        from bench_paging_kv import kv_case

        res["kv"] = kv_case(a, path, weight_bytes)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    if a.plot:
        Path(a.plot).write_text(svg(res, fractions))


def report(
    a: argparse.Namespace, variants: list[Variant], refused: dict, weight_bytes: int, bw: float, lengths: list[int]
) -> dict[str, Any]:
    base = variants[0]
    t_res = statistics.median(base.decode_s)
    p_res = {n: statistics.median(base.prefill_s[n]) for n in lengths}
    crossover = next((n for n in lengths if p_res[n] >= weight_bytes / bw), None)
    res: dict[str, Any] = {"weight_bytes": weight_bytes, "read_bandwidth": bw, "args": vars(a), "refused": refused}
    res["resident"] = {"decode_tok_s": 1 / t_res, "prefill": {n: n / p_res[n] for n in lengths}}
    res["compute_bound_from"] = crossover
    print(
        f"\nresident: decode {1 / t_res:.1f} tok/s; prefill "
        + ", ".join(f"{n}: {n / p_res[n]:.0f} tok/s" for n in lengths)
    )
    rows = []
    for v in variants[1:]:
        t = statistics.median(v.decode_s)
        bound = v.loaded / bw  # seconds per token to read what is paged
        # paired with the resident round run just before it: the shared machine's noise cancels
        ratio = statistics.median(rt / pt for rt, pt in zip(base.decode_s, v.decode_s))
        mode, f = v.name.split()[:2]
        row = {
            "mode": mode,
            "weights": float(f[2:]),
            "settings": v.settings,
            "budget": v.budgets,
            "decode_tok_s": 1 / t,
            "decode_ratio": ratio,
            "paged_bytes_per_token": v.loaded,
            "decode_vs_bound": bound / t if v.loaded else None,
            "decode_vs_roofline": max(bound, t_res) / t,
            "prefill": {n: n / statistics.median(v.prefill_s[n]) for n in lengths},
            "prefill_ratio": {
                n: statistics.median(rt / pt for rt, pt in zip(base.prefill_s[n], v.prefill_s[n])) for n in lengths
            },
            "bit_identical": v.logits == base.logits
            and all(v.prefill_logits[n] == base.prefill_logits[n] for n in lengths),
        }
        rows.append(row)
        show(row)
    for name, why in refused.items():
        print(f"{name}: refused ({why})")
    res["paged"] = rows
    speed = {}
    for f in sorted({r["weights"] for r in rows}):
        d = next((r for r in rows if r["weights"] == f and r["mode"] == "drain"), None)
        g = next((r for r in rows if r["weights"] == f and r["mode"] == "fenced" and not r["settings"]), None)
        if d and g:
            speed[f] = g["decode_tok_s"] / d["decode_tok_s"]
    res["fenced_over_drain_decode"] = speed
    pre: dict[float, dict[int, float]] = {}  # the same for banded prefill, paired round by round
    for f in sorted({r["weights"] for r in rows}):
        d = next((v for v in variants[1:] if v.name == f"drain f={f:g}"), None)
        g = next((v for v in variants[1:] if v.name == f"fenced f={f:g}"), None)
        if d and g:
            pre[f] = {n: statistics.median(dt / gt for dt, gt in zip(d.prefill_s[n], g.prefill_s[n])) for n in lengths}
    res["fenced_over_drain_prefill"] = pre
    if crossover:
        print(
            f"banded prefill is compute-bound from a prompt of {crossover} tokens (resident prefill >= reading the weights)"
        )
    print("fenced / drain (decode): " + ", ".join(f"f={f:g}: {s:.2f}x" for f, s in speed.items()))
    for f, by_n in pre.items():
        print(f"fenced / drain (banded prefill), f={f:g}: " + ", ".join(f"{n}: {s:.2f}x" for n, s in by_n.items()))
    return res


def show(r: dict[str, Any]) -> None:
    head = f"{r['mode']:>6} f={r['weights']:.2f}" + (f" {r['settings']}" if r["settings"] else "")
    if "refused" in r:
        print(f"{head}: refused ({r['refused'][:90]})")
        return
    vb = r["decode_vs_bound"]
    print(
        f"{head} budget {r['budget']['decode'] / 1e6:7.1f} MB: decode {r['decode_tok_s']:7.1f} tok/s "
        f"({r['decode_ratio']:.2f}x resident, {'-' if vb is None else f'{vb:.2f}'} of the transfer bound, "
        f"{r['decode_vs_roofline']:.2f} of max(transfer, resident)); "
        + ", ".join(f"prefill {n}: {v:.0f} tok/s ({r['prefill_ratio'][n]:.2f}x)" for n, v in r["prefill"].items())
        + f"; bit-identical {r['bit_identical']}"
    )


def svg(res: dict[str, Any], fractions: list[float]) -> str:
    """Decode tokens/s against the fraction of the weights the pager may hold."""
    w, h, m = 480, 300, 50
    top = max([res["resident"]["decode_tok_s"]] + [r.get("decode_tok_s", 0) for r in res["paged"]]) * 1.1

    def xy(f: float, v: float) -> tuple[float, float]:
        return m + (w - 2 * m) * f, h - m - (h - 2 * m) * v / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-size="11" font-family="sans-serif">'
    ]
    parts.append(f'<rect width="{w}" height="{h}" fill="white"/>')
    parts.append(f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>')
    parts.append(f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>')
    for f in fractions:
        x, _ = xy(f, 0)
        parts.append(f'<text x="{x:.0f}" y="{h - m + 15}" text-anchor="middle">{f:g}</text>')
    for k in range(5):
        v = top * k / 4
        _, y = xy(0, v)
        parts.append(f'<text x="{m - 5}" y="{y:.0f}" text-anchor="end">{v:.0f}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">weights the pager may hold (fraction)</text>')
    parts.append(f'<text x="12" y="{m - 20}">decode tokens/s ({res["weight_bytes"] / 1e6:.0f} MB of weights)</text>')
    _, y = xy(0, res["resident"]["decode_tok_s"])
    parts.append(f'<line x1="{m}" y1="{y:.0f}" x2="{w - m}" y2="{y:.0f}" stroke="gray" stroke-dasharray="4"/>')
    parts.append(f'<text x="{w - m}" y="{y - 4:.0f}" text-anchor="end" fill="gray">resident</text>')
    for mode, colour in (("drain", "#c0392b"), ("fenced", "#2471a3")):
        pts = [xy(r["weights"], r["decode_tok_s"]) for r in res["paged"] if r["mode"] == mode and not r["settings"]]
        if pts:
            line = " ".join(f"{x:.0f},{y:.0f}" for x, y in pts)
            parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
            parts.append(f'<text x="{pts[-1][0] + 4:.0f}" y="{pts[-1][1]:.0f}" fill="{colour}">{mode}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    main()
