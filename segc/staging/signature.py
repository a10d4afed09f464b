"""The trace cache's key: how a call's arguments become an abstract :class:`Signature`
and the flat list of graph inputs.

:class:`CallSpec` holds what a jitted function knows about its calls (static argument
positions and names, the explicit ``state=`` objects, the module's parameters) and
turns one call into ``(signature, array leaves, parameters)``; the jitted function and
its compiled stages share it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from ..dtypes import short
from ..errors import SignatureError, TraceError
from ..trace import state as st
from ..trace.params import ParamGatherer, ParamSig
from ..trace.pytree import TreeDef, flatten

ROOTS = ("args", "kwargs", "static")


def _aval(shape: tuple[int, ...], dtype: str) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def _state_str(key: tuple) -> str:
    def one(x: Any) -> str:
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple) and isinstance(x[1], str):
            return _aval(*x)
        if isinstance(x, tuple) and len(x) == 3 and x[1] in ("array", "static"):
            return f"{x[0]}={one(x[2])}"
        if isinstance(x, tuple):
            return "(" + ", ".join(one(y) for y in x) + ")"
        return str(x)

    return f"{key[0]}{one(tuple(key[1:]))}"


def _static_change(a: TreeDef, b: TreeDef, path: str) -> str | None:
    """``static value PATH: OLD -> NEW`` where two trees of one structure first differ in a
    static leaf; None where the structures differ."""
    if a.kind != b.kind or len(a.children) != len(b.children) or (a.kind == "dict" and a.keys != b.keys):
        return None
    if a.kind == "static":
        return None if a.keys == b.keys else f"static value {path}: {a.value!r} -> {b.value!r}"
    for i, (x, y) in enumerate(zip(a.children, b.children)):
        if not path:  # the root: (args, kwargs, static)
            sub = ROOTS[i]
        elif a.kind == "dict":
            sub = f"{path}[{a.keys[i]!r}]"
        else:
            sub = f"{path}[{i}]"
        found = _static_change(x, y, sub)
        if found is not None:
            return found
    return None


def _modes_str(modes: tuple[bool, ...]) -> str:
    if all(modes):
        return "train"
    if not any(modes):
        return "eval"
    return f"{sum(modes)} of {len(modes)} submodules in train"


@dataclass(frozen=True)
class Signature:
    """The abstract signature that keys the trace cache."""

    tree: TreeDef
    leaves: tuple[tuple[tuple[int, ...], str], ...]
    params: tuple[tuple[str, tuple[int, ...], str], ...]
    state: tuple[tuple, ...] = ()
    paths: tuple[str, ...] = field(default=(), compare=False)  # each array leaf's path, for messages
    modes: tuple[bool, ...] = ()  # each submodule's training flag (ParamGatherer.modes)

    def __hash__(self) -> int:
        """Hashed once: a decode loop looks its signature up on every call, and the
        parameters alone are hundreds of nested tuples."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.tree, self.leaves, self.params, self.state, self.modes))
            object.__setattr__(self, "_hash", h)
        return h

    def closest(self, cached: Sequence[Signature]) -> Signature | None:
        """The cached signature this one was expected to hit: the same argument
        structure first, then the most equal leaves, parameters and state objects (the
        latest in ``cached`` on a tie)."""
        best, score = None, -1
        for s in cached:
            sc = (s.tree == self.tree) * (1 << 30) + sum(a == b for a, b in zip(s.leaves, self.leaves))
            sc += (s.params == self.params) + sum(a == b for a, b in zip(s.state, self.state))
            sc += s.modes == self.modes
            if sc >= score:
                best, score = s, sc
        return best

    def explain_change(self, old: Signature | None) -> str:
        if old is None:
            return "first call"
        if old.tree != self.tree:
            where = _static_change(old.tree, self.tree, "")
            return where or f"argument structure changed: {old.tree} -> {self.tree}"
        for k, (a, b) in enumerate(zip(old.leaves, self.leaves)):
            if a != b:
                where = self.paths[k] if k < len(self.paths) else f"array argument {k}"
                return f"{where}: {_aval(*a)} -> {_aval(*b)}"
        if old.params != self.params:
            for p, q in zip(old.params, self.params):
                if p != q:
                    return f"parameter {q[0]!r}: {_aval(p[1], p[2])} -> {_aval(q[1], q[2])}"
            return "the module's parameter set changed"
        if old.modes != self.modes:
            return f"the module's train/eval mode changed: {_modes_str(old.modes)} -> {_modes_str(self.modes)}"
        if old.state != self.state:
            if len(old.state) != len(self.state):
                return f"number of state objects: {len(old.state)} -> {len(self.state)}"
            for k, (a, b) in enumerate(zip(old.state, self.state)):
                if a != b:
                    return f"state[{k}]: {_state_str(a)} -> {_state_str(b)}"
        return "a different signature"


@dataclass
class CacheInfo:
    hits: int = 0
    misses: int = 0
    retraces: list[str] = field(default_factory=list)
    trace_seconds: float = 0.0
    # traces abandoned because a state object had to grow or switch to exact mode first
    aborted: list[str] = field(default_factory=list)
    evictions: int = 0  # entries dropped by the cache bound (least recently used first)
    eager_calls: int = 0  # calls run eagerly (a state object segc does not trace, with a warning)

    @property
    def traces(self) -> int:
        return self.misses


