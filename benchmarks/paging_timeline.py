"""Where a paged call's time goes: both threads' steps timed (``Pager.timeline``).

    .venv/bin/python benchmarks/paging_timeline.py --weights 0.25,1.0 --prompts 256
    python3 benchmarks/paging_timeline.py --layers 16 --hidden 2048 --intermediate 8192 \
        --heads 32 --kv-heads 8 --vocab 32000 --dtype bfloat16 --source host \
        --prompts 8192 --chunk 2048 --weights 0.25,1.0      # the H200's reference llama

For each budget (``--weights``: the fraction of the weights the pager may hold) and
mode, a decode token and a banded prefill, timed after a warm-up call, split into:

- the pager thread: *reading* (a page's bytes sent: on CUDA the DMA, waited for),
  *waiting for reclaim* (the prefetch depth: a band ``depth`` tickets back not yet
  complete), *waiting for room* (buffers or bytes under the limit the dispatch thread
  has not freed yet), *idle* (nothing requested);
- the dispatch thread: *admit* (waiting at the admit fence for a page), *eval*
  (waiting for a band's outputs: the device's work), *call* (building and dispatching
  the band: segc's and MLX's host work), and the rest (the engine's own bookkeeping).

``read / wall`` is how busy the medium is: a transfer-bound run wants it near 1; a
compute-bound one wants *eval* to be most of the dispatch thread's time (the host is
ahead of the device).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))
from bench_paging import build_dir, prompt


def split(timeline: list[tuple[float, str, int]], t0: float, t1: float) -> dict[str, float]:
    """Seconds per step of each thread in ``[t0, t1]``."""
    out: dict[str, float] = defaultdict(float)
    ev = sorted((t, w, k) for t, w, k in timeline if t0 <= t <= t1)
    # the pager thread: from each of its notes to the next of its notes
    pager = [(t, w) for t, w, _ in ev if w in ("read", "read done", "wait reclaim", "wait room")]
    for (ta, wa), (tb, _) in zip(pager, [*pager[1:], (t1, "end")]):
        out["pager " + {"read": "reading", "read done": "idle"}.get(wa, wa)] += tb - ta
    if pager:
        out["pager idle"] += pager[0][0] - t0
    # the dispatch thread
    marks = ("admit", "admitted", "called", "completed", "eval", "evaled", "room", "roomed")
    disp = [(t, w) for t, w, _ in ev if w in marks]
    names = {"admit": "admit wait", "admitted": "call"}
    prev = t0
    state, stack = "rest", []
    for t, w in disp:
        out["dispatch " + state] += t - prev
        prev = t
        if w in ("eval", "room"):  # inside admit or complete: back to it after
            stack.append(state)
            state = w + (" wait" if w == "eval" else "")
        elif w in ("evaled", "roomed"):
            state = stack.pop() if stack else "rest"
        else:
            state = names.get(w, "rest")
    out["dispatch " + state] += t1 - prev
    # the medium: busy from a page's read (issue) until it landed, one page at a time
    issued: dict[int, float] = {}
    free = t0
    for t, w, k in ev:
        if w == "read":
            issued.setdefault(k, t)
        elif w == "read done" and k in issued:
            start = max(issued.pop(k), free)
            if t > start:
                out["medium busy"] += t - start
                free = t
    out["wall"] = t1 - t0
    return out


def show(label: str, s: dict[str, float], per: str) -> None:
    wall = s["wall"]
    parts = [f"{k} {v / wall:.2f}" for k, v in sorted(s.items()) if k != "wall"]
    print(f"{label}: {wall * 1e3:.1f} ms {per}; " + ", ".join(parts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 8), ("hidden", 512), ("intermediate", 1536), ("heads", 8), ("kv-heads", 4)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--weights", default="0.25,1.0")
    p.add_argument("--modes", default="drain,fenced")
    p.add_argument("--prompts", default="256")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--tokens", type=int, default=6)
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--band", type=int, default=1)
    p.add_argument("--source", default="disk", choices=["disk", "host"])
    p.add_argument("--dir", help="where to save the model (default: a temporary directory)")
    p.add_argument("--profile", action="store_true", help="then cProfile a banded prefill, every page held")
    p.add_argument("--piece", type=int, help="cudacopy.PIECE_BYTES (CUDA: a copy at most this long; 0: a tensor)")
    p.add_argument("--read-delay", type=float, default=0.0, help="seconds per MB read: a slower medium")
    p.add_argument("--count-all-runs", action="store_true", help="ablation: the depth counts held runs too")
    p.add_argument("--dump", help="write every case's timeline (seconds from its start, step, ticket) here as JSON")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.dir) if a.dir else Path(tmp) / "model"
        if not (path / "config.json").exists():
            build_dir(a, path)
        run(a, path)


def run(a: argparse.Namespace, path: Path) -> None:
    from segc.engine.paging import PagedModel

    if a.count_all_runs:
        from segc.engine.paging.runs import Runs

        real = Runs.reached
        Runs.reached = lambda self, ticket, reads: real(self, ticket, True)  # type: ignore[method-assign]
    if a.piece is not None:
        from segc.engine.paging import cudacopy

        cudacopy.PIECE_BYTES = a.piece

    dumps: dict[str, list[tuple[float, str, int]]] = {}
    for f in (float(x) for x in a.weights.split(",")):
        for mode in a.modes.split(","):
            pm = PagedModel(path, 1 << 50, mode=mode, band=a.band, depth=a.depth, source=a.source, kv_paging=False)
            if a.read_delay:
                slow(pm, a.read_delay)
            limit = int(f * pm.weight_bytes)
            if limit < max(pm.page_bytes):  # as bench_paging.py: the pager could not hold one page
                print(f"{mode} f={f:g}: refused (one page needs {max(pm.page_bytes)} bytes)")
                pm.close()
                continue
            res: dict[str, Any] = {}
            for n in [int(x) for x in a.prompts.split(",")]:
                x = prompt(n, a.vocab)
                for timed in (False, True):
                    cache = pm.make_cache()
                    pm.budget = pm.min_budget(x[:, : a.chunk], cache, -(-n // a.chunk)) - max(pm.page_bytes) + limit
                    tl = _start(pm)
                    mx.synchronize()
                    t0 = time.perf_counter()
                    mx.eval(pm.prefill(x, cache, chunk=a.chunk))
                    t1 = time.perf_counter()
                    if timed:
                        dumps[f"{mode} f={f:g} prefill {n}"] = [(t - t0, w, k) for t, w, k in tl if t0 <= t <= t1]
                        res[f"prefill {n}"] = split(tl, t0, t1)
            cache = pm.make_cache()
            x = prompt(32, a.vocab)
            pm.budget = pm.min_budget(x, cache) - max(pm.page_bytes) + limit
            tok = mx.argmax(pm(x, cache)[:, -1:], axis=-1).astype(mx.uint32)
            pm.budget = pm.min_budget(tok, cache) - max(pm.page_bytes) + limit
            for timed in (False, True):
                tl = _start(pm)
                mx.eval(tok)
                t0 = time.perf_counter()
                for _ in range(a.tokens):
                    tok = mx.argmax(pm(tok, cache)[:, -1:], axis=-1).astype(mx.uint32)
                    mx.eval(tok)
                t1 = time.perf_counter()
                if timed:
                    dumps[f"{mode} f={f:g} decode"] = [(t - t0, w, k) for t, w, k in tl if t0 <= t <= t1]
                    res["decode"] = split(tl, t0, t1)
                    res["decode"] = {k: v / a.tokens for k, v in res["decode"].items()}
            for what, s in res.items():
                show(f"{mode:>6} f={f:g} {what}", s, "a token" if what == "decode" else "")
            pm.close()
    if a.dump:
        import json

        Path(a.dump).write_text(json.dumps(dumps))
    if a.profile:
        profile(a, path)


def profile(a: argparse.Namespace, path: Path) -> None:
    """cProfile of a banded prefill with every page held (fenced): the host's work per band call."""
    import cProfile
    import pstats

    from segc.engine.paging import PagedModel

    pm = PagedModel(path, 1 << 50, source=a.source, kv_paging=False)
    n = int(a.prompts.split(",")[-1])
    x = prompt(n, a.vocab)
    for timed in (False, False, True):
        cache = pm.make_cache()
        pr = cProfile.Profile() if timed else None
        if pr is not None:
            pr.enable()
        mx.eval(pm.prefill(x, cache, chunk=a.chunk))
        if pr is not None:
            pr.disable()
            print(f"banded prefill of {n} tokens, every page held: {pm.stats.bands} band calls so far")
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
            pstats.Stats(pr).sort_stats("cumulative").print_stats(35)
    pm.close()


def slow(pm: Any, per_mb: float) -> None:
    """The source's reads take ``per_mb`` seconds per MB more (a slower medium)."""
    from segc.engine.paging import DiskSource

    base = DiskSource(pm.path).raw  # the files' bytes (a reader of its own: no recursion)

    def reader(info: Any) -> Any:
        time.sleep(per_mb * info.nbytes / 1e6)
        return base(info)

    pm.source.reader = reader


def _start(pm: Any) -> list[tuple[float, str, int]]:
    """A fresh timeline on ``pm`` (its pager's steps from the next call on)."""
    tl: list[tuple[float, str, int]] = []
    pm.timeline = tl
    return tl


if __name__ == "__main__":
    main()
