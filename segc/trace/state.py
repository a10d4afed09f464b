"""State: objects a traced function mutates (KV caches), functionalized.

A *state object* is found among the call's arguments (an object with
``update_and_fetch`` or a ``state`` property, as mlx-lm's caches have, or an instance of
a class given to :func:`register`) or named explicitly with ``segc.jit(fn, state=[...])``
when ``fn`` captures it. For the trace its arrays become graph inputs of kind
``"state"``; its final arrays become extra graph outputs; its Python attributes are
advanced on the host. Nothing is written into the caller's objects until the call has
run: a call that fails leaves them untouched.

Each object gets a :class:`Slot` for the call, in one of two modes:

``exact``
    the generic mode: the object is shallow-copied with its arrays replaced by graph
    inputs and the model's own code runs on the copy; its non-array attributes are part
    of the signature (so a new offset traces again) and their values after the trace
    are copied back (:func:`commit`).
``dynamic``
    a :class:`StateKind` registered in :data:`KINDS` claims the object and supplies its
    own slot, traced stand-in, commit, growth and donation. ``kvcache.py`` registers
    mlx-lm's ``KVCache`` and ``RotatingKVCache``, whose write offset becomes an array
    input, so a decode loop traces once per buffer capacity rather than per token.

During the trace, each object is swapped in place (``__class__`` and ``__dict__``) for
its traced stand-in and restored on every exit path, so functions that capture the
object see the stand-in too.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .. import dtypes
from ..errors import StateError
from .snapshots import snapshot

_MARK = "\x00segc.state#"


class NeedsGrowth(Exception):
    """Raised during a trace: a dynamic state object must grow (on the host) first."""

    def __init__(self, slot: int, n: int):
        self.slot, self.n = slot, n


class NeedsExact(Exception):
    """Raised during a trace: this state object cannot be traced dynamically; use exact mode."""

    def __init__(self, slot: int, why: str):
        self.slot, self.why = slot, why


def aval(x: mx.array) -> tuple[tuple[int, ...], str]:
    return tuple(x.shape), dtypes.short(x.dtype)


@dataclass(slots=True)
class Slot:
    """One state object in one call: its mode, the arrays it feeds the graph, its key."""

    index: int
    obj: Any
    mode: str  # "dynamic" | "exact"
    kind: str  # "exact", "container", or the name of a registered StateKind
    inputs: list[mx.array] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    key: tuple = ()  # part of the trace-cache key
    host: dict[str, Any] = field(default_factory=dict)  # host values for the trace and commit


class Record:
    """What a stand-in did during the trace (filled in by the stand-in)."""

    def __init__(self) -> None:
        self.n = 0  # tokens written
        self.outputs: list[str] = []  # attribute names of the state's arrays after the call
        self.statics: dict[str, Any] = {}  # exact mode: non-array attributes after the call


@dataclass(frozen=True)
class Commit:
    """How to write one slot's graph outputs back into the caller's object."""

    kind: str
    outputs: tuple[str, ...]
    n: int
    statics: tuple[tuple[str, Any], ...] = ()


def _never(*_: Any) -> bool:
    return False


def _no_growth(slot: Slot, n: int) -> dict[str, Any] | None:
    return None


@dataclass(frozen=True)
class StateKind:
    """A dynamic way to functionalize one class of state object."""

    name: str
    slot: Callable[[int, Any, dict[str, Any] | None], Slot | None]  # None: not dynamically
    standin: Callable[[Slot, list[mx.array], Record], tuple[type, dict]]
    commit: Callable[[Slot, Commit, list[mx.array]], None]
    needs_growth: Callable[[Slot, Commit], bool] = _never
    grow: Callable[[Slot, int], dict[str, Any] | None] = _no_growth  # replacement buffers
    donate: Callable[[Slot, Commit], bool] = _never  # detach buffers the call rewrites
    # a repeated call's slots for a run of objects of this kind, from the keys their last
    # slots had (``staging.fastpath``): None where any object's key would differ now
    rebind: Callable[[int, Sequence[Any], Sequence[tuple]], list[Slot] | None] | None = None


KINDS: dict[str, StateKind] = {}  # dynamic kinds, tried in order before exact mode
_RECOGNIZERS: list[Callable[[Any], bool]] = []  # which argument objects are state


def register_kind(kind: StateKind) -> StateKind:
    KINDS[kind.name] = kind
    return kind


def recognize(test: Callable[[Any], bool]) -> None:
    """Treat argument objects for which ``test`` is true as state."""
    _RECOGNIZERS.append(test)


_EAGER: list[Callable[[Any], str | None]] = []  # state objects segc runs eagerly, and why


def run_eagerly(reason: Callable[[Any], str | None]) -> None:
    """Register a test: a state object for which it gives a reason is not traced; calls
    that pass it run the function eagerly (``segc.SegcWarning`` says so once)."""
    _EAGER.append(reason)


def eager_reason(obj: Any) -> str | None:
    return next((r for test in _EAGER if (r := test(obj)) is not None), None)


def register(cls: type) -> type:
    """Treat instances of ``cls`` found in a call's arguments as state (exact mode)."""
    recognize(lambda x: isinstance(x, cls))
    return cls


