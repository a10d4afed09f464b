"""A repeated call with state objects, bound without the general path.

A decode loop calls ``step(x, cache=cache)`` with a new token array of the same shape and
the same list of the same KV-cache objects every time. The general path (``Jitted._bind``)
walks the arguments for state objects, builds a slot per object, flattens the arguments
and hashes a signature, which costs tens of microseconds per cache, per call. After a call
that hit the trace cache, :func:`learn` records the call's shape: which top-level
arguments are arrays (shape and dtype), which are containers of state objects (the
container and its objects, by identity) and which are plain constants. :func:`match`
checks a new call against that record and rebuilds only what changes per call: the
array leaves, the parameters (``ParamGatherer.gather``, which reuses its signature
object when no parameter changed) and each object's slot (through its state kind). A
call that differs in any way, a slot whose key changed or a cache that must grow goes
the general path, so this changes which code binds a call, never what it binds to.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..trace import state as st
from ..trace.params import ParamSig
from .signature import CallSpec, Signature

_SCALARS = (bool, int, float, str, type(None))
Bound = tuple[list[mx.array], dict[str, mx.array], list[st.Slot]]  # a call's leaves, parameters and slots


@dataclass(frozen=True)
class Pattern:
    """The shape of a call that hit the trace cache (see the module's docstring)."""

    sig: Signature
    n_args: int
    kw: tuple[str, ...]
    where: tuple[tuple[Any, ...], ...]  # per argument, then per keyword argument
    kinds: tuple[str, ...]  # per state object: its StateKind's name
    keys: tuple[tuple, ...]  # per state object: its slot's key
    psig: ParamSig | None
    objs: tuple[Any, ...]  # the state objects, in order
    runs: tuple[tuple[str, int, int], ...]  # (kind, first, end): consecutive objects of one kind (_runs(kinds))


class Recent:
    """The last hits' patterns, the most recent first, all of the same state objects: a
    decode loop has one; an engine that runs chunks of several shapes through the same
    cache objects (a banded prefill, ``segc.engine``) has one per shape. A call with
    other objects drops them (``retain``): a pattern keeps its objects alive."""

    def __init__(self, size: int = 8):
        self.size = size
        self.items: list[Pattern] = []

    def matches(self, spec: CallSpec, args: tuple, kwargs: dict) -> Iterator[tuple[Pattern, Bound]]:
        for p in self.items:
            bound = match(p, spec, args, kwargs)
            if bound is not None:
                yield p, bound

    def hit(self, p: Pattern) -> Pattern:
        if self.items[0] is not p:
            self.items.remove(p)
            self.items.insert(0, p)
        return p

    def retain(self, objs: list[Any]) -> None:
        if self.items and not _same(self.items[0].objs, objs):
            self.items.clear()

    def add(self, p: Pattern | None) -> None:
        if p is not None:
            same = [q for q in self.items if q.sig != p.sig and _same(q.objs, p.objs)]
            self.items = [p, *same][: self.size]

    def clear(self) -> None:
        self.items.clear()


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def learn(
    spec: CallSpec,
    args: tuple,
    kwargs: dict,
    objs: list[Any],
    slots: list[st.Slot],
    leaves: list[mx.array],
    sig: Signature,
) -> Pattern | None:
    """The call's pattern, or None where this path does not apply (static arguments,
    captured state, containers, exact slots, arrays nested in arguments)."""
    if spec.static_argnums or spec.static_argnames or spec.state is not None:
        return None
    if not slots or any(s.mode != "dynamic" or s.kind not in st.KINDS for s in slots):
        return None
    values = [*args, *kwargs.values()]
    where: list[tuple[Any, ...]] = []
    found: list[Any] = []
    arrays: list[mx.array] = []
    for v in values:
        if isinstance(v, mx.array):
            where.append(("a", tuple(v.shape), v.dtype))
            arrays.append(v)
        elif isinstance(v, list | tuple) and v and all(any(x is o for o in objs) for x in v):
            where.append(("s", v, tuple(v)))
            found.extend(v)
        elif any(v is o for o in objs):
            where.append(("o", v))
            found.append(v)
        elif type(v) in _SCALARS:
            where.append(("c", type(v), v))
        else:
            return None
    same = operator.is_
    if len(found) != len(objs) or not all(map(same, found, objs)):
        return None
    if len(arrays) != len(leaves) or not all(map(same, arrays, leaves)):
        return None
    psig = spec.params.gather()[1] if spec.params is not None else None
    kinds, keys = tuple(s.kind for s in slots), tuple(s.key for s in slots)
    return Pattern(sig, len(args), tuple(kwargs), tuple(where), kinds, keys, psig, tuple(objs), _runs(kinds))


def _runs(kinds: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    out: list[tuple[str, int, int]] = []
    for i, k in enumerate(kinds):
        if out and out[-1][0] == k:
            out[-1] = (k, out[-1][1], i + 1)
        else:
            out.append((k, i, i + 1))
    return tuple(out)


def match(p: Pattern, spec: CallSpec, args: tuple, kwargs: dict) -> Bound | None:
    """The call's leaves, parameters and slots if it has pattern ``p``; else None."""
    if len(args) != p.n_args or len(kwargs) != len(p.kw) or tuple(kwargs) != p.kw:
        return None
    leaves: list[mx.array] = []
    objs: list[Any] = []
    for v, w in zip((*args, *kwargs.values()), p.where):
        tag = w[0]
        if tag == "a":
            if not isinstance(v, mx.array) or tuple(v.shape) != w[1] or v.dtype != w[2]:
                return None
            leaves.append(v)
        elif tag == "s":
            if v is not w[1] or len(v) != len(w[2]) or not all(map(operator.is_, v, w[2])):
                return None
            objs.extend(v)
        elif tag == "o":
            if v is not w[1]:
                return None
            objs.append(v)
        elif type(v) is not w[1] or v != w[2]:
            return None
    if len(objs) != len(p.kinds):
        return None
    slots: list[st.Slot] = []
    for kind, a, b in p.runs:  # a kind's own loop over its run of objects where it has one
        k = st.KINDS[kind]
        if k.rebind is not None:
            got = k.rebind(a, objs[a:b], p.keys[a:b])
            if got is None:
                return None
            slots += got
            continue
        for i in range(a, b):  # first: a pattern of other cache shapes fails at its first object
            s = k.slot(i, objs[i], None)
            if s is None or s.key != p.keys[i]:
                return None
            slots.append(s)
    params: dict[str, mx.array] = {}
    if spec.params is not None:
        params, psig = spec.params.gather()
        if psig is not p.psig and psig != p.psig:
            return None
        modes = spec.params.modes()
        if modes is not p.sig.modes and modes != p.sig.modes:
            return None
    return leaves, params, slots
