"""Analyses over a graph: FLOPs and bytes per equation, liveness, peak live bytes,
bytes crossing each boundary, and the critical path. Pure functions; nothing here
changes a graph.

Positions: ``ops(g)`` is the list of computing equations (pseudo-equations left out);
a *cut point* ``k`` (``1 <= k < len(ops)``) is the gap before ``ops[k]``.

The cost model is a roofline: an equation takes ``max(flops / F, bytes / B)`` seconds on a
:class:`Machine`. Views (reshape, broadcast, transpose, slice, ...) cost nothing: MLX
makes them without copying; but a reshape MLX cannot make a view of (of a transposed
matrix, say) copies it (``layout.py``: MLX's strides and flags for each view). A value read through a broadcast costs its source's bytes;
an elementwise output that keeps a broadcast layout writes only its data. A fused
multiply-add counts two FLOPs (``AddMM``: the product, then the scaled add). Bytes are
counted as if nothing were fused; that
overestimates elementwise chains, equally for every cut placement (fusion-aware
legalisation never splits a fused chain).

Liveness is buffer-level: a view (a broadcast of a constant, a transposed weight) owns
no memory and keeps its source alive; a buffer is freed after its last use through any
alias. The peak live bytes of a segment is its working set: the buffers it reads (graph
inputs and parameters included) plus its own buffers live at the worst point. The
whole-run peak adds, for each segment, the activations held across it for later
segments. Boundary bytes count activation buffers crossing a cut (a view of a constant
crosses for free); the run's total counts a buffer crossing several cuts once.

These are the analyses of one graph; ``segc.research`` builds a cost model that
predicts time and MLX's memory from them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir import Eqn, Graph, Segment, Var, segments
from ..lower.prim import Prim, lookup
from ..units import fmt_bytes, fmt_seconds
from .layout import Layout, dense, view_layout

# --------------------------------------------------------------------------- cost model


@dataclass(frozen=True, slots=True)
class Machine:
    """Roofline parameters. The default is an NVIDIA H200 in bf16 (docs/performance.md)."""

    name: str = "h200"
    flops_per_s: float = 790e12
    bytes_per_s: float = 4.8e12


H200 = Machine()


def _facts(e: Eqn) -> Prim:
    return lookup(e.prim)


def is_view(e: Eqn) -> bool:
    """A view or a reinterpretation: no FLOPs, no bytes moved (``Prim.memory``)."""
    return _facts(e).memory in ("view", "view_keep", "reshape")


def eqn_flops(e: Eqn, vs: dict[str, Var]) -> int:
    """Floating point operations of one equation (a fused multiply-add counts two)."""
    if e.is_pseudo:
        return 0
    p = _facts(e)
    return 0 if p.memory != "compute" else p.flops(e, vs)


def eqn_bytes(e: Eqn, vs: dict[str, Var], lv: Liveness | None = None) -> tuple[int, int]:
    """(bytes read, bytes written) of one equation, as if it ran alone.

    With the graph's :class:`Liveness` the layout is known: a reshape MLX cannot make a
    view of copies (reads and writes its bytes); a value read through a view
    costs the smaller of the view and the buffer behind it (a broadcast reads its
    source, a slice its elements); an output that keeps a broadcast layout writes only
    its data. Without it every value is dense and every view free."""
    if e.is_pseudo:
        return 0, 0
    if lv is None:
        if is_view(e):
            return 0, 0
        written = sum(o.nbytes for o in e.outs)
        if e.prim == "Gather":
            return written + sum(vs[v].nbytes for v in e.ins[1:]), written
        return sum(vs[v].nbytes for v in dict.fromkeys(e.ins)), written
    if is_view(e) and all(lv.root[o.name] != o.name for o in e.outs):
        return 0, 0  # a view that aliases its input (a reshape MLX makes a view of)
    written = sum(lv.nbytes[o.name] for o in e.outs if lv.root[o.name] == o.name)

    def read(v: str) -> int:
        r = lv.root[v]
        return min(vs[v].nbytes, lv.nbytes[r] if r in lv.defined or r not in lv.consts else vs[r].nbytes)

    if e.prim == "Gather":  # reads the gathered rows and the indices, not the table
        return written + sum(read(v) for v in e.ins[1:]), written
    return sum(read(v) for v in dict.fromkeys(e.ins)), written


def eqn_cost(e: Eqn, vs: dict[str, Var], m: Machine = H200, lv: Liveness | None = None) -> float:
    """Seconds on the roofline of ``m``."""
    r, w = eqn_bytes(e, vs, lv)
    return max(eqn_flops(e, vs) / m.flops_per_s, (r + w) / m.bytes_per_s)


@dataclass(frozen=True, slots=True)
class EqnStats:
    id: int
    prim: str
    flops: int
    read: int
    written: int
    cost: float


def eqn_stats(g: Graph, m: Machine = H200) -> list[EqnStats]:
    """One record per computing equation, in order."""
    vs = g.vars()
    lv = liveness(g)
    out = []
    for e in ops(g):
        r, w = eqn_bytes(e, vs, lv)
        out.append(EqnStats(e.id, e.prim, eqn_flops(e, vs), r, w, eqn_cost(e, vs, m, lv)))
    return out


# --------------------------------------------------------------------------- liveness


def ops(g: Graph) -> list[Eqn]:
    return [e for e in g.eqns if not e.is_pseudo]


@dataclass(frozen=True, slots=True)
class Liveness:
    """Buffer-level liveness. A view (broadcast, transpose, slice, a reshape MLX makes a
    view of, ...) owns no memory: ``root`` maps every value to the buffer it
    reads (itself for a computed value, a graph input or a constant) and a view keeps its
    root alive. ``defined``: op index of each computed buffer; ``last_use``: last op
    reading the buffer through any alias (``n`` for a graph output); ``nbytes``: bytes
    allocated for each buffer (graph inputs included, constants 0): an elementwise
    output that keeps a broadcast layout holds only its data (:func:`liveness`);
    ``consts``: the constants' names."""

    n: int
    defined: dict[str, int]
    last_use: dict[str, int]
    nbytes: dict[str, int]
    root: dict[str, str]
    consts: frozenset[str] = frozenset()


