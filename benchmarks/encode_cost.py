"""What MLX charges the host per primitive when it evaluates a graph (issue 13).

On MLX's CUDA build a decode step is host-bound: ``mx.async_eval`` (MLX encoding each
primitive into a CUDA graph and launching it) takes longer than the device then needs
(``decode_ablation.py``). This times, in one process, graphs of one kind of node at a
time: a chain of views (``Transpose``, ``Reshape``), of small elementwise kernels, of
decode-sized matrix-vector products, inside and outside ``mx.compile``; per node, the
host time to build the graph and to encode it, and the wait for the device.

Then it interleaves decode steps of the reference llama in the same process (eager
mlx-lm, ``mx.compile``, segc's variants: ``segc`` one commit and MLX's decomposition of
the attention, ``segcfused`` one commit and segc's fused attention, ``segcauto`` the
defaults), round-robin, with the same split: in one process the variants share MLX's
caches, so each appears twice (``A`` and ``B`` runs) as a check that the order does not
move the figures. Then a decode loop's rate (``piped``: blocks of 8 calls back to back,
each ``mx.async_eval``'d, the variants' blocks alternating) and, for segc's variants,
its host time split into segc's call path and the executor's compiled calls.

    python benchmarks/encode_cost.py [--layers 16] [--rounds 30] [--skip-nodes] [--arch mixtral] [--bits 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))


def split_call(make: Callable[[], list[mx.array]]) -> tuple[float, float, float]:
    """One call's seconds: building its graph (until ``make`` returns), MLX's encoding
    and launch (until ``mx.async_eval`` returns), the wait for the device."""
    mx.synchronize()
    t0 = time.perf_counter()
    out = make()
    t1 = time.perf_counter()
    mx.async_eval(out)
    t2 = time.perf_counter()
    mx.eval(out)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def _time(make: Callable[[], list[mx.array]], reps: int) -> dict[str, float]:
    for _ in range(3):
        mx.eval(make())
    b, e, w = zip(*(split_call(make) for _ in range(reps)))
    med = statistics.median
    return {"build": med(b), "encode": med(e), "wait": med(w)}


def node_costs(n: int, reps: int) -> dict[str, dict[str, float]]:
    """Per node, microseconds: a chain of ``n`` nodes of one kind."""
    small = mx.ones((64, 64), dtype=mx.bfloat16)
    x = mx.ones((1, 2048), dtype=mx.bfloat16)
    ws = [mx.random.normal((2048, 2048)).astype(mx.bfloat16) for _ in range(8)]
    mx.eval(small, x, ws)

    def transposes() -> list[mx.array]:
        y = small
        for _ in range(n):
            y = y.T
        return [y]

    def reshapes() -> list[mx.array]:
        y = small
        for i in range(n):
            y = y.reshape((32, 128) if i % 2 == 0 else (64, 64))
        return [y]

    def adds() -> list[mx.array]:
        y = small
        for _ in range(n):
            y = y + small
        return [y]

    def gemvs() -> list[mx.array]:
        y = x
        for i in range(n // 4):
            y = y @ ws[i % 8].T  # Transpose + Matmul
        return [y]

    def gemvs_pre() -> list[mx.array]:
        y = x
        for i in range(n // 4):
            y = y @ wts[i % 8]  # Matmul of a transposed view made once
        return [y]

    wts = [w.T for w in ws]
    mx.eval(wts)
    chain = mx.compile(lambda y: transposes_of(y))

    def transposes_of(y: mx.array) -> mx.array:
        for _ in range(n):
            y = y.T
        return y

    def compiled_transposes() -> list[mx.array]:
        return [chain(small)]

    cases = {
        "transpose (view)": (transposes, n),
        "reshape (view)": (reshapes, n),
        "add (64x64 kernel)": (adds, n),
        "transpose + gemv 2048": (gemvs, n // 4),
        "gemv 2048 on a view made once": (gemvs_pre, n // 4),
        "transpose in mx.compile": (compiled_transposes, n),
    }
    out = {}
    for name, (f, nodes) in cases.items():
        t = _time(f, reps)
        out[name] = {k: 1e6 * v / nodes for k, v in t.items()}
    return out


def _with_caches(y: Any, fc: Any) -> list[mx.array]:
    """A call's outputs and the caches it updates: what one call must evaluate."""
    return y if isinstance(y, list) else [y, *fc.arrays()]