def is_state(x: Any) -> bool:
    if isinstance(x, mx.array | type):
        return False
    if any(test(x) for test in _RECOGNIZERS):
        return True
    if not hasattr(x, "__dict__") or isinstance(x, nn.Module):
        return False
    # an mlx-lm-style cache: update_and_fetch, or a `state` property
    return callable(getattr(x, "update_and_fetch", None)) or isinstance(getattr(type(x), "state", None), property)


def children(obj: Any) -> list[Any]:
    """State objects held by a container state object (mlx-lm's ``CacheList``)."""
    out: list[Any] = []
    for v in vars(obj).values():
        if isinstance(v, tuple | list) and v and all(is_state(c) for c in v):
            out.extend(v)
    return out


def _map_leaves(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` (tuples, lists and dicts) with ``fn`` applied to every other object."""
    if isinstance(tree, tuple | list):
        out = [_map_leaves(v, fn) for v in tree]
        if isinstance(tree, list):
            return out
        return type(tree)(*out) if hasattr(tree, "_fields") else tuple(out)  # a namedtuple stays one
    if isinstance(tree, dict) and not isinstance(tree, nn.Module):
        pairs = [(k, _map_leaves(v, fn)) for k, v in tree.items()]
        return OrderedDict(pairs) if type(tree) is OrderedDict else dict(pairs)
    return fn(tree)


def extract(tree: Any, found: list[Any]) -> Any:
    """``tree`` with every state object replaced by a static marker string; the objects
    (and the state objects they contain) are appended to ``found``."""

    def mark(x: Any) -> Any:
        if not is_state(x):
            return x
        for i, o in enumerate(found):
            if o is x:
                return f"{_MARK}{i}"
        found.append(x)
        m = f"{_MARK}{len(found) - 1}"
        extract(children(x), found)
        return m

    return _map_leaves(tree, mark)


def restore(tree: Any, objs: list[Any]) -> Any:
    """Put the state objects back where :func:`extract` left markers."""

    def unmark(x: Any) -> Any:
        return objs[int(x[len(_MARK) :])] if isinstance(x, str) and x.startswith(_MARK) else x

    return _map_leaves(tree, unmark)


# --------------------------------------------------------------------------- slots


def make_slot(index: int, obj: Any, *, exact: bool, grown: dict[str, Any] | None = None) -> Slot:
    """Decide the slot's mode and collect its graph inputs (``grown`` replaces buffers)."""
    kids = children(obj)
    if kids:  # a container: its children are slots of their own; it has no arrays
        s = Slot(index, obj, "exact", "container")
        s.key = (type(obj).__qualname__, len(kids))
        return s
    if not exact:
        for kind in KINDS.values():
            dyn = kind.slot(index, obj, grown)
            if dyn is not None:
                return dyn
    return _exact_slot(index, obj)


def _static(v: Any, where: str) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, tuple | list) and all(x is None or isinstance(x, bool | int | float | str) for x in v):
        return tuple(v)
    raise StateError(
        f"{where} is a {type(v).__name__}; segc functionalizes state attributes that are "
        "mx.arrays, lists of mx.arrays, or hashable scalars"
    )


def _exact_slot(index: int, obj: Any) -> Slot:
    s = Slot(index, obj, "exact", "exact")
    key: list[Any] = [type(obj).__qualname__]
    for name, v in sorted(vars(obj).items()):
        where = f"state[{index}] ({type(obj).__name__}).{name}"
        if isinstance(v, mx.array):
            key.append((name, "array", aval(v)))
            s.inputs.append(v)
            s.names.append(name)
        elif isinstance(v, list | tuple) and v and any(isinstance(x, mx.array) for x in v):
            shape: list[Any] = []
            for i, x in enumerate(v):
                if isinstance(x, mx.array):
                    shape.append(aval(x))
                    s.inputs.append(x)
                    s.names.append(f"{name}[{i}]")
                else:
                    shape.append(("static", _static(x, f"{where}[{i}]")))
            key.append((name, type(v).__name__, tuple(shape)))
        else:
            key.append((name, "static", _static(v, where)))
    s.key = tuple(key)
    return s


def _exact_standin(slot: Slot, arrays: list[mx.array], rec: Record) -> tuple[type, dict]:
    d = snapshot(slot.obj)
    _put(d, slot.names, arrays)
    return type(slot.obj), d


def _put(d: dict[str, Any], names: list[str] | tuple[str, ...], arrays: list[mx.array]) -> None:
    """Write ``arrays`` into the attribute dict ``d`` by name: ``attr``, or ``attr[i]`` for
    an element of a list or tuple attribute (which keeps its type)."""
    for name, a in zip(names, arrays):
        if "[" not in name:
            d[name] = a
            continue
        base, i = name[:-1].split("[")
        seq = list(d[base])
        seq[int(i)] = a
        d[base] = seq if isinstance(d[base], list) else tuple(seq)


@contextmanager
def swapped(slots: list[Slot], arrays: list[list[mx.array]]) -> Iterator[list[Record]]:
    """Swap each state object for its traced stand-in (in place); restore on exit."""
    saved = []
    recs = []
    try:
        for s, arrs in zip(slots, arrays):
            rec = Record()
            recs.append(rec)
            if s.kind == "container":
                continue
            standin = _exact_standin if s.kind == "exact" else KINDS[s.kind].standin
            cls, d = standin(s, arrs, rec)
            saved.append((s.obj, s.obj.__class__, s.obj.__dict__))
            s.obj.__dict__ = d
            if cls is not s.obj.__class__:
                s.obj.__class__ = cls
        yield recs
    finally:
        for obj, cls, d in reversed(saved):
            if obj.__class__ is not cls:
                obj.__class__ = cls
            obj.__dict__ = d


def outputs_after(slot: Slot, rec: Record) -> list[mx.array]:
    """The stand-in's arrays after the traced call (read before :func:`swapped` exits)."""
    d = vars(slot.obj)
    if slot.kind == "container":
        return []
    if slot.kind != "exact":
        if not rec.n:
            rec.outputs = []
        return [d[k] for k in rec.outputs]
    outs: list[mx.array] = []
    rec.outputs, rec.statics = [], {}
    for name, v in d.items():
        where = f"state[{slot.index}] ({type(slot.obj).__name__}).{name} after the call"
        if isinstance(v, mx.array):
            rec.outputs.append(name)
            outs.append(v)
        elif isinstance(v, list | tuple) and any(isinstance(x, mx.array) for x in v):
            rec.statics[name] = copy.copy(v)
            for i, x in enumerate(v):
                if isinstance(x, mx.array):
                    rec.outputs.append(f"{name}[{i}]")
                    outs.append(x)
        else:
            _static(v, where)
            rec.statics[name] = v
    return outs


def grow(slots: list[Slot], n: int, grown: dict[int, dict[str, Any]]) -> bool:
    """Grow (on the host, uncommitted) every dynamic slot that cannot take ``n`` more
    tokens; whether any had to. Slots of the same kind over the same buffers (an engine's
    stand-ins for the layers outside a band share the band's) share one grown copy."""
    any_ = False
    done: dict[tuple, dict[str, Any] | None] = {}
    for s in slots:
        kind = KINDS.get(s.kind)
        if kind is None:
            continue
        key = (s.kind, *map(id, s.inputs))
        bufs = done[key] if key in done else done.setdefault(key, kind.grow(s, n))
        if bufs is not None:
            grown[s.index] = bufs
            any_ = True
    return any_


def give_back(slot: Slot, unread: dict[str, mx.array], written: dict[str, mx.array]) -> None:
    """Put back the buffers :func:`donate` detached (their names in
    ``slot.host["donated"]``) after a dispatch that failed: the input itself if the
    executor never read it (``unread``), else the buffer that the segment reading it
    wrote (``written``), which a state kind's write leaves equal to the input wherever
    the object can be read (a KV cache writes beyond its offset, which stays as it was)."""
    for name in slot.host.get("donated", ()):
        buf = unread.get(name)
        setattr(slot.obj, name, buf if buf is not None else written.get(name))


def commit_plan(slot: Slot, rec: Record) -> Commit:
    return Commit(slot.kind, tuple(rec.outputs), rec.n, tuple(rec.statics.items()))


def commit(slot: Slot, plan: Commit, outs: list[mx.array]) -> None:
    """Write the call's results into the caller's state object."""
    obj = slot.obj
    if plan.kind == "container":
        return
    if plan.kind != "exact":
        KINDS[plan.kind].commit(slot, plan, outs)
        return
    d = dict(plan.statics)
    _put(d, plan.outputs, outs)
    for k in list(vars(obj)):
        if k not in d:
            delattr(obj, k)
    obj.__dict__.update(d)