def liveness(g: Graph) -> Liveness:
    """Liveness, with MLX's layouts: a broadcast view's data is its source's; an
    elementwise equation (``Prim.fusible``) whose one input with more than one element
    of data is in a broadcast layout (the others scalars) writes its output in
    that layout, allocating only that data (MLX's ``set_unary_output_data`` and its
    scalar-vector binary case); any other output is dense."""
    os_ = ops(g)
    vs = g.vars()
    root: dict[str, str] = {}
    layout: dict[str, Layout] = {}  # each value's strides and flags, as MLX lays it out (layout.py)
    nbytes: dict[str, int] = {}
    data: dict[str, int] = {}  # elements of data behind each value
    for i in g.inputs:
        root[i.var.name], layout[i.var.name], nbytes[i.var.name] = i.var.name, dense(i.var.shape), i.var.nbytes
        data[i.var.name] = i.var.size
    for c in g.consts:
        root[c.var.name], layout[c.var.name], nbytes[c.var.name] = c.var.name, dense(c.var.shape), 0
        data[c.var.name] = c.var.size
    defined: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, e in enumerate(os_):
        for v in e.ins:
            last[root[v]] = k
        src = e.ins[0] if e.ins else None
        p = _facts(e)
        mem = p.memory
        made: Layout | None = None
        if mem in ("view", "view_keep", "reshape") and src is not None:
            made = view_layout(e, layout[src], vs[src].shape, e.outs[0].shape if e.outs else ())
        keep = None  # the one broadcast input an elementwise output keeps the layout of
        if p.fusible and mem in ("compute", "move") and e.ins:
            big = [v for v in e.ins if data[v] > 1]
            if len(big) == 1 and data[big[0]] < vs[big[0]].size:
                keep = big[0]
        for o in e.outs:
            if made is not None:
                assert src is not None
                root[o.name], layout[o.name] = root[src], made
                data[o.name] = data[src] if e.prim == "Broadcast" else min(o.size, data[src])
            else:
                root[o.name], layout[o.name], data[o.name] = o.name, dense(o.shape), o.size
                if keep is not None and o.size == vs[keep].size:  # MLX gives it its input's strides and data
                    layout[o.name] = Layout(layout[keep].strides, layout[keep].row, False)
                    data[o.name] = data[keep]
                nbytes[o.name] = data[o.name] * o.nbytes // max(o.size, 1)
                defined[o.name] = k
                last[o.name] = k
    for v in g.outputs:
        last[root[v]] = len(os_)
    return Liveness(len(os_), defined, last, nbytes, root, frozenset(c.var.name for c in g.consts))


def crossing_bytes(g: Graph, live: Liveness | None = None) -> list[int]:
    """``out[k]``: bytes of activation buffers (computed by the graph, not its inputs or
    constants) that a cut at point ``k`` would carry from before it to after it."""
    lv = live or liveness(g)
    diff = [0] * (lv.n + 2)
    for v, d in lv.defined.items():
        u = lv.last_use[v]
        if u > d:  # crosses points d+1 .. u
            diff[d + 1] += lv.nbytes[v]
            diff[min(u, lv.n) + 1] -= lv.nbytes[v]
    out, acc = [], 0
    for k in range(lv.n + 1):
        acc += diff[k]
        out.append(acc)
    return out


def span_peak(g: Graph, a: int, b: int, live: Liveness | None = None, os_: Sequence[Eqn] | None = None) -> int:
    """Peak live bytes of ops ``[a, b)`` run as one segment: the buffers it reads from
    outside (graph inputs included, constants not) plus its own buffers live at the
    worst point."""
    lv = live or liveness(g)
    os_ = os_ if os_ is not None else ops(g)
    outside = 0
    seen: set[str] = set()
    for e in os_[a:b]:
        for v in e.ins:
            r = lv.root[v]
            if r not in seen and not (a <= lv.defined.get(r, -1) < b):
                seen.add(r)
                outside += lv.nbytes[r]
    cur = peak = 0
    frees: dict[int, int] = {}
    for k in range(a, b):
        for o in os_[k].outs:
            if lv.defined.get(o.name) != k:
                continue  # a view: no memory of its own
            cur += o.nbytes
            end = lv.last_use[o.name]
            if end < b:
                frees[end] = frees.get(end, 0) + o.nbytes
        peak = max(peak, cur)
        cur -= frees.pop(k, 0)
    return outside + peak


