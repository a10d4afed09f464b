"""Trace an MLX function into segc's IR through MLX's own graph capture.

``mx.export_function(callback, fn, *args, **kwargs)`` hands the callback every input,
output, constant and primitive of the graph ``fn`` builds; nothing in ``mlx.core`` is
patched. Array leaves of the arguments become positional inputs; module parameters
become keyword inputs named by their path, so they stay graph inputs (not constants).

Boundary markers: ``segc.boundary(x, name)`` is ``mx.depends([x], [tag])`` where
``tag`` is a small uint8 constant spelling ``segc:<name>``. In eager code that is an
identity; in a trace it is a ``Depends`` primitive whose tag the tracer recognises and
turns into a ``segc.cut`` equation (the marker's outputs alias its inputs).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import dtypes
from .errors import TraceError, UnsupportedPrimitive
from .ir import CUT, Const, DTypeArg, Eqn, Graph, Input, Var, verify
from .pytree import TreeDef, flatten

_MAGIC = b"segc:"
_TAGS: dict[str, mx.array] = {}


def _tag(name: str) -> mx.array:
    t = _TAGS.get(name)
    if t is None:
        t = mx.array(list(_MAGIC + name.encode()), dtype=mx.uint8)
        mx.eval(t)
        _TAGS[name] = t
    return t


def boundary(x: Any, name: str = "boundary") -> Any:
    """Mark a segment boundary after ``x`` (an array or a pytree of arrays).

    An exact identity when run eagerly; under ``segc.jit`` the segment ends here.
    """
    if not isinstance(name, str) or not name:
        raise TraceError(f"segc.boundary: name must be a non-empty string, got {name!r}")
    from .pytree import unflatten

    leaves, _, td = flatten(x, what="segc.boundary value")
    if not leaves:
        return x
    return unflatten(td, mx.depends(leaves, [_tag(name)]))


def _marker_name(value: mx.array) -> str | None:
    if value.dtype != mx.uint8 or value.ndim != 1 or value.size < len(_MAGIC):
        return None
    raw = bytes(np.array(value, copy=False).tobytes())
    return raw[len(_MAGIC) :].decode() if raw.startswith(_MAGIC) else None


# --------------------------------------------------------------------------- module globs


class _After:
    """Stands in for a submodule during a trace: calls it, then marks a boundary."""

    def __init__(self, module: nn.Module, path: str):
        self._segc_module = module
        self._segc_path = path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._segc_module(*args, **kwargs)
        return boundary(out, self._segc_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._segc_module, name)


def _match(path: str, patterns: Sequence[str]) -> bool:
    """Dotted globs: ``*`` matches within one path component; a pattern may match any
    suffix of the path (``"layers.*"`` matches ``"model.layers.3"``, not
    ``"model.layers.3.mlp"``)."""
    parts = path.split(".")
    for p in patterns:
        pp = p.split(".")
        if len(pp) <= len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts[-len(pp) :], pp)):
            return True
    return False


def _slots(module: nn.Module, prefix: str = "") -> list[tuple[Any, Any, str, nn.Module]]:
    """(container, key, path, submodule) for every submodule held in a module, list or dict."""
    out = []

    def visit(container: Any, key: Any, path: str, value: Any) -> None:
        if isinstance(value, nn.Module):
            out.append((container, key, path, value))
            for k, v in value.items():
                visit(value, k, f"{path}.{k}" if path else str(k), v)
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                visit(value, i, f"{path}.{i}", v)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(value, k, f"{path}.{k}", v)

    for k, v in module.items():
        visit(module, k, f"{prefix}{k}", v)
    return out


class module_boundaries:
    """Context manager: boundaries after every submodule whose path matches a glob."""

    def __init__(self, module: nn.Module | None, patterns: Sequence[str]):
        self.module = module
        self.patterns = list(patterns)
        self.swapped: list[tuple[Any, Any, nn.Module]] = []

    def __enter__(self) -> module_boundaries:
        if self.module is None or not self.patterns:
            return self
        for container, key, path, sub in _slots(self.module):
            if _match(path, self.patterns) and not isinstance(container, tuple):
                self.swapped.append((container, key, sub))
                if isinstance(container, nn.Module):
                    dict.__setitem__(container, key, _After(sub, path))
                else:
                    container[key] = _After(sub, path)
        return self

    def __exit__(self, *exc: Any) -> None:
        for container, key, sub in reversed(self.swapped):
            if isinstance(container, nn.Module):
                dict.__setitem__(container, key, sub)
            else:
                container[key] = sub
        self.swapped.clear()


# --------------------------------------------------------------------------- the trace


@dataclass
class Traced:
    graph: Graph
    out_tree: TreeDef


def _canon(a: Any) -> Any:
    if isinstance(a, tuple | list):
        return tuple(_canon(x) for x in a)
    if isinstance(a, mx.Dtype):
        return DTypeArg(dtypes.short(a))
    if isinstance(a, bool | int | float | str) or a is None:
        return a
    return str(a)  # enums and other exotic states are kept by name


_STATE_ERR = re.compile(r"Unable to get state for primitive (\w+)")

_HINTS = {
    "Load": "an input or captured array is an unevaluated lazy array from mx.load; "
    "call mx.eval on the weights before tracing",
    "Contiguous": "mx.contiguous cannot be exported by MLX",
}


def trace(
    fn: Callable[..., Any],
    arg_leaves: Sequence[mx.array],
    arg_paths: Sequence[str],
    rebuild_args: Callable[[list[mx.array]], tuple[tuple, dict]],
    *,
    params: dict[str, mx.array] | None = None,
    bind_params: Callable[[dict[str, mx.array]], None] | None = None,
    name: str = "fn",
    kinds: Sequence[str] | None = None,
) -> Traced:
    """Trace ``fn`` called as ``fn(*args, **kwargs)`` with ``rebuild_args(leaves)``.

    ``params`` (path -> array) become keyword graph inputs; during the trace
    ``bind_params`` installs the tracer's placeholders in the module. ``kinds`` gives
    each positional leaf its input kind (``"arg"`` by default, ``"state"`` for state).
    """
    params = params or {}
    records: list[dict] = []
    out_tree: list[TreeDef] = []

    def traced(*leaves: mx.array, **pkw: mx.array) -> list[mx.array]:
        if bind_params is not None and pkw:
            bind_params(pkw)
        args, kwargs = rebuild_args(list(leaves))
        out = fn(*args, **kwargs)
        outs, _, td = flatten(out, what="output")
        out_tree.append(td)
        if not outs:
            raise TraceError(f"{name} returned no arrays (output structure {td})")
        return outs

    try:
        mx.export_function(records.append, traced, *arg_leaves, **params)  # type: ignore[arg-type]
    except (TraceError, UnsupportedPrimitive):
        raise
    except ValueError as exc:
        m = _STATE_ERR.search(str(exc))
        if m:
            prim = m.group(1)
            raise UnsupportedPrimitive(prim, _HINTS.get(prim, "MLX cannot export it"), where=name) from None
        raise TraceError(f"tracing {name} failed: {exc}") from exc
    g = _build(records, arg_paths, name, kinds)
    return Traced(verify(g), out_tree[0])


def _build(records: list[dict], arg_paths: Sequence[str], name: str, kinds: Sequence[str] | None = None) -> Graph:
    rename: dict[str, str] = {}  # export name -> IR name
    alias: dict[str, str] = {}  # marker output -> marker input (IR names)
    counter = {"v": 0}
    by_type: dict[str, list[dict]] = {}
    for r in records:
        by_type.setdefault(r["type"], []).append(r)
    kw_of = {}
    for r in by_type.get("keyword_inputs", []):
        kw_of.update({ename: k for k, ename in r["keywords"]})

    inputs: list[Input] = []
    pos = 0
    for r in by_type.get("inputs", []):
        for ename, shape, dt in r["inputs"]:
            if ename in kw_of:
                nm = f"p{len(inputs) - pos}"
                inputs.append(Input(Var(nm, tuple(shape), dtypes.short(dt)), "param", kw_of[ename]))
            else:
                nm = f"a{pos}"
                kind = kinds[pos] if kinds is not None else "arg"
                inputs.append(Input(Var(nm, tuple(shape), dtypes.short(dt)), kind, arg_paths[pos]))
                pos += 1
            rename[ename] = nm

    consts: list[Const] = []
    markers: dict[str, str] = {}
    for r in by_type.get("constants", []):
        for ename, value in r["constants"]:
            mname = _marker_name(value)
            if mname is not None:
                markers[ename] = mname
                continue
            nm = f"c{len(consts)}"
            consts.append(Const(Var(nm, tuple(value.shape), dtypes.short(value.dtype)), value))
            rename[ename] = nm

    def ir_name(ename: str) -> str:
        nm = rename[ename]
        return alias.get(nm, nm)

    eqns: list[Eqn] = []
    for k, r in enumerate(by_type.get("primitive", [])):
        ins = [x[0] for x in r["inputs"]]
        if r["name"] == "Depends" and ins and ins[-1] in markers:
            outs = [x[0] for x in r["outputs"]]
            for o, i in zip(outs, ins[: len(outs)]):
                rename[o] = ir_name(i)
            eqns.append(Eqn(k, CUT, (), (), (markers[ins[-1]],)))
            continue
        in_names = tuple(ir_name(i) if i not in markers else _lost_marker(i) for i in ins)
        outs_v = []
        for ename, shape, dt in r["outputs"]:
            nm = f"v{counter['v']}"
            counter["v"] += 1
            rename[ename] = nm
            outs_v.append(Var(nm, tuple(shape), dtypes.short(dt)))
        eqns.append(Eqn(k, r["name"], in_names, tuple(outs_v), _canon(tuple(r["arguments"]))))

    outputs = tuple(ir_name(ename) for r in by_type.get("outputs", []) for ename, _, _ in r["outputs"])
    return Graph(name, tuple(inputs), tuple(consts), tuple(eqns), outputs)


def _lost_marker(ename: str) -> str:
    raise TraceError("a segc.boundary tag array was used as a value; boundary tags are internal")


def matching_modules(module: nn.Module, patterns: Sequence[str]) -> list[str]:
    return [p for _, _, p, _ in _slots(module) if _match(p, patterns)]


def auto_boundaries(module: nn.Module) -> str | None:
    """The glob for "one segment per block": the longest list of submodules named
    ``layers`` (or ``h``, ``blocks``) in the module, e.g. ``"model.layers.*"``."""
    best: tuple[int, str] | None = None
    lists: dict[str, int] = {}
    for _, _, path, _ in _slots(module):
        head, _, last = path.rpartition(".")
        if last.isdigit() and head.rpartition(".")[2] in ("layers", "h", "blocks"):
            lists[head] = lists.get(head, 0) + 1
    for head, n in lists.items():
        if best is None or n > best[0]:
            best = (n, head)
    return None if best is None else f"{best[1]}.*"
