"""A llama layer's MLP, from the attention's output product on, as one kernel: the finder.

Three of ``products.py``'s matches follow each other in every layer of a llama decode
step: ``h = r + o @ Wo.T`` (``add``), ``a = silu(norm(h) @ Wg.T) * (norm(h) @ Wu.T)``
(``glu`` with its norm), ``out = h + a @ Wd.T`` (``add``). Each is one kernel; each
kernel is host work for MLX at every call (building, encoding, a node of the commit's
CUDA graph), and a decode step on the H200 is bound by that host work
(docs/performance.md). The three become one kernel (``cuda_chain.py``) whose stages
hand ``h`` and ``a`` to each other through device memory, each row computed by the
same code as the three kernels: the same bits. A chain is a :class:`ProductMatch` of
kind ``"chain"`` whose ``parts`` are the three matches.

**The next product too.** What the chain writes (the layer's output) is normalised and
multiplied next: by the next layer's query, key and value weights (one product where
they are concatenated), or by the output head after the final norm. Where that normed
``gemv`` is in the same segment, it is the chain's fourth part, a fourth stage of the
kernel, which defines both values (``ProductMatch.outs``): one kernel fewer again, and
two a layer where every layer's is taken. The cuts then fall after it (a cut inside a
kernel is not legal, ``passes/legalize.py``), so a layer's segment starts at its
attention. Taken where it is the only normed product of the chain's output (q, k and
v not concatenated: three products share the norm, and none is taken) and every other
reader of the chain's output comes after it. ``CHAIN_NEXT`` (``True``) and the
environment's ``SEGC_CHAIN_NEXT`` (``0`` keeps three parts) choose.

Taken where ``h`` is read by the norm and the last addition alone, ``a`` by the down
product alone (through views that keep its bytes), none of them a segment output, over
plain weights of one floating dtype, and where a block's shared memory holds the two
rows it keeps (``SHARED_MAX``). ``CHAIN_PRODUCTS`` (``"never"``, the default, or
``"auto"``) and the environment's ``SEGC_CHAIN_PRODUCTS`` (``1`` on, ``0`` off) choose;
with the product kernels off there is no chain. Off by default: on the one H200 that
ran it, its first version took 0.2 ms of host time off a decode step of the reference
llama but added more device time than that (docs/lowering.md); the kernel changed
since, unmeasured.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from .. import dtypes
from ..errors import UsageError
from ..ir import Eqn
from .pattern import SegmentGraph, views_to
from .product_match import ProductMatch

# "never" (the default: not yet measured faster) or "auto": chain the products where
# the product kernels are taken. The environment's SEGC_CHAIN_PRODUCTS (1 or 0) decides
# over it. Read when a graph is lowered.
CHAIN_PRODUCTS = "never"
# whether a chain takes the normed product of what it writes as a fourth part (the
# environment's SEGC_CHAIN_NEXT=0 says no). Read when a graph is lowered.
CHAIN_NEXT = True
# bytes of shared memory a block may keep rows in (below the 48 KiB of a static
# allocation, with room for the norm's and the tickets' few words)
SHARED_MAX = 40 * 1024
_VIEWS = ("Flatten", "Reshape", "Unflatten")


def chains_wanted(setting: str | None = None) -> bool:
    """Whether chains are made where the product kernels are: the environment's
    ``SEGC_CHAIN_PRODUCTS`` (``1``, ``0``) where set, else ``setting`` (default
    :data:`CHAIN_PRODUCTS`)."""
    setting = CHAIN_PRODUCTS if setting is None else setting
    if setting not in ("auto", "never"):
        raise UsageError(f"CHAIN_PRODUCTS must be 'auto' or 'never', not {setting!r}")
    given = os.environ.get("SEGC_CHAIN_PRODUCTS", "").strip()
    if given not in ("", "0", "1"):
        raise UsageError(f"SEGC_CHAIN_PRODUCTS must be 1 or 0, not {given!r}")
    return given == "1" if given else setting == "auto"


def next_wanted() -> bool:
    """Whether a chain takes a fourth part: :data:`CHAIN_NEXT`, unless the environment's
    ``SEGC_CHAIN_NEXT`` is ``0`` (``1`` asks for it)."""
    given = os.environ.get("SEGC_CHAIN_NEXT", "").strip()
    if given not in ("", "0", "1"):
        raise UsageError(f"SEGC_CHAIN_NEXT must be 1 or 0, not {given!r}")
    return given == "1" if given else CHAIN_NEXT


def aligned(n: int, itemsize: int) -> int:
    """``n`` values rounded up to a multiple of 16 bytes: where a row after ``n``
    values starts 16-byte aligned (as MLX's vector loads and ``gemv`` check)."""
    step = max(1, 16 // itemsize)
    return -(-n // step) * step


def shared_elems(hidden: int, inner: int, itemsize: int) -> int:
    """Elements of the block's shared row buffer: the normalised row and ``h`` (the
    norm's stage, the normalised row first and 16-byte aligned), or the activation (the
    down product's)."""
    return max(aligned(hidden, itemsize) + hidden, inner)


def _row_of(g: SegmentGraph, out: str, x: str) -> list[Eqn] | None:
    """The views from ``out`` to ``x`` (each value on the way, ``x`` too, read once: by
    the next view, ``x`` by the down product), or None."""
    end, walked = views_to(g, out, (x,), lambda e: e.prim in _VIEWS)
    return walked if end == x and g.uses[x] == 1 else None


def chain_products(
    found: Sequence[ProductMatch], eqns: Sequence[Eqn], keep: Sequence[str], context: Sequence[Eqn] = ()
) -> list[ProductMatch]:
    """``found`` (``find_products``' matches in ``eqns``) with each ``add``, normed
    ``glu``, ``add`` that form a layer's MLP replaced by one chain (module docstring)."""
    g = SegmentGraph(eqns, keep, context)
    by_row: dict[str, ProductMatch] = {m.ins[0]: m for m in found if m.kind == "glu" and m.eps is not None}
    adds = [m for m in found if m.kind == "add" and m.eps is None and m.quant is None]
    by_addend = {m.ins[-1]: m for m in adds}
    out: list[ProductMatch] = []
    taken: set[int] = set()
    nxt = next_wanted()
    for a in adds:
        b = by_row.get(a.out)
        c = by_addend.get(a.out)
        if b is None or c is None or b.quant is not None or {id(a), id(b), id(c)} & taken:
            continue
        views = _row_of(g, b.out, c.ins[0])
        if views is None:
            continue
        hidden, inner, dt = a.n, b.n, g.dtype.get(a.out)
        if c.n != hidden or dt is None or g.dtype.get(c.out) != dt or g.dtype.get(b.out) != dt:
            continue
        h_readers = {e.id for e in g.readers.get(a.out, [])}
        if a.out in keep or b.out in keep or g.uses[a.out] != 2 or h_readers - (b.skip | {c.last}):
            continue
        if shared_elems(hidden, inner, dtypes.itemsize(dt)) * dtypes.itemsize(dt) > SHARED_MAX:
            continue
        ins = (*a.ins, *b.ins[1:], c.ins[1])  # o, Wo, r, the gate's and up's weights, the norm's, Wd
        skip = a.skip | b.skip | c.skip | {e.id for e in views}
        chain = ProductMatch("chain", ins, b.rows, inner, (*a.order, *b.order, *c.order), c.out, c.shape, c.last, skip)
        d = _next(g, found, c, dt, taken) if nxt else None
        if d is None:
            chain = replace(chain, eps=b.eps, parts=(a, b, c))
        else:
            chain = replace(
                chain, ins=(*ins, *d.ins[1:]), last=d.last, skip=skip | d.skip, eps=b.eps, parts=(a, b, c, d)
            )
            taken.add(id(d))
        out.append(chain)
        taken |= {id(a), id(b), id(c)}
    return [m for m in found if id(m) not in taken] + out


def _next(
    g: SegmentGraph, found: Sequence[ProductMatch], c: ProductMatch, dt: str, taken: set[int]
) -> ProductMatch | None:
    """The normed ``gemv`` of ``c``'s output that a chain ending in ``c`` takes as its
    fourth part (module docstring), or None. Order is each equation's place in the
    segment (``g.pos``: the replay's order; ids are not, a concatenated product's is new)."""
    normed = [m for m in found if m.eps is not None and m.ins[0] == c.out]
    if len(normed) != 1:  # none, or several sharing the norm (each normalises the row itself)
        return None
    (d,) = normed
    if d.kind != "gemv" or d.quant is not None or id(d) in taken or g.dtype.get(d.out) != dt:
        return None
    at = g.pos[d.last]
    if any(e.id not in d.skip and g.pos[e.id] < at for e in g.readers.get(c.out, [])):
        return None  # read before the kernel (at d's last equation) has defined it
    return d
