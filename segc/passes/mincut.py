"""``min_boundary_bytes``: cut where the fewest bytes cross, by a minimum s-t cut.

Between each pair of consecutive markers (all of them, or those named), the equations
form a flow network (networkx): equations before the interval are the source, those
after it the sink; each value is one edge ``in -> out`` weighted by its bytes (however
many equations read it), with infinite edges from its producer and to its consumers;
an infinite edge from each consumer back to its producer keeps the source side closed
under dependencies (a valid prefix of some topological order); fused chains
(``legalize.pinned_groups``: with segc's own kernels where they lower) are tied
together so no cut splits them. The minimum cut is one cut point; when its source side
is not already a prefix of the interval, the plan reorders the interval's equations
(source side first, each side in its original order), which changes no value. Among
cuts as cheap, one that needs no reordering and lies nearest the middle of the interval
wins.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..errors import ScheduleError
from ..ir import Graph
from .analysis import crossing_bytes, liveness, ops
from .legalize import inside, pinned_groups
from .plan import Plan, marker_points, plan_at


@dataclass(frozen=True)
class MinBoundaryBytes:
    between: tuple[str, ...] | None = None  # marker names; None: every marker

    def __call__(self, g: Graph) -> Plan:
        import networkx as nx

        os_ = ops(g)
        n = len(os_)
        marks = marker_points(g)
        if self.between is not None:
            known = {nm for _, nm, _ in marks}
            missing = [b for b in self.between if b not in known]
            if missing:
                raise ScheduleError(f"min_boundary_bytes: no marker named {missing[0]!r}; markers: {sorted(known)}")
            marks = [m for m in marks if m[1] in self.between]
        bounds = [m[0] for m in marks]
        if len(bounds) < 2:
            raise ScheduleError("min_boundary_bytes needs at least two markers to cut between")
        lv = liveness(g)
        producer: dict[str, int] = {}
        for k, e in enumerate(os_):
            for o in e.outs:
                producer[o.name] = k
        deps: set[tuple[int, int]] = set()  # (consumer, producer) of every data edge
        readers: dict[str, set[int]] = {}  # buffer -> ops reading it through any alias
        for k, e in enumerate(os_):
            for v in e.ins:
                if v in producer:
                    deps.add((k, producer[v]))
                r = lv.root[v]
                if r in lv.defined:
                    readers.setdefault(r, set()).add(k)
        for v in g.outputs:
            if lv.root[v] in lv.defined:
                readers.setdefault(lv.root[v], set()).add(n)
        groups = [grp for grp, _ in pinned_groups(g)]
        bad = inside(groups)  # illegal_points, from the groups at hand
        cross = crossing_bytes(g, lv)
        order = list(range(n))
        points: list[int] = []
        for lo, hi in itertools.pairwise(bounds):

            def node(k: int, lo: int = lo, hi: int = hi) -> Any:
                return "s" if k < lo else ("t" if k >= hi else k)

            fg = nx.DiGraph()
            fg.add_nodes_from(["s", "t", *range(lo, hi)])
            for c, d in deps:  # a consumer on the source side needs its producer there
                if lo <= c < hi or lo <= d < hi:
                    fg.add_edge(node(c), node(d))
            for r, cs in readers.items():  # one edge per buffer, weighted by its bytes
                d = lv.defined[r]
                if d >= hi or all(c < lo for c in cs):
                    continue
                fg.add_edge(node(d), ("in", r))
                fg.add_edge(("in", r), ("out", r), capacity=lv.nbytes[r])
                for c in cs:
                    fg.add_edge(("out", r), node(c))
            for grp in groups:
                for a, b in itertools.pairwise(grp):
                    if node(a) != node(b):
                        fg.add_edge(node(a), node(b))
                        fg.add_edge(node(b), node(a))
            try:
                value, (side_s, _) = nx.minimum_cut(fg, "s", "t")
            except nx.NetworkXUnbounded:
                continue  # a fused chain spans the whole interval: no cut here
            # among cuts as cheap, prefer one in the current order, nearest the middle
            same = [k for k in range(lo, hi + 1) if 0 < k < n and k not in bad and cross[k] <= value]
            if same:
                mid = lo + hi
                points.append(min(same, key=lambda k: (abs(2 * k - mid), k)))
                continue
            first = [k for k in range(lo, hi) if k in side_s]
            rest = [k for k in range(lo, hi) if k not in side_s]
            order[lo:hi] = first + rest
            points.append(lo + len(first))
        os2 = [os_[k] for k in order]
        reorder = None if order == list(range(n)) else tuple(e.id for e in os2)
        pts = [p for p in sorted(set(points)) if 0 < p < n]
        name = f"min_boundary_bytes({','.join(self.between)})" if self.between else "min_boundary_bytes"
        return plan_at(g, name, pts, os_=os2, order=reorder)
