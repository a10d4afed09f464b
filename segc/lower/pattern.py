"""A segment's equations as a graph to match patterns in: who makes and who reads each
value, and how often. The fused kernels' finders (``attention.py``, ``products.py``)
match equations by primitive and shape and replace a pattern only where nothing else
reads its intermediate values (:func:`skippable`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Sequence

from ..ir import Eqn


class SegmentGraph:
    """Producers, readers and use counts of a segment's values; ``keep`` (the segment's
    outputs) count as used outside; ``context`` (the whole graph's equations) gives the
    producers of the segment's inputs."""

    def __init__(self, eqns: Sequence[Eqn], keep: Sequence[str], context: Sequence[Eqn] = ()):
        self.prod: dict[str, Eqn] = {o.name: e for e in eqns for o in e.outs}
        self.pos: dict[int, int] = {e.id: i for i, e in enumerate(eqns)}  # ids need not be in order
        # the whole graph's producers: a broadcast scalar another segment made is still
        # a constant (its value is looked up there; the segment reads it as an input)
        self.anywhere: dict[str, Eqn] = {o.name: e for e in context for o in e.outs}
        self.anywhere.update(self.prod)
        self.shape: dict[str, tuple[int, ...]] = {o.name: o.shape for e in eqns for o in e.outs}
        self.dtype: dict[str, str] = {o.name: o.dtype for e in eqns for o in e.outs}
        self.uses: Counter[str] = Counter(v for e in eqns for v in e.ins)
        self.readers: dict[str, list[Eqn]] = {}
        for e in eqns:
            for v in dict.fromkeys(e.ins):
                self.readers.setdefault(v, []).append(e)
        for v in keep:
            self.uses[v] += 1 << 30  # a segment output is used outside

    def eqn(self, v: str, *prims: str) -> Eqn | None:
        """The equation making ``v`` in this segment, if it is one of ``prims``."""
        e = self.prod.get(v)
        return e if e is not None and e.prim in prims else None


def through(g: SegmentGraph, v: str, prims: tuple[str, ...], path: list[Eqn]) -> str:
    """Walk back from ``v`` through equations of ``prims``, recording them."""
    while (e := g.eqn(v, *prims)) is not None:
        path.append(e)
        v = e.ins[0]
    return v


def views_to(
    g: SegmentGraph, v: str, ends: Container[str], view: Callable[[Eqn], bool], most: int = 8
) -> tuple[str, list[Eqn]]:
    """From ``v`` forward along equations ``view`` accepts, each the only reader of the
    value before it (:func:`only_reader`), to the first value in ``ends`` or where the
    walk stops (after at most ``most``): that value and the equations walked."""
    walked: list[Eqn] = []
    while v not in ends and len(walked) < most:
        e = only_reader(v, g)
        if e is None or not view(e):
            break
        walked.append(e)
        v = e.outs[0].name
    return v, walked


def only_reader(v: str, g: SegmentGraph) -> Eqn | None:
    """The one equation that reads ``v`` once, if nothing else (nor the segment's
    outputs) reads it."""
    if g.uses[v] != 1:
        return None
    rs = g.readers.get(v, [])
    return rs[0] if len(rs) == 1 else None


def skippable(path: list[Eqn], last: Eqn, g: SegmentGraph, kept: Sequence[str]) -> frozenset[int]:
    """The pattern's equations nothing else needs (a shared scale broadcast, or a mask
    another attention reads, keeps running)."""
    eqns = {e.id: e for e in path}  # each once
    skip: set[int] = set()
    # latest first: an equation is skipped when every use of its outputs is by skipped
    # equations of the pattern (the kernel reads its own inputs itself)
    for e in sorted(eqns.values(), key=lambda e: -g.pos.get(e.id, e.id)):
        by_skipped = Counter(v for i in skip for v in eqns[i].ins)
        if e is last or all(o.name not in kept and g.uses[o.name] == by_skipped[o.name] for o in e.outs):
            skip.add(e.id)
    return frozenset(skip)
