"""Trace an MLX function into segc's IR through MLX's own graph capture.

``mx.export_function(callback, fn, *args, **kwargs)`` hands the callback every input,
output, constant and primitive of the graph ``fn`` builds; nothing in ``mlx.core`` is
patched. Array leaves of the arguments become positional inputs; module parameters
become keyword inputs named by their path, so they stay graph inputs (not constants).
A ``Depends`` on a boundary tag (``markers.py``) becomes a ``segc.cut`` equation.
"""

from __future__ import annotations

import os
import re
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..errors import TraceError, UnsupportedPrimitive
from ..ir import CUT, Const, DTypeArg, Eqn, Graph, Input, Var, verify
from .markers import marker_name
from .pytree import TreeDef, flatten

# --------------------------------------------------------------------------- the trace


@dataclass
class Capture:
    """What one trace gives: the graph and the structure of the function's output."""

    graph: Graph
    out_tree: TreeDef


_PLAIN = frozenset({int, float, str, bool, type(None)})


def _canon(a: Any) -> Any:
    if isinstance(a, tuple | list):
        if all([type(x) in _PLAIN for x in a]):  # most arguments: a flat list of ints
            return tuple(a)
        return tuple(_canon(x) for x in a)
    if isinstance(a, mx.Dtype):
        return DTypeArg(dtypes.short(a))
    if isinstance(a, bool | int | float | str) or a is None:
        return a
    return str(a)  # enums and other exotic states are kept by name


# how deep this thread is inside mx.export_function (a nested segc.jit call inlines)
_LOCAL = threading.local()


def tracing() -> bool:
    """Whether this thread is inside a segc trace."""
    return getattr(_LOCAL, "depth", 0) > 0


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
) -> Capture:
    """Trace ``fn`` called as ``fn(*args, **kwargs)`` with ``rebuild_args(leaves)``.

    ``params`` (path -> array) become graph inputs of kind ``"param"`` named by their
    path, after the argument leaves and sorted by path; during the trace ``bind_params``
    installs the tracer's placeholders in the module. They are handed to
    ``mx.export_function`` positionally: nanobind takes at most 1024 keyword arguments,
    and a model may have any number of parameters. ``kinds`` gives each argument leaf its
    input kind (``"arg"`` by default, ``"state"`` for state).
    """
    names = sorted(params or {})
    values = [(params or {})[k] for k in names]
    n_args = len(arg_leaves)
    records: list[dict] = []
    out_tree: list[TreeDef] = []

    def traced(*leaves: mx.array) -> list[mx.array]:
        if bind_params is not None and names:
            bind_params(dict(zip(names, leaves[n_args:])))
        args, kwargs = rebuild_args(list(leaves[:n_args]))
        out = fn(*args, **kwargs)
        outs, _, td = flatten(out, what="output")
        out_tree.append(td)
        if not outs:
            raise TraceError(f"{name} returned no arrays (output structure {td})")
        return outs

    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        mx.export_function(records.append, traced, *arg_leaves, *values)  # type: ignore[arg-type]
    except (TraceError, UnsupportedPrimitive):
        raise
    except ValueError as exc:
        if "Attempting to eval an array" in str(exc):
            raise TraceError(_eval_message(name, exc)) from None
        m = _STATE_ERR.search(str(exc))
        if m:
            prim = m.group(1)
            raise UnsupportedPrimitive(prim, _HINTS.get(prim, "MLX cannot export it"), where=name) from None
        raise TraceError(f"tracing {name} failed: {exc}") from exc
    finally:
        _LOCAL.depth -= 1
    g = _build(records, arg_paths, names, name, kinds)
    return Capture(verify(g), out_tree[0])


_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the segc package


def _eval_message(name: str, exc: BaseException) -> str:
    """An evaluation inside the traced function, naming the user's line with a hint."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(_OWN)]
    where = ""
    code = ""
    if frames:
        f = frames[-1]
        code = (f.line or "").strip()
        where = f" at {f.filename}:{f.lineno}" + (f" (`{code}`)" if code else "")
    if ".item()" in code or "float(" in code or "int(" in code or ".tolist()" in code:
        hint = "move .item() out of the traced function, or pass the value as a static argument (static_argnames=)"
    elif re.search(r"\b(if|while|and|or|not|assert)\b", code):
        hint = (
            "use mx.where(cond, a, b) for a data-dependent choice, or make the deciding value static (static_argnames=)"
        )
    elif re.search(r"\b(print|repr|str|format)\(", code) or 'f"' in code or "f'" in code:
        hint = "print or format the result after the call; inside the function arrays have no values yet"
    elif "np." in code or "numpy" in code:
        hint = "keep the computation in mlx.core inside the function; convert to NumPy after the call"
    else:
        hint = (
            "a traced function cannot read array values: use mx.where instead of Python branches, move .item() "
            "out of it, or make the value a static argument (static_argnames=)"
        )
    return f"{name} evaluates an array while being traced{where}: values do not exist during tracing; {hint}"


def _build(
    records: list[dict],
    arg_paths: Sequence[str],
    param_names: Sequence[str],
    name: str,
    kinds: Sequence[str] | None = None,
) -> Graph:
    rename: dict[str, str] = {}  # export name -> IR name
    alias: dict[str, str] = {}  # marker output -> marker input (IR names)
    counter = {"v": 0}
    by_type: dict[str, list[dict]] = {}
    for r in records:
        by_type.setdefault(r["type"], []).append(r)
    inputs: list[Input] = []
    n_args = len(arg_paths)
    flat = [x for r in by_type.get("inputs", []) for x in r["inputs"]]
    for k, (ename, shape, dt) in enumerate(flat):
        var_type = (tuple(shape), dtypes.short(dt))
        if k < n_args:
            nm = f"a{k}"
            kind = kinds[k] if kinds is not None else "arg"
            inputs.append(Input(Var(nm, *var_type), kind, arg_paths[k]))
        else:
            nm = f"p{k - n_args}"
            inputs.append(Input(Var(nm, *var_type), "param", param_names[k - n_args]))
        rename[ename] = nm

    consts: list[Const] = []
    markers: dict[str, str] = {}
    for r in by_type.get("constants", []):
        for ename, value in r["constants"]:
            mname = marker_name(value)
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
