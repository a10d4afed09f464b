"""Which part of segc's dynamic decode graph costs device time (issue 13), without segc.

segc's dynamic KV cache differs from mlx-lm's in three ways (segc/trace/kvcache.py):
the write position is an array (``DynamicSliceUpdate``), attention reads the whole buffer
with a boolean mask, and RoPE gets the offset as an array. This times a decode step of
the reference llama in plain MLX with each of them switched on alone and together, eager
and under ``mx.compile``, each variant in a process of its own (MLX's kernel and
CUDA-graph caches are per process):

==============  ============  ================  ================
variant         write         attention         RoPE offset
==============  ============  ================  ================
``static``      host index    live keys, fused  int
``dynwrite``    array         live keys, fused  int
``masked``      host index    whole + mask      int
``arrayrope``   host index    live keys, fused  array
``dynamic``     array         whole + mask      array (segc's)
==============  ============  ================  ================

Every call writes position ``--context`` again (the offset is reset), so each call does
the same work. Run on the GPU machine (docs/gpu.md); on the CPU quote ratios only:

    python benchmarks/decode_ablation.py --context 1024 --calls 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

VARIANTS = {
    # name: (array write, masked attention over the whole buffer, array RoPE offset)
    "static": (False, False, False),
    "dynwrite": (True, False, False),
    "masked": (False, True, False),
    "arrayrope": (False, False, True),
    "dynamic": (True, True, True),
}


def _cache_class() -> type:
    from mlx_lm.models.cache import KVCache

    class Ablated(KVCache):  # type: ignore[misc, valid-type]
        """An mlx-lm KVCache held at one context, written and read as the variant says."""

        def __init__(self, keys: mx.array, values: mx.array, context: int, how: tuple[bool, bool, bool]):
            super().__init__()
            self.keys, self.values = keys, values
            self.context = context
            self.dyn_write, self.masked, self.array_rope = how
            self.at = mx.array(context, dtype=mx.int32)
            self.n = 0

        @property  # type: ignore[override]
        def offset(self) -> Any:
            return self.at if self.array_rope else self.context + self.n

        @offset.setter
        def offset(self, value: Any) -> None:  # KVCache.__init__ sets it
            pass

        def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
            n, c = keys.shape[2], self.context
            if self.dyn_write:
                self.keys = mx.slice_update(self.keys, keys, self.at, axes=(2,))
                self.values = mx.slice_update(self.values, values, self.at, axes=(2,))
            else:
                self.keys[..., c : c + n, :] = keys
                self.values[..., c : c + n, :] = values
            self.n = n
            if self.masked:
                return self.keys, self.values
            return self.keys[..., : c + n, :], self.values[..., : c + n, :]

        def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
            if not self.masked:
                return None if n == 1 else "causal"
            q = self.at + mx.arange(n, dtype=mx.int32)[:, None]
            return q >= mx.arange(self.keys.shape[2], dtype=mx.int32)[None]

    return Ablated


def run_one(variant: str, context: int, calls: int, layers: int, compiled: bool) -> dict[str, float]:
    from segc.models import tiny_llama

    model = tiny_llama(
        num_hidden_layers=layers,
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        dtype=mx.bfloat16,
    )
    cls = _cache_class()
    cap = ((context + 1 + 255) // 256) * 256
    mx.random.seed(1)
    caches = [
        cls(
            mx.random.normal((1, 8, cap, 64)).astype(mx.bfloat16),
            mx.random.normal((1, 8, cap, 64)).astype(mx.bfloat16),
            context,
            VARIANTS[variant],
        )
        for _ in range(layers)
    ]
    mx.eval([(c.keys, c.values) for c in caches])
    x = mx.array([[1]])

    at = mx.array(context, dtype=mx.int32)

    def pure(t: mx.array, pos: mx.array, *kv: mx.array) -> list[mx.array]:
        for i, c in enumerate(caches):
            c.keys, c.values, c.at = kv[2 * i], kv[2 * i + 1], pos  # the position: an input
        y = model(t, cache=caches)
        return [y, *(a for c in caches for a in (c.keys, c.values))]

    fn: Callable[..., list[mx.array]] = mx.compile(pure) if compiled else pure

    def one() -> list[mx.array]:
        kv = [a for c in caches for a in (c.keys, c.values)]
        out = fn(x, at, *kv)
        for i, c in enumerate(caches):
            c.keys, c.values = out[1 + 2 * i], out[2 + 2 * i]
        return out

    for _ in range(5):
        mx.eval(one())
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        mx.eval(one())
        ts.append(time.perf_counter() - t0)
    return {"median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: VARIANT:eager|compiled
    a = ap.parse_args()
    if a.one:
        v, mode = a.one.split(":")
        print(json.dumps(run_one(v, a.context, a.calls, a.layers, mode == "compiled")))
        return
    print(f"decode ablation on {mx.default_device()}: {a.layers} layers, context {a.context}, {a.calls} calls")
    print(f"  {'variant':<10} {'eager':>10} {'compiled':>10}   (median ms per step, each a process of its own)")
    base: float | None = None
    for v in a.variants.split(","):
        row = []
        for mode in ("eager", "compiled"):
            cmd = [sys.executable, __file__, "--one", f"{v}:{mode}"]
            cmd += ["--context", str(a.context), "--calls", str(a.calls), "--layers", str(a.layers)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                row.append(float("nan"))
                print(f"  {v}:{mode} failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            row.append(json.loads(r.stdout.strip().splitlines()[-1])["median_ms"])
        base = base if base is not None else row[0]
        print(f"  {v:<10} {row[0]:10.3f} {row[1]:10.3f}   (x static eager: {row[0] / base:.2f}, {row[1] / base:.2f})")


if __name__ == "__main__":
    main()
