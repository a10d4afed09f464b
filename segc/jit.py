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
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from . import state as st
from . import trace as tracing
from .dtypes import short as _dtype_short
from .errors import SignatureError, TraceError
from .ir import Graph, Segment, segments, verify
from .pytree import TreeDef, flatten, unflatten
from .runtime.executor import Executor, donate_state
from .runtime.params import ParamGatherer, ParamSig


@dataclass(frozen=True)
class Signature:
    """The abstract signature that keys the trace cache."""

    tree: TreeDef
    leaves: tuple[tuple[tuple[int, ...], str], ...]
    params: tuple[tuple[str, tuple[int, ...], str], ...]
    state: tuple[tuple, ...] = ()

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
        if old.state != self.state:
            if len(old.state) != len(self.state):
                return f"number of state objects: {len(old.state)} -> {len(self.state)}"
            for k, (a, b) in enumerate(zip(old.state, self.state)):
                if a != b:
                    return f"state[{k}]: {_state_str(a)} -> {_state_str(b)}"
        return "a different signature"


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


@dataclass
class CacheInfo:
    hits: int = 0
    misses: int = 0
    retraces: list[str] = field(default_factory=list)
    trace_seconds: float = 0.0
    # traces abandoned because a state object had to grow or switch to exact mode first
    aborted: list[str] = field(default_factory=list)

    @property
    def traces(self) -> int:
        return self.misses