# --------------------------------------------------------------------------- summaries


@dataclass(frozen=True, slots=True)
class SegmentStats:
    index: int
    name: str
    n_eqns: int
    flops: int
    bytes: int
    cost: float  # seconds on the machine's roofline
    peak_live: int  # working set, parameters included
    cross: int  # activation bytes crossing the cut that ends it (0 for the last)


@dataclass(frozen=True, slots=True)
class GraphStats:
    segments: tuple[SegmentStats, ...]
    flops: int
    bytes: int
    cost: float
    peak_live: int  # whole run: the worst segment plus the activations held across it
    boundary_bytes: int  # bytes of the buffers crossing at least one cut, each counted once
    critical_path: tuple[int, ...]  # equation ids
    critical_cost: float

    @property
    def max_segment_cost(self) -> float:
        return max((s.cost for s in self.segments), default=0.0)

    @property
    def max_segment_peak(self) -> int:
        return max((s.peak_live for s in self.segments), default=0)


def _op_span(g: Graph, s: Segment) -> tuple[int, int]:
    before = sum(1 for e in g.eqns[: s.start] if not e.is_pseudo)
    return before, before + sum(1 for e in g.eqns[s.start : s.stop] if not e.is_pseudo)


def boundary_bytes(lv: Liveness, starts: Sequence[int]) -> int:
    """Bytes of the activation buffers that cross at least one of the cuts before op
    indices ``starts``: made before a cut and read (or returned) after it. A buffer
    crossing several cuts is written once and counted once."""
    pts = sorted(starts)
    total = 0
    for v, d in lv.defined.items():
        i = bisect.bisect_right(pts, d)  # the first cut after its definition
        if i < len(pts) and pts[i] <= lv.last_use[v]:
            total += lv.nbytes[v]
    return total


def critical_path(g: Graph, m: Machine = H200) -> tuple[float, tuple[int, ...]]:
    """The most expensive dependency chain: (its cost in seconds, its equation ids)."""
    vs = g.vars()
    lv = liveness(g)
    producer: dict[str, int] = {}
    dist: list[float] = []
    prev: list[int] = []
    os_ = ops(g)
    for k, e in enumerate(os_):
        best, arg = 0.0, -1
        for v in e.ins:
            p = producer.get(v)
            if p is not None and dist[p] > best:
                best, arg = dist[p], p
        dist.append(best + eqn_cost(e, vs, m, lv))
        prev.append(arg)
        for o in e.outs:
            producer[o.name] = k
    if not dist:
        return 0.0, ()
    k = max(range(len(dist)), key=dist.__getitem__)
    total, path = dist[k], []
    while k >= 0:
        path.append(os_[k].id)
        k = prev[k]
    return total, tuple(reversed(path))


def analyze(g: Graph, m: Machine = H200) -> GraphStats:
    vs = g.vars()
    os_ = ops(g)
    lv = liveness(g)
    cross = crossing_bytes(g, lv)
    per = [(eqn_flops(e, vs), sum(eqn_bytes(e, vs, lv)), eqn_cost(e, vs, m, lv)) for e in os_]
    segs = []
    run_peak = 0
    starts = []
    for s in segments(g):
        a, b = _op_span(g, s)
        starts.append(a)
        peak = span_peak(g, a, b, lv, os_)
        held = cross[a] if a > 0 else 0
        held -= sum(lv.nbytes[r] for r in {lv.root[v] for v in s.inputs} if lv.defined.get(r, a) < a)
        run_peak = max(run_peak, peak + max(held, 0))
        segs.append(
            SegmentStats(
                s.index,
                s.name,
                b - a,
                sum(p[0] for p in per[a:b]),
                sum(p[1] for p in per[a:b]),
                sum(p[2] for p in per[a:b]),
                peak,
                cross[b] if b < lv.n else 0,
            )
        )
    cc, path = critical_path(g, m)
    return GraphStats(
        tuple(segs),
        sum(p[0] for p in per),
        sum(p[1] for p in per),
        sum(p[2] for p in per),
        run_peak,
        boundary_bytes(lv, starts[1:]),
        path,
        cc,
    )


# --------------------------------------------------------------------------- printing


def header_annotator(g: Graph, m: Machine = H200) -> Callable[[Segment], str]:
    """For ``segc.ir.to_text(g, annotate=...)``: each segment header's cost on ``m``'s
    roofline, peak live bytes and the bytes crossing the cut that ends it."""
    st = analyze(g, m)
    texts = {
        seg.start: f", cost {fmt_seconds(ss.cost)}, peak {fmt_bytes(ss.peak_live)}, cross {fmt_bytes(ss.cross)}"
        for seg, ss in zip(segments(g), st.segments)
    }
    return lambda s: texts.get(s.start, "")
