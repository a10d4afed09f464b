"""The gathered one-row products of a mixture-of-experts decode step, for
``product_match.py``: mlx-lm's ``SwitchGLU`` over one token, whose experts' products
MLX's CUDA build runs as ``gather_mv`` (``GatherMM`` of one row a slot, indices not
sorted: ``mlx/backend/cuda/matmul.cpp``), each slot the ``gemv`` of the expert's
weight (``gemv_gather`` calls ``gemv_impl``).

Two patterns, each one kernel (``cuda_gather.py``):

- ``gglu``: the gate's and up's gathered products of one row and SwiGLU between them,
  as ``glu`` is for dense weights (the same finder, ``product_match._match_glu``,
  whose parts come from :func:`gathered`);
- ``gmoe``: the down product of each slot's row, each slot's result times its score,
  the sum over the slots and the residual addition, ``r + (y * s[..., None]).sum(-2)``
  with ``y = gather_mm(h, Wd.T, idx).squeeze(-2)`` (mixtral's ``MixtralSparseMoeBlock``
  and the decoder layer's residual): :func:`match_moe`.

MLX sums the slots with its ``col_reduce_small`` kernel where the rows are a multiple of
its vector width (16 bytes) and the slots at most 32: in the dtype, from zero, in slot
order (one slot: a copy); the kernel does the same, and elsewhere (another reduction
kernel, whose warp sums in a tree) ``gmoe`` is not matched. The environment's ``SEGC_FUSED_GATHER=0`` leaves
both to MLX's kernels (read when a graph is lowered: a benchmark's A/B switch).
"""

from __future__ import annotations

import math

from ..dtypes import itemsize
from ..ir import Eqn
from ..settings import env_choice
from .pattern import SegmentGraph, skippable, through

DTYPES = ("bf16", "f16", "f32")
_INT32 = 2**31  # the kernels index a weight with int


def gathered(g: SegmentGraph, v: str, rows: bool = False) -> tuple[str, str, str, int, list[Eqn]] | None:
    """``v = gather_mm(a, W.swapaxes(-1, -2), lhs, idx)`` as MLX's ``gather_mv`` runs
    it: ``W`` of ``(E, N, K)``, ``idx`` of ``(..., k)`` slots, ``v`` of ``(..., k, 1,
    N)``; ``a`` one row for every slot, or with ``rows`` one row a slot (``(..., k, 1,
    K)``, ``lhs`` the slots' arange). Returns ``(a, W, idx, N, [equations])``."""
    mm = g.eqn(v, "GatherMM")
    if mm is None or env_choice("SEGC_FUSED_GATHER", ("0", "1"), "1") == "0":
        return None
    if len(mm.ins) != 4 or any(mm.args[:2]):  # sorted: MLX's grouped GEMM instead
        return None
    a, bt, lhs, idx = mm.ins
    tr = g.eqn(bt, "Transpose")
    if tr is None or list(tr.args[0]) != [0, 2, 1]:
        return None
    w = tr.ins[0]
    ws, xs, ix, out = g.shape.get(w, ()), g.shape.get(a, ()), g.shape.get(idx, ()), g.shape[v]
    if len(ws) != 3 or not ix or math.prod(ix[:-1]) != 1 or g.dtype.get(idx) != "u32":
        return None
    k, (e_, n, kk) = ix[-1], ws
    if out != (*ix, 1, n) or e_ * n * kk >= _INT32:
        return None
    if rows:
        if xs != (*ix, 1, kk) or not _slots(g, lhs, k):
            return None
    elif not xs or math.prod(xs) != kk or xs[-1] != kk:
        return None
    kinds = {g.dtype.get(a), g.dtype.get(w), g.dtype.get(v)}
    if len(kinds) != 1 or not kinds <= set(DTYPES):
        return None
    return a, w, idx, n, [mm, tr]


def _slots(g: SegmentGraph, lhs: str, k: int) -> bool:
    """Whether ``lhs`` is ``arange(k)`` (reshaped): slot ``j`` reads row ``j``."""
    e = g.anywhere.get(through(g, lhs, ("Reshape",), []))
    return e is not None and e.prim == "Arange" and [float(x) for x in e.args[:3]] == [0.0, float(k), 1.0]


def match_moe(e: Eqn, g: SegmentGraph) -> tuple[tuple[str, ...], tuple[bool, ...], int, frozenset[int]] | None:
    """``e`` (an ``Add``) as ``gmoe``: ``(ins, order, N, skip)``, ``ins`` being
    ``(h, Wd, scores, r, idx)`` and ``order`` (the slot's product first in its product
    with the score, the residual first in the addition)."""
    if e.prim != "Add" or len(e.ins) != 2 or len(set(e.ins)) != 2:
        return None
    shape, dt = e.outs[0].shape, e.outs[0].dtype
    for side in (0, 1):
        s_v, r = e.ins[side], e.ins[1 - side]
        if g.shape.get(r) != shape or g.dtype.get(r) != dt:
            continue
        path: list[Eqn] = [e]
        sq = g.eqn(s_v, "Squeeze")
        red = g.eqn(sq.ins[0], "Reduce") if sq is not None else None
        if sq is None or red is None or red.args[0] != 2 or len(red.args[1]) != 1:
            continue
        prod = g.eqn(red.ins[0], "Multiply")
        if prod is None or len(prod.ins) != 2:
            continue
        path += [sq, red, prod]
        for yside in (0, 1):
            found = _slot_products(g, prod.ins[yside], prod.ins[1 - yside], red.args[1][0], shape, dt)
            if found is None:
                continue
            (h, w, scores, idx, n), walked = found
            ins = (h, w, scores, r, idx)
            all_eqns = [*path, *walked]
            skip = skippable(all_eqns, e, g, ins)
            if not {x.id for x in all_eqns if x.prim != "Transpose"} <= skip:
                return None
            return ins, (yside == 0, side == 1), n, skip
    return None


def _slot_products(
    g: SegmentGraph, y_v: str, b_v: str, axis: int, shape: tuple[int, ...], dt: str
) -> tuple[tuple[str, str, str, str, int], list[Eqn]] | None:
    """``y_v`` the slots' down products (squeezed), ``b_v`` their scores broadcast along
    the rows, summed over ``axis`` into ``shape``."""
    walked: list[Eqn] = []
    sq = g.eqn(y_v, "Squeeze")
    bc = g.eqn(b_v, "Broadcast")
    ex = g.eqn(bc.ins[0], "ExpandDims") if bc is not None else None
    if sq is None or bc is None or ex is None:
        return None
    found = gathered(g, sq.ins[0], rows=True)
    if found is None:
        return None
    h, w, idx, n, eqns = found
    k = g.shape[idx][-1]
    scores = ex.ins[0]
    ys = g.shape[y_v]
    if ys != (*g.shape[idx], n) or g.shape.get(b_v) != ys or g.shape.get(scores) != g.shape[idx]:
        return None
    if axis != len(ys) - 2 or shape != (*g.shape[idx][:-1], n) or not 1 <= k <= 32 or n % (16 // itemsize(dt)):
        return None  # MLX sums the slots otherwise than its col_reduce_small (a tree, or a copy)
    if g.shape.get(bc.ins[0]) != (*g.shape[idx], 1) or g.dtype.get(scores) != dt or g.dtype.get(h) != dt:
        return None
    walked += [sq, bc, ex, *eqns]
    return (h, w, scores, idx, n), walked
