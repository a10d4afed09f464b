"""A decode layer as one kernel: the finder.

With chains (``product_chain.py``) a llama layer's decode step is two of segc's kernels:
the rotated KV write with the attention that reads it (a pair, ``fused._pairs``), then
the chain, whose first product reads the attention's output through views. Where they
are in one segment the two become one kernel (``cuda_layer.py``): the attention a first
stage, whose row the chain's output product reads. A layer is a :class:`ProductMatch`
of kind ``"layer"``: the chain's fields, its ``pair`` and the inputs of both.

Taken where the attention is of one query row (a decode step: its output ``(1, H, 1,
D)`` has the layout of the row the product reads), the views from it to that row keep
its layout (reshapes, and transposes that move axes of size 1 only), each value on the
way read once and no segment output, the chain's dtype, a block's shared memory
holding the chain's rows, the attention's row and its queries and scores (within
``product_chain.SHARED_MAX``), and nothing but the kernel reads the new key and value
buffers before the chain's last equation (where the kernel runs). ``CHAIN_ATTENTION``
(``True``) and the environment's ``SEGC_CHAIN_ATTENTION`` (``0``: a chain stays after
its pair) choose, where chains are made at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..errors import UsageError
from ..ir import Eqn
from .attention import reference_attention
from .kvwrite import reference_kv_write
from .pattern import SegmentGraph, views_to
from .product_chain import SHARED_MAX, shared_elems
from .product_match import ProductMatch, layer_parts
from .products import chained

# whether a chain takes the attention before it (the environment's SEGC_CHAIN_ATTENTION=0
# says no). Read when a graph is lowered.
CHAIN_ATTENTION = True
_VIEWS = ("Flatten", "Reshape", "Unflatten", "Transpose")
CHUNK = 32  # keys a block of the attention scores (``cuda_attention.CHUNK``: that module needs CUDA's MLX)


def attention_wanted() -> bool:
    """Whether a chain takes its layer's attention: :data:`CHAIN_ATTENTION`, unless the
    environment's ``SEGC_CHAIN_ATTENTION`` is ``0`` (``1`` asks for it)."""
    given = os.environ.get("SEGC_CHAIN_ATTENTION", "").strip()
    if given not in ("", "0", "1"):
        raise UsageError(f"SEGC_CHAIN_ATTENTION must be 1 or 0, not {given!r}")
    return given == "1" if given else CHAIN_ATTENTION


def _keeps_layout(e: Eqn, g: SegmentGraph) -> bool:
    """A view whose output has its input's bytes in order: a reshape, or a transpose
    that moves only axes of size 1."""
    if e.prim != "Transpose":
        return True
    shape = g.shape.get(e.ins[0])
    if shape is None:
        return False
    moved = [p for p in e.args[0] if shape[p] != 1]
    return moved == sorted(moved)


def chain_layers(
    prods: Sequence[ProductMatch],
    pairs: Sequence[tuple[Any, Any]],
    eqns: Sequence[Eqn],
    keep: Sequence[str],
    avals: Mapping[str, tuple],
    context: Sequence[Eqn] = (),
) -> tuple[list[ProductMatch], list[tuple[Any, Any]]]:
    """``prods`` with each chain whose row is a pair's attention (through views) replaced
    by a layer, and the pairs that are left (module docstring)."""
    g = SegmentGraph(eqns, keep, context)
    rows = {p.ins[0]: p for p in prods if p.kind == "chain"}
    layers: dict[int, ProductMatch] = {}
    left = []
    for w, m in pairs:
        made = _layer(g, w, m, rows, avals)
        if made is None or id(made[0]) in layers:
            left.append((w, m))
        else:
            layers[id(made[0])] = made[1]
    return [layers.get(id(p), p) for p in prods], left


def _layer(
    g: SegmentGraph,
    w: Any,
    m: Any,
    rows: Mapping[str, ProductMatch],
    avals: Mapping[str, tuple],
) -> tuple[ProductMatch, ProductMatch] | None:
    """The chain reading the attention of the pair ``(w, m)`` and the layer they make,
    or None (module docstring). A segment output is used more than once (``g.uses``)."""
    row, views = views_to(g, m.out, rows, lambda e: e.prim in _VIEWS and _keeps_layout(e, g))
    ch = rows.get(row)
    q = avals.get(w.ins[5], ((), None))[0]  # the queries, before their rotation
    if ch is None or len(q) != 4 or q[0] != 1 or q[2] != 1 or g.uses.get(row) != 1:
        return None
    dt = avals.get(m.out, ((), None))[1]
    if dt is None or dt != avals.get(ch.out, ((), None))[1]:
        return None
    kv = avals.get(w.ins[0], ((), None))[0]  # the key buffer: (1, KV heads, capacity, head size)
    if len(kv) != 4 or q[1] % max(kv[1], 1):
        return None
    size, rep = dtypes.itemsize(dt), q[1] // kv[1]
    shared = (
        max(shared_elems(ch.parts[0].n, ch.parts[1].n, size), q[1] * q[3]) * size + 4 * rep * (q[3] + CHUNK) + CHUNK
    )
    if shared > SHARED_MAX:  # the chain's rows, the attention's row, its scores and queries (floats), its mask
        return None
    skip = ch.skip | w.skip | m.skip | {e.id for e in views}
    late = g.pos[ch.last]  # where the kernel runs: nothing else may read the new buffers before
    if any(e.id not in skip and g.pos[e.id] < late for v in w.outs[:2] for e in g.readers.get(v, [])):
        return None
    return ch, replace(ch, kind="layer", ins=(*w.ins, m.mask, *ch.ins[1:]), skip=frozenset(skip), pair=(w, m))


def reference_layer(m: ProductMatch, ins: Sequence[mx.array]) -> list[mx.array]:
    """What a layer's kernel computes, by references (the tests' stand-in for it without
    CUDA): its write and attention (``kvwrite.reference_kv_write``,
    ``attention.reference_attention``), then its chain over the attention's output as a
    row (``products.chained``): ``[new key buffer, new value buffer, the chain's outputs]``."""
    w, att, chain, write, (mask, *rest) = layer_parts(m, ins)
    ko, vo, qr = reference_kv_write(w, write)
    o = reference_attention(qr, ko, vo, mask, att.scale)
    out = chained(chain, [o.reshape(1, -1), *rest])
    return [ko, vo, *(out if isinstance(out, list) else [out])]
