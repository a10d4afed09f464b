"""Masked decode attention as one kernel: find MLX's decomposed attention in a segment.

A dynamic KV cache (``segc/trace/kvcache.py``) hands attention its whole buffer and a
boolean mask that hides the unwritten tail. MLX 0.32's CUDA backend has no fused kernel
for an array mask, so ``mx.fast.scaled_dot_product_attention`` records its fallback:
``q * scale`` (unflattened into KV-head groups), a ``Matmul`` with the transposed keys
(broadcast over the group: a copy of the keys per query head), a ``Select`` of the mask
against the dtype's lowest value, a precise ``Softmax``, a second ``Matmul`` with the
(broadcast) values and a ``Flatten``. :func:`find_attention` finds that shape in a
segment's equations, by primitive and by shape (every step is checked to be the one the
fallback makes, so nothing else matches), for a few query rows (decode) and a mask
shared by every batch and head. The replay (``replay.py``) then computes the match with
one kernel (``cuda_attention.py``) instead of its equations: the same function,
rounded differently (in float32 throughout), which is why it is used only where the
fallback is not eager's kernel anyway (docs/lowering.md, "Fused decode attention").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..backend import on_cuda
from ..errors import UsageError
from ..ir import Eqn
from ..settings import env_choice
from .pattern import SegmentGraph, only_reader, skippable, through

MAX_ROWS = 16  # query rows (heads per KV head x query tokens) one kernel block holds
MAX_HEAD_DIM = 256  # one thread per element of a head in the combining kernel


@dataclass(frozen=True)
class AttentionMatch:
    """One decomposed masked attention: ``out = softmax(scale * q @ k^T, where=mask) @ v``.

    ``q`` is ``(B, Hq, L, D)``, ``k`` and ``v`` ``(B, Hkv, C, D)``, ``mask`` a boolean of
    ``(..., M, C)`` with every leading axis 1 and ``M`` 1 or ``L``; ``out`` is the var the
    last equation (``last``) defines. ``skip`` are the equations the kernel replaces."""

    q: str
    k: str
    v: str
    mask: str
    scale: float
    out: str
    last: int
    skip: frozenset[int]


def _scalar(v: str, g: SegmentGraph, consts: Mapping[str, Any], path: list[Eqn]) -> float | None:
    """The value of a (broadcast) captured scalar constant; its broadcasts join ``path``."""
    walked: list[Eqn] = []
    while (e := g.anywhere.get(v)) is not None and e.prim == "Broadcast":
        if v in g.prod:
            walked.append(e)
        v = e.ins[0]
    c = consts.get(v)
    if not isinstance(c, mx.array) or c.size != 1:
        return None
    path.extend(walked)
    value = c.astype(mx.float32).item()
    return value if isinstance(value, float) else None


def _match(
    sm: Eqn, g: SegmentGraph, consts: Mapping[str, Any], shape_of: Mapping[str, tuple[int, ...]]
) -> AttentionMatch | None:
    sel = g.eqn(sm.ins[0], "Select")
    if sel is None or len(sm.outs) != 1:
        return None
    cond, scores, fill = sel.ins
    path: list[Eqn] = [sm, sel]
    low = _scalar(fill, g, consts, path)
    dt = g.dtype.get(scores)
    if low is None or dt not in ("bf16", "f16", "f32"):
        return None
    if low != float(mx.finfo({"bf16": mx.bfloat16, "f16": mx.float16, "f32": mx.float32}[dt]).min):
        return None
    m1 = g.eqn(scores, "Matmul")
    if m1 is None or len(m1.ins) != 2:
        return None
    path.append(m1)
    # q side: [Unflatten | Reshape] <- Multiply(q, scale)
    qg = through(g, m1.ins[0], ("Unflatten", "Reshape"), path)
    mul = g.eqn(qg, "Multiply")
    if mul is None:
        return None
    path.append(mul)
    scale, q = None, None
    for a, b in ((0, 1), (1, 0)):
        s = _scalar(mul.ins[a], g, consts, path)
        if s is not None:
            scale, q = s, mul.ins[b]
            break
    if scale is None or q is None:
        return None
    qs = shape_of.get(q)
    if qs is None or len(qs) != 4:
        return None
    bsz, hq, lq, d = qs
    # k side: [Broadcast] <- Transpose(last two) <- [ExpandDims]
    kt = through(g, m1.ins[1], ("Broadcast",), path)
    tr = g.eqn(kt, "Transpose")
    if tr is None:
        return None
    perm = list(tr.args[0])
    n = len(perm)
    if perm != [*range(n - 2), n - 1, n - 2]:
        return None
    path.append(tr)
    k = through(g, tr.ins[0], ("ExpandDims",), path)
    ks = shape_of.get(k)
    if ks is None or len(ks) != 4 or ks[0] != bsz or ks[3] != d:
        return None
    hkv, cap = ks[1], ks[2]
    if hkv == 0 or hq % hkv != 0:
        return None
    rep = hq // hkv
    grouped = (bsz, hkv, rep, lq, cap) if rep > 1 else (bsz, hq, lq, cap)
    if g.shape.get(scores) != grouped or n != len(grouped):
        return None
    if rep > 1 and g.shape.get(qg) != qs:  # the group split is a reshape of q itself
        return None
    # softmax -> the value matmul, its only reader
    (p,) = (o.name for o in sm.outs)
    m2 = only_reader(p, g)
    if m2 is None or m2.prim != "Matmul" or m2.ins[0] != p:
        return None
    path.append(m2)
    v = through(g, m2.ins[1], ("Broadcast", "ExpandDims"), path)
    if shape_of.get(v) != ks or g.dtype.get(scores) != g.dtype.get(m2.outs[0].name):
        return None
    out_eqn = m2
    if rep > 1:
        fl = only_reader(m2.outs[0].name, g)
        if fl is None or fl.prim not in ("Flatten", "Reshape") or fl.outs[0].shape != qs:
            return None
        out_eqn = fl
        path.append(fl)
    elif m2.outs[0].shape != qs:
        return None
    # the mask: back through the broadcasts and reshapes the fallback adds
    # the mask: back through the broadcasts and reshapes the fallback adds, to where the
    # segment reads it (``mv``), then on through the whole graph to the mask as made
    # (``origin``): every axis before its last two must be a broadcast
    mask_prims = ("Unflatten", "Reshape", "Broadcast", "ExpandDims")
    mpath: list[Eqn] = []
    mv = through(g, cond, mask_prims, mpath)
    origin = mv
    while (e := g.anywhere.get(origin)) is not None and e.prim in mask_prims:
        origin = e.ins[0]
    ms, seen = shape_of.get(origin), shape_of.get(mv)
    if ms is None or seen is None or len(ms) < 1 or ms[-1] != cap or any(x != 1 for x in ms[:-2]):
        return None
    if (len(ms) >= 2 and ms[-2] not in (1, lq)) or seen[-1] != cap:
        return None
    made = g.anywhere.get(origin)
    if made is not None and next(o.dtype for o in made.outs if o.name == origin) != "bool":
        return None
    if hq // hkv * lq > MAX_ROWS or d > MAX_HEAD_DIM:
        return None
    # the scores, their mask and probabilities must have no other reader
    for e in (sel, m1, sm):
        if any(g.uses[o.name] != 1 for o in e.outs):
            return None
    path.extend(mpath)
    return AttentionMatch(
        q, k, v, mv, scale, out_eqn.outs[0].name, out_eqn.id, skippable(path, out_eqn, g, (q, k, v, mv))
    )


def find_attention(
    eqns: Sequence[Eqn],
    keep: Sequence[str],
    consts: Mapping[str, Any],
    shape_of: Mapping[str, tuple[int, ...]],
    context: Sequence[Eqn] = (),
) -> list[AttentionMatch]:
    """Every decomposed masked attention in ``eqns`` (a segment's equations, in order)
    whose intermediate values nothing else reads; ``keep`` are the segment's outputs,
    ``consts`` the captured constants' values, ``shape_of`` every var's shape (inputs
    included), ``context`` the whole graph's equations (where a segment's inputs were
    made: a mask or a broadcast scalar shared by every layer comes from the first)."""
    g = SegmentGraph(eqns, keep, context)
    found: list[AttentionMatch] = []
    taken: set[int] = set()
    for e in eqns:
        if e.prim != "Softmax":
            continue
        m = _match(e, g, consts, shape_of)
        if m is None or m.skip & taken:
            continue
        taken |= m.skip
        found.append(m)
    return found


def rows_mask(mask: mx.array) -> mx.array:
    """The ``(rows, keys)`` mask a matched attention's mask stands for: a broadcast of one
    such mask over batch and heads (``find_attention`` checks it), its first copy."""
    return mask.reshape(-1, *mask.shape[-2:])[0] if mask.ndim > 2 else mask


def reference_attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array, scale: float) -> mx.array:
    """What the kernel computes, in MLX ops (float32 throughout, one rounding at the end):
    the tests' stand-in for the kernel on a machine without CUDA. A row whose mask hides
    every key gets the mean of the values, as the fallback's softmax over equal scores."""
    b, hq, lq, d = q.shape
    hkv, cap = k.shape[1], k.shape[2]
    rep = hq // hkv
    qf = (q.astype(mx.float32) * scale).reshape(b, hkv, rep * lq, d)
    s = qf @ k.astype(mx.float32).swapaxes(-1, -2)  # (b, hkv, rep*lq, cap)
    m2 = mask.reshape(-1, cap)
    rows = mx.broadcast_to(m2, (lq, cap)) if m2.shape[0] == 1 else m2
    rows = mx.broadcast_to(rows[None, None, None], (b, hkv, rep, lq, cap)).reshape(b, hkv, rep * lq, cap)
    none = ~mx.any(rows, axis=-1, keepdims=True)
    # a row that hides every key: equal scores (MLX's fallback masks with the dtype's
    # lowest value, not -inf), so equal weights
    s = mx.where(none, 0.0, mx.where(rows, s, -mx.inf))
    p = mx.softmax(s, axis=-1)
    o = p @ v.astype(mx.float32)
    return o.reshape(b, hq, lq, d).astype(q.dtype)


