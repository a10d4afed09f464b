"""The finder of ``products.py``: a segment's one-row products and their neighbours,
by primitive and shape (see that module for what is matched and why)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import dtypes
from ..ir import Eqn
from .attention import rows_mask
from .gather_match import gathered, match_moe
from .pattern import SegmentGraph, only_reader, skippable, through
from .prim import lookup

DTYPES = ("bf16", "f16", "f32")
# MLX 0.32's CUDA quantized product takes its ``qmv`` kernel for one row of an affine
# quantization of these bits and group sizes (``dispatch_quant_types``), a row length
# divisible by 8 (``supports_qmv``) and at most QMV_MAX rows and row length (beyond, on
# a Hopper GPU, its ``qmm_sm90``)
QBITS = (2, 3, 4, 5, 6, 8)
QGROUPS = (32, 64, 128)
QMV_MAX = 16384


@dataclass(frozen=True)
class ProductMatch:
    """One product and what follows it. ``ins`` are the values the kernel reads:
    ``add``: (row, weight, addend); ``glu``: (row, gate weight[, up weight]), the gate
    weight read twice when one concatenated weight holds both; ``gemv``: (row, weight);
    with ``eps`` (a norm before the product) the row is the norm's input and the norm's
    weight comes last; with ``quant`` ((group size, bits) of an affine quantization),
    each weight is three values: the packed weight, its scales, its biases. ``rows`` is
    the first weight row of each part (``add``: one; ``glu``: gate, up) and ``n`` the rows a part
    has; a ``chain`` (``product_chain.py``) is an ``add``, a normed ``glu`` and an ``add``
    as one kernel, its ``parts`` (and a normed ``gemv`` of what the chain writes, a fourth);
    a ``layer`` (``layer_chain.py``) is a chain with the rotated KV write and the
    attention before it (``pair``), its row the attention's output; ``order`` the recorded operand orders (``add``: the product first;
    ``glu``: ``g`` first in ``g * sigmoid(g)``, that product first in its product with
    ``u``). Gathered (``gather_match.py``): ``gglu`` is ``glu`` over the experts'
    weights ``(E, N, K)`` with their indices last; ``gmoe``: (slots' rows, down weights,
    scores, addend, indices), ``order`` (a slot's product first in its product with
    the score, the addend first). ``out`` (of ``shape``) is what the last equation
    (``last``) defines; ``skip`` the equations the kernel replaces."""

    kind: str
    ins: tuple[str, ...]
    rows: tuple[int, ...]
    n: int
    order: tuple[bool, ...]
    out: str
    shape: tuple[int, ...]
    last: int
    skip: frozenset[int]
    eps: float | None = None
    quant: tuple[int, int] | None = None
    parts: tuple[ProductMatch, ...] = ()
    pair: tuple[Any, Any] | None = None  # a layer's rotated write and attention (``layer_chain.py``)

    @property
    def outs(self) -> tuple[str, ...]:
        """What the kernel defines: ``out``, and a chain of four parts its fourth part's
        output after it (``product_chain.py``); a layer the write's new key and value
        buffers first (``layer_chain.py``)."""
        chain = (self.out, self.parts[3].out) if len(self.parts) == 4 else (self.out,)
        return chain if self.pair is None else (*self.pair[0].outs[:2], *chain)


def layer_parts(m: ProductMatch, ins: Sequence[Any]) -> tuple[Any, Any, ProductMatch, list[Any], list[Any]]:
    """A layer's (``layer_chain.py``) write, attention and chain, and ``ins`` as they take
    them: the write's inputs, then the attention's ``(rows, keys)`` mask and the chain's
    inputs after its row (the attention's output)."""
    assert m.pair is not None
    w, att = m.pair
    n = len(w.ins)
    return w, att, replace(m, kind="chain", pair=None), list(ins[:n]), [rows_mask(ins[n]), *ins[n + 1 :]]


@dataclass(frozen=True)
class _Part:
    """One part of a product: its row, its weight (one value, or three quantized), the
    first weight row and the rows it has, the quantization."""

    x: str
    ws: tuple[str, ...]
    first: int
    n: int
    quant: tuple[int, int] | None
    idx: str | None = None  # gathered (gather_match.py): the experts' indices


class _Graph(SegmentGraph):
    """A segment's graph that knows every value's shape and dtype (inputs included)."""

    def __init__(self, eqns: Sequence[Eqn], keep: Sequence[str], avals: Mapping[str, tuple], context: Sequence[Eqn]):
        super().__init__(eqns, keep, context)
        for name, (shape, dtype) in avals.items():
            self.shape.setdefault(name, tuple(shape))
            self.dtype.setdefault(name, dtype)


def _product(g: SegmentGraph, v: str, path: list[Eqn]) -> _Part | None:
    """``v`` as one part of a one-row product read by nothing else, the walked
    equations added to ``path``."""
    found: list[Eqn] = []
    v = through(g, v, ("Unflatten", "Reshape"), found)
    first, part = 0, None
    sl = g.eqn(v, "Slice")
    if sl is not None:
        start, stop, strides = sl.args[0], sl.args[1], sl.args[2]
        full = g.shape.get(sl.ins[0], ())[:-1]
        if len(start) != len(full) + 1 or any(s != 1 for s in strides):
            return None
        if any(a != 0 or b != d for a, b, d in zip(start[:-1], stop[:-1], full)):
            return None
        first, part = start[-1], stop[-1] - start[-1]
        found.append(sl)
        v = sl.ins[0]
    p = _matmul(g, v) or _qmatmul(g, v) or (_gathered(g, v) if sl is None else None)
    if p is None or not _fresh(g, p[0].x):
        return None
    path.extend([*found, *p[1]])
    return p[0] if part is None else replace(p[0], first=first, n=part)


def _matmul(g: SegmentGraph, v: str) -> tuple[_Part, list[Eqn]] | None:
    """``v = x @ W.T`` for one row ``x`` of ``(1, K)``: MLX's ``gemv``."""
    mm = g.eqn(v, "Matmul")
    if mm is None or len(mm.ins) != 2:
        return None
    x, wt = mm.ins
    tr = g.eqn(wt, "Transpose")
    xs, out = g.shape.get(x) or (), g.shape[v]
    if tr is None or list(tr.args[0]) != [1, 0] or len(xs) != 2 or xs[0] != 1 or len(out) != 2:
        return None
    w = tr.ins[0]
    kinds = {g.dtype.get(x), g.dtype.get(w), g.dtype.get(v)}
    if len(kinds) != 1 or not kinds <= set(DTYPES):
        return None
    return _Part(x, (w,), 0, out[1], None), [mm, tr]


def _gathered(g: SegmentGraph, v: str) -> tuple[_Part, list[Eqn]] | None:
    """``v`` one row's products by the experts ``idx`` picks (``gather_match.py``)."""
    found = gathered(g, v)
    if found is None:
        return None
    x, w, idx, n, eqns = found
    return _Part(x, (w,), 0, n, None, idx), eqns


def _qmatmul(g: SegmentGraph, v: str) -> tuple[_Part, list[Eqn]] | None:
    """``v = quantized_matmul(x, w, scales, biases, transpose=True)`` for one row ``x``
    (affine): MLX's ``qmv``."""
    qm = g.eqn(v, "QuantizedMatmul")
    if qm is None or len(qm.ins) != 4 or len(qm.args) < 4:
        return None
    group, bits, mode, transpose = qm.args[:4]
    x, w, sc, b = qm.ins
    xs, out = g.shape.get(x) or (), g.shape[v]
    if mode != 0 or transpose is not True or bits not in QBITS or group not in QGROUPS:
        return None
    if not xs or math.prod(xs) != xs[-1] or math.prod(out) != out[-1] or len(xs) != len(out):
        return None
    k, n = xs[-1], out[-1]
    if k % 8 or k % group or k > QMV_MAX or n > QMV_MAX or g.dtype.get(w) != "u32":
        return None
    if g.shape.get(w) != (n, k * bits // 32) or g.shape.get(sc) != (n, k // group) or g.shape.get(b) != g.shape[sc]:
        return None
    kinds = {g.dtype.get(x), g.dtype.get(sc), g.dtype.get(b), g.dtype.get(v)}
    if len(kinds) != 1 or not kinds <= set(DTYPES):
        return None
    return _Part(x, (w, sc, b), 0, n, (group, bits)), [qm]


# views that keep a buffer's start (what walks back to a fresh buffer may pass)
_SAME_START = ("Reshape", "Flatten", "Unflatten", "ExpandDims", "Squeeze", "Transpose", "Depends", "StopGradient")


def _fresh(g: SegmentGraph, v: str) -> bool:
    """Whether the row starts its own buffer: made (through views that keep the start)
    by an equation that computes or copies, or a graph input. A row that is a slice of
    another buffer may start off MLX's alignment, where MLX's matmul would copy it first
    and the kernel would not (so it would sum in another order)."""
    while (e := g.anywhere.get(v)) is not None and e.prim in _SAME_START:
        v = e.ins[0]
    return e is None or lookup(e.prim).memory in ("compute", "move")


def _fits(g: SegmentGraph, v: str, readers: int) -> bool:
    return g.uses[v] == readers and len(g.readers.get(v, [])) == readers


def _match_add(e: Eqn, g: SegmentGraph) -> ProductMatch | None:
    if len(e.ins) != 2 or len(set(e.ins)) != 2:
        return None
    shape = e.outs[0].shape
    if any(g.shape.get(v) != shape or g.dtype.get(v) != e.outs[0].dtype for v in e.ins):
        return None
    for side in (0, 1):
        y, r = e.ins[side], e.ins[1 - side]
        path: list[Eqn] = [e]
        p = _product(g, y, path)
        if p is None or p.idx is not None or p.first != 0 or p.n != shape[-1] or g.shape.get(p.ws[0], (0,))[0] != p.n:
            continue
        ins = (p.x, *p.ws, r)
        m = ProductMatch("add", ins, (0,), p.n, (side == 0,), e.outs[0].name, shape, e.id, frozenset(), None, p.quant)
        return _close(m, path, e, g)
    return None


def _match_glu(e: Eqn, g: SegmentGraph) -> ProductMatch | None:
    if len(e.ins) != 2:
        return None
    for side in (0, 1):
        gs_v, u_v = e.ins[side], e.ins[1 - side]
        inner = g.eqn(gs_v, "Multiply")
        if inner is None or len(inner.ins) != 2:
            continue
        for gside in (0, 1):
            g_v, s_v = inner.ins[gside], inner.ins[1 - gside]
            sig = g.eqn(s_v, "Sigmoid")
            if sig is None or sig.ins[0] != g_v or not _fits(g, g_v, 2) or not _fits(g, s_v, 1):
                continue
            path: list[Eqn] = [e, inner, sig]
            pg, pu = _product(g, g_v, path), _product(g, u_v, path)
            if pg is None or pu is None or (pg.x, pg.n, pg.quant, pg.idx) != (pu.x, pu.n, pu.quant, pu.idx):
                continue
            shape = e.outs[0].shape
            if g.shape.get(g_v) != shape or g.shape.get(u_v) != shape or g.dtype.get(g_v) != e.outs[0].dtype:
                continue
            ins = (pg.x, *pg.ws) if pg.ws == pu.ws else (pg.x, *pg.ws, *pu.ws)
            order = (gside == 0, side == 0)
            rows = (pg.first, pu.first)
            kind = "glu" if pg.idx is None else "gglu"
            ins = ins if pg.idx is None else (*ins, pg.idx)
            m = ProductMatch(kind, ins, rows, pg.n, order, e.outs[0].name, shape, e.id, frozenset(), None, pg.quant)
            return _close(m, path, e, g)
    return None


def _close(m: ProductMatch, path: list[Eqn], last: Eqn, g: SegmentGraph) -> ProductMatch | None:
    """``m`` with its skipped equations, if every equation but the weights' transposes
    can go (an intermediate value read elsewhere would need the product twice); with
    the norm that makes its row where that can go too."""
    skip = skippable(path, last, g, m.ins)
    core = {e.id for e in path if e.prim != "Transpose"}
    if not core <= skip:
        return None
    plain = replace(m, skip=skip)
    norm = _norm(g, m.ins[0]) if m.kind != "gglu" else None  # (the gathered kernels take no norm)
    if norm is None:
        return plain
    walked, rms = norm
    xin, nw = rms.ins
    with_norm = replace(m, ins=(xin, *m.ins[1:], nw), eps=float(rms.args[0]))
    skip2 = skippable([*path, *walked, rms], last, g, with_norm.ins)
    if not core | {e.id for e in walked} | {rms.id} <= skip2:
        return plain
    return replace(with_norm, skip=skip2)


def _norm(g: SegmentGraph, x: str) -> tuple[list[Eqn], Eqn] | None:
    """The ``RMSNorm`` making the row ``x`` (through reshapes), where a kernel can take
    it: a weight of one axis, a row MLX normalises with its ``rms_norm_small`` kernel."""
    walked: list[Eqn] = []
    rms = g.eqn(through(g, x, ("Flatten", "Reshape"), walked), "RMSNorm")
    if rms is None or len(rms.ins) != 2:
        return None
    xin, nw = rms.ins
    k = g.shape.get(xin, ())
    dt = g.dtype.get(xin)
    if not k or math.prod(k) != k[-1] or g.shape.get(nw) != (k[-1],) or g.dtype.get(nw) != dt:
        return None
    if dt not in DTYPES or norm_blocks(k[-1], dt) is None or not _fresh(g, xin):
        return None
    return walked, rms


def norm_blocks(k: int, dtype: str) -> tuple[int, int, int] | None:
    """MLX 0.32's CUDA ``RMSNorm`` launch for a row of ``k``: (threads, chunks, reads
    per chunk) of its ``rms_norm_small`` kernel (``dispatch_num_chunks``); None where MLX
    runs its other kernel (a row longer than ``reads * 1024``)."""
    reads = 16 // dtypes.itemsize(dtype)
    if k > reads * 128 * 8:
        return None
    nvec = (k + reads - 1) // reads
    if k <= reads * 64:
        return 64, 1, reads
    if nvec % 128 == 0 and nvec // 128 <= 8:
        return 128, max(1, nvec // 128), reads
    if nvec % 64 == 0 and nvec // 64 <= 8:
        return 64, max(1, nvec // 64), reads
    return 128, max(1, (nvec + 127) // 128), reads


def _match_moe(e: Eqn, g: SegmentGraph) -> ProductMatch | None:
    """A residual addition of the experts' weighted down products (``gather_match``)."""
    found = match_moe(e, g)
    if found is None:
        return None
    ins, order, n, skip = found
    return ProductMatch("gmoe", ins, (0,), n, order, e.outs[0].name, e.outs[0].shape, e.id, skip)


def _match_gemv(e: Eqn, g: SegmentGraph) -> ProductMatch | None:
    """A plain one-row product: worth a kernel of its own only with the norm before it."""
    out = e.outs[0].name
    path: list[Eqn] = []
    p = _product(g, out, path)
    if p is None or p.first != 0 or path[0] is not e or g.shape.get(p.ws[0], (0,))[0] != p.n:
        return None
    m = ProductMatch("gemv", (p.x, *p.ws), (0,), p.n, (), out, e.outs[0].shape, e.id, frozenset(), None, p.quant)
    found = _close(m, path, e, g)  # with its norm, or not at all
    return found if found is not None and found.eps is not None else None


def find_products(
    eqns: Sequence[Eqn], keep: Sequence[str], avals: Mapping[str, tuple], context: Sequence[Eqn] = ()
) -> list[ProductMatch]:
    """Every pattern in ``eqns`` (``add``, ``glu``, and ``gemv`` with its norm, over plain
    or quantized weights; ``eqns`` a segment's equations, in order; ``keep`` its
    outputs; ``avals`` every value's (shape, dtype), inputs included), none sharing an
    equation."""
    g = _Graph(eqns, keep, avals, context)
    found: list[ProductMatch] = []
    taken: set[int] = set()
    # the epilogues first (a product they take is not a plain one), then plain products
    # with their norm, then norms several plain products share
    passes = (
        {"Add": _match_add, "Multiply": _match_glu},
        {"Add": _match_moe},
        {"Matmul": _match_gemv, "QuantizedMatmul": _match_gemv},
        {"RMSNorm": _shared_norm},
    )
    for matchers in passes:
        for e in eqns:
            if e.prim not in matchers or e.id in taken:
                continue
            ms = matchers[e.prim](e, g)
            ms = [ms] if isinstance(ms, ProductMatch) else ms or []
            skip = {i for m in ms for i in m.skip}
            if ms and not skip & taken:
                taken |= skip
                found.extend(ms)
    return found


_PRODUCTS = ("Matmul", "QuantizedMatmul")


def _shared_norm(rms: Eqn, g: SegmentGraph) -> list[ProductMatch]:
    """A norm whose row only plain one-row products read (q, k and v, not
    concatenated): each product a kernel that normalises the row itself; the norm's
    equations are skipped with the first."""
    out, walked = rms.outs[0].name, []
    row = out
    while (r := only_reader(row, g)) is not None and r.prim in ("Flatten", "Reshape"):
        walked.append(r)
        row = r.outs[0].name
    readers = g.readers.get(row, [])
    if len(readers) < 2 or g.uses[row] != len(readers) or any(e.prim not in _PRODUCTS for e in readers):
        return []
    norm = _norm(g, row)
    if norm is None or norm[1] is not rms:
        return []
    xin, nw = rms.ins
    found: list[ProductMatch] = []
    for mm in readers:
        path: list[Eqn] = []
        p = _product(g, mm.outs[0].name, path)
        if p is None or p.x != row or p.first != 0 or g.shape.get(p.ws[0], (0,))[0] != p.n:
            return []
        ins = (xin, *p.ws, nw)
        skip = skippable(path, mm, g, ins)  # the product, and its transpose if only it reads it
        first = not found
        m = ProductMatch(
            "gemv", ins, (0,), p.n, (), mm.outs[0].name, mm.outs[0].shape, mm.id, frozenset(), None, p.quant
        )
        found.append(
            replace(m, skip=skip | ({rms.id, *(e.id for e in walked)} if first else set()), eps=float(rms.args[0]))
        )
    return found
