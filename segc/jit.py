"""``segc.jit``: the decorator, its trace cache, and staged ``.trace`` / ``.lower``.

In the manner of ``jax.jit``: calling the jitted function looks up its abstract
signature (pytree structure, static values, shapes and dtypes of array leaves and of
module parameters) in a cache; a miss traces, cuts, lowers and compiles, and records a
readable reason. ``.trace(*a)`` returns a :class:`Traced` stage, ``.lower(*a)`` a
:class:`Lowered` one (the segmented IR), whose ``.compile()`` gives the callable
:class:`Compiled`, which refuses arguments of another signature.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from . import trace as tracing
from .errors import SignatureError, TraceError
from .ir import Graph, Segment, segments, verify
from .pytree import TreeDef, flatten, unflatten
from .runtime.executor import Executor


@dataclass(frozen=True)
class Signature:
    """The abstract signature that keys the trace cache."""

    tree: TreeDef
    leaves: tuple[tuple[tuple[int, ...], str], ...]
    params: tuple[tuple[str, tuple[int, ...], str], ...]

    def explain_change(self, old: Signature | None) -> str:
        if old is None:
            return "first call"
        if old.tree != self.tree:
            return f"argument structure changed: {old.tree} -> {self.tree}"
        for k, (a, b) in enumerate(zip(old.leaves, self.leaves)):
            if a != b:
                return f"array argument {k}: {_aval(*a)} -> {_aval(*b)}"
        if old.params != self.params:
            for p, q in zip(old.params, self.params):
                if p != q:
                    return f"parameter {q[0]!r}: {_aval(p[1], p[2])} -> {_aval(q[1], q[2])}"
            return "the module's parameter set changed"
        return "a different signature"


def _aval(shape: tuple[int, ...], dtype: str) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


@dataclass
class CacheInfo:
    hits: int = 0
    misses: int = 0
    retraces: list[str] = field(default_factory=list)
    trace_seconds: float = 0.0

    @property
    def traces(self) -> int:
        return self.misses


class Traced:
    """The traced IR of one signature, before cut placement."""

    def __init__(self, jitted: Jitted, sig: Signature, graph: Graph, out_tree: TreeDef):
        self.jitted, self.signature, self.graph, self.out_tree = jitted, sig, graph, out_tree

    def as_text(self) -> str:
        return self.graph.as_text()

    def lower(self) -> Lowered:
        return Lowered(self, self.graph)


class Lowered:
    """The segmented IR: segments derived from the cuts in the graph."""

    def __init__(self, traced: Traced, graph: Graph):
        self.traced = traced
        self.graph = verify(graph)

    @property
    def segments(self) -> list[Segment]:
        return segments(self.graph)

    def as_text(self) -> str:
        return self.graph.as_text()

    def __str__(self) -> str:
        return self.as_text()

    def compile(self, *, drain: bool = False) -> Compiled:
        return Compiled(self, drain=drain)


class Compiled:
    """A callable for one signature. Calling it with another signature raises."""

    def __init__(self, lowered: Lowered, *, drain: bool = False, compile: bool = True):
        self.lowered = lowered
        self.graph = lowered.graph
        self.executor = Executor(self.graph, compile=compile, drain=drain)
        t = lowered.traced
        self.signature = t.signature
        self.out_tree = t.out_tree
        self._param_order = [i.path for i in self.graph.inputs if i.kind == "param"]

    @property
    def segments(self) -> list[Segment]:
        return self.executor.segments

    def as_text(self) -> str:
        return self.graph.as_text()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sig, leaves, params = self.lowered.traced.jitted._abstract(args, kwargs)
        if sig != self.signature:
            raise SignatureError(
                f"{self.graph.name} was compiled for another signature: {sig.explain_change(self.signature)}"
            )
        return self._run(leaves, params)

    def _run(self, leaves: list[mx.array], params: dict[str, mx.array]) -> Any:
        inputs = leaves + [params[p] for p in self._param_order]
        return unflatten(self.out_tree, self.executor(inputs))


class Jitted:
    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        boundaries: str | Sequence[str] | None = None,
        static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
        drain: bool = False,
        name: str | None = None,
    ):
        if not callable(fn):
            raise TraceError(f"segc.jit needs a function or an nn.Module, got {type(fn).__name__}")
        self.module = fn if isinstance(fn, nn.Module) else None
        self.fn = fn
        self.boundaries = [boundaries] if isinstance(boundaries, str) else list(boundaries or [])
        if self.boundaries and self.module is None:
            raise TraceError("boundaries= globs name submodules: pass an nn.Module to segc.jit")
        if self.module is not None and self.boundaries and not tracing.matching_modules(self.module, self.boundaries):
            raise TraceError(f"boundaries {self.boundaries} match no submodule of {type(self.module).__name__}")
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        self.drain = drain
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self._cache: dict[Signature, Compiled] = {}
        self._last: Signature | None = None
        self.info = CacheInfo()
        functools.update_wrapper(self, fn if not isinstance(fn, nn.Module) else type(fn).__call__, updated=())  # type: ignore[arg-type]

    # ----------------------------------------------------------------- signature

    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        static: list[tuple[str, Any, Any]] = []
        for i in self.static_argnums:
            if i >= len(args):
                raise SignatureError(f"static_argnums has {i} but {self.name} got {len(args)} positional arguments")
            static.append(("arg", i, args[i]))
        for n in self.static_argnames:
            if n in kwargs:
                static.append(("kw", n, kwargs[n]))
        dyn_args = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        dyn_kw = {k: v for k, v in sorted(kwargs.items()) if k not in self.static_argnames}
        for _, where, v in static:
            try:
                hash(v)
            except TypeError:
                raise SignatureError(
                    f"static argument {where!r} of {self.name} is not hashable ({type(v).__name__})"
                ) from None
        return dyn_args, dyn_kw, tuple(static)

    def _abstract(self, args: tuple, kwargs: dict) -> tuple[Signature, list[mx.array], dict[str, mx.array]]:
        dyn_args, dyn_kw, static = self._split(args, kwargs)
        leaves, _, td = flatten((dyn_args, dyn_kw, static), what="argument", names=_ROOTS)
        params = self._params()
        sig = Signature(
            td,
            tuple((tuple(x.shape), _short(x.dtype)) for x in leaves),
            tuple((k, tuple(v.shape), _short(v.dtype)) for k, v in params.items()),
        )
        return sig, leaves, params

    def _params(self) -> dict[str, mx.array]:
        if self.module is None:
            return {}
        params = dict(tree_flatten(self.module.parameters()))
        for k, v in params.items():
            if not isinstance(v, mx.array):
                raise TraceError(f"parameter {k!r} of {self.name} is a {type(v).__name__}, not an mx.array")
        return params

    # ----------------------------------------------------------------- stages

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        sig, leaves, params = self._abstract(args, kwargs)
        return self._trace(sig, args, kwargs, leaves, params)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        return self.trace(*args, **kwargs).lower()

    def _trace(self, sig: Signature, args: tuple, kwargs: dict, leaves: list[mx.array], params: dict) -> Traced:
        dyn_args, dyn_kw, static = self._split(args, kwargs)
        _, paths, td = flatten((dyn_args, dyn_kw, static), what="argument", names=_ROOTS)

        def rebuild(xs: list[mx.array]) -> tuple[tuple, dict]:
            d_args, d_kw, st = unflatten(td, xs)
            full = list(d_args)
            for kind, where, v in st:
                if kind == "arg":
                    full.insert(where, v)
            kw = dict(d_kw)
            kw.update({where: v for kind, where, v in st if kind == "kw"})
            return tuple(full), kw

        module = self.module
        original = module.parameters() if module is not None else None

        def bind(pkw: dict[str, mx.array]) -> None:
            assert module is not None
            module.update(tree_unflatten(list(pkw.items())))

        globs = self.boundaries

        def fn(*a: Any, **k: Any) -> Any:
            with tracing.module_boundaries(module, globs):
                return self.fn(*a, **k)

        t0 = time.perf_counter()
        try:
            tr = tracing.trace(
                fn,
                leaves,
                paths,
                rebuild,
                params=params,
                bind_params=bind if module is not None else None,
                name=self.name,
            )
        finally:
            if module is not None and original is not None:
                module.update(original)
        self.info.trace_seconds += time.perf_counter() - t0
        return Traced(self, sig, tr.graph, tr.out_tree)

    # ----------------------------------------------------------------- calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sig, leaves, params = self._abstract(args, kwargs)
        c = self._cache.get(sig)
        if c is None:
            self.info.misses += 1
            self.info.retraces.append(sig.explain_change(self._last))
            c = self._trace(sig, args, kwargs, leaves, params).lower().compile(drain=self.drain)
            self._cache[sig] = c
        else:
            self.info.hits += 1
        self._last = sig
        return c._run(leaves, params)

    def cache_info(self) -> CacheInfo:
        return self.info

    def clear_cache(self) -> None:
        self._cache.clear()
        self._last = None


def _short(dt: mx.Dtype) -> str:
    from .dtypes import short

    return short(dt)


_ROOTS = ("args", "kwargs", "static")


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Trace ``fn`` (a function or an ``nn.Module``) once per signature and run it segmented.

    Options: ``boundaries`` (globs over submodule paths, e.g. ``"layers.*"``: a boundary
    after each matching submodule), ``static_argnums``, ``static_argnames``,
    ``drain`` (host ``mx.eval`` after every segment: a baseline for benchmarks), ``name``.
    Usable as ``@segc.jit`` or ``@segc.jit(boundaries=...)``.
    """
    if fn is None:
        return lambda f: Jitted(f, **options)
    return Jitted(fn, **options)
