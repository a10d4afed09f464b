"""``optimal`` on a machine model that saves host time on a repeated segment
(``MachineModel.repeat_s``, ``repeat_op_s``: an earlier segment of the call had the same
equations; ``costmodel.py``, "Repeats").

Whether a segment repeats depends on the plan's other segments, which the dynamic
program's span costs (``optimal.py``) cannot see: its plan is exact without the saving
and only a start with it. On an H100 the calibration fitted 0.45 us of saving per
repeated equation of a prefill, and under that model the DP's plan was predicted 5%
slower than cutting at every marker, whose segments all repeat; that plan measured the
fastest (docs/experiments-log.md, the twenty-sixth run). So, where the model has the
saving, whole plans are costed (``costmodel.predict_time``'s figure, by :class:`PlanTimer`): the DP's, none, a cut at
every point (each equation's segment then repeats the last like it), the layer-periodic
ones (every marker, every second, third and fourth), ``optimal:markers``'s plan (for
``optimal``), then, from each, a local search while the predicted time falls
(:func:`_moves`), at most :data:`MAX_PLANS` plans in all. Never predicted slower
than any of those plans; not an exact optimum: on 300 random machines with two or three
repeated layers, above the least of every plan on three, by at most 1.6%, where the DP's
plan alone was above it on 93, by up to 185% (``benchmarks/optimal_gap.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise

from ..ir import Graph
from .analysis import ops
from .costmodel import MachineModel, OpCosts, eqn_signature, op_costs, segment_times, span_in_bytes, timed

MAX_PLANS = 2000  # whole plans costed (PlanTimer: 1-2 ms each on the reference llama's graphs: 1-5 s a plan)
PERIODS = (1, 2, 3, 4)  # every marker, every second, ...


def saves_on_repeats(m: MachineModel) -> bool:
    return m.repeat_s > 0 or m.repeat_op_s > 0


def search(
    g: Graph,
    m: MachineModel,
    start: Sequence[int],
    markers: Sequence[int],
    points: Sequence[int],
    feasible: Callable[[Sequence[int]], bool],
    extra: Sequence[tuple[str, Sequence[int]]] = (),
    oc: OpCosts | None = None,
) -> tuple[list[int], float, str]:
    """The cut points (op indices) of the least predicted time found, that time, and
    what found it (``"dp"``, ``"none"``, ``"every point"``, ``"markers"``, ``"every:K"``,
    ``"optimal:markers"`` or ``"search"``). ``start``
    is the DP's plan, ``markers`` the legalised marker points, ``feasible`` whether a
    plan keeps every segment within the budget. Only those points move: with the
    markers alone (``optimal:markers``), the plan stays at them. ``extra``: more
    starts, by name (``optimal`` gives ``optimal:markers``'s plan: a step among all
    points costs many more plans than among the markers, and on an H100's prefill model
    the search with every point ended 1.2% above the one with the markers alone,
    docs/experiments-log.md, the twenty-ninth run). ``oc``: ``g``'s per-op costs under
    ``m``, where the caller has them."""
    costs: dict[tuple[int, ...], float] = {}
    timer = PlanTimer(g, m, oc)

    def cost(points: Sequence[int]) -> float:
        key = tuple(sorted(set(points)))
        if key not in costs:
            costs[key] = timer(key) if feasible(key) else math.inf
        return costs[key]

    found = [("dp", list(start)), ("none", []), ("every point", sorted(set(points) | set(markers)))]
    found += [("markers" if k == 1 else f"every:{k}", list(markers[k - 1 :: k])) for k in PERIODS if markers]
    found += [(name, list(plan)) for name, plan in extra]
    groups = orbits(g, markers, points)
    starts = sorted(found, key=lambda c: cost(c[1]))  # the first of equals: the DP's plan
    best_how, best = starts[0]
    for i, (name, plan) in enumerate(starts):  # a local search from each, best first, a share of the plans each
        limit = len(costs) + (MAX_PLANS - len(costs)) // (len(starts) - i)
        while len(costs) < limit:  # the best of the near moves, else the first far one that gains
            near, far = _moves(plan, groups, markers, points)
            tried = []
            for o in near:  # costed in turn, while the share lasts (a plan costed before is free)
                if tuple(o) in costs or len(costs) < limit:
                    cost(o)
                    tried.append(o)
            step = min(tried, key=cost, default=None)
            if step is None or cost(step) >= cost(plan):
                step = next((o for o in far if len(costs) < limit and cost(o) < cost(plan)), None)
            if step is None:
                break
            plan, name = step, "search"
        if cost(plan) < cost(best):
            best_how, best = name, plan
    return sorted(best), cost(best), best_how


class PlanTimer:
    """``costmodel.predict_time`` of ``g`` cut at op indices, without cutting it. The
    per-op costs (``op_costs``) change with the cuts only where one falls inside a fused
    chain, which no legal point does: computed once on the uncut graph, a plan costs its
    segments alone (``segment_times``), each segment's boundary reads cached by span, some
    20 times faster than cutting and predicting the graph (tests: the same figures)."""

    def __init__(self, g: Graph, m: MachineModel, oc: OpCosts | None = None):
        self.m, self.os_ = m, ops(g)
        self.oc = oc or op_costs(g, m)
        self.reads: dict[tuple[int, int], int] = {}

    def _reads(self, a: int, b: int) -> int:
        if (a, b) not in self.reads:
            self.reads[a, b] = span_in_bytes(self.oc.lv, self.os_, a, b)
        return self.reads[a, b]

    def __call__(self, points: Sequence[int]) -> float:
        ends = [0, *sorted(set(points)), len(self.os_)]
        spans = [(f"s{i}", a, b) for i, (a, b) in enumerate(pairwise(ends)) if b > a]
        segs = segment_times(self.os_, self.oc, spans, [True] * len(spans), self.m, self._reads)
        return timed(segs, self.m).total


def _moves(
    plan: Sequence[int], groups: list[set[int]], markers: Sequence[int], points: Sequence[int]
) -> tuple[list[list[int]], Iterator[list[int]]]:
    """The plans one step from ``plan``, near and far. Near: a group's points all in or
    all out (a cut in one layer alone breaks its repeat); a group in the plan for its
    neighbour (a cut moved by one point in every layer); a marker or a cut of the plan
    in or out. Far: any other point in."""
    have = set(plan)
    near = [sorted(have - t) if t <= have else sorted(have | t) for t in groups]
    for a, b in pairwise(groups):
        if a <= have and not b & have:
            near.append(sorted((have - a) | b))
        if b <= have and not a & have:
            near.append(sorted((have - b) | a))
    near += [sorted(have ^ {p}) for p in sorted(set(markers) | have)]
    far = (sorted(have | {p}) for p in sorted(set(points) - set(markers) - have))
    return near, far


def orbits(g: Graph, markers: Sequence[int], points: Sequence[int]) -> list[set[int]]:
    """The points between markers grouped by their place in a layer: where two spans
    between markers have the same equations (as ``costmodel.eqn_signature`` compares them),
    a point at the same offset in each, one set per offset (the points alone where no
    span repeats)."""
    os_ = ops(g)
    sig = [eqn_signature(e) for e in os_]
    ends = [0, *markers, len(os_)]
    spans = list(pairwise(ends))
    legal = set(points) - set(markers)
    out: dict[tuple, set[int]] = {}
    for a, b in spans:
        kind = tuple(sig[a:b])
        for p in range(a + 1, b):
            if p in legal:
                out.setdefault((kind, p - a), set()).add(p)
    return [out[k] for k in sorted(out, key=lambda k: min(out[k]))]
