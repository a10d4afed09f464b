"""Sibling projections as one matrix product: bits and host cost (issue 13).

A decode step on MLX's CUDA build is host-bound in MLX's encoding, at 1.3-2.3 us a
kernel (``encode_cost.py``). A llama layer runs seven projections; q, k and v read the
same input, and so do gate and up. Concatenating their weights once (``[Wq; Wk; Wv]``,
``[Wg; Wu]``) makes three products of them, and the outputs are row slices (views) of
one product. This measures, in plain MLX on the reference llama:

- bits: each projection's output from the concatenated weight against its own product,
  byte for byte, for 1, 2, 4, 8, 32 and 512 rows (decode and prefill), and the logits
  of a decode step and a prefill with and without the concatenation;
- host cost: decode steps at context 1024 (eager and ``mx.compile``, each with and
  without the concatenation), interleaved in one process, each call split into building
  the graph, MLX's encoding (until ``mx.async_eval`` returns) and the wait; then a
  decode loop's rate (blocks of 8 calls back to back).

    python benchmarks/fused_projections.py [--layers 16] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).parent))


def fuse(model: nn.Module) -> Callable[[], None]:
    """Give each layer's attention and MLP one product for q/k/v and gate/up; the model's
    own weights become row slices (views) of the concatenations, so no weight is held
    twice. Returns a function that undoes it."""
    from mlx_lm.models.activations import swiglu

    undo: list[Callable[[], None]] = []
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        ws = [at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]
        qkv = mx.concatenate(ws, axis=0)
        gu = mx.concatenate([mlp.gate_proj.weight, mlp.up_proj.weight], axis=0)
        mx.eval(qkv, gu)
        nq, nk = ws[0].shape[0], ws[1].shape[0]
        ni = mlp.gate_proj.weight.shape[0]

        def attn_call(
            x: mx.array,
            mask: Any = None,
            cache: Any = None,
            at: Any = at,
            qkv: mx.array = qkv,
            nq: int = nq,
            nk: int = nk,
        ) -> mx.array:
            from mlx_lm.models.base import scaled_dot_product_attention

            B, L, _ = x.shape
            y = x @ qkv.T
            q, k, v = y[..., :nq], y[..., nq : nq + nk], y[..., nq + nk :]
            q = q.reshape(B, L, at.n_heads, -1).transpose(0, 2, 1, 3)
            k = k.reshape(B, L, at.n_kv_heads, -1).transpose(0, 2, 1, 3)
            v = v.reshape(B, L, at.n_kv_heads, -1).transpose(0, 2, 1, 3)
            if cache is not None:
                q = at.rope(q, offset=cache.offset)
                k = at.rope(k, offset=cache.offset)
                k, v = cache.update_and_fetch(k, v)
            else:
                q, k = at.rope(q), at.rope(k)
            o = scaled_dot_product_attention(q, k, v, cache=cache, scale=at.scale, mask=mask)
            return at.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))

        def mlp_call(x: mx.array, mlp: Any = mlp, gu: mx.array = gu, ni: int = ni) -> mx.array:
            y = x @ gu.T
            return mlp.down_proj(swiglu(y[..., :ni], y[..., ni:]))

        at.__dict__["_fused_call"] = attn_call
        mlp.__dict__["_fused_call"] = mlp_call
        undo.append(lambda at=at, mlp=mlp: (at.__dict__.pop("_fused_call"), mlp.__dict__.pop("_fused_call")))
    return lambda: [u() for u in undo] and None


def _install_dispatch() -> None:
    """Route ``Attention.__call__``/``MLP.__call__`` to a module's fused call when it
    has one (instances cannot override ``__call__``)."""
    from mlx_lm.models import llama

    for cls in (llama.Attention, llama.MLP):
        orig = cls.__call__

        def call(self: Any, *a: Any, orig: Any = orig, **k: Any) -> Any:
            f = self.__dict__.get("_fused_call")
            return f(*a, **k) if f is not None else orig(self, *a, **k)

        cls.__call__ = call  # type: ignore[method-assign]


def _bytes(a: mx.array) -> bytes:
    import numpy as np

    mx.eval(a)
    return bytes(memoryview(np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)))


def projection_bits(model: nn.Module) -> dict[int, bool]:
    """Per row count: whether every projection of layer 0 from the concatenated weight
    has the same bytes as its own product."""
    at, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    dim = at.q_proj.weight.shape[1]
    out: dict[int, bool] = {}
    for rows in (1, 2, 4, 8, 32, 512):
        x = mx.random.normal((1, rows, dim)).astype(at.q_proj.weight.dtype)
        ok = True
        for group in ([at.q_proj, at.k_proj, at.v_proj], [mlp.gate_proj, mlp.up_proj]):
            cat = mx.concatenate([m.weight for m in group], axis=0)
            y = x @ cat.T
            start = 0
            for m in group:
                n = m.weight.shape[0]
                ok &= _bytes(y[..., start : start + n]) == _bytes(x @ m.weight.T)
                start += n
        out[rows] = ok
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--preset", default="reference")
    args = ap.parse_args()
    from bench_llama import FixedContext, compiled_with_cache, make_model
    from encode_cost import split_call

    _install_dispatch()
    model = make_model(args.preset, layers=args.layers)
    print(f"device {mx.default_device()}, mlx {mx.__version__}")
    print("projection bytes equal, by rows:", projection_bits(model))

    vocab = model.args.vocab_size
    prompt = mx.random.randint(0, vocab, (1, 512))
    ref_prefill = model(prompt)
    fc = FixedContext(model, 1024)
    x = mx.array([[1]])
    ref_decode = model(x, cache=fc.reset())
    mx.eval(ref_prefill, ref_decode)
    undo = fuse(model)
    same_p = _bytes(model(prompt)) == _bytes(ref_prefill)
    same_d = _bytes(model(x, cache=fc.reset())) == _bytes(ref_decode)
    print(f"logits bytes equal with the concatenation: prefill 512 {same_p}, decode {same_d}")
    undo()

    fns: dict[str, Callable[[], Any]] = {}
    fns["eager"] = lambda: model(x, cache=fc.reset())
    fns["compile"] = compiled_with_cache(model, fc)
    fused_model = make_model(args.preset, layers=args.layers)
    fc2 = FixedContext(fused_model, 1024)
    fuse(fused_model)
    fns["eagerfused"] = lambda: fused_model(x, cache=fc2.reset())
    cf = compiled_with_cache(fused_model, fc2)
    fns["compilefused"] = lambda: cf(x)
    cfx = {"eager": fc, "compile": fc, "eagerfused": fc2, "compilefused": fc2}

    def outs(v: str) -> list[mx.array]:
        y = fns[v]() if v.startswith("eager") else fns[v](x) if v == "compile" else fns[v]()
        return [y, *cfx[v].arrays()]

    for v in fns:
        for _ in range(3):
            mx.eval(outs(v))
    acc: dict[str, list[tuple[float, float, float]]] = {v: [] for v in fns}
    names = list(fns)
    for i in range(args.rounds):
        for v in names if i % 2 == 0 else names[::-1]:
            acc[v].append(split_call(lambda v=v: outs(v)))
    piped: dict[str, list[float]] = {v: [] for v in fns}
    for i in range(args.rounds):
        for v in names if i % 2 == 0 else names[::-1]:
            mx.synchronize()
            t0 = time.perf_counter()
            for _ in range(8):
                mx.async_eval(outs(v))
            mx.eval(cfx[v].arrays())
            piped[v].append((time.perf_counter() - t0) / 8)
    med = statistics.median
    base = med(sum(t) for t in acc["eager"])
    print(f"{'variant':14s} {'build':>7s} {'encode':>7s} {'wait':>7s} {'wall':>7s} {'x eager':>7s} {'piped':>7s}")
    for v in names:
        b, e, w = (1e3 * med(p) for p in zip(*acc[v]))
        wall = med(sum(t) for t in acc[v])
        print(f"{v:14s} {b:7.3f} {e:7.3f} {w:7.3f} {1e3 * wall:7.3f} {wall / base:7.2f} {1e3 * med(piped[v]):7.3f}")


if __name__ == "__main__":
    main()
