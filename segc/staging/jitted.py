"""``segc.jit``: the decorator and its trace cache.

In the manner of ``jax.jit``: calling the jitted function looks up its abstract
signature (pytree structure, static values, shapes and dtypes of array leaves, of module
parameters and of state objects) in a cache; a miss traces, cuts, lowers and compiles,
and records a readable reason (:attr:`Jitted.info`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import SegcWarning, StateError, TraceError, UsageError
from ..lower import ATTENTION
from ..passes.strategies import resolve as resolve_strategy
from ..runtime import DISPATCH_LOCK, resolve_commit
from ..runtime.fenced import WindowRun
from ..trace import state as st
from ..trace import tracing
from ..trace.boundaries import resolve_boundaries
from ..trace.params import ParamGatherer
from . import fastpath
from .concat import Concats
from .effects import EngineHooks
from .retraces import STATIC_WARN, exact_limit_reason, static_only, static_warning
from .signature import CacheInfo, CallSpec, Signature, as_tuple, check_state_option, check_static_names
from .stages import Compiled, Effects, Lowered, Traced
from .tracecall import trace_call
from .validate import check_against_eager

Bound = tuple[Traced, "Compiled | None", list[mx.array], dict[str, mx.array], list[st.Slot]]


_TRANSFORM = "Not allowed inside a graph transformation"  # MLX's async_eval on a transform's arrays


class _ExactLimit(Exception):
    """Raised by ``_bind`` instead of a trace past ``exact_trace_limit``: run eagerly."""


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
        exact_trace_limit: int = 16,
        freeze_params: bool = False,
        kv_in_place: bool | None = None,
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
        if strategy is not None:
            resolve_strategy(strategy)  # a misspelt spec (or a 3) is refused here, not at the first call
        self.strategy = strategy  # cut placement (segc.passes): None keeps the markers' cuts
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        if not isinstance(freeze_params, bool):
            raise UsageError(f"freeze_params must be True or False, not {freeze_params!r}")
        self.freeze_params = freeze_params  # parameters checked once, then as captured (clear_cache)
        if kv_in_place is not None and not isinstance(kv_in_place, bool):
            raise UsageError(f"kv_in_place must be True, False or None, not {kv_in_place!r}")
        self.kv_in_place = kv_in_place  # the decode's KV rows written into the old buffers (CUDA)
        gather = ParamGatherer(self.module, self.name, frozen=freeze_params) if self.module is not None else None
        self.spec = CallSpec(
            fn,
            self.name,
            as_tuple(static_argnums, int, "static_argnums"),
            as_tuple(static_argnames, str, "static_argnames"),
            state,
            gather,
        )
        check_state_option(state, self.name)
        check_static_names(fn, self.spec.static_argnames, self.name)
        # concatenated weights of every signature; the module's rebound to views of them
        self._concats = Concats(self._rebind if gather is not None else None)
        if not isinstance(cache_size, int) or isinstance(cache_size, bool) or cache_size < 1:
            raise TraceError(f"cache_size must be an int >= 1, got {cache_size!r}")
        self.cache_size = cache_size
        if not isinstance(exact_trace_limit, int) or isinstance(exact_trace_limit, bool) or exact_trace_limit < 0:
            raise TraceError(f"exact_trace_limit must be an int >= 0, got {exact_trace_limit!r}")
        self.exact_trace_limit = exact_trace_limit
        self._exact_traces = 0  # traces made with a state object in exact mode
        self._static_retraces = 0  # traces for calls that differed only in static values
        self._cache: OrderedDict[Signature, Compiled] = OrderedDict()  # least recently used first
        self._effects = Effects()  # the engine's boundary schedule, windows and timeline
        self._active: WindowRun | None = None  # the window calls run, and its stash (use_window)
        self._warned: set[str] = set()  # the reasons to run eagerly already warned of
        self._last: Signature | None = None
        self._fast = fastpath.Recent()  # the last hits' call patterns
        self.info = CacheInfo()
        functools.update_wrapper(self, fn if not isinstance(fn, nn.Module) else type(fn).__call__, updated=())  # type: ignore[arg-type]
        self.__dict__["__call__"] = _with_signature(self, fn)  # what inspect finds on step.__call__

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

    def _rebind(self, arrays: dict[str, mx.array]) -> None:
        """The module's weights rebound to views of their concatenation (``Concats``):
        every entry lets go of the arrays it last passed or captured (an entry whose
        graph reads the members themselves, a prefill's, would otherwise hold every
        member twice, for good where it froze them)."""
        assert self.spec.params is not None  # a module's function: Concats has a rebind
        self.spec.params.rebind(arrays)
        for entry in self._cache.values():
            entry.release_params(arrays)

    def entries(self) -> list[Compiled]:
        """The compiled entries of the trace cache, one per signature seen."""
        return list(self._cache.values())

    def _trace(
        self, sig: Signature, args: tuple, kwargs: dict, leaves: list[mx.array], params: dict, slots: list[st.Slot]
    ) -> Traced:
        return trace_call(self, sig, args, kwargs, leaves, params, slots)

    def _compile(self, t: Traced) -> Compiled:
        """The miss path: lower and compile a fresh trace, and file it in the cache."""
        c = t.lower(effects=self._effects).compile(**self._compile_options())
        self.info.misses += 1
        # against the entry this call was expected to hit (the nearest cached signature)
        expected = t.signature.closest(list(self._cache)) if self._cache else self._last
        self.info.retraces.append(t.signature.explain_change(expected))
        if static_only(t.signature, expected):
            self._static_retraces += 1
            if self._static_retraces == STATIC_WARN:
                warnings.warn(static_warning(self.name, STATIC_WARN), SegcWarning, stacklevel=4)
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
        try:
            with DISPATCH_LOCK:  # one call at a time in the process (MLX's compiled calls)
                return self._call(args, kwargs)
        except ValueError as exc:
            if _TRANSFORM not in str(exc):
                raise
        # under mx.grad, mx.vmap, nn.value_and_grad or mx.compile: MLX refuses the first
        # commit (before anything ran), and the function is inlined into the transform's
        # graph as it is, as a jax.jit function is under jax.grad (docs/api.md)
        self.info.eager_calls += 1
        return self.fn(*args, **kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        for pat, (leaves, params, slots) in self._fast.matches(self.spec, args, kwargs):  # fastpath.py
            c = self._cache.get(pat.sig)
            if c is not None:
                if c.needs_growth(slots):
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
        try:
            _, c, leaves, params, slots = self._bind(args, kwargs, objs, cached=True)
        except _ExactLimit as lim:
            return self._eager(args, kwargs, objs, str(lim))
        assert c is not None
        if self.validate and self.info.misses != misses and any(s.mode == "dynamic" for s in slots):
            return self._validated(c, args, kwargs, objs, leaves, params, slots)
        out = c.run(leaves, params, slots, self._active)
        if self.info.misses == misses:  # a hit: the next call like it may take the fast path
            self._fast.add(fastpath.learn(self.spec, *given, objs, slots, leaves, c.signature))
        return out

    def _eager(self, args: tuple, kwargs: dict, objs: list[Any], why: str) -> Any:
        """Run the function as it is: a state object segc does not trace (a warning once)."""
        if why not in self._warned:
            self._warned.add(why)
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
        try:
            _, c2, leaves, params, slots = self._bind(args, kwargs, objs, cached=True)
        except _ExactLimit as lim:
            return self._eager(args, kwargs, objs, str(lim))
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
                if c.needs_growth(slots):
                    st.grow(slots, max(p.n for p in c.commits), grown)
                    continue
                self.info.hits += 1
                self._last = sig
                return c.lowered.traced, c, leaves, params, slots
            try:
                exact_slots = any(s.mode == "exact" for s in slots)
                # (not under an engine's effects: an eager call would skip its windows and events)
                plain = self._active is None and self._effects == Effects()
                if cached and exact_slots and plain and self._exact_traces >= self.exact_trace_limit:
                    raise _ExactLimit(exact_limit_reason(self._exact_traces, self.state_mode, self.info.aborted, slots))
                t = self._trace(sig, args, kwargs, leaves, params, slots)
                self._exact_traces += exact_slots
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
            except TraceError as err:  # the model cannot run on the dynamic stand-in: exact mode
                dynamic = {s.index for s in slots if s.mode == "dynamic"}
                if not dynamic or isinstance(err, StateError):
                    raise
                why = str(err).splitlines()[0][:200]
                self.info.aborted.append(f"the dynamic caches' trace failed ({why}): traced in exact mode")
                exact |= dynamic
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
        self._exact_traces = 0  # exact mode may trace again up to its limit
        if self.spec.params is not None:
            self.spec.params.forget()  # freeze_params: the module's parameters as they are now
        self._last = None
        self._fast.clear()
        self._concats.clear()
        gc.collect()
        mx.clear_cache()


def _with_signature(step: Jitted, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``step.__call__`` as an attribute with ``fn``'s signature: mlx-lm asks
    ``inspect.signature(model.__call__)`` whether a model takes ``input_embeddings``.
    Calling ``step`` itself goes through the class's ``__call__``, as for any object."""

    ref = weakref.ref(step)  # not step itself: the attribute would keep it alive in a cycle

    def call(*args: Any, **kwargs: Any) -> Any:
        return Jitted.__call__(ref(), *args, **kwargs)  # type: ignore[arg-type]

    with contextlib.suppress(TypeError, ValueError):  # no introspectable signature: *args, **kwargs
        call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return call
