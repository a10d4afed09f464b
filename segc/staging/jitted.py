"""``segc.jit``: the decorator and its trace cache.

In the manner of ``jax.jit``: calling the jitted function looks up its abstract
signature (pytree structure, static values, shapes and dtypes of array leaves, of module
parameters and of state objects) in a cache; a miss traces, cuts, lowers and compiles,
and records a readable reason (:attr:`Jitted.info`).
"""

from __future__ import annotations

import functools
import gc
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..errors import SegcWarning, StateError, TraceError, UsageError
from ..lower import ATTENTION
from ..runtime import DISPATCH_LOCK, resolve_commit
from ..runtime.fenced import WindowRun
from ..trace import module_boundaries, trace, tracing
from ..trace import state as st
from ..trace.boundaries import resolve_boundaries
from ..trace.clone import clone_modules
from ..trace.params import ParamGatherer
from ..trace.pytree import flatten, unflatten
from . import fastpath, rng
from .concat import Concats
from .effects import EngineHooks
from .signature import ROOTS, CacheInfo, CallSpec, Signature, as_tuple
from .stages import Compiled, Effects, Lowered, Traced
from .validate import check_against_eager

Bound = tuple[Traced, "Compiled | None", list[mx.array], dict[str, mx.array], list[st.Slot]]


