"""Segments and what belongs to each, derived from the equation list.

Segmentation lives in the equations themselves: a ``segc.cut`` ends the segment before
it. Everything here is computed from the cuts, never stored beside them, so no pass can
leave it stale: each segment's span, its boundary values (:func:`segments`), the
effects the runtime must honour for it (:func:`segment_effects`) and the segments and
entry/exit values of a window (:func:`window_args`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScheduleError
from .nodes import CUT, HOST_EVENT, SIGNAL, WAIT, WINDOW, Eqn, GraphLike


@dataclass(frozen=True, slots=True)
class Segment:
    """A derived view: equations ``eqns[start:stop]`` between two cuts.

    A segment is named by the cut that ends it (a schedule's cut node: the segment ends
    after it); the last one is ``"tail"``.
    """

    index: int
    name: str
    start: int
    stop: int
    inputs: tuple[str, ...]  # values defined before the segment (or graph inputs) used in it
    outputs: tuple[str, ...]  # values defined in it and used later or returned

    def eqns(self, g: GraphLike) -> tuple[Eqn, ...]:
        """The segment's computing equations (what the runtime replays)."""
        return tuple(e for e in g.eqns[self.start : self.stop] if not e.is_pseudo)


def segments(g: GraphLike) -> list[Segment]:
    """Cut the equation list at every ``segc.cut``; derive each segment's boundary values.

    An empty segment (two cuts in a row, or a cut first or last) is dropped.
    """
    spans: list[tuple[str, int, int]] = []
    start = 0
    for i, e in enumerate(g.eqns):
        if e.prim == CUT:
            spans.append((str(e.args[0]) if e.args else f"cut{e.id}", start, i))
            start = i + 1
    spans.append(("tail", start, len(g.eqns)))
    spans = [s for s in spans if any(not e.is_pseudo for e in g.eqns[s[1] : s[2]])]

    const_names = {c.var.name for c in g.consts}
    defined_in: dict[str, int] = {}
    for k, (_, a, b) in enumerate(spans):
        for e in g.eqns[a:b]:
            for o in e.outs:
                defined_in[o.name] = k
    used_after: dict[int, set[str]] = {k: set() for k in range(len(spans))}
    needs: list[list[str]] = []
    for k, (_, a, b) in enumerate(spans):
        seen: dict[str, None] = {}
        for e in g.eqns[a:b]:
            for v in e.ins:
                if v in const_names or defined_in.get(v) == k:
                    continue
                seen.setdefault(v, None)
                if v in defined_in:
                    used_after[defined_in[v]].add(v)
        needs.append(list(seen))
    for v in g.outputs:
        if v in defined_in:
            used_after[defined_in[v]].add(v)
    result = []
    for k, (name, a, b) in enumerate(spans):
        outs = tuple(o.name for e in g.eqns[a:b] for o in e.outs if o.name in used_after[k])
        result.append(Segment(k, name, a, b, tuple(needs[k]), outs))
    return result


def segment_of(g: GraphLike, segs: list[Segment] | None = None) -> list[int]:
    """For each equation position, the index of the (non-empty) segment it belongs to; a
    pseudo-equation between segments belongs to the next one (the last, past the end)."""
    segs = segments(g) if segs is None else segs
    out, k = [], 0
    for p in range(len(g.eqns)):
        while k < len(segs) - 1 and segs[k].stop <= p:
            k += 1
        out.append(k)
    return out


@dataclass(frozen=True, slots=True)
class SegmentEffects:
    """What the runtime must honour around one segment (a schedule's cut and wait nodes,
    and its window membership)."""

    signals: tuple[tuple[str, int], ...] = ()  # (event, value): signal once the segment has completed
    waits: tuple[tuple[str, int], ...] = ()  # (event, value): dispatch only once event >= value
    windows: tuple[str, ...] = ()  # names of the windows that select this segment

    def __bool__(self) -> bool:
        return bool(self.signals or self.waits or self.windows)


def segment_effects(g: GraphLike, segs: list[Segment] | None = None) -> list[SegmentEffects]:
    """One :class:`SegmentEffects` per segment of ``g``, in order."""
    segs = segments(g) if segs is None else segs
    where = segment_of(g, segs)
    signals: list[list[tuple[str, int]]] = [[] for _ in segs]
    waits: list[list[tuple[str, int]]] = [[] for _ in segs]
    windows: list[list[str]] = [[] for _ in segs]
    for p, e in enumerate(g.eqns):
        if not segs:
            break
        if e.prim == SIGNAL:
            signals[where[p]].append((e.args[0], e.args[1]))
        elif e.prim == WAIT:
            waits[where[p]].append((e.args[0], e.args[1]))
        elif e.prim == WINDOW:
            for k in window_segments(g, e, segs):
                windows[k].append(e.args[0])
    return [SegmentEffects(tuple(s), tuple(w), tuple(n)) for s, w, n in zip(signals, waits, windows)]


def host_events(g: GraphLike) -> tuple[str, ...]:
    """The events the host (not the graph) signals."""
    return tuple(e.args[0] for e in g.eqns if e.prim == HOST_EVENT)


# --------------------------------------------------------------------------- windows


def window_args(g: GraphLike, name: str, first: int, last: int) -> tuple:
    """The ``segc.window`` arguments ``(name, first, last, mode, entry, exit)`` for the
    window over equations ``[first, last]`` (ids) of ``g``, derived from its cuts.

    ``mode`` ``"range"``: both endpoints are in ``g``; ``entry`` names the values the
    window reads from segments before it, ``exit`` those it computes for later segments
    or the graph's outputs. ``"all"``: neither endpoint is in ``g`` (another graph of
    the call holds the window), so it selects everything. One endpoint only is a
    :class:`ScheduleError` naming the missing one.
    """
    pos = {e.id: k for k, e in enumerate(g.eqns) if not e.is_pseudo}
    has_f, has_l = first in pos, last in pos
    if not has_f and not has_l:
        return (name, first, last, "all", (), ())
    if has_f != has_l:
        missing, present = ("last", "first") if has_f else ("first", "last")
        mid, pid = (last, first) if has_f else (first, last)
        raise ScheduleError(
            f"window {name!r}: its {missing} endpoint #{mid} is not in graph {g.name!r}, but its {present} "
            f"endpoint #{pid} is; give both endpoints of one graph, or neither"
        )
    a, b = pos[first], pos[last]
    if a > b:
        raise ScheduleError(f"window {name!r}: first endpoint #{first} comes after last endpoint #{last}")
    sel = [s for s in segments(g) if s.start <= b and s.stop > a]
    lo, hi = sel[0].start, sel[-1].stop
    defined_before = {o.name for e in g.eqns[:lo] for o in e.outs}
    inside = g.eqns[lo:hi]
    entry = dict.fromkeys(v for e in inside for v in e.ins if v in defined_before)
    used_after = {v for e in g.eqns[hi:] for v in e.ins} | set(g.outputs)
    exit_ = [o.name for e in inside for o in e.outs if o.name in used_after]
    return (name, first, last, "range", tuple(entry), tuple(exit_))


def window_segments(g: GraphLike, e: Eqn, segs: list[Segment] | None = None) -> list[int]:
    """Indices of the segments a ``segc.window`` equation selects."""
    segs = segments(g) if segs is None else segs
    if e.args[3] == "all":
        return [s.index for s in segs]
    pos = {x.id: k for k, x in enumerate(g.eqns) if not x.is_pseudo}
    a, b = pos[e.args[1]], pos[e.args[2]]
    return [s.index for s in segs if s.start <= b and s.stop > a]