Kernel = Callable[[mx.array, mx.array, mx.array, mx.array, float], mx.array]
ATTENTION = ("auto", "on", "off")

# what a KV buffer passes through between the cache's write and the fallback's operand
_VIEWS = ("Transpose", "Reshape", "Broadcast", "ExpandDims", "Unflatten", "Flatten", "Squeeze", "Copy")
# MLX 0.32's CUDA ``supports_sdpa_vector``: eager's fused kernel for a few query tokens
_VECTOR_HEAD_DIMS = (64, 96, 128)
_VECTOR_MAX_QUERY = 4


def eager_fuses(m: AttentionMatch, shapes: Mapping[str, tuple[int, ...]], producers: Mapping[str, Eqn]) -> bool:
    """Whether this attention is a dynamic KV cache's, where eager MLX would have run a
    fused kernel: its keys and values come from a ``DynamicSliceUpdate`` (segc's cache
    write; eager writes with a host offset and reads the live keys), and eager's CUDA
    SDPA takes such an attention whole (MLX 0.32's ``supports_sdpa_vector``: head
    dimensions 64, 96 or 128, fewer than 4 query tokens, no array mask). Elsewhere
    eager itself computes the fallback, and keeping it keeps eager's bits."""

    def written(v: str) -> bool:
        while (e := producers.get(v)) is not None and e.prim in _VIEWS:
            v = e.ins[0]
        return e is not None and e.prim == "DynamicSliceUpdate"

    q, vv = shapes.get(m.q), shapes.get(m.v)
    if q is None or vv is None or len(q) != 4:
        return False
    shape_ok = q[-1] == vv[-1] and q[-1] in _VECTOR_HEAD_DIMS and q[2] < _VECTOR_MAX_QUERY
    return shape_ok and written(m.k) and written(m.v)


