"""The trace of one call of a ``segc.jit`` function (its cache miss path's first step).

The function runs on placeholders inside a private copy of the module tree
(``segc.trace.clone``), with its state objects swapped for their stand-ins; the
result is a :class:`Traced`: the graph, the output tree, what each state object's
commit writes, and the random draws the call makes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..errors import StateError
from ..ir import Graph
from ..trace import leaks, module_boundaries, trace
from ..trace import state as st
from ..trace.clone import clone_modules
from ..trace.pytree import flatten, unflatten
from . import rng
from .concat import Concats
from .signature import ROOTS, CacheInfo, CallSpec, Signature
from .stages import Traced


class Tracing(Protocol):
    """What a trace reads of its ``segc.jit`` function (``Jitted`` has it all)."""

    spec: CallSpec
    module: nn.Module | None
    fn: Callable[..., Any]
    boundaries: list[str]
    name: str
    info: CacheInfo
    strategy: Any
    concat_projections: bool
    attention: Any
    _concats: Concats


def trace_call(
    j: Tracing,
    sig: Signature,
    args: tuple,
    kwargs: dict,
    leaves: list[mx.array],
    params: dict,
    slots: list[st.Slot],
) -> Traced:
    """Trace ``j``'s function for one call already bound to ``sig``."""
    j.spec.check_call(args, kwargs)
    dyn_args, dyn_kw, static = j.spec.split(args, kwargs)
    _, paths, td = flatten((dyn_args, dyn_kw, static), what="argument", names=ROOTS)
    n_args = len(leaves)
    objs = [s.obj for s in slots]
    held: dict[str, list[mx.array]] = {}

    def rebuild(xs: list[mx.array]) -> tuple[tuple, dict]:
        held["state"] = xs[n_args:]
        held["args"] = xs[:n_args]  # the placeholders fn gets: a write in place rebinds one
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
    module = clone_modules(j.module) if j.module is not None else None
    target = module if module is not None else j.fn

    bound: dict[str, mx.array] = {}

    def bind(pkw: dict[str, mx.array]) -> None:
        assert module is not None
        module.update(tree_unflatten(list(pkw.items())))
        bound.update(pkw)

    recorded: list[st.Commit] = []

    def fn(*a: Any, **k: Any) -> Any:
        xs, per_slot = held["state"], []
        for s in slots:
            per_slot.append(xs[: len(s.inputs)])
            xs = xs[len(s.inputs) :]
        with st.swapped(slots, per_slot) as recs, module_boundaries(module, j.boundaries):
            out = target(*a, **k)
            if module is not None and (written := leaks.assigned_params(module, bound)):
                raise StateError(
                    f"{j.name} assigns to its module's arrays {written[:4]} in the call (running statistics, "
                    "as BatchNorm's in train mode): a segc trace does not carry them out; run that module in "
                    "eval mode, or call it outside segc.jit"
                )
            outs = [st.outputs_after(s, r) for s, r in zip(slots, recs)]
            recorded[:] = [st.commit_plan(s, r) for s, r in zip(slots, recs)]
        result = (out, tuple(x for o in outs for x in o)) if slots else out
        return result, tuple(held["args"])  # the arguments as fn left them (written_args)

    state_paths = [f"state[{s.index}].{n}" for s in slots for n in s.names]
    t0 = time.perf_counter()
    real = rng.key_words()
    watched = leaks.watch(leaks.roots(j.fn), skip=objs)
    key = rng.sentinel()
    try:
        tr = trace(
            fn,
            leaves + [x for s in slots for x in s.inputs],
            list(paths) + state_paths,
            rebuild,
            kinds=["arg"] * n_args + ["state"] * len(state_paths),
            params=params,
            bind_params=bind if module is not None else None,
            name=j.name,
        )
    finally:
        try:
            draws = rng.rewind(key, j.name)  # the trace itself draws nothing
        finally:
            rng.restore(real)
        j.info.trace_seconds += time.perf_counter() - t0
        leaked = watched.leaks([*leaves, *params.values()])
        if leaked:
            watched.restore()  # the caller's objects as they were before the call
    if leaked:
        raise StateError(
            f"{j.name} stored a traced array in {leaked[0]}"
            + (f" (and {len(leaked) - 1} more places)" if len(leaked) > 1 else "")
            + ", an object segc does not see: pass it as an argument or in segc.jit(..., state=[...]) "
            "(a KV cache the function closes over, a list it appends to); it is left as it was"
        )
    graph = written_args(tr.graph, n_args, list(paths), j.name)
    out_tree = tr.out_tree.children[0]
    out_tree = out_tree.children[0] if slots else out_tree
    exact = frozenset(s.index for s in slots if s.mode == "exact")
    graph = rng.key_as_input(graph, key) if draws else graph
    rest = (tuple(recorded), exact, j.strategy)
    concat = j.concat_projections
    return Traced(
        j.spec, sig, graph, out_tree, *rest, draws=draws, concat=concat, concats=j._concats, attention=j.attention
    )


def written_args(g: Graph, n_args: int, paths: list[str], name: str) -> Graph:
    """``g`` without its last ``n_args`` outputs, the arguments as the function left
    them; each must be the argument itself. A function that writes into an argument in
    place (``a[0] = v``, ``a += 1``: MLX rebinds the caller's array) would change the
    caller's array in eager MLX and not under segc, so it is refused, naming it."""
    outs, extra = g.outputs[: len(g.outputs) - n_args], g.outputs[len(g.outputs) - n_args :]
    args = [i.var.name for i in g.inputs if i.kind == "arg"]
    for k, (o, a) in enumerate(zip(extra, args)):
        if o != a:
            raise StateError(
                f"{name} writes into its argument {paths[k]} in place (a[...] = v, a += 1), which in eager MLX "
                "changes the caller's array; segc does not write it back: return the new value instead"
            )
    return g.replace(outputs=outs)
