"""The verifier: the IR's invariants, fences and windows included.

:func:`verify` checks single assignment, definition before use, known dtypes, unique
equation ids and that pseudo-equations define nothing. When the graph holds effects it
also rejects, with an :class:`~segc.IRError` naming the equation:
- malformed fence arguments (event names, values that are not ints >= 1);
- signal values of one event that do not strictly increase in program order;
- a wait that no signal can satisfy: no ``segc.signal`` of its event reaches its value
  and no ``segc.host_event`` declares that the host signals it;
- a wait that can deadlock: every signal that would satisfy it is in its own segment or
  a later one (segments dispatch in order; a segment's signal fires when it completes);
- windows that are malformed or stale (their entry/exit no longer match the cuts) and
  window names used twice.
"""

from __future__ import annotations

from typing import TypeVar

from .. import dtypes
from ..errors import IRError, ScheduleError
from .nodes import EFFECTS, HOST_EVENT, SIGNAL, WAIT, WINDOW, GraphLike, Var
from .segments import segment_of, window_args

G = TypeVar("G", bound=GraphLike)


def verify(g: G) -> G:
    """Check the IR's invariants; raise :class:`IRError` naming the first violation."""
    defined: set[str] = set()

    def define(v: Var, where: str) -> None:
        if v.name in defined:
            raise IRError(f"{where}: value {v.name} assigned twice")
        if not dtypes.is_dtype_name(v.dtype):
            raise IRError(f"{where}: unknown dtype {v.dtype!r} for {v.name}")
        if any((not isinstance(d, int)) or d < 0 for d in v.shape):
            raise IRError(f"{where}: bad shape {v.shape} for {v.name}")
        defined.add(v.name)

    for i in g.inputs:
        define(i.var, f"input {i.path!r}")
    for c in g.consts:
        define(c.var, "constant")
        if c.value is not None and (tuple(c.value.shape) != c.var.shape or dtypes.short(c.value.dtype) != c.var.dtype):
            raise IRError(f"constant {c.var.name}: value does not match {c.var.type_str()}")
    ids: set[int] = set()
    for e in g.eqns:
        where = f"equation #{e.id} ({e.prim})"
        if e.id in ids:
            raise IRError(f"{where}: duplicate equation id")
        ids.add(e.id)
        if e.is_pseudo and e.outs:
            raise IRError(f"{where}: a pseudo-equation has no outputs")
        for v in e.ins:
            if v not in defined:
                raise IRError(f"{where}: uses {v} before it is defined")
        for o in e.outs:
            define(o, where)
    for v in g.outputs:
        if v not in defined:
            raise IRError(f"graph output {v} is never defined")
    if any(e.prim in EFFECTS for e in g.eqns):
        verify_effects(g)
    return g


def verify_effects(g: GraphLike) -> None:
    seg = segment_of(g)
    host: set[str] = set()
    signals: dict[str, list[tuple[int, int, int]]] = {}  # event -> (value, segment, id)
    for p, e in enumerate(g.eqns):
        where = f"equation #{e.id} ({e.prim})"
        if e.prim == HOST_EVENT:
            if len(e.args) != 1 or not isinstance(e.args[0], str) or not e.args[0]:
                raise IRError(f"{where}: expected one event name, got {list(e.args)}")
            if e.args[0] in host:
                raise IRError(f"{where}: host event {e.args[0]!r} declared twice")
            host.add(e.args[0])
        elif e.prim in (SIGNAL, WAIT):
            ok = len(e.args) == 2 and isinstance(e.args[0], str) and bool(e.args[0])
            ok = ok and isinstance(e.args[1], int) and not isinstance(e.args[1], bool) and e.args[1] >= 1
            if not ok:
                raise IRError(f"{where}: expected (event name, int value >= 1), got {list(e.args)}")
            if e.prim == SIGNAL:
                prev = signals.setdefault(e.args[0], [])
                if prev and prev[-1][0] >= e.args[1]:
                    raise IRError(
                        f"{where}: event {e.args[0]!r} is signalled {e.args[1]} after #{prev[-1][2]} signalled "
                        f"{prev[-1][0]}; signal values must increase"
                    )
                prev.append((e.args[1], seg[p], e.id))
    for p, e in enumerate(g.eqns):
        if e.prim != WAIT:
            continue
        ev, val = e.args
        if ev in host:
            continue
        sat = [s for s in signals.get(ev, []) if s[0] >= val]
        if not sat:
            raise IRError(
                f"equation #{e.id} (segc.wait): waits for {ev!r} >= {val}, but no signal of {ev!r} reaches {val} "
                f"and no segc.host_event declares that the host signals it"
            )
        if all(s[1] >= seg[p] for s in sat):
            s = sat[0]
            raise IRError(
                f"equation #{e.id} (segc.wait): deadlock: segment {seg[p]} waits for {ev!r} >= {val}, which only "
                f"segment {s[1]} signals (#{s[2]}), not before it"
            )
    _verify_windows(g)


def _verify_windows(g: GraphLike) -> None:
    names: set[str] = set()
    for e in g.eqns:
        if e.prim != WINDOW:
            continue
        where = f"equation #{e.id} (segc.window)"
        if len(e.args) != 6 or not isinstance(e.args[0], str) or e.args[3] not in ("all", "range"):
            raise IRError(f"{where}: expected (name, first, last, 'all'|'range', entry, exit), got {list(e.args)}")
        if e.args[0] in names:
            raise IRError(f"{where}: window name {e.args[0]!r} used twice")
        names.add(e.args[0])
        try:
            want = window_args(g, e.args[0], e.args[1], e.args[2])
        except ScheduleError as exc:
            raise IRError(f"{where}: {exc}") from None
        if tuple(e.args) != want:
            raise IRError(
                f"{where}: window {e.args[0]!r} is stale: the cuts give mode {want[3]}, entry {list(want[4])}, "
                f"exit {list(want[5])}; place windows after cuts"
            )