def only_where_eager_fuses(kernel: Kernel) -> Kernel:
    """``kernel``, marked for :func:`eager_fuses` (``"auto"``)."""

    def auto(q: mx.array, k: mx.array, v: mx.array, mask: mx.array, scale: float) -> mx.array:
        return kernel(q, k, v, mask, scale)

    auto.where_eager_fuses = True  # type: ignore[attr-defined]
    auto.kernel = kernel  # type: ignore[attr-defined]
    return auto


def attention_kernel(setting: str | Kernel = "auto") -> Kernel | None:
    """The fused kernel segments lower their masked decode attention to, or None (keep
    MLX's decomposition). ``"auto"``: the CUDA kernel where the default device is a CUDA
    GPU, for the attentions where eager would have run a fused kernel
    (:func:`eager_fuses`; on the H200 a decode step of the reference llama takes 12%
    less time with it, docs/performance.md), unless the environment sets
    ``SEGC_FUSED_ATTENTION=0``; never on the CPU, where the decomposition is eager MLX's
    own computation and keeps its bits.
    ``"on"`` asks for it (a CUDA GPU or a UsageError), ``"off"`` never uses it. A callable
    ``(q, k, v, mask, scale) -> out`` is used as the kernel (tests, research)."""
    if callable(setting):
        return setting
    if setting not in ATTENTION:
        raise UsageError(f"attention must be one of {ATTENTION}, not {setting!r}")
    cuda = on_cuda()
    if setting == "auto":
        off = env_choice("SEGC_FUSED_ATTENTION", ("1", "0"), "1") == "0"  # a bad value refused on any device
        if not cuda or off:
            return None
        from .cuda_attention import attention_kernels, cuda_attention

        attention_kernels()  # a bad SEGC_ATTENTION_KERNELS is refused when segments are built
        return only_where_eager_fuses(cuda_attention)
    if setting == "off":
        return None
    if not cuda:
        raise UsageError("attention='on' needs MLX's CUDA backend and a GPU default device")
    from .cuda_attention import attention_kernels, cuda_attention

    attention_kernels()
    return cuda_attention
