"""``window``: an execution window ``[first, last]`` over equation ids, in the IR.

A window selects the segments that intersect the inclusive range of equations from
``first`` to ``last`` (matched by id, per graph, as the seed matches by pointer). It is
a ``segc.window`` pseudo-equation, placed at the start of its first segment, with
arguments ``(name, first, last, mode, entry, exit)``:

- ``mode`` ``"range"``: both endpoints are in the graph; ``entry`` names the values the
  window reads from segments before it (the activation the runtime's stash supplies),
  ``exit`` the values it computes for segments after it or for the graph's outputs
  (what the stash receives);
- ``mode`` ``"all"``: neither endpoint is in this graph (another graph of the same call
  holds the window): the window selects everything, as the seed encodes in full;
- exactly one endpoint in the graph is an error (:class:`segc.ScheduleError`) naming
  the one that is missing.

Entry and exit are derived from the cuts, so a later pass that moves cuts leaves them
stale and the verifier says so; place windows after cuts. Placing a window whose name
is already used replaces it, so the pass is idempotent.
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir import WINDOW, Eqn, Graph, segments
from . import register


def window_args(g: Graph, name: str, first: int, last: int) -> tuple:
    """The ``segc.window`` arguments for ``[first, last]`` in ``g`` (see the module)."""
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


def window_segments(g: Graph, e: Eqn) -> list[int]:
    """Indices of the segments a ``segc.window`` equation selects."""
    segs = segments(g)
    if e.args[3] == "all":
        return [s.index for s in segs]
    pos = {x.id: k for k, x in enumerate(g.eqns) if not x.is_pseudo}
    a, b = pos[e.args[1]], pos[e.args[2]]
    return [s.index for s in segs if s.start <= b and s.stop > a]


@register("window")
def window(g: Graph, first: int, last: int, name: str = "window") -> Graph:
    """Place (or replace) the window ``name`` over equations ``[first, last]``."""
    if not isinstance(name, str) or not name:
        raise ScheduleError(f"window name must be a non-empty string, got {name!r}")
    eqns = [e for e in g.eqns if not (e.prim == WINDOW and e.args[0] == name)]
    old = next((e for e in g.eqns if e.prim == WINDOW and e.args[0] == name), None)
    base = g.replace(eqns=tuple(eqns))
    args = window_args(base, name, first, last)
    eid = old.id if old is not None else max((e.id for e in g.eqns), default=-1) + 1
    if args[3] == "all":
        at = 0
    else:
        seg = segments(base)[window_segments(base, Eqn(-1, WINDOW, (), (), args))[0]]
        at = seg.start
    eqns.insert(at, Eqn(eid, WINDOW, (), (), args))
    return g.replace(eqns=tuple(eqns))
