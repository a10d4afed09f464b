"""``window``: an execution window ``[first, last]`` over equation ids, in the IR.

A window selects the segments that intersect the inclusive range of equations from
``first`` to ``last`` (matched by id, per graph, so it survives re-tracing). It is
a ``segc.window`` pseudo-equation, placed at the start of its first segment, with
arguments ``(name, first, last, mode, entry, exit)``:

- ``mode`` ``"range"``: both endpoints are in the graph; ``entry`` names the values the
  window reads from segments before it (the activation the runtime's stash supplies),
  ``exit`` the values it computes for segments after it or for the graph's outputs
  (what the stash receives);
- ``mode`` ``"all"``: neither endpoint is in this graph (another graph of the same call
  holds the window): the window selects everything (the graph runs in full);
- exactly one endpoint in the graph is an error (:class:`segc.ScheduleError`) naming
  the one that is missing.

Entry and exit are derived from the cuts (``segc.ir.window_args``), so a later pass that moves cuts leaves them
stale and the verifier says so; place windows after cuts. Placing a window whose name
is already used replaces it, so the pass is idempotent.
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir import WINDOW, Eqn, Graph, segments, window_args, window_segments
from .registry import register


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