SEGC = {  # segc's variants: (commit, attention, concat_projections, boundaries)
    "segc": ("fences", "off", False, "layers.*"),
    "segcfused": ("fences", "on", False, "layers.*"),
    "segcauto": ("auto", "auto", False, "layers.*"),  # the defaults, a segment per layer
    "segcconcat": ("fences", "auto", True, "layers.*"),  # one commit, sibling products as one
    "segcautoconcat": ("auto", "auto", True, "layers.*"),
    "segcwhole": ("auto", "auto", False, None),  # segc.jit(model): no boundaries, one segment
    "segcwholeconcat": ("auto", "auto", True, None),
    # the same with MLX's own one-position KV writes, not segc's select on CUDA
    # (segc.lower.shapes.SELECT_WRITE, read when the jit lowers: at its first call)
    "segcwholeconcatdsu": ("auto", "auto", True, None, "never"),
    # the same without segc's product kernels on CUDA (segc.lower.products.FUSED_PRODUCTS)
    "segcwholeconcatplain": ("auto", "auto", True, None, "auto", "never"),
    "segcwholeplain": ("auto", "auto", False, None, "auto", "never"),
    # segcwholeconcat with segc.jit(..., freeze_params=True): no parameter check per call
    "segcwholeconcatfrozen": ("auto", "auto", True, None, "auto", "auto", True),
}


