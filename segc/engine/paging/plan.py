"""What a paged run needs to know before it starts: which parameters each band of
layers reads (its *page*), and how much memory beyond the pages a call needs (its
*reserve*), both read from the segmented IR of the call; and the model's skeleton, its
parameters replaced by stand-ins that cost no memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ...errors import PagingError
from ...ir import Graph, segments
from .source import DTYPES, TensorInfo

SKIP = ("segc.",)  # pseudo equations (cuts, markers, fences, windows) make nothing
# operations MLX runs as views (no new buffer): always, and when their input is a parameter
ALWAYS_VIEWS = frozenset({"Broadcast", "BroadcastAxes", "Squeeze", "ExpandDims", "StopGradient"})
VIEWS = ALWAYS_VIEWS | {"Transpose", "Reshape", "Flatten", "Unflatten", "Slice", "View", "AsStrided"}
_STATE = re.compile(r"state\[(\d+)\]\.")  # a state input's path: the index of its cache


@dataclass(frozen=True)
class CallPlan:
    """``pages[k]``: the parameter names band ``k``'s segments read, in graph order;
    ``reserve(chunks)``: the bytes a call of this shape needs beyond its resident pages,
    an upper bound: every value the widest band makes (views of parameters aside), the
    outputs every band keeps (new KV buffers, logits), every band's hand-over to later
    bands for each chunk (the activation stash), and the KV buffers the call reads once
    more (a cache grown on the host before the call)."""

    pages: tuple[tuple[str, ...], ...]
    temps: tuple[int, ...]  # per band: the bytes of every value its segments make
    kept: tuple[int, ...]  # per band: the bytes of the graph outputs it makes
    stash: tuple[int, ...]  # per band: the bytes of what it hands to later segments
    state: int  # the call's KV buffers (its state inputs)
    band_state: tuple[int, ...] = ()  # per band: the bytes of its layers' state inputs
    head: int = 0  # the bytes of the outputs the model's head makes (the logits)
    # per layer: (shape, dtype) of each state output its segment makes, in output order
    kv_avals: tuple[tuple[tuple[tuple[int, ...], str], ...], ...] = ()
    # a segment's output is a parameter or a view of one: a page's buffers may outlive its
    # band (in the stash or the call's outputs), so the pager must not recycle them
    aliased: bool = False

    def reserve(self, chunks: int = 1) -> int:
        return max(self.temps) + sum(self.kept) + chunks * sum(self.stash) + self.state

    def band_kv(self, k: int) -> int:
        """Band ``k``'s KV bytes in a call: its layers' state inputs and new buffers."""
        return self.band_state[k] + self.kept[k] - (self.head if k == len(self.kept) - 1 else 0)


def band_members(n_layers: int, band: int) -> list[range]:
    """The layers of each band (the last band also runs the model's head)."""
    return [range(lo, min(lo + band, n_layers)) for lo in range(0, n_layers, band)]


def call_plan(g: Graph, n_layers: int, band: int) -> CallPlan:
    """The plan of graph ``g`` (one segment per layer, then the head's)."""
    segs = segments(g)
    if len(segs) != n_layers + 1:
        raise PagingError(f"{g.name}: {len(segs)} segments for {n_layers} layers; trace with one boundary per layer")
    vs = g.vars()
    params = {i.var.name: i.path for i in g.inputs if i.kind == "param"}
    state = sum(vs[i.var.name].nbytes for i in g.inputs if i.kind == "state")
    per_layer = [0] * n_layers  # state input bytes by the cache's index (``state[i].keys``)
    for i in g.inputs:
        m = _STATE.match(i.path) if i.kind == "state" else None
        if m is not None and int(m.group(1)) < n_layers:
            per_layer[int(m.group(1))] += vs[i.var.name].nbytes
    outputs = set(g.outputs)
    order = {v: n for n, v in enumerate(g.outputs)}
    kv_avals = tuple(
        tuple((vs[v].shape, vs[v].dtype) for v in sorted((v for v in s.outputs if v in outputs), key=order.__getitem__))
        for s in segs[:n_layers]
    )
    head = sum(vs[v].nbytes for v in segs[n_layers].outputs if v in outputs)
    views = set(params)  # parameters, and views of them
    pages, temps, kept, stash = [], [], [], []
    for members in band_members(n_layers, band):
        idx = list(members) + ([n_layers] if members[-1] == n_layers - 1 else [])
        seen: dict[str, None] = {}
        made = keep = out = 0
        for j in idx:
            s = segs[j]
            for v in s.inputs:
                if v in params:
                    seen.setdefault(params[v])
            for e in s.eqns(g):
                if e.prim.startswith(SKIP):
                    continue
                if e.prim in ALWAYS_VIEWS or (e.prim in VIEWS and e.ins and e.ins[0] in views):
                    views.update(o.name for o in e.outs)
                    continue
                made += sum(o.nbytes for o in e.outs)
            keep += sum(vs[v].nbytes for v in s.outputs if v in outputs)
            out += sum(vs[v].nbytes for v in s.outputs if v not in outputs)
        pages.append(tuple(seen))
        temps.append(made)
        kept.append(keep)
        stash.append(out)
    band_state = tuple(sum(per_layer[i] for i in members) for members in band_members(n_layers, band))
    of_params = set(params)  # parameters and views of them only (``views`` also holds broadcasts)
    for e in g.eqns:
        if e.prim in VIEWS and e.ins and e.ins[0] in of_params:
            of_params.update(o.name for o in e.outs)
    aliased = any(v in of_params for s in segs for v in s.outputs)
    return CallPlan(tuple(pages), tuple(temps), tuple(kept), tuple(stash), state, band_state, head, kv_avals, aliased)


def _container(model: nn.Module, path: str) -> tuple[Any, Any]:
    obj: Any = model
    parts = path.split(".")
    for part in parts[:-1]:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj, parts[-1]


def stub(shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    """A stand-in of ``shape`` and ``dtype`` that holds one element (a broadcast)."""
    s = mx.broadcast_to(mx.zeros((), dtype=dtype), shape)
    mx.eval(s)
    return s


class Skeleton:
    """A model built from a local mlx-lm directory without its weights: every parameter
    is a :func:`stub`; :meth:`bind` puts real arrays in, :meth:`unbind` the stubs back."""

    def __init__(self, path: Path, tensors: dict[str, TensorInfo]):
        from mlx_lm.utils import load_model

        if not (path / "config.json").is_file():
            raise PagingError(f"{path} has no config.json: give a local mlx-lm model directory")
        try:
            model, self.config = load_model(path, lazy=True)  # lazy: nothing is read
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            raise PagingError(f"loading {path}: {exc}") from exc
        self.model = model
        self.slots: dict[str, tuple[Any, Any]] = {}
        self.stubs: dict[str, mx.array] = {}
        self.dtypes: dict[str, mx.Dtype] = {}
        for name, a in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
            info = tensors.get(name)
            if info is None:
                raise PagingError(f"{path}: no file holds tensor {name!r}, a parameter of the model")
            if info.shape != tuple(a.shape) or DTYPES[info.dtype][1] != a.dtype:
                raise PagingError(
                    f"{info.file}: tensor {name!r} is {info.dtype}{list(info.shape)}, the model wants "
                    f"{a.dtype}{list(a.shape)}"
                )
            self.slots[name] = _container(model, name)
            self.stubs[name] = stub(tuple(a.shape), a.dtype)
            self.dtypes[name] = a.dtype
        self.unbind(self.slots)
        layers = getattr(model, "layers", None)
        if not isinstance(layers, list) or not layers:
            raise PagingError(f"paging needs a model whose layers are a plain list (model.layers); got {type(layers)}")
        self.n_layers = len(layers)

    def bind(self, arrays: dict[str, mx.array]) -> None:
        from .source import as_dtype

        for name, a in arrays.items():
            c, k = self.slots[name]
            c[k] = as_dtype(a, self.dtypes[name])

    def unbind(self, names: Any) -> None:
        for name in names:
            c, k = self.slots[name]
            c[k] = self.stubs[name]
