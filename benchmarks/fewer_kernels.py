"""What one kernel fewer a layer is worth in a decode step (issue 13).

On MLX's CUDA build a decode step is host-bound: MLX encodes every kernel on the host
(``encode_cost.py``), so a step costs what its kernels cost the host. This writes the
reference llama's decode step by hand in plain MLX, under ``mx.compile`` (weights
captured, the KV caches' buffers inputs and outputs, q/k/v and gate/up concatenated as
``segc.jit(..., concat_projections=True)`` does), and removes kernels one kind at a time:

- ``ropeqk``: one ``mx.fast.rope`` over q's and k's heads together (they are adjacent in
  the concatenated product's row, and take the same positions): one kernel fewer a layer;
- ``addmm``: the two residual additions folded into the products (``mx.addmm``): two
  kernels fewer a layer, other bits (one rounding where eager rounds twice);
- ``nonorm`` / ``noact``: upper bounds, not models: the two RMSNorms, or the SwiGLU,
  left out (on top of ``ropeqk`` and ``addmm``).

``base`` is checked byte for byte against eager mlx-lm's logits (the hand-written step
is the model), ``ropeqk`` against ``base``; ``addmm``'s difference is printed. Then
every variant, eager mlx-lm and ``mx.compile`` of mlx-lm's model are timed in one
process, round-robin: each call split into building the graph, MLX's encoding and the
wait (``encode_cost.split_call``), and a decode loop's rate (blocks of 8 calls, each
``mx.async_eval``'d). ``kernels`` counts the graph's non-view nodes (``mx.export_to_dot``).

    python benchmarks/fewer_kernels.py [--layers 16] [--rounds 30] [--context 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from segc.dtypes import to_bytes

sys.path.insert(0, str(Path(__file__).parent))

VARIANTS = {  # name: (ropeqk, addmm, drop the norms, drop the activation)[, segc's dynamic cache]
    "base": (False, False, False, False),
    "ropeqk": (True, False, False, False),
    "addmm": (False, True, False, False),
    "both": (True, True, False, False),
    "nonorm": (True, True, True, False),
    "noact": (True, True, False, True),
    "inputs": (False, False, False, False),  # base with the weights as inputs (as segc passes them)
    # segc's dynamic cache, one difference at a time (write, RoPE offset, attention as
    # decode_ablation.py names them), then all three, then all three with weight inputs
    "dynwrite": (False, False, False, False, (True, False, False)),
    "dynrope": (False, False, False, False, (False, True, False)),
    "dynattn": (False, False, False, False, (False, False, True)),
    "dynall": (False, False, False, False, (True, True, True)),
    "dynsel": (False, False, False, False, ("select", True, True)),  # dynall, the write a select
    "dynallin": (False, False, False, False, (True, True, True)),
}
# segc.jit(model, concat_projections=True), one segment; segcdsu: with MLX's own
# one-position writes where segc's lowering makes a select on CUDA (segc.lower.shapes);
# segcplain: without segc's product kernels on CUDA (segc.lower.products); segcfrozen:
# segc.jit(..., freeze_params=True), no check of the parameters per call
SEGC = {"segc": "fences", "segcauto": "auto", "segcdsu": "fences", "segcplain": "fences", "segcfrozen": "fences"}
# (Flatten and Unflatten are views too; counted as kernels before the tenth session)
VIEWS = {"Reshape", "Transpose", "Slice", "Broadcast", "AsStrided", "Squeeze", "ExpandDims", "Flatten", "Unflatten"}


def hand_step(
    model: nn.Module, context: int, flags: tuple, as_inputs: bool = False
) -> tuple[Callable[..., list[mx.array]], list[mx.array]]:
    """mlx-lm llama's decode step at a fixed ``context``, written out; ``flags`` as
    VARIANTS. Returns ``step(x, offset, *kv, *weights)`` and the weights it takes when
    ``as_inputs`` (else ``step(x, offset, *kv)`` with the weights captured, and ``[]``).
    ``offset`` (an int32 array holding ``context``) is read only by the dynamic forms:
    the write at an array position (``mx.slice_update``), RoPE's array offset, and
    segc's fused attention over the whole buffer with a mask (the CUDA kernel)."""
    ropeqk, addmm, nonorm, noact = flags[:4]
    dynwrite, dynrope, dynattn = flags[4] if len(flags) > 4 else (False, False, False)
    inner = model.model
    eps = inner.norm.eps
    at0 = inner.layers[0].self_attn
    hq, hk = at0.n_heads, at0.n_kv_heads
    flat = [inner.embed_tokens.weight, inner.norm.weight]
    for layer in inner.layers:
        at, mlp = layer.self_attn, layer.mlp
        qkv = mx.concatenate([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight], axis=0)
        gu = mx.concatenate([mlp.gate_proj.weight, mlp.up_proj.weight], axis=0)
        ln1, ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        flat += [ln1, qkv, at.o_proj.weight, ln2, gu, mlp.down_proj.weight]
    mx.eval(flat)
    n_layers = len(inner.layers)

    def step(x: mx.array, off: mx.array, *rest: mx.array) -> list[mx.array]:
        pos = off if dynrope else context
        kv, w = rest[: 2 * n_layers], (rest[2 * n_layers :] if as_inputs else flat)
        h = w[0][x]
        B = x.shape[0]
        out = []
        for i in range(n_layers):
            ln1, qkv, wo, ln2, gu, wd = w[2 + 6 * i : 8 + 6 * i]
            d = qkv.shape[0] // (hq + 2 * hk)
            n = h if nonorm else mx.fast.rms_norm(h, ln1, eps)
            y = n @ qkv.T
            if ropeqk:
                qk = y[..., : (hq + hk) * d].reshape(B, 1, hq + hk, d).transpose(0, 2, 1, 3)
                qk = at0.rope(qk, offset=pos)
                q, k = qk[:, :hq], qk[:, hq:]
            else:
                q = at0.rope(y[..., : hq * d].reshape(B, 1, hq, d).transpose(0, 2, 1, 3), offset=pos)
                k = at0.rope(y[..., hq * d : (hq + hk) * d].reshape(B, 1, hk, d).transpose(0, 2, 1, 3), offset=pos)
            v = y[..., (hq + hk) * d :].reshape(B, 1, hk, d).transpose(0, 2, 1, 3)
            K, V = kv[2 * i], kv[2 * i + 1]
            if dynwrite == "select":  # segc's lowering of the one-position write on CUDA
                hit = mx.arange(K.shape[2], dtype=off.dtype).reshape(1, 1, -1, 1) == off
                K, V = mx.where(hit, k, K), mx.where(hit, v, V)
            elif dynwrite:
                K = mx.slice_update(K, k, off.reshape(1), axes=(2,))
                V = mx.slice_update(V, v, off.reshape(1), axes=(2,))
            else:
                K[..., context : context + 1, :] = k  # mlx-lm KVCache.update_and_fetch's writes
                V[..., context : context + 1, :] = v
            out += [K, V]
            if dynattn:
                from segc.lower.cuda_attention import cuda_attention

                mask = (mx.arange(K.shape[2]) <= off)[None]
                a = cuda_attention(q, K, V, mask, at0.scale)
            else:
                a = mx.fast.scaled_dot_product_attention(
                    q, K[..., : context + 1, :], V[..., : context + 1, :], scale=at0.scale, mask=None
                )
            a = a.transpose(0, 2, 1, 3).reshape(B, 1, -1)
            h = mx.addmm(h, a, wo.T) if addmm else h + a @ wo.T
            n = h if nonorm else mx.fast.rms_norm(h, ln2, eps)
            g = n @ gu.T
            ni = gu.shape[0] // 2
            act = g[..., :ni] if noact else nn.silu(g[..., :ni]) * g[..., ni:]
            h = mx.addmm(h, act, wd.T) if addmm else h + act @ wd.T
        h = mx.fast.rms_norm(h, w[1], eps)
        return [h @ w[0].T, *out]

    return step, (flat if as_inputs else [])


