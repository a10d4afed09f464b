"""``mx.fast`` primitives (whole on the GPU, decomposed by the CPU trace), random bits
and ``Depends``."""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..ir import Eqn, Var
from .prim import no_flops, normalize_flops, rule
from .threefry import random_bits


def _sdpa_flops(e: Eqn, vs: dict[str, Var]) -> int:
    q, k = vs[e.ins[0]], vs[e.ins[1]]
    return 4 * q.size * k.shape[-2]


@rule("RMSNorm", flops=normalize_flops)
def _rms_norm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, w = ins
    # no weight is passed as the scalar 1 that mx.fast.rms_norm makes for None
    return mx.fast.rms_norm(x, w if w.ndim == 1 else None, args[0])


@rule("LayerNorm", flops=normalize_flops)
def _layer_norm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, w, b = ins
    return mx.fast.layer_norm(x, w if w.ndim == 1 else None, b if b.ndim == 1 else None, args[0])


@rule(
    "RoPE",
    check=lambda e, ins: None if e.args[4] else "the inverse rotation (RoPE's VJP) has no MLX op",
    refused="forward=False (the VJP's inverse rotation)",
    flops=normalize_flops,
)
def _rope(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    dims, traditional, base, scale, _ = args
    x, offset = ins[0], ins[1]
    if len(ins) == 3:
        return mx.fast.rope(x, dims, traditional=bool(traditional), base=None, scale=scale, offset=offset, freqs=ins[2])
    return mx.fast.rope(x, dims, traditional=bool(traditional), base=base, scale=scale, offset=offset)


def _check_sdpa(e: Eqn, ins: list[Var]) -> str | None:
    _, causal, has_sinks, output_lse = e.args[:4]
    if output_lse:
        return "the logsumexp output is made only under a gradient trace"
    if causal and len(ins) > 3 + bool(has_sinks):
        return "a causal attention with an array mask"
    return None


@rule(
    "ScaledDotProductAttention",
    check=_check_sdpa,
    refused="it outputs the logsumexp (gradient traces only); causal with an array mask",
    flops=_sdpa_flops,
)
def _sdpa(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    scale, causal, has_sinks, _, force_fused = [*args, False][:5]
    q, k, v = ins[:3]
    rest = ins[3:]
    sinks = rest.pop() if has_sinks else None
    mask: Any = "causal" if causal else (rest[0] if rest else None)
    return mx.fast.scaled_dot_product_attention(
        q, k, v, scale=scale, mask=mask, sinks=sinks, force_fused=bool(force_fused)
    )


@rule("RandomBits", rebuilt="not one key and an even number of 32-bit words: threefry.random_bits")
def _random_bits(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``RandomBits(shape, width)``: Python exposes it only as ``mx.random.split(key, n)``
    (shape ``(n, 2)``, width 4). The bits depend only on the key and the number of 32-bit
    words, so an output of one key and an even whole number of words is split's, viewed
    and reshaped; any other (an odd number of words, a batch of keys) is MLX's kernel
    rebuilt from MLX operations (``threefry.py``)."""
    shape, width = args
    (key,) = ins
    nbytes = math.prod(shape) * width
    dtype = dtypes.to_mx(e.outs[0].dtype)
    if nbytes == 0:
        return mx.zeros(tuple(shape), dtype=dtype)
    if tuple(key.shape) == (2,) and nbytes % 8 == 0:
        words = mx.random.split(key, nbytes // 8)
        return mx.reshape(words.view(dtype), tuple(shape))
    return random_bits(key, tuple(shape), dtype)


@rule("Depends", memory="view_keep", flops=no_flops)
def _depends(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    n = len(e.outs)
    return list(mx.depends(ins[:n], ins[n:]))