def decode_interleaved(
    layers: int, rounds: int, variants: list[str], arch: str = "llama", bits: int | None = None
) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, dict[str, float]]]:
    """Per variant and run (``A``, ``B``), medians in ms; per variant, a decode loop's ms
    per token (``piped``); and per segc variant, its host time split into segc's call
    path and the executor's loop (``bench_llama.host_split``)."""
    from bench_llama import FixedContext, compiled_with_cache, first_call_with, host_split, make_model

    import segc

    model = make_model("reference", layers=layers, arch=arch, bits=bits)
    fc = FixedContext(model, 1024)
    x = mx.array([[1]])
    fns: dict[str, Callable[[], Any]] = {}
    steps: dict[str, Any] = {}
    second: list[Any] = []

    def own() -> tuple[Any, Any]:
        if not second:
            m2 = make_model("reference", layers=layers, arch=arch, bits=bits)
            second.extend([m2, FixedContext(m2, 1024)])
        return second[0], second[1]

    fcs: dict[str, Any] = {v: fc for v in variants}  # the caches each variant updates
    for v in variants:
        if v == "eager":
            fns[v] = lambda: model(x, cache=fc.reset())
        elif v == "compile":
            f = compiled_with_cache(model, fc)
            fns[v] = lambda f=f: f(x)
        elif v == "compileconcat":  # plain MLX: q/k/v and gate/up concatenated by hand (llama)
            from fused_projections import _install_dispatch, fuse

            _install_dispatch()
            m3 = make_model("reference", layers=layers, arch=arch, bits=bits)
            fuse(m3)
            fc3 = FixedContext(m3, 1024)
            f = compiled_with_cache(m3, fc3)
            fns[v], fcs[v] = (lambda f=f: f(x)), fc3
        else:
            # the settings a variant leaves out: segc's select write and product kernels, not frozen
            spec = SEGC[v] + ("auto", "auto", False)[len(SEGC[v]) - 4 :]
            commit, attention, concat, bounds, select, fused, frozen = spec
            # concat_projections rebinds the module's weights to views of their
            # concatenations: those variants get a model (and caches) of their own
            m, c = (model, fc) if not concat else own()
            step = segc.jit(
                m,
                boundaries=bounds,
                commit=commit,
                attention=attention,
                validate=False,
                concat_projections=concat,
                freeze_params=frozen,
            )
            fns[v] = lambda step=step, c=c: step(x, cache=c.reset())
            if SEGC[v][4:]:  # lowered now, with those settings
                first_call_with(lambda f=fns[v], c=c: mx.eval(f(), c.arrays()), select, fused)
            steps[v], fcs[v] = step, c
    order = [(f"{v}/{r}", fns[v], fcs[v]) for r in "AB" for v in variants]
    for _, f, c in order:
        mx.eval(f(), c.arrays())
    acc: dict[str, dict[str, list[float]]] = {k: {"build": [], "encode": [], "wait": []} for k, _, _ in order}
    for i in range(rounds):
        seq = order if i % 2 == 0 else order[::-1]
        for k, f, c in seq:
            parts = split_call(lambda f=f, c=c: _with_caches(f(), c))
            for part, t in zip(("build", "encode", "wait"), parts):
                acc[k][part].append(t)
    # a decode loop's rate: blocks of calls back to back (each async_eval'd, as mlx-lm's
    # loop does), one wait per block; the variants' blocks alternate
    piped: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(rounds):
        for v in variants if i % 2 == 0 else variants[::-1]:
            mx.synchronize()
            t0 = time.perf_counter()
            for _ in range(8):
                mx.async_eval(_with_caches(fns[v](), fcs[v]))
            mx.eval(fcs[v].arrays())
            piped[v].append((time.perf_counter() - t0) / 8)
    split = {v: host_split(st, fns[v], fcs[v].arrays, rounds) for v, st in steps.items()}
    split = {v: {k: (1e3 * x if k.endswith("_s") else x) for k, x in d.items()} for v, d in split.items()}
    per_call = {k: {p: 1e3 * statistics.median(v) for p, v in d.items()} for k, d in acc.items()}
    return per_call, {v: 1e3 * statistics.median(ts) for v, ts in piped.items()}, split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=400)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--arch", default="llama", help="mlx-lm architecture at the reference sizes (mixtral: 8 experts)")
    ap.add_argument("--bits", type=int, default=None, help="quantize the weights (group size 64)")
    ap.add_argument("--rounds", type=int, default=30)
    fused = ",segcfused" if mx.cuda.is_available() else ""  # segc's fused attention needs CUDA
    ap.add_argument("--variants", default=f"eager,compile,segc{fused}")
    ap.add_argument("--skip-nodes", action="store_true", help="only the decode steps")
    ap.add_argument("--json")
    a = ap.parse_args()
    print(f"encode cost on {mx.default_device()}")
    nc = {} if a.skip_nodes else node_costs(a.nodes, a.reps)
    if nc:
        print(f"  per node, us:           {'build':>8} {'encode':>8} {'wait':>8}")
    for k, v in nc.items():
        print(f"  {k:<30} {v['build']:8.2f} {v['encode']:8.2f} {v['wait']:8.2f}")
    dec, piped, split = decode_interleaved(a.layers, a.rounds, a.variants.split(","), a.arch, a.bits)
    what = a.arch + (f", {a.bits}-bit" if a.bits else "")
    print(f"decode step, {what}, {a.layers} layers, context 1024, one process, round-robin x{a.rounds}, ms:")
    print(f"  {'variant/run':<16} {'build':>8} {'encode':>8} {'wait':>8} {'wall':>8}")
    for k, v in dec.items():
        print(f"  {k:<16} {v['build']:8.3f} {v['encode']:8.3f} {v['wait']:8.3f} {sum(v.values()):8.3f}")
    print("a decode loop (blocks of 8 calls, each async_eval'd), ms per token:")
    for k, ms in piped.items():
        print(f"  {k:<16} {ms:8.3f}")
    for k, v in split.items():
        print(
            f"  {k}: build {v['call_s']:.3f} ms = segc's call path {v['call_path_s']:.3f} + executor "
            f"{v['executor_s']:.3f} ({v['segments']} segments, {v['executor_per_segment_s']:.3f} each)"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"node_costs": nc, "decode": dec, "piped": piped, "host_split": split}, indent=1)
        )


if __name__ == "__main__":
    main()