class Traced:
    """The traced IR of one signature, before cut placement."""

    def __init__(self, jitted: Jitted, sig: Signature, graph: Graph, out_tree: TreeDef):
        self.jitted, self.signature, self.graph, self.out_tree = jitted, sig, graph, out_tree
        self.commits: tuple[st.Commit, ...] = ()  # per state object: how its outputs are written back
        self.exact: frozenset[int] = frozenset()  # state objects traced in exact mode

    def as_text(self) -> str:
        return self.graph.as_text()

    def lower(self, strategy: Any = None) -> Lowered:
        """Place the cuts by ``strategy`` (default: the jit's; see ``segc.passes.place``)."""
        from .passes.pipeline import place

        return Lowered(self, place(self.graph, strategy if strategy is not None else self.jitted.strategy))


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
        self.commits = t.commits
        self.exact = t.exact
        self._n_state_out = sum(len(c.outputs) for c in self.commits)
        self._ran = False
        self._param_order = [i.path for i in self.graph.inputs if i.kind == "param"]

    @property
    def segments(self) -> list[Segment]:
        return self.executor.segments

    def as_text(self) -> str:
        return self.graph.as_text()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        jitted = self.lowered.traced.jitted
        args, kwargs, objs = jitted._extract(args, kwargs)
        slots = [st.make_slot(i, o, exact=i in self.exact) for i, o in enumerate(objs)]
        sig, leaves, params = jitted._abstract(args, kwargs, slots)
        if sig != self.signature:
            raise SignatureError(
                f"{self.graph.name} was compiled for another signature: {sig.explain_change(self.signature)}"
            )
        if any(st.needs_growth(s, c) for s, c in zip(slots, self.commits)):
            raise SignatureError(f"{self.graph.name}: a KV cache must grow first; call the jitted function instead")
        return self._run(leaves, params, slots)

    def _run(self, leaves: list[mx.array], params: dict[str, mx.array], slots: Sequence[st.Slot] = ()) -> Any:
        inputs = leaves + [x for s in slots for x in s.inputs] + [params[p] for p in self._param_order]
        # Once this signature has run, hand KV-cache buffers that the call rewrites to the
        # executor alone: MLX then updates them in place instead of copying every cache on
        # every decode step (the commit below puts the results back into the objects).
        donate = self._ran and donate_state(slots, self.commits)
        outs = self.executor(inputs, consume=donate)
        self._ran = True
        n = len(outs) - self._n_state_out
        k = n
        for s, c in zip(slots, self.commits):
            st.commit(s, c, outs[k : k + len(c.outputs)])
            k += len(c.outputs)
        return unflatten(self.out_tree, outs[:n])


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
        state: Sequence[Any] | Callable[[], Sequence[Any]] | None = None,
        state_mode: str = "auto",
        strategy: Any = None,
        validate: bool = True,
    ):
        if not callable(fn):
            raise TraceError(f"segc.jit needs a function or an nn.Module, got {type(fn).__name__}")
        self.module = fn if isinstance(fn, nn.Module) else None
        self.fn = fn
        if boundaries == "auto":
            boundaries = tracing.auto_boundaries(self.module) if self.module is not None else None
        if boundaries is not None and not isinstance(boundaries, str | list | tuple):
            raise TraceError(f"boundaries= takes a glob or a list of globs, got {type(boundaries).__name__}")
        self.boundaries = [boundaries] if isinstance(boundaries, str) else list(boundaries or [])
        if state_mode not in ("auto", "exact"):
            raise TraceError(f"state_mode must be 'auto' or 'exact', got {state_mode!r}")
        self.state_mode = state_mode
        self._state = state
        self._exact_after: dict[Signature, frozenset[int]] = {}
        if self.boundaries and self.module is None:
            raise TraceError("boundaries= globs name submodules: pass an nn.Module to segc.jit")
        if self.module is not None and self.boundaries and not tracing.matching_modules(self.module, self.boundaries):
            raise TraceError(f"boundaries {self.boundaries} match no submodule of {type(self.module).__name__}")
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        if not all(isinstance(i, int) for i in self.static_argnums):
            raise TraceError(f"static_argnums takes ints, got {static_argnums!r}")
        if not all(isinstance(n, str) for n in self.static_argnames):
            raise TraceError(f"static_argnames takes strings, got {static_argnames!r}")
        self.drain = drain
        self.validate = validate  # check each new dynamic-cache graph against eager once
        self.strategy = strategy  # cut placement (segc.passes): None keeps the markers' cuts
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self._cache: dict[Signature, Compiled] = {}
        self._last: Signature | None = None
        self.info = CacheInfo()
        self._gather = ParamGatherer(self.module, self.name) if self.module is not None else None
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

    def _extract(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, list[Any]]:
        """Replace state objects in the arguments by markers; add the explicit ``state=``."""
        objs: list[Any] = []
        args = st.extract(args, objs)
        kwargs = st.extract(kwargs, objs)
        named = self._state() if callable(self._state) else self._state
        for o in named or ():
            if isinstance(o, mx.array) or not hasattr(o, "__dict__"):
                raise st.StateError(
                    f"state= of {self.name} holds a {type(o).__name__}; name objects whose attributes it mutates"
                )
            if not any(o is x for x in objs):
                objs.append(o)
        return args, kwargs, objs

    def _abstract(
        self, args: tuple, kwargs: dict, slots: Sequence[st.Slot] = ()
    ) -> tuple[Signature, list[mx.array], dict[str, mx.array]]:
        dyn_args, dyn_kw, static = self._split(args, kwargs)
        leaves, _, td = flatten((dyn_args, dyn_kw, static), what="argument", names=_ROOTS)
        params, psig = self._gather.gather() if self._gather is not None else ({}, ParamSig())
        state = tuple(s.key for s in slots)
        sig = Signature(td, tuple((tuple(x.shape), _short(x.dtype)) for x in leaves), psig, state)
        return sig, leaves, params

    def _params(self) -> dict[str, mx.array]:
        # read-only: shared between calls while the parameters do not change
        return self._gather.gather()[0] if self._gather is not None else {}

    # ----------------------------------------------------------------- stages

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        args, kwargs, objs = self._extract(args, kwargs)
        return self._settle(args, kwargs, objs, cached=False)[0]

    def lower(self, *args: Any, strategy: Any = None, **kwargs: Any) -> Lowered:
        return self.trace(*args, **kwargs).lower(strategy)

    def _trace(
        self,
        sig: Signature,
        args: tuple,
        kwargs: dict,
        leaves: list[mx.array],
        params: dict,
        slots: Sequence[st.Slot] = (),
    ) -> Traced:
        self._check_call(args, kwargs)
        dyn_args, dyn_kw, static = self._split(args, kwargs)
        _, paths, td = flatten((dyn_args, dyn_kw, static), what="argument", names=_ROOTS)
        n_args = len(leaves)
        objs = [s.obj for s in slots]
        held: dict[str, list[mx.array]] = {}

        def rebuild(xs: list[mx.array]) -> tuple[tuple, dict]:
            held["state"] = xs[n_args:]
            d_args, d_kw, stat = unflatten(td, xs[:n_args])
            full = list(d_args)
            for kind, where, v in stat:
                if kind == "arg":
                    full.insert(where, v)
            kw = dict(d_kw)
            kw.update({where: v for kind, where, v in stat if kind == "kw"})
            return st.restore(tuple(full), objs), st.restore(kw, objs)

        module = self.module
        original = module.parameters() if module is not None else None

        def bind(pkw: dict[str, mx.array]) -> None:
            assert module is not None
            module.update(tree_unflatten(list(pkw.items())))

        globs = self.boundaries

        recorded: list[st.Commit] = []

        def fn(*a: Any, **k: Any) -> Any:
            xs, per_slot = held["state"], []
            for s in slots:
                per_slot.append(xs[: len(s.inputs)])
                xs = xs[len(s.inputs) :]
            with st.swapped(list(slots), per_slot) as recs, tracing.module_boundaries(module, globs):
                out = self.fn(*a, **k)
                outs = [st.outputs_after(s, r) for s, r in zip(slots, recs)]
                recorded[:] = [st.commit_plan(s, r) for s, r in zip(slots, recs)]
            return (out, tuple(x for o in outs for x in o)) if slots else out

        state_paths = [f"state[{s.index}].{n}" for s in slots for n in s.names]
        t0 = time.perf_counter()
        try:
            tr = tracing.trace(
                fn,
                leaves + [x for s in slots for x in s.inputs],
                list(paths) + state_paths,
                rebuild,
                kinds=["arg"] * n_args + ["state"] * len(state_paths),
                params=params,
                bind_params=bind if module is not None else None,
                name=self.name,
            )
        finally:
            if module is not None and original is not None:
                module.update(original)
        self.info.trace_seconds += time.perf_counter() - t0
        out_tree = tr.out_tree.children[0] if slots else tr.out_tree
        t = Traced(self, sig, tr.graph, out_tree)
        t.commits = tuple(recorded)
        t.exact = frozenset(s.index for s in slots if s.mode == "exact")
        return t

    def _check_call(self, args: tuple, kwargs: dict) -> None:
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

    # ----------------------------------------------------------------- calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, objs = self._extract(args, kwargs)
        if not objs:
            sig, leaves, params = self._abstract(args, kwargs)
            c = self._cache.get(sig)
            if c is None:
                c = self._trace(sig, args, kwargs, leaves, params).lower().compile(drain=self.drain)
                self.info.misses += 1
                self.info.retraces.append(sig.explain_change(self._last))
                self._cache[sig] = c
            else:
                self.info.hits += 1
            self._last = sig
            return c._run(leaves, params)
        misses = self.info.misses
        _, c, leaves, params, slots = self._settle(args, kwargs, objs, cached=True)
        assert c is not None
        if self.validate and self.info.misses != misses and any(s.mode == "dynamic" for s in slots):
            return self._validated(c, args, kwargs, objs, leaves, params, slots)
        return c._run(leaves, params, slots)

    def _validated(
        self,
        c: Compiled,
        args: tuple,
        kwargs: dict,
        objs: list[Any],
        leaves: list[mx.array],
        params: dict[str, mx.array],
        slots: list[st.Slot],
    ) -> Any:
        """The first call of a graph with dynamic KV caches, checked against eager.

        A dynamic cache hands the model its whole buffer, masked; model code that derives
        positions from the fetched keys' length (phi3small's block-sparse attention) then
        computes something else. So the first call of every such graph also runs the
        model eagerly on copies of the caches and compares outputs and caches: bit for
        bit on the CPU, within ``VALIDATE_TOL`` elsewhere (where a masked attention
        kernel rounds differently, docs/models.md). On a mismatch the caller's caches
        are rolled back, this function switches to ``state_mode="exact"`` and the call
        runs again; ``cache_info().aborted`` says why.
        """
        saved = [st.snapshot(o) for o in objs]
        for o in objs:  # the eager reference mutates fresh arrays, also of captured caches
            st.roll_back(o, st.fresh_attrs(o))
        try:
            ref = self.fn(*st.restore(args, objs), **st.restore(kwargs, objs))
            eager_state = [st.observable(o) for o in objs]
        finally:
            for o, snap in zip(objs, saved):
                st.roll_back(o, snap)
        out = c._run(leaves, params, slots)
        why = _disagreement(out, ref, [st.observable(o) for o in objs], eager_state)
        if why is None:
            return out
        for o, snap in zip(objs, saved):
            st.roll_back(o, snap)
        self.info.aborted.append(f"dynamic KV caches disagree with eager ({why}): state_mode='exact' from now on")
        self.state_mode = "exact"
        self._cache.clear()
        self._exact_after.clear()
        _, c2, leaves, params, slots = self._settle(args, kwargs, objs, cached=True)
        assert c2 is not None
        return c2._run(leaves, params, slots)

    def _settle(
        self, args: tuple, kwargs: dict, objs: list[Any], *, cached: bool
    ) -> tuple[Traced, Compiled | None, list[mx.array], dict[str, mx.array], list[st.Slot]]:
        """Find (or trace) the graph for a call with state objects.

        A dynamic KV cache that must grow is grown on the host first (as mlx-lm would grow
        it) and the signature looked up again; a state object the dynamic stand-in cannot
        serve is traced in exact mode. Nothing is written into ``objs`` here.
        """
        exact: set[int] = set(range(len(objs))) if self.state_mode == "exact" else set()
        grown: dict[int, dict[str, Any]] = {}
        for _ in range(2 * len(objs) + 4):
            slots = [st.make_slot(i, o, exact=i in exact, grown=grown.get(i)) for i, o in enumerate(objs)]
            sig, leaves, params = self._abstract(args, kwargs, slots)
            c = self._cache.get(sig) if cached else None
            if c is None and sig in self._exact_after:
                exact |= self._exact_after[sig]
                continue
            if c is not None:
                growing = [s for s, p in zip(slots, c.commits) if st.needs_growth(s, p)]
                if growing:
                    n = max(p.n for p in c.commits)
                    self._grow(slots, n, grown)
                    continue
                self.info.hits += 1
                self._last = sig
                return c.lowered.traced, c, leaves, params, slots
            try:
                t = self._trace(sig, args, kwargs, leaves, params, slots)
            except st._Grow as g:
                self.info.aborted.append(f"state[{g.slot}] grows for {g.n} more tokens")
                self._grow(slots, g.n, grown)
                continue
            except st._Exact as e:
                self.info.aborted.append(f"state[{e.slot}] traced in exact mode: {e.why}")
                # every state object of that kind is likely to need the same: switch them together
                exact |= {s.index for s in slots if s.kind == slots[e.slot].kind}
                self._exact_after[sig] = frozenset(exact)
                continue
            if not cached:
                return t, None, leaves, params, slots
            self.info.misses += 1
            self.info.retraces.append(sig.explain_change(self._last))
            c = t.lower().compile(drain=self.drain)
            self._cache[sig] = c
            self._last = sig
            return t, c, leaves, params, slots
        raise st.StateError(f"{self.name}: the state objects' layout did not settle: {self.info.aborted[-3:]}")

    @staticmethod
    def _grow(slots: Sequence[st.Slot], n: int, grown: dict[int, dict[str, Any]]) -> None:
        """Grow (on the host, uncommitted) every dynamic KV cache that cannot take ``n`` more tokens."""
        for s in slots:
            if s.kind == "kv" and s.key[1] is not None and s.host["offset"] + n > s.key[1][0][2]:
                grown[s.index] = st.grow(s.obj, n)

    def cache_info(self) -> CacheInfo:
        return self.info

    def clear_cache(self) -> None:
        self._cache.clear()
        self._last = None