class Jitted(EngineHooks):
    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        boundaries: str | Sequence[str] | None = None,
        static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
        drain: bool = False,
        commit: str = "auto",
        attention: Any = "auto",
        name: str | None = None,
        state: Sequence[Any] | Callable[[], Sequence[Any]] | None = None,
        state_mode: str = "auto",
        strategy: Any = None,
        validate: bool = True,
        cache_size: int = 64,
        concat_projections: bool = False,
    ):
        if not callable(fn):
            raise TraceError(f"segc.jit needs a function or an nn.Module, got {type(fn).__name__}")
        self.module = fn if isinstance(fn, nn.Module) else None
        self.fn = fn
        self.boundaries = resolve_boundaries(self.module, boundaries)
        if state_mode not in ("auto", "exact"):
            raise TraceError(f"state_mode must be 'auto' or 'exact', got {state_mode!r}")
        self.state_mode = state_mode
        self._exact_after: dict[Signature, frozenset[int]] = {}  # signatures traced again in exact mode
        self._writes: dict[Signature, int] = {}  # and tokens their calls write, where they had to grow
        self.drain = drain
        resolve_commit(commit)  # a bad policy is refused here, not at the first call
        self.commit = commit
        if not callable(attention) and attention not in ATTENTION:
            raise UsageError(f"attention must be one of {ATTENTION}, not {attention!r}")
        self.attention = attention
        self.validate = validate  # check each new dynamic-cache graph against eager once
        if not isinstance(concat_projections, bool):
            raise UsageError(f"concat_projections must be True or False, not {concat_projections!r}")
        self.concat_projections = concat_projections  # sibling products as one (passes/concat.py)
        self.strategy = strategy  # cut placement (segc.passes): None keeps the markers' cuts
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        gather = ParamGatherer(self.module, self.name) if self.module is not None else None
        self.spec = CallSpec(
            fn,
            self.name,
            as_tuple(static_argnums, int, "static_argnums"),
            as_tuple(static_argnames, str, "static_argnames"),
            state,
            gather,
        )
        # concatenated weights of every signature; the module's rebound to views of them
        self._concats = Concats(gather.rebind if gather is not None else None)
        if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
            raise TraceError(f"cache_size must be an int >= 1, got {cache_size!r}")
        self.cache_size = cache_size
        self._cache: OrderedDict[Signature, Compiled] = OrderedDict()  # least recently used first
        self._effects = Effects()  # the engine's boundary schedule, windows and timeline
        self._active: WindowRun | None = None  # the window calls run, and its stash (use_window)
        self._warned = False
        self._last: Signature | None = None
        self._fast = fastpath.Recent()  # the last hits' call patterns
        self.info = CacheInfo()
        functools.update_wrapper(self, fn if not isinstance(fn, nn.Module) else type(fn).__call__, updated=())  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        """Attributes a ``Jitted`` lacks are the module's (``layers``, ``make_cache``,
        ``args``), so that it stands in for the model in mlx-lm's own loops."""
        module = self.__dict__.get("module")
        if module is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError(
                f"'Jitted' object has no attribute {name!r}, nor has its module ({type(module).__name__})"
            ) from None

    @property
    def static_argnums(self) -> tuple[int, ...]:
        return self.spec.static_argnums

    @property
    def static_argnames(self) -> tuple[str, ...]:
        return self.spec.static_argnames

    # ----------------------------------------------------------------- stages

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        with DISPATCH_LOCK:
            args, kwargs, objs = self.spec.extract(args, kwargs)
            return self._bind(args, kwargs, objs, cached=False)[0]

    def lower(self, *args: Any, strategy: Any = None, **kwargs: Any) -> Lowered:
        return self.trace(*args, **kwargs).lower(strategy)

    def entries(self) -> list[Compiled]:
        """The compiled entries of the trace cache, one per signature seen."""
        return list(self._cache.values())

    def _trace(
        self, sig: Signature, args: tuple, kwargs: dict, leaves: list[mx.array], params: dict, slots: list[st.Slot]
    ) -> Traced:
        self.spec.check_call(args, kwargs)
        dyn_args, dyn_kw, static = self.spec.split(args, kwargs)
        _, paths, td = flatten((dyn_args, dyn_kw, static), what="argument", names=ROOTS)
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

        # the trace binds placeholders and wraps submodules in a private copy of the
        # module tree, never in the user's module (trace/clone.py)
        module = clone_modules(self.module) if self.module is not None else None
        target = module if module is not None else self.fn

        def bind(pkw: dict[str, mx.array]) -> None:
            assert module is not None
            module.update(tree_unflatten(list(pkw.items())))

        recorded: list[st.Commit] = []

        def fn(*a: Any, **k: Any) -> Any:
            xs, per_slot = held["state"], []
            for s in slots:
                per_slot.append(xs[: len(s.inputs)])
                xs = xs[len(s.inputs) :]
            with st.swapped(slots, per_slot) as recs, module_boundaries(module, self.boundaries):
                out = target(*a, **k)
                outs = [st.outputs_after(s, r) for s, r in zip(slots, recs)]
                recorded[:] = [st.commit_plan(s, r) for s, r in zip(slots, recs)]
            return (out, tuple(x for o in outs for x in o)) if slots else out

        state_paths = [f"state[{s.index}].{n}" for s in slots for n in s.names]
        t0 = time.perf_counter()
        key = rng.key_words()
        try:
            tr = trace(
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
            draws = rng.rewind(key, self.name)  # the trace itself draws nothing
            self.info.trace_seconds += time.perf_counter() - t0
        out_tree = tr.out_tree.children[0] if slots else tr.out_tree
        exact = frozenset(s.index for s in slots if s.mode == "exact")
        graph = rng.key_as_input(tr.graph, key) if draws else tr.graph
        rest = (tuple(recorded), exact, self.strategy)
        concat = self.concat_projections
        return Traced(self.spec, sig, graph, out_tree, *rest, draws=draws, concat=concat, concats=self._concats)

    def _compile(self, t: Traced) -> Compiled:
        """The miss path: lower and compile a fresh trace, and file it in the cache."""
        c = t.lower(effects=self._effects).compile(
            drain=self.drain, commit=self.commit, attention=self.attention, concats=self._concats
        )
        self.info.misses += 1
        # against the entry this call was expected to hit (the nearest cached signature)
        expected = t.signature.closest(list(self._cache)) if self._cache else self._last
        self.info.retraces.append(t.signature.explain_change(expected))
        self._cache[t.signature] = c
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
            self.info.evictions += 1
        self._last = t.signature
        return c

    # ----------------------------------------------------------------- calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tracing():  # called inside another segc trace: inline, as jax.jit does
            return self.fn(*args, **kwargs)
        with DISPATCH_LOCK:  # one call at a time in the process (MLX's compiled calls)
            return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        for pat, (leaves, params, slots) in self._fast.matches(self.spec, args, kwargs):  # fastpath.py
            c = self._cache.get(pat.sig)
            if c is not None:
                if any(st.needs_growth(s, p) for s, p in zip(slots, c.commits)):
                    break
                self._cache.move_to_end(pat.sig)
                self.info.hits += 1
                self._last = self._fast.hit(pat).sig
                return c.run(leaves, params, slots, self._active)
        given = args, kwargs
        args, kwargs, objs = self.spec.extract(args, kwargs)
        self._fast.retain(objs)  # the patterns of other objects would keep those alive
        why = next((r for o in objs if (r := st.eager_reason(o)) is not None), None)
        if why is not None:
            return self._eager(args, kwargs, objs, why)
        if not objs:  # the fast path: no state objects to settle
            sig, leaves, params = self.spec.abstract(args, kwargs)
            c = self._cache.get(sig)
            if c is not None:
                self._cache.move_to_end(sig)
            if c is None:
                c = self._compile(self._trace(sig, args, kwargs, leaves, params, []))
            else:
                self.info.hits += 1
                self._last = sig
            return c.run(leaves, params, window=self._active)
        misses = self.info.misses
        _, c, leaves, params, slots = self._bind(args, kwargs, objs, cached=True)
        assert c is not None
        if self.validate and self.info.misses != misses and any(s.mode == "dynamic" for s in slots):
            return self._validated(c, args, kwargs, objs, leaves, params, slots)
        out = c.run(leaves, params, slots, self._active)
        if self.info.misses == misses:  # a hit: the next call like it may take the fast path
            self._fast.add(fastpath.learn(self.spec, *given, objs, slots, leaves, c.signature))
        return out

    def _eager(self, args: tuple, kwargs: dict, objs: list[Any], why: str) -> Any:
        """Run the function as it is: a state object segc does not trace (a warning once)."""
        if not self._warned:
            self._warned = True
            warnings.warn(f"{self.name}: {why}; such calls run eagerly", SegcWarning, stacklevel=4)
        self.info.eager_calls += 1
        return self.fn(*st.restore(args, objs), **st.restore(kwargs, objs))

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
        """The first call of a graph with dynamic KV caches, checked against eager
        (``validate.py``). On a mismatch the caller's caches are rolled back, this
        function switches to ``state_mode="exact"`` and the call runs again;
        ``cache_info().aborted`` says why."""
        out, why = check_against_eager(
            lambda: self.fn(*st.restore(args, objs), **st.restore(kwargs, objs)),
            lambda: c.run(leaves, params, slots, self._active),
            objs,
        )
        if why is None:
            return out
        self.info.aborted.append(f"dynamic KV caches disagree with eager ({why}): state_mode='exact' from now on")
        self.state_mode = "exact"
        self._forget()
        _, c2, leaves, params, slots = self._bind(args, kwargs, objs, cached=True)
        assert c2 is not None
        return c2.run(leaves, params, slots, self._active)

    def _bind(self, args: tuple, kwargs: dict, objs: list[Any], *, cached: bool) -> Bound:
        """Find (or trace) the graph for a call with state objects.

        A dynamic state object that must grow is grown on the host first (as mlx-lm would
        grow it) and the signature looked up again; one the dynamic stand-in cannot serve
        is traced in exact mode. Nothing is written into ``objs`` here.
        """
        exact: set[int] = set(range(len(objs))) if self.state_mode == "exact" else set()
        grown: dict[int, dict[str, Any]] = {}
        for _ in range(2 * len(objs) + 4):
            slots = [st.make_slot(i, o, exact=i in exact, grown=grown.get(i)) for i, o in enumerate(objs)]
            sig, leaves, params = self.spec.abstract(args, kwargs, slots)
            c = self._cache.get(sig) if cached else None
            if c is not None:
                self._cache.move_to_end(sig)
            if c is None and sig in self._exact_after:
                exact |= self._exact_after[sig]
                continue
            if c is None and sig in self._writes and st.grow(slots, self._writes[sig], grown):
                continue  # grown as this signature's last trace found it must be: no trace
            if c is not None:
                growing = [s for s, p in zip(slots, c.commits) if st.needs_growth(s, p)]
                if growing:
                    st.grow(slots, max(p.n for p in c.commits), grown)
                    continue
                self.info.hits += 1
                self._last = sig
                return c.lowered.traced, c, leaves, params, slots
            try:
                t = self._trace(sig, args, kwargs, leaves, params, slots)
            except st.NeedsGrowth as g:
                self.info.aborted.append(f"state[{g.slot}] grows for {g.n} more tokens")
                self._writes[sig] = g.n
                st.grow(slots, g.n, grown)
                continue
            except st.NeedsExact as e:
                self.info.aborted.append(f"state[{e.slot}] traced in exact mode: {e.why}")
                # every state object of that kind is likely to need the same: switch them together
                exact |= {s.index for s in slots if s.kind == slots[e.slot].kind}
                self._exact_after[sig] = frozenset(exact)
                continue
            if not cached:
                return t, None, leaves, params, slots
            return t, self._compile(t), leaves, params, slots
        raise StateError(f"{self.name}: the state objects' layout did not settle: {self.info.aborted[-3:]}")

    def _forget(self) -> None:
        self._cache.clear()
        self._exact_after.clear()
        self._writes.clear()

    def cache_info(self) -> CacheInfo:
        return self.info

    def clear_cache(self) -> None:
        """Drop every compiled entry and hand the memory back to MLX's allocator (and
        MLX's buffer cache back to the system: ``mx.clear_cache``)."""
        self._forget()
        self._last = None
        self._fast.clear()
        self._concats.clear()
        gc.collect()
        mx.clear_cache()


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Trace ``fn`` (a function or an ``nn.Module``) once per signature and run it segmented.

    Options: ``boundaries`` (globs over submodule paths, e.g. ``"layers.*"``: a boundary
    after each matching submodule; ``"auto"``: after each block of the model's
    ``layers`` list), ``static_argnums``, ``static_argnames``,
    ``drain`` (host ``mx.eval`` after every segment: a baseline for benchmarks),
    ``commit`` (when segments are committed to the device: ``"auto"``, ``"segment"``,
    ``"fences"``; see :mod:`segc.runtime.executor`), ``attention`` (``"auto"``, ``"on"``,
    ``"off"``: whether a dynamic KV cache's masked decode attention runs as segc's fused
    CUDA kernel; ``"auto"``: on a CUDA GPU unless ``SEGC_FUSED_ATTENTION=0``, see
    :mod:`segc.lower.attention`),
    ``name``,
    ``state`` (objects ``fn`` captures and mutates, e.g. KV caches; caches passed as
    arguments are found automatically), ``state_mode`` (``"auto"``: dynamic KV caches
    that do not retrace per token; ``"exact"``: every state object functionalized as
    is, retracing when its offset changes). See :mod:`segc.trace.state`.
    ``strategy`` (cut placement: ``"balanced:4"``, a saved ``segc.passes.Plan``, a
    callable, ...; see :mod:`segc.passes.strategies`), ``validate`` (default True: the
    first call of each graph with dynamic KV caches is also run eagerly on copies of the
    caches and compared; on a mismatch the function falls back to ``state_mode="exact"``),
    ``cache_size`` (default 64: the most signatures kept, least recently used out),
    ``concat_projections`` (default False; sibling products as one over concatenated
    weights, the module's weights rebound to views: :mod:`segc.passes.concat`).
    Usable as ``@segc.jit`` or ``@segc.jit(boundaries=...)``.
    """
    if fn is None:
        return lambda f: Jitted(f, **options)
    return Jitted(fn, **options)
