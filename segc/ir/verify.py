"""The verifier: the IR's invariants, fences and windows included.

:func:`verify` checks single assignment, definition before use, known dtypes, unique
equation ids and that pseudo-equations read and define nothing; and that the graph
prints as text that parses back to it: node types (a hand-built graph with a string
among an equation's outputs is refused by name, not with an ``AttributeError``), value
and primitive names the text can hold, whole dims >= 0 (not ``True``), equation ids
that are ints >= 0, input kinds ``arg`` / ``param`` / ``state`` with string paths, and a
``segc.cut`` with one string argument (its segment's name). When the graph holds effects
it also rejects, with an :class:`~segc.IRError` naming the equation:
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

import re
from typing import Any, TypeVar

from .. import dtypes
from ..errors import IRError, ScheduleError
from .nodes import CUT, EFFECTS, HOST_EVENT, INPUT_KINDS, SIGNAL, WAIT, WINDOW, Const, Eqn, GraphLike, Input, Var
from .segments import segment_of, window_args

G = TypeVar("G", bound=GraphLike)
# what the text form can hold: a value's name after '%', a primitive's name before '('
VALUE_NAME = re.compile(r"[\w.\-]+")
PRIM_NAME = re.compile(r"[\w.\-:]+")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _const_value(c: Const) -> tuple[tuple[int, ...], str] | None:
    """The shape and short dtype of a constant's value (None: elided); IRError when the
    value is not an MLX array."""
    if c.value is None:
        return None
    try:
        return tuple(c.value.shape), dtypes.short(c.value.dtype)
    except (AttributeError, KeyError, TypeError):
        raise IRError(
            f"constant {c.var.name}: its value must be an evaluated mx.array, got {type(c.value).__name__}"
        ) from None


def _plain_name(x: Any) -> bool:
    """A fast yes for a name the text form holds: an ASCII identifier (a subset of
    ``VALUE_NAME``); no means: ask the pattern."""
    return type(x) is str and x.isascii() and x.isidentifier()


def _plain_shape(shape: Any) -> bool:
    """A fast yes for a tuple of plain ints >= 0 (``type(d) is int`` leaves bools out)."""
    return type(shape) is tuple and all([type(d) is int and d >= 0 for d in shape])


def _check_eqn_fields(e: Any, where: str) -> None:
    if not isinstance(e, Eqn):
        raise IRError(f"{where}: not an Eqn: {type(e).__name__}")
    if not _is_int(e.id) or e.id < 0:
        raise IRError(f"{where}: the equation id must be an int >= 0, got {e.id!r}")
    if not isinstance(e.prim, str) or not PRIM_NAME.fullmatch(e.prim):
        raise IRError(f"{where}: bad primitive name {e.prim!r} (letters, digits, '_', '.', '-', ':')")
    if not isinstance(e.ins, tuple) or not all(isinstance(v, str) for v in e.ins):
        raise IRError(f"{where}: inputs must be a tuple of value names, got {e.ins!r}")
    if not isinstance(e.outs, tuple) or not all(isinstance(o, Var) for o in e.outs):
        raise IRError(f"{where}: outputs must be a tuple of Var, got {e.outs!r}")
    if not isinstance(e.args, tuple):
        raise IRError(f"{where}: arguments must be a tuple, got {type(e.args).__name__}")
    if e.is_pseudo and (e.outs or e.ins):
        raise IRError(f"{where}: a pseudo-equation reads and defines nothing")
    if e.prim == CUT and (len(e.args) != 1 or not isinstance(e.args[0], str)):
        raise IRError(f"{where}: a segc.cut takes one argument, its segment's name (a string), got {list(e.args)}")


def verify(g: G) -> G:
    """Check the IR's invariants; raise :class:`IRError` naming the first violation."""
    defined: set[str] = set()
    prims: set[str] = set()  # primitive names already matched

    def define(v: Any, at: Any) -> None:
        # the common case in one test (the names, dtypes and shapes of a trace), the checks below otherwise
        if (
            type(v) is Var
            and _plain_name(v.name)
            and v.name not in defined
            and type(v.dtype) is str
            and dtypes.is_dtype_name(v.dtype)
            and _plain_shape(v.shape)
        ):
            defined.add(v.name)
            return
        where = at if isinstance(at, str) else f"equation #{at.id} ({at.prim})"
        if not isinstance(v, Var):
            raise IRError(f"{where}: not a Var: {v!r}")
        if not isinstance(v.name, str) or not VALUE_NAME.fullmatch(v.name):
            raise IRError(f"{where}: bad value name {v.name!r} (letters, digits, '_', '.', '-')")
        if v.name in defined:
            raise IRError(f"{where}: value {v.name} assigned twice")
        if not isinstance(v.dtype, str) or not dtypes.is_dtype_name(v.dtype):
            raise IRError(f"{where}: unknown dtype {v.dtype!r} for {v.name}")
        if not isinstance(v.shape, tuple) or any(not _is_int(d) or d < 0 for d in v.shape):
            raise IRError(f"{where}: bad shape {v.shape!r} for {v.name} (a tuple of ints >= 0)")
        defined.add(v.name)

    if not isinstance(g.name, str):
        raise IRError(f"the graph's name must be a string, got {g.name!r}")
    for i in g.inputs:
        if not isinstance(i, Input) or not isinstance(i.path, str):
            raise IRError(f"graph input {i!r}: expected an Input with a string path")
        if i.kind not in INPUT_KINDS:
            raise IRError(f"input {i.path!r}: unknown kind {i.kind!r}; kinds: {', '.join(INPUT_KINDS)}")
        define(i.var, f"input {i.path!r}")
    for c in g.consts:
        if not isinstance(c, Const):
            raise IRError(f"graph constant {c!r}: not a Const")
        define(c.var, "constant")
        got = _const_value(c)
        if got is not None and got != (c.var.shape, c.var.dtype):
            raise IRError(f"constant {c.var.name}: value does not match {c.var.type_str()}")
    ids: set[int] = set()
    for e in g.eqns:
        if not (  # the common case in one test; the checks (and their messages) otherwise
            type(e) is Eqn
            and type(e.id) is int
            and e.id >= 0
            and e.id not in ids
            and e.prim in prims
            and type(e.ins) is tuple
            and type(e.outs) is tuple
            and type(e.args) is tuple
            and not e.is_pseudo
            and all([type(v) is str and v in defined for v in e.ins])
            and all([type(o) is Var for o in e.outs])
        ):
            where = f"equation #{getattr(e, 'id', '?')} ({getattr(e, 'prim', '?')})"
            _check_eqn_fields(e, where)
            prims.add(e.prim)
            if e.id in ids:
                raise IRError(f"{where}: duplicate equation id")
            for v in e.ins:
                if v not in defined:
                    raise IRError(f"{where}: uses {v} before it is defined")
        ids.add(e.id)
        for o in e.outs:
            define(o, e)
    for v in g.outputs:
        if not isinstance(v, str) or v not in defined:
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
