"""Host memory of the trace cache: one entry per prompt length, bounded or not.

    python benchmarks/cache_memory.py [--lengths 200] [--layers 4] [--hidden 128]

Prints the process's resident set (RSS) after filling the cache with one entry per
prompt length, with ``cache_size`` unbounded and with the default bound, and after
``clear_cache()``. Each variant runs in a process of its own (MLX's and the allocator's
state would otherwise carry over).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(lengths: int, layers: int, hidden: int, cache_size: int) -> dict:
    import mlx.core as mx

    import segc
    from segc.models import tiny_llama

    model = tiny_llama(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden)
    step = segc.jit(model, boundaries="layers.*", cache_size=cache_size)
    start = rss_mb()
    for n in range(1, lengths + 1):
        mx.eval(step(mx.array([[1] * n])))
    full = rss_mb()
    entries = len(step.entries())
    step.clear_cache()
    cleared = rss_mb()
    for n in range(1, lengths + 1):  # the same lengths again: does the memory come back into use?
        mx.eval(step(mx.array([[1] * n])))
    return {
        "cache_size": cache_size,
        "entries": entries,
        "rss_start_mb": round(start),
        "rss_full_mb": round(full),
        "rss_after_clear_mb": round(cleared),
        "rss_refilled_mb": round(rss_mb()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, default=200)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.lengths, a.layers, a.hidden, a.child)))
        return
    print(f"# {a.lengths} prompt lengths, tiny llama {a.layers} layers, hidden {a.hidden}")
    print("| cache_size | entries | RSS start | full | after clear_cache | refilled |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in (10**9, 64):
        cmd = [sys.executable, __file__, f"--lengths={a.lengths}", f"--layers={a.layers}", f"--hidden={a.hidden}"]
        out = subprocess.run([*cmd, f"--child={size}"], capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        label = "unbounded" if size == 10**9 else str(size)
        print(
            f"| {label} | {r['entries']} | {r['rss_start_mb']} MB | {r['rss_full_mb']} MB "
            f"| {r['rss_after_clear_mb']} MB | {r['rss_refilled_mb']} MB |"
        )


if __name__ == "__main__":
    main()
