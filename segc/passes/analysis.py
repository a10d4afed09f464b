"""Analyses over a graph: FLOPs and bytes per equation, liveness, peak live bytes,
bytes crossing each boundary, and the critical path. Pure functions; nothing here
changes a graph.

Positions: ``ops(g)`` is the list of computing equations (pseudo-equations left out);
a *cut point* ``k`` (``1 <= k < len(ops)``) is the gap before ``ops[k]``.

The cost model is a roofline: an equation takes ``max(flops / F, bytes / B)`` seconds on a
:class:`Machine`. Views (reshape, broadcast, transpose, slice, ...) cost nothing: MLX
makes them without copying. Bytes are counted as if nothing were fused; that
overestimates elementwise chains, equally for every cut placement (fusion-aware
legalisation never splits a fused chain).

Liveness is buffer-level: a view (a broadcast of a constant, a transposed weight) owns
no memory and keeps its source alive; a buffer is freed after its last use through any
alias. The peak live bytes of a segment is its working set: the buffers it reads (graph
inputs and parameters included) plus its own buffers live at the worst point. The
whole-run peak adds, for each segment, the activations held across it for later
segments. Boundary bytes count activation buffers crossing a cut (a view of a constant
crosses for free).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..ir import Eqn, Graph, Segment, Var, segments

# --------------------------------------------------------------------------- cost model


@dataclass(frozen=True, slots=True)
class Machine:
    """Roofline parameters. The default is an NVIDIA H200 in bf16 (DESIGN.md)."""

    name: str = "h200"
    flops_per_s: float = 790e12
    bytes_per_s: float = 4.8e12


H200 = Machine()

# primitives that make views or only reinterpret: no FLOPs, no bytes moved
VIEWS = frozenset(
    {
        "Reshape",
        "Broadcast",
        "ExpandDims",
        "Squeeze",
        "Transpose",
        "Slice",
        "Flatten",
        "Unflatten",
        "AsStrided",
        "Split",
        "Depends",
        "StopGradient",
        "BroadcastAxes",
    }
)
# data movement: bytes, no FLOPs
MOVES = frozenset(
    {"Gather", "Concatenate", "Pad", "SliceUpdate", "Scatter", "Copy", "Arange", "Full", "Contiguous", "AsType"}
)


def _matmul_flops(e: Eqn, vs: dict[str, Var]) -> int:
    x = vs[e.ins[0]]
    k = x.shape[-1] if x.shape else 1
    return 2 * sum(o.size for o in e.outs) * k


def eqn_flops(e: Eqn, vs: dict[str, Var]) -> int:
    """Floating point operations of one equation (a fused multiply-add counts two)."""
    if e.is_pseudo or e.prim in VIEWS or e.prim in MOVES:
        return 0
    out = sum(o.size for o in e.outs)
    if e.prim in ("Matmul", "AddMM", "BlockMaskedMM", "GatherMM", "QuantizedMatmul", "GatherQMM"):
        return _matmul_flops(e, vs)
    if e.prim == "Convolution":
        w = vs[e.ins[1]]
        return 2 * out * (w.size // max(w.shape[0], 1))
    if e.prim == "ScaledDotProductAttention":
        q, k = vs[e.ins[0]], vs[e.ins[1]]
        return 4 * q.size * k.shape[-2]
    if e.prim in ("Reduce", "ArgReduce", "Scan", "LogSumExp"):
        return sum(vs[v].size for v in e.ins[:1])
    if e.prim in ("Softmax", "RMSNorm", "LayerNorm", "RoPE"):
        return 5 * out
    return out  # elementwise


def eqn_bytes(e: Eqn, vs: dict[str, Var]) -> tuple[int, int]:
    """(bytes read, bytes written) of one equation, as if it ran alone."""
    if e.is_pseudo or e.prim in VIEWS:
        return 0, 0
    written = sum(o.nbytes for o in e.outs)
    if e.prim == "Gather":  # reads the gathered rows and the indices, not the table
        return written + sum(vs[v].nbytes for v in e.ins[1:]), written
    return sum(vs[v].nbytes for v in dict.fromkeys(e.ins)), written


def eqn_cost(e: Eqn, vs: dict[str, Var], m: Machine = H200) -> float:
    """Seconds on the roofline of ``m``."""
    r, w = eqn_bytes(e, vs)
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
    out = []
    for e in ops(g):
        r, w = eqn_bytes(e, vs)
        out.append(EqnStats(e.id, e.prim, eqn_flops(e, vs), r, w, eqn_cost(e, vs, m)))
    return out


# --------------------------------------------------------------------------- liveness


def ops(g: Graph) -> list[Eqn]:
    return [e for e in g.eqns if not e.is_pseudo]


# views alias their input's buffer; these keep a contiguous buffer contiguous
ALIASES = frozenset(
    {"Broadcast", "BroadcastAxes", "ExpandDims", "Squeeze", "Transpose", "Slice", "AsStrided", "Split"}
    | {"StopGradient", "Depends", "Reshape", "Flatten", "Unflatten"}
)
_KEEP_CONTIGUOUS = frozenset({"ExpandDims", "Squeeze", "StopGradient", "Depends", "Reshape", "Flatten", "Unflatten"})
_RESHAPES = frozenset({"Reshape", "Flatten", "Unflatten"})


@dataclass(frozen=True, slots=True)
class Liveness:
    """Buffer-level liveness. A view (broadcast, transpose, slice, a reshape of a
    contiguous value, ...) owns no memory: ``root`` maps every value to the buffer it
    reads (itself for a computed value, a graph input or a constant) and a view keeps its
    root alive. ``defined``: op index of each computed buffer; ``last_use``: last op
    reading the buffer through any alias (``n`` for a graph output); ``nbytes``: bytes of
    each buffer (graph inputs included, constants 0)."""

    n: int
    defined: dict[str, int]
    last_use: dict[str, int]
    nbytes: dict[str, int]
    root: dict[str, str]


def liveness(g: Graph) -> Liveness:
    os_ = ops(g)
    root: dict[str, str] = {}
    contiguous: dict[str, bool] = {}
    nbytes: dict[str, int] = {}
    for i in g.inputs:
        root[i.var.name], contiguous[i.var.name], nbytes[i.var.name] = i.var.name, True, i.var.nbytes
    for c in g.consts:
        root[c.var.name], contiguous[c.var.name], nbytes[c.var.name] = c.var.name, True, 0
    defined: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, e in enumerate(os_):
        for v in e.ins:
            last[root[v]] = k
        src = e.ins[0] if e.ins else None
        alias = e.prim in ALIASES and src is not None and not (e.prim in _RESHAPES and not contiguous[src])
        for o in e.outs:
            if alias:
                assert src is not None
                root[o.name] = root[src]
                contiguous[o.name] = contiguous[src] and e.prim in _KEEP_CONTIGUOUS
            else:
                root[o.name], contiguous[o.name], nbytes[o.name] = o.name, True, o.nbytes
                defined[o.name] = k
                last[o.name] = k
    for v in g.outputs:
        last[root[v]] = len(os_)
    return Liveness(len(os_), defined, last, nbytes, root)


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
    boundary_bytes: int  # sum over cuts of bytes crossing
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


def critical_path(g: Graph, m: Machine = H200) -> tuple[float, tuple[int, ...]]:
    """The most expensive dependency chain: (its cost in seconds, its equation ids)."""
    vs = g.vars()
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
        dist.append(best + eqn_cost(e, vs, m))
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
    per = [(eqn_flops(e, vs), sum(eqn_bytes(e, vs)), eqn_cost(e, vs, m)) for e in os_]
    segs = []
    run_peak = 0
    for s in segments(g):
        a, b = _op_span(g, s)
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
        sum(s.cross for s in segs),
        path,
        cc,
    )


# --------------------------------------------------------------------------- printing


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def fmt_seconds(t: float) -> str:
    if t == 0:
        return "0 s"
    exp = min(max(math.floor(math.log10(t) / 3), -3), 0)
    unit = {0: "s", -1: "ms", -2: "us", -3: "ns"}[exp]
    return f"{t / 10 ** (3 * exp):.3g} {unit}"


_HEADER_CACHE: list = []  # [(graph, {segment start: text})]: one graph, for printing


def header_stats(g: Graph, s: Segment) -> str:
    """The tail of a segment header line (``segc.ir.segment_header``): cost, peak live
    bytes, bytes crossing the cut that ends the segment, and the segment's effects."""
    if not _HEADER_CACHE or _HEADER_CACHE[0][0] is not g:
        st = analyze(g)
        texts = {}
        for seg, ss in zip(segments(g), st.segments):
            effects = [_effect_text(e) for e in g.eqns[seg.start : seg.stop] if e.prim.startswith("segc.")]
            effects = [x for x in effects if x]
            texts[seg.start] = f", cost {fmt_seconds(ss.cost)}, peak {ss.peak_live} B, cross {ss.cross} B" + (
                f"; {'; '.join(effects)}" if effects else ""
            )
        _HEADER_CACHE[:] = [(g, texts)]
    return _HEADER_CACHE[0][1].get(s.start, "")


def _effect_text(e: Eqn) -> str:
    from ..ir import HOST_EVENT, SIGNAL, WAIT, WINDOW

    if e.prim == WAIT:
        return f"waits {e.args[0]} >= {e.args[1]}"
    if e.prim == SIGNAL:
        return f"signals {e.args[0]} = {e.args[1]} when done"
    if e.prim == HOST_EVENT:
        return f"host signals {e.args[0]}"
    if e.prim == WINDOW:
        inout = (
            f", entry {' '.join('%' + v for v in e.args[4]) or '-'}, exit {' '.join('%' + v for v in e.args[5]) or '-'}"
        )
        return f"window {e.args[0]!r} [#{e.args[1]}, #{e.args[2]}] {e.args[3]}" + (
            inout if e.args[3] == "range" else ""
        )
    return ""