VALIDATE_TOL = 1e-2  # off the CPU: |segc - eager| <= tol * (1 + |eager|), as the GPU zoo test allows


def _close(a: Any, b: Any) -> bool:
    if not isinstance(a, mx.array) or not isinstance(b, mx.array):
        return bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if mx.default_device() == mx.cpu:
        return bool(mx.array_equal(a, b, equal_nan=True).item())
    return bool(mx.allclose(a, b, rtol=VALIDATE_TOL, atol=VALIDATE_TOL, equal_nan=True).item())


def _disagreement(out: Any, ref: Any, state: Sequence[list], eager_state: Sequence[list]) -> str | None:
    """Why segc's outputs and caches differ from eager's, or None."""
    got, _, _ = flatten(out, what="output")
    want, _, _ = flatten(ref, what="output")
    if len(got) != len(want) or not all(_close(a, b) for a, b in zip(got, want)):
        return "outputs differ"
    for k, (a, b) in enumerate(zip(state, eager_state)):
        if len(a) != len(b) or not all(_close(x, y) for x, y in zip(a, b)):
            return f"state[{k}] differs"
    return None


def _short(dt: mx.Dtype) -> str:
    return _dtype_short(dt)


_ROOTS = ("args", "kwargs", "static")


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Trace ``fn`` (a function or an ``nn.Module``) once per signature and run it segmented.

    Options: ``boundaries`` (globs over submodule paths, e.g. ``"layers.*"``: a boundary
    after each matching submodule; ``"auto"``: after each block of the model's
    ``layers`` list), ``static_argnums``, ``static_argnames``,
    ``drain`` (host ``mx.eval`` after every segment: a baseline for benchmarks), ``name``,
    ``state`` (objects ``fn`` captures and mutates, e.g. KV caches; caches passed as
    arguments are found automatically), ``state_mode`` (``"auto"``: dynamic KV caches
    that do not retrace per token; ``"exact"``: every state object functionalized as
    is, retracing when its offset changes). See :mod:`segc.state`.
    ``strategy`` (cut placement: ``"balanced:4"``, a saved ``segc.passes.Plan``, a
    callable, ...; see :mod:`segc.passes.strategies`), ``validate`` (default True: the
    first call of each graph with dynamic KV caches is also run eagerly on copies of the
    caches and compared; on a mismatch the function falls back to ``state_mode="exact"``).
    Usable as ``@segc.jit`` or ``@segc.jit(boundaries=...)``.
    """
    if fn is None:
        return lambda f: Jitted(f, **options)
    return Jitted(fn, **options)
