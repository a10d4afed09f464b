"""The KV paging case of ``benchmarks/bench_paging.py`` (docs/paging.md, "KV paging"):
at a long context, resident against the KV caches paged, in one run.

Variants, each on a fresh cache per round (round-robin; the first round untimed, it
also measures each paged phase's budget: ``PagingStats.needed`` with an unlimited one):

- ``resident``: ``segc.jit`` of the model, every weight and cache in memory (chunked
  prefill, then decode);
- ``kv paged``: ``PagedModel(kv_paging=True)`` with every weight resident (the budget is
  the phase's need plus the other pages): only the caches move;
- ``kv+weights paged``: the same at the phase's smallest budget: caches and weights move.

Per variant: banded and chunked prefill of ``--kv-context`` tokens (chunks of
``--kv-chunk``), then ``--tokens`` decode steps at that context, ``--kv-rounds`` timed
rounds; tokens/s as a ratio to resident (paired by round), the KV bytes moved per decoded token (read back and written
out) and the time the KV store takes to move them at its measured bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlx.core as mx

PHASES = ("banded", "chunked", "decode")


def _bits(x: mx.array) -> bytes:
    mx.eval(x)
    return bytes(memoryview(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x))


def store_bandwidth(nbytes: int = 8 << 20) -> float:
    """Bytes per second the KV store moves a buffer out and back: written from MLX's
    memory to its file (a spare overwritten, as in a steady decode), read into host
    memory, copied into MLX's memory. The best of 8."""
    from segc.engine.paging import KVStore

    store = KVStore()
    a = mx.random.normal((1, 8, nbytes // 8 // 64 // 4, 64))
    mx.eval(a)
    best = float("inf")
    for _ in range(8):
        t0 = time.perf_counter()
        lazy = store.write(0, {"keys": a})
        block = store.home(SimpleNamespace(keys=lazy["keys"]))
        assert block is not None
        back = mx.array(store.host(block)["keys"])
        mx.eval(back)
        best = min(best, time.perf_counter() - t0)
        del lazy, back
    store.close()
    return a.nbytes / best


def callables(path: Path, pm: Any) -> tuple[Any, Any]:
    """``(call(x, cache), make_cache())`` of a variant: the resident model under
    ``segc.jit`` (``pm`` None) or the ``PagedModel``."""
    if pm is not None:
        return pm, pm.make_cache
    from mlx_lm.models.cache import make_prompt_cache

    import segc
    from segc.engine import load_local_model

    model, _ = load_local_model(path)
    step = segc.jit(model, boundaries="auto", validate=False)
    return (lambda x, c: step(x, cache=c)), (lambda: make_prompt_cache(model))


class Runner:
    """One variant: ``pm`` None (resident) or a ``PagedModel`` with ``extra`` bytes of
    pages beside each phase's need."""

    def __init__(self, name: str, path: Path, pm: Any = None, extra: int = 0):
        self.name, self.pm, self.extra = name, pm, extra
        self.times: dict[str, list[float]] = {p: [] for p in PHASES}
        self.logits: dict[str, list[bytes]] = {}
        self.needed: dict[str, int] = {}
        self.budget: dict[str, int] = {}
        self.moved = 0  # KV bytes moved per decoded token
        self.call, self.make_cache = callables(path, pm)

    def phase(self, name: str) -> None:
        """Set the budget for phase ``name`` (the first round measures its need)."""
        if self.pm is None:
            return
        if name not in self.needed:
            self.pm.budget = 1 << 50
            self.pm.stats.needed = 0
        else:
            self.pm.budget = self.budget[name] = self.needed[name] + self.extra

    def measured(self, name: str) -> None:
        if self.pm is not None and name not in self.needed:
            self.needed[name] = self.pm.stats.needed

    def round(self, x: mx.array, chunk: int, tokens: int, timed: bool) -> None:
        n = x.shape[1]
        for kind in ("banded", "chunked") if self.pm is not None else ("chunked",):
            cache = self.make_cache()
            self.phase(kind)
            mx.synchronize()
            t0 = time.perf_counter()
            if self.pm is not None:
                logits = self.pm.prefill(x, cache, chunk=chunk, banded=kind == "banded")
            else:
                for s in range(0, n, chunk):
                    logits = self.call(x[:, s : s + chunk], cache)
            mx.eval(logits)
            if timed:
                self.times[kind].append(time.perf_counter() - t0)
            self.measured(kind)
            self.logits[kind] = [_bits(logits)]
        self.phase("decode")
        moved = self.kv_moved()
        out = []
        tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
        mx.eval(tok)
        t0 = time.perf_counter()
        for _ in range(tokens):
            logits = self.call(tok, cache)
            tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
            mx.eval(tok)
            out.append(logits)
        if timed:
            self.times["decode"].append((time.perf_counter() - t0) / tokens)
            self.moved = (self.kv_moved() - moved) // tokens
        self.measured("decode")
        self.logits["decode"] = [_bits(v) for v in out]
        self.kv_bytes = sum(a.nbytes for c in cache for a in (c.keys, c.values))

    def kv_moved(self) -> int:
        return 0 if self.pm is None else self.pm.stats.kv_read_bytes + self.pm.stats.kv_written_bytes


def kv_case(a: argparse.Namespace, path: Path, weight_bytes: int) -> dict[str, Any]:
    from segc.engine.paging import PagedModel

    x = mx.array([[(7 * i + 3) % a.vocab for i in range(a.kv_context)]], dtype=mx.uint32)
    bw = store_bandwidth()
    options = dict(kv_paging=True, depth=a.depth, evict=a.evict, source=a.source)
    runners = [
        Runner("resident", path),
        Runner("kv paged", path, PagedModel(path, budget=1 << 50, **options), weight_bytes),
        Runner("kv+weights paged", path, PagedModel(path, budget=1 << 50, **options)),
    ]
    for r in runners[1:]:
        r.extra -= max(r.pm.page_bytes) if r.extra else 0  # the need holds one page already
    for rnd in range(a.kv_rounds + 1):
        for r in runners:
            t0 = time.perf_counter()
            r.round(x, a.kv_chunk, a.tokens, rnd > 0)
            print(f"  KV case, round {rnd}: {r.name} {time.perf_counter() - t0:.1f} s", flush=True)
    base = runners[0]
    whole = Runner("caches resident", path, PagedModel(path, budget=1 << 50, kv_paging=False))
    whole.round(x, a.kv_chunk, 1, False)  # the budgets each phase needs with every cache in memory
    whole.pm.close()
    kv_bytes = base.kv_bytes
    print(
        f"\nKV paging at context {a.kv_context}: KV caches {kv_bytes / 1e6:.1f} MB, weights {weight_bytes / 1e6:.1f} MB; "
        f"KV store bandwidth (out, back, in) {bw / 1e9:.2f} GB/s; smallest budgets with every cache in memory "
        "(weights paged): " + ", ".join(f"{p} {whole.needed[p] / 1e6:.1f} MB" for p in PHASES)
    )
    print(
        f"resident: decode {1 / statistics.median(base.times['decode']):.1f} tok/s, chunked prefill "
        f"{a.kv_context / statistics.median(base.times['chunked']):.0f} tok/s"
    )
    rows = []
    for r in runners[1:]:
        ratio = {
            p: statistics.median(rt / pt for rt, pt in zip(base.times[q], r.times[p]))
            for p, q in (("decode", "decode"), ("banded", "chunked"), ("chunked", "chunked"))
        }
        t = statistics.median(r.times["decode"])
        row = {
            "variant": r.name,
            "budget": r.budget,
            "decode_tok_s": 1 / t,
            "decode_ratio": ratio["decode"],
            "kv_bytes_per_token": r.moved,
            "decode_vs_kv_bound": (r.moved / bw) / t,
            "prefill_tok_s": {p: a.kv_context / statistics.median(r.times[p]) for p in ("banded", "chunked")},
            "prefill_ratio": {p: ratio[p] for p in ("banded", "chunked")},
            "kv_over_budget": kv_bytes / r.budget["decode"],
            "bit_identical": r.logits["decode"] == base.logits["decode"]
            and r.logits["banded"] == r.logits["chunked"] == base.logits["chunked"],
        }
        rows.append(row)
        print(
            f"{r.name:>16}: decode budget {r.budget['decode'] / 1e6:6.1f} MB (KV / budget "
            f"{row['kv_over_budget']:.2f}): {row['decode_tok_s']:6.1f} tok/s ({row['decode_ratio']:.2f}x resident; "
            f"KV {r.moved / 1e6:.1f} MB per token, {row['decode_vs_kv_bound']:.2f} of the KV store bound); "
            + "; ".join(
                f"{p} prefill budget {r.budget[p] / 1e6:.1f} MB: {row['prefill_tok_s'][p]:.0f} tok/s "
                f"({row['prefill_ratio'][p]:.2f}x)"
                for p in ("banded", "chunked")
            )
            + f"; bit-identical {row['bit_identical']}"
        )
    for r in runners[1:]:
        r.pm.close()
    return {
        "context": a.kv_context,
        "chunk": a.kv_chunk,
        "kv_bytes": kv_bytes,
        "caches_resident_budget": whole.needed,
        "store_bandwidth": bw,
        "resident": {
            "decode_tok_s": 1 / statistics.median(base.times["decode"]),
            "prefill_tok_s": a.kv_context / statistics.median(base.times["chunked"]),
        },
        "paged": rows,
    }


if __name__ == "__main__":  # a module of bench_paging.py's KV case, not a script of its own
    print(__doc__)