class CallSpec:
    """Turns a call's arguments into a signature and graph inputs (see the module)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        static_argnums: tuple[int, ...],
        static_argnames: tuple[str, ...],
        state: Sequence[Any] | Callable[[], Sequence[Any]] | None,
        params: ParamGatherer | None,
    ):
        self.fn, self.name = fn, name
        self.static_argnums, self.static_argnames = static_argnums, static_argnames
        self.state = state
        self.params = params

    def split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        """(dynamic positional arguments, dynamic keywords, static values)."""
        static: list[tuple[str, Any, Any]] = []
        nums = self.static_positions(len(args))
        for i in nums:
            static.append(("arg", i, args[i]))
        for n in self.static_argnames:
            if n in kwargs:
                static.append(("kw", n, kwargs[n]))
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
        dyn_kw = {k: v for k, v in sorted(kwargs.items()) if k not in self.static_argnames}
        for _, where, v in static:
            try:
                hash(v)
            except TypeError:
                raise SignatureError(
                    f"static argument {where!r} of {self.name} is not hashable ({type(v).__name__})"
                ) from None
        return dyn_args, dyn_kw, tuple(static)

    def static_positions(self, n_args: int) -> tuple[int, ...]:
        """``static_argnums`` for a call with ``n_args`` positional arguments: negative
        ones counted from the end, each once, in order (as ``jax.jit`` normalises them)."""
        if not self.static_argnums:
            return ()
        out = set()
        for i in self.static_argnums:
            j = i + n_args if i < 0 else i
            if not 0 <= j < n_args:
                raise SignatureError(f"static_argnums has {i} but {self.name} got {n_args} positional arguments")
            out.add(j)
        return tuple(sorted(out))

    def extract(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, list[Any]]:
        """Replace state objects in the arguments by markers; add the explicit ``state=``."""
        objs: list[Any] = []
        args = st.extract(args, objs)
        kwargs = st.extract(kwargs, objs)
        named = self.state() if callable(self.state) else self.state
        if named is not None and not isinstance(named, list | tuple):
            raise st.StateError(
                f"state= of {self.name} {'returned' if callable(self.state) else 'is'} a {type(named).__name__}; "
                "it takes a list of the objects the function mutates (state=[cache], or a function returning one)"
            )
        for o in named or ():
            if isinstance(o, mx.array) or not hasattr(o, "__dict__"):
                raise st.StateError(
                    f"state= of {self.name} holds a {type(o).__name__}; name objects whose attributes it mutates"
                )
            if not any(o is x for x in objs):
                objs.append(o)
        return args, kwargs, objs

    def abstract(
        self, args: tuple, kwargs: dict, slots: Sequence[st.Slot] = ()
    ) -> tuple[Signature, list[mx.array], dict[str, mx.array]]:
        """The call's signature, its array leaves and the module's parameters."""
        dyn_args, dyn_kw, static = self.split(args, kwargs)
        leaves, paths, td = flatten((dyn_args, dyn_kw, static), what="argument", names=ROOTS)
        params, psig = self.params.gather() if self.params is not None else ({}, ParamSig())
        modes = self.params.modes() if self.params is not None else ()
        state = tuple(s.key for s in slots)
        avals = tuple((tuple(x.shape), short(x.dtype)) for x in leaves)
        sig = Signature(td, avals, psig, state, tuple(paths), modes)
        return sig, leaves, params

    def check_call(self, args: tuple, kwargs: dict) -> None:
        """A call that does not fit the function's signature is a SignatureError here,
        not a TypeError from inside MLX's graph capture."""
        try:
            sig = inspect.signature(self.fn)
        except (TypeError, ValueError):  # no introspectable signature: let the call decide
            return
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise SignatureError(f"{self.name}: {exc}") from None


def as_tuple(x: Any, kind: type, what: str) -> tuple:
    """``static_argnums``-like options as a tuple of ``kind``, or a TraceError."""
    words = {int: "ints", str: "strings"}[kind]
    try:
        out = (x,) if isinstance(x, kind) else tuple(x)
    except TypeError:
        raise TraceError(f"{what} takes {words}, got {x!r}") from None
    if not all(isinstance(i, kind) and not isinstance(i, bool) for i in out):
        raise TraceError(f"{what} takes {words}, got {x!r}")
    return out


def check_state_option(state: Any, name: str) -> None:
    """``state=`` is a list of objects, or a function giving one (checked at each call)."""
    if state is None or callable(state) or isinstance(state, list | tuple):
        return
    raise st.StateError(
        f"state= of {name} is a {type(state).__name__}; it takes a list of the objects the function "
        "mutates (state=[cache]), or a function returning one"
    )


def check_static_names(fn: Any, names: tuple[str, ...], name: str) -> None:
    """Each ``static_argnames`` entry names a parameter of ``fn`` (unless it takes
    ``**kwargs``), so that a misspelt name is refused here, not silently traced."""
    if not names:
        return
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no introspectable signature: nothing to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = [n for n in names if n not in params]
    if unknown:
        raise TraceError(f"static_argnames {unknown} name no parameter of {name} (its parameters: {list(params)})")
