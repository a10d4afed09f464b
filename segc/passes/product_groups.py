"""The cost model's fusion groups on a machine that runs segc's CUDA kernels
(``segc.lower.fused``, with segc's defaults there): each one-row product with the norm
before it and the residual addition or gated activation after it is one kernel, so one
group; so is each decode attention where eager would have fused it, each rotated KV
write with its queries' rotation, and each such write with the attention that reads it
(two groups where the attention is MLX's over the live keys, ``lower/live.py``).

The patterns are found segment by segment, as the lowering finds them (``lower.replay``):
a cut inside one leaves each side to MLX's own kernels, and a value a later segment
reads keeps the kernel that would have consumed it from matching."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..ir import Eqn, Graph, segments
from ..lower.fused import cuda_defaults, find_all
from .analysis import Liveness, is_view


def with_products(
    g: Graph, os_: Sequence[Eqn], groups: Sequence[Sequence[int]], lv: Liveness, live: list[int] | None = None
) -> list[tuple[int, ...]]:
    """``groups`` (lists of ``os_`` positions) with each pattern segc's CUDA lowering makes
    one kernel (``fused.find_all`` over each segment) merged into one group, with the
    groups it overlaps. A view that aliases its input launches nothing and joins no group
    (a weight's transpose read by two products would join them); one that copies (a
    reshape of a broadcast mask, by ``lv``) is a kernel the pattern's kernel replaces.
    ``live``, if given, gets the position of each live attention's last equation (where
    the runtime may commit inside a segment: ``lower.live_commits``), in order."""
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
    consts = {c.var.name: c.value for c in g.consts}

    def aliases(e: Eqn) -> bool:
        return is_view(e) and bool(e.outs) and lv.root[e.outs[0].name] != e.outs[0].name

    for s in segments(g):
        found = find_all(s.eqns(g), s.outputs, consts, avals, g.eqns, **cuda_defaults())
        for kernel in found.kernels(launched=True):
            ks = [at[i] for i in sorted(kernel) if i in at and not aliases(os_[at[i]])]
            join(ks)
            grouped.update(ks)
        if live is not None:
            live += sorted(max(at[i] for i in m.skip if i in at) for _, m in found.live)
    merged: dict[int, list[int]] = {}
    for k in sorted(grouped):
        merged.setdefault(root(k), []).append(k)
    return [tuple(ks) for ks in merged.values()]


def lowering_kernels(g: Graph, os_: Sequence[Eqn], flags: Mapping[str, bool] | None = None) -> list[tuple[int, ...]]:
    """The ``os_`` positions of each kernel segc's lowering makes of several equations
    when the graph runs uncut (``fused.find_all`` over all of it, with ``flags``: by
    default the CUDA lowering's), and of each set of products that share one norm: the
    spans a cut must not split for the lowering to find the same kernels as the
    unsegmented graph (``legalize``)."""
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    consts = {c.var.name: c.value for c in g.consts}
    at = {e.id: k for k, e in enumerate(os_)}
    fused = find_all(os_, g.outputs, consts, avals, g.eqns, **(cuda_defaults() if flags is None else flags))
    found = fused.kernels()
    # products that share one norm (q, k and v not concatenated: each kernel normalises
    # the row itself, the norm's equations skipped with the first) are found only
    # together: a cut among them leaves the norm and the products to MLX's kernels
    families: dict[tuple[str, str], list[frozenset[int]]] = {}
    for p in fused.products:
        if p.kind == "gemv" and p.eps is not None:
            families.setdefault((p.ins[0], p.ins[-1]), []).append(p.skip)
    found += [frozenset().union(*fam) for fam in families.values() if len(fam) > 1]
    return [ks for kernel in found if len(ks := tuple(sorted(at[i] for i in kernel if i in at))) > 1]