def kernels(outs: list[mx.array]) -> int:
    from decode_ablation import _nodes

    return sum(n for k, n in _nodes(outs).items() if k not in VIEWS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--preset", default="reference")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    from bench_llama import FixedContext, compiled_with_cache, first_call_with, make_model
    from encode_cost import split_call

    model = make_model(args.preset, layers=args.layers)
    print(
        f"device {mx.default_device()}, mlx {mx.__version__}, MLX_MAX_OPS_PER_BUFFER={os.environ.get('MLX_MAX_OPS_PER_BUFFER')}"
    )
    x = mx.array([[1]])
    fc = FixedContext(model, args.context)
    ref = model(x, cache=fc.reset())
    mx.eval(ref)
    fns: dict[str, Callable[[], list[mx.array]]] = {
        "eager": lambda: [model(x, cache=fc.reset()), *fc.arrays()],
    }
    cm = compiled_with_cache(model, fc)
    fns["compile"] = lambda: [cm(x), *fc.arrays()]
    kv0 = [mx.array(a) for a in fc.arrays()]
    mx.eval(kv0)
    first: dict[str, mx.array] = {}
    off = mx.array(args.context, dtype=mx.int32)
    for v in args.variants.split(","):
        if v in SEGC:
            import segc

            m2 = make_model(args.preset, layers=args.layers)  # concat_projections rebinds its weights
            fc2 = FixedContext(m2, args.context)
            j = segc.jit(m2, validate=False, concat_projections=True, commit=SEGC[v], freeze_params=v == "segcfrozen")
            fns[v] = lambda j=j, fc2=fc2: [j(x, cache=fc2.reset()), *fc2.arrays()]
            select = "never" if v == "segcdsu" else "auto"  # read when the jit lowers
            fused = "never" if v == "segcplain" else "auto"
            first[v] = first_call_with(fns[v], select, fused)[0]
            continue
        if VARIANTS[v][4:] and VARIANTS[v][4][2] and mx.default_device() != mx.gpu:
            print(f"{v}: segc's attention kernel needs MLX's CUDA build; left out")
            continue
        step, ws = hand_step(model, args.context, VARIANTS[v], as_inputs=v in ("inputs", "dynallin"))
        f = mx.compile(step)
        state = list(kv0)

        def call(f: Any = f, state: list[mx.array] = state, ws: list[mx.array] = ws) -> list[mx.array]:
            y, *kv = f(x, off, *state, *ws)
            state[:] = kv
            return [y, *kv]

        first[v] = call()[0]
        fns[v] = call
    base = first.get("base")
    if base is not None:
        print("base == eager mlx-lm, bytes:", to_bytes(base) == to_bytes(ref))
    for v, y in first.items():
        if v != "base" and base is not None:
            same = to_bytes(y) == to_bytes(base)
            diff = mx.abs(y.astype(mx.float32) - base.astype(mx.float32)).max().item()
            print(f"{v} == base, bytes: {same} (max |diff| {diff:.3g})")
    counts = {}
    for v in fns:  # each call's own graph: everything before it evaluated
        mx.eval(fns[v]())
        outs = fns[v]()
        counts[v] = kernels(outs)
        if v in ("base", "segc"):
            from decode_ablation import _nodes

            print(f"{v} nodes:", _nodes(outs))
        mx.eval(outs)
    for v in fns:
        for _ in range(3):
            mx.eval(fns[v]())
    names = list(fns)
    acc: dict[str, list[tuple[float, float, float]]] = {v: [] for v in names}
    piped: dict[str, list[float]] = {v: [] for v in names}
    for i in range(args.rounds):
        for v in names if i % 2 == 0 else names[::-1]:
            acc[v].append(split_call(fns[v]))
    for i in range(args.rounds):
        for v in names if i % 2 == 0 else names[::-1]:
            mx.synchronize()
            t0 = time.perf_counter()
            outs: list[mx.array] = []
            for _ in range(8):
                outs = fns[v]()
                mx.async_eval(outs)
            mx.eval(outs)
            piped[v].append((time.perf_counter() - t0) / 8)
    med = statistics.median
    e = med(piped["eager"])
    print(f"{'variant':9s} {'kernels':>7s} {'build':>7s} {'encode':>7s} {'wait':>7s} {'piped':>7s} {'x eager':>7s}")
    for v in names:
        b, en, w = (1e3 * med(p) for p in zip(*acc[v]))
        p = med(piped[v])
        print(f"{v:9s} {counts[v]:7d} {b:7.3f} {en:7.3f} {w:7.3f} {1e3 * p:7.3f} {p / e:7.2f}")


if __name__ == "__main__":
    main()
