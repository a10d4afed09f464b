"""The cost model's fusion groups on a machine that runs segc's product kernels: each
one-row product with the norm before it and the residual addition or gated activation
after it (``segc.lower.product_match``) is one kernel there, so one group; so is each
rotated KV write with its queries' rotation (``segc.lower.kvwrite``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Eqn, Graph
from ..lower.kvwrite import find_fused
from .analysis import is_view


def with_products(g: Graph, os_: Sequence[Eqn], groups: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """``groups`` (lists of ``os_`` positions) with each product pattern and each rotated
    KV write segc's CUDA lowering makes one kernel (``product_match.find_products``,
    ``kvwrite.find_kv_writes``, over the whole graph) merged into one group, with the
    groups it overlaps."""
    vs = g.vars()
    avals = {n: (v.shape, v.dtype) for n, v in vs.items()}
    at = {e.id: k for k, e in enumerate(os_)}
    parent = list(range(len(os_)))  # union-find over positions

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def join(ks: Sequence[int]) -> None:
        for k in ks[1:]:
            parent[root(k)] = root(ks[0])

    for grp in groups:
        join(list(grp))
    grouped = {k for grp in groups for k in grp}
    products, writes = find_fused(g.eqns, g.outputs, avals, g.eqns)
    for skip in [m.skip for m in products] + [w.skip for w in writes]:
        ks = [at[i] for i in sorted(skip) if i in at and not is_view(os_[at[i]])]  # views launch nothing
        join(ks)
        grouped.update(ks)
    merged: dict[int, list[int]] = {}
    for k in sorted(grouped):
        merged.setdefault(root(k), []).append(k)
    return [tuple(ks) for ks in merged.values()]
