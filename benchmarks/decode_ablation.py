"""Where segc's dynamic decode step spends its time (issue 13), with and without segc.

(It was written to find which part of the dynamic graph costs *device* time; it found
that a decode step on the GPU is host-bound in MLX's encoding: docs/performance.md,
"where the host time goes".)

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

Beside them, segc's own decode step (``segc``: one commit; ``segcauto``: the default
commit policy; ``segcfused``: segc's fused attention; ``segcwhole``: one segment). A
variant named ``v@nographs`` runs with MLX's CUDA graphs off (``MLX_USE_CUDA_GRAPHS=0``).

Each call's wall time is split into building the lazy graph, MLX's encoding and launch
(until ``mx.async_eval`` returns) and the wait for the device; ``piped`` runs the calls
back to back, the steady rate a decode loop gets. ``nodes`` counts the primitives in one
call's graph (``mx.export_to_dot``). Every call writes position ``--context`` again (the
offset is reset), so each call does the same work. Run on the GPU machine (docs/gpu.md); on the CPU quote ratios only:

    python benchmarks/decode_ablation.py --context 1024 --calls 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
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
SEGC = {
    # name: segc.jit's (commit, attention, boundaries); run once (segc compiles its own)
    "segc": ("fences", "off", "layers.*"),
    "segcauto": ("auto", "off", "layers.*"),
    "segcfused": ("fences", "on", "layers.*"),
    "segcwhole": ("fences", "off", None),
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


def _split(one: Callable[[], list[mx.array]], calls: int) -> dict[str, float]:
    """Per call: graph building (until the call returns), MLX's encoding and launch
    (``mx.async_eval`` returns once every kernel is in a CUDA graph and launched), and
    the wait for the device; then ``calls`` calls back to back, each ``async_eval``'d,
    one wait at the end: the steady rate, max(host, device) per call."""
    for _ in range(5):
        mx.eval(one())
    from encode_cost import split_call  # this directory is on sys.path when run as a script

    build, encode, wait = zip(*(split_call(one) for _ in range(calls)))
    wall = [sum(t) for t in zip(build, encode, wait)]
    mx.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        out = one()
        mx.async_eval(out)
    mx.eval(out)
    piped = (time.perf_counter() - t0) / calls
    med = statistics.median
    return {
        "median_ms": 1e3 * med(wall),
        "min_ms": 1e3 * min(wall),
        "build_ms": 1e3 * med(build),
        "encode_ms": 1e3 * med(encode),
        "wait_ms": 1e3 * med(wait),
        "piped_ms": 1e3 * piped,
    }


def _nodes(outs: list[mx.array]) -> dict[str, int]:
    """The primitives in the lazy graph of one call (``mx.export_to_dot``), by name."""
    import collections
    import re
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".dot") as f:
        mx.export_to_dot(f.name, *outs)
        txt = Path(f.name).read_text()
    names = re.findall(r'label ="([^"]*)", shape=rectangle', txt)
    return dict(collections.Counter(n.split(" ")[0] for n in names).most_common())


def _model(layers: int) -> Any:
    """The reference llama (bench_llama.py's preset) with ``layers`` layers."""
    from bench_llama import make_model  # this directory is on sys.path when run as a script

    return make_model("reference", layers=layers)


def _plain(variant: str, context: int, layers: int, compiled: bool) -> Callable[[], list[mx.array]]:
    """A decode step in plain MLX with the variant's cache (no segc)."""
    model = _model(layers)
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

    return one


def _segc(variant: str, context: int, layers: int) -> Callable[[], list[mx.array]]:
    """segc's own decode step on mlx-lm's caches held at ``context`` (its dynamic graph,
    ``validate=False`` as in bench_llama.py)."""
    from bench_llama import FixedContext  # this directory is on sys.path when run as a script

    import segc

    model = _model(layers)
    fc = FixedContext(model, context)
    x = mx.array([[1]])
    commit, attention, bounds = SEGC[variant]
    step = segc.jit(model, boundaries=bounds, commit=commit, attention=attention, validate=False)

    def one() -> list[mx.array]:
        y = step(x, cache=fc.reset())
        return [y, *fc.arrays()]

    return one


def run_one(variant: str, context: int, calls: int, layers: int, compiled: bool) -> dict[str, Any]:
    one = _segc(variant, context, layers) if variant in SEGC else _plain(variant, context, layers, compiled)
    mx.eval(one())
    nodes = _nodes(one())
    r: dict[str, Any] = _split(one, calls)
    r["nodes"] = sum(nodes.values())
    r["by_primitive"] = nodes
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--variants", default=",".join([*VARIANTS, *SEGC]))
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: VARIANT:eager|compiled
    a = ap.parse_args()
    if a.one:
        v, mode = a.one.split(":")
        print(json.dumps(run_one(v, a.context, a.calls, a.layers, mode == "compiled")))
        return
    print(f"decode ablation on {mx.default_device()}: {a.layers} layers, context {a.context}, {a.calls} calls")
    print("  ms per call, medians, each variant a process of its own: wall = build + encode + wait;")
    print("  piped = calls back to back (async_eval each), per call; nodes = primitives in one call's graph")
    cols = ("median_ms", "build_ms", "encode_ms", "wait_ms", "piped_ms")
    print(f"  {'variant':<20} {'wall':>8} {'build':>8} {'encode':>8} {'wait':>8} {'piped':>8} {'nodes':>6}")
    results: dict[str, Any] = {}
    for spec in a.variants.split(","):
        v, _, flag = spec.partition("@")  # "v@nographs": MLX's CUDA graphs off (MLX_USE_CUDA_GRAPHS=0)
        env = dict(os.environ, MLX_USE_CUDA_GRAPHS="0") if flag == "nographs" else None
        for mode in ("eager",) if v in SEGC else ("eager", "compiled"):
            name = (v if v in SEGC else f"{v}:{mode}") + (f"@{flag}" if flag else "")
            cmd = [sys.executable, __file__, "--one", f"{v}:{mode}"]
            cmd += ["--context", str(a.context), "--calls", str(a.calls), "--layers", str(a.layers)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            if r.returncode != 0:
                print(f"  {name} failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            results[name] = res
            figs = " ".join(f"{res[c]:8.3f}" for c in cols)
            print(f"  {name:<20} {figs} {res['nodes']:6d}", flush=True)
    for name, res in results.items():
        print(f"  {name}: {res['by_primitive']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": str(mx.default_device()), "context": a.context, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
