"""``concat_projections``: sibling projections of one input become one product.

A llama layer multiplies one normalised input by three weights (q, k and v) and another
by two (gate and up). Each product is a kernel, and on MLX's CUDA build every kernel
costs the host 1.3-2.3 us to encode while a decode-sized product takes the device about
5 us (docs/performance.md): a decode step is host-bound by its kernel count. This pass
replaces every group of products that read the same input value, in the same segment,
each from weights that are graph parameters, by one product over the weights
concatenated along their output rows, and the members' results by row slices (views)
of that product::

    Matmul(x, Transpose(q)), Matmul(x, Transpose(k))   ->   y = Matmul(x, Transpose(q|k))
                                                            Slice(y)[.., :nq], Slice(y)[.., nq:]

``AddMM`` groups (a projection with a bias, ``x @ W.T + b``: the weights and the biases
concatenated) and ``QuantizedMatmul`` groups (weights, scales and biases,
``transpose=True``, the same group size, bits and mode) are concatenated the same way.

Only products of one row (a decode step of one sequence): there a member's slice of the
row is contiguous, and what reads it (a reshape into heads) stays a view. With more rows
each slice is strided, the reshapes after it copy, and the products' saving is lost:
a 512-token prefill of the reference llama measured 1.1x slower on the H200.

The concatenated weight is a new ``param`` input whose path names its members
(:func:`concat_path`); the caller builds it from the members (``segc.staging.concat``).
Unlike the other passes this one changes the equations, not only cuts and order, and it
must keep the bits: each output element of a product is a dot product over the shared
input dimension, which a kernel computes the same way whatever the number of output
rows, but a library may pick another algorithm for another shape (split-K in cuBLAS,
for one). So every group shape is checked first by ``check`` (default:
:func:`segc.lower.concat.same_bits`, which runs both forms once on random data on the
default device); a group whose shape fails keeps its separate products.

Slices keep their members' equation ids (schedules and plans that name a member still
find it); the concatenated product and its transpose get new ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..ir import CUT, Eqn, Graph, Input, Var
from .registry import register

PREFIX = "segc:concat("
Check = Callable[[str, Var, Sequence[Sequence[tuple[int, ...]]], Sequence[str], tuple[Any, ...]], bool]


def concat_path(paths: Sequence[str]) -> str:
    """The path of a concatenated parameter: ``segc:concat(a,b,c)`` (no spaces: the IR
    text splits an input's kind from its type at the last space)."""
    return PREFIX + ",".join(paths) + ")"


def members(path: str) -> list[str] | None:
    """The member paths of a concatenated parameter's path; None for any other path."""
    if not (path.startswith(PREFIX) and path.endswith(")")):
        return None
    return path[len(PREFIX) : -1].split(",")


@dataclass
class _Member:
    eqn: Eqn  # the product
    weights: tuple[str, ...]  # the parameters it reads (weight; weight, bias; weight, scales, biases)
    drop: tuple[str, ...]  # values only it reads that go with it (the weight's Transpose, the bias's Broadcast)


def _transposed_param(g_defs: dict[str, Eqn], params: dict[str, Input], name: str) -> str | None:
    e = g_defs.get(name)
    if e is None or e.prim != "Transpose" or tuple(e.args[0]) != (1, 0) or e.ins[0] not in params:
        return None
    return e.ins[0]


def _candidates(g: Graph) -> dict[tuple, list[_Member]]:
    params = {i.var.name: i for i in g.inputs if i.kind == "param" and members(i.path) is None}
    defs = {o.name: e for e in g.eqns for o in e.outs}
    uses: dict[str, int] = {}
    for e in g.eqns:
        for v in e.ins:
            uses[v] = uses.get(v, 0) + 1
    for v in g.outputs:
        uses[v] = uses.get(v, 0) + 1
    groups: dict[tuple, list[_Member]] = {}
    seg = 0
    for e in g.eqns:
        if e.prim == CUT:
            seg += 1
            continue
        if e.prim == "Matmul" and len(e.ins) == 2:
            p = _transposed_param(defs, params, e.ins[1])
            if p is None or params[p].var.shape[1] != defs[e.ins[1]].outs[0].shape[0]:
                continue
            drop: tuple[str, ...] = (e.ins[1],) if uses.get(e.ins[1]) == 1 else ()
            m = _Member(e, (p,), drop)
            key: tuple = (seg, e.prim, e.ins[0], params[p].var.dtype, params[p].var.shape[1], e.outs[0].dtype)
        elif e.prim == "AddMM" and len(e.ins) == 3 and len(e.args) == 2:  # x @ W.T + bias
            p = _transposed_param(defs, params, e.ins[1])
            b = defs.get(e.ins[2])
            if p is None or b is None or b.prim != "Broadcast" or b.ins[0] not in params:
                continue
            if params[b.ins[0]].var.shape != e.outs[0].shape[-1:] or tuple(b.args[0]) != e.outs[0].shape:
                continue
            drop = tuple(v for v in e.ins[1:] if uses.get(v) == 1)
            m = _Member(e, (p, b.ins[0]), drop)
            w, bias = params[p].var, params[b.ins[0]].var
            key = (seg, e.prim, e.ins[0], w.dtype, w.shape[1], bias.dtype, tuple(e.args), e.outs[0].dtype)
        elif e.prim == "QuantizedMatmul" and len(e.ins) == 4 and len(e.args) >= 4 and e.args[3] is True:
            if not all(v in params for v in e.ins[1:]):
                continue
            m = _Member(e, tuple(e.ins[1:]), ())
            shapes = tuple((params[v].var.dtype, params[v].var.shape[1]) for v in e.ins[1:])
            key = (seg, e.prim, e.ins[0], shapes, tuple(e.args), e.outs[0].dtype)
        else:
            continue
        if len(e.outs[0].shape) == 0 or math.prod(e.outs[0].shape[:-1]) != 1:
            continue  # one row only: see the module docstring
        groups.setdefault(key, []).append(m)
    out = {}
    for key, ms in groups.items():
        seen: set[str] = set()
        distinct = []  # a weight read twice (x @ W.T twice) stays with its first product
        for m in ms:
            if not set(m.weights) & seen:
                seen.update(m.weights)
                distinct.append(m)
        if len(distinct) >= 2:
            out[key] = distinct
    return out


@register("concat_projections")
def concat_projections(g: Graph, *, check: Check | None = None) -> Graph:
    """Concatenate sibling products (module docstring); ``check(prim, input value,
    member weight shapes, weight dtypes, args)`` says whether a group's shape keeps its
    bits on this device."""
    if check is None:
        from ..lower.concat import same_bits

        check = same_bits
    groups = _candidates(g)
    if not groups:
        return g
    vars_ = g.vars()
    params = {i.var.name: i for i in g.inputs}
    names = set(vars_)
    next_id = max((e.id for e in g.eqns), default=-1) + 1
    counter = 0

    def fresh(prefix: str) -> str:
        nonlocal counter
        while f"{prefix}{counter}" in names:
            counter += 1
        names.add(f"{prefix}{counter}")
        return f"{prefix}{counter}"

    new_inputs: list[Input] = []
    replace: dict[int, list[Eqn]] = {}  # the first member's id -> what takes its place
    removed: set[int] = set()
    dropped: set[str] = set()
    for ms in groups.values():
        first = ms[0].eqn
        x = vars_[first.ins[0]]
        wshapes = [[params[w].var.shape for w in m.weights] for m in ms]
        wdtypes = [params[w].var.dtype for w in ms[0].weights]
        if not check(first.prim, x, wshapes, wdtypes, tuple(first.args)):
            continue
        cat_vars = []
        for j, w0 in enumerate(ms[0].weights):
            rows = sum(params[m.weights[j]].var.shape[0] for m in ms)
            v = Var(fresh("pc"), (rows, *params[w0].var.shape[1:]), params[w0].var.dtype)
            new_inputs.append(Input(v, "param", concat_path([params[m.weights[j]].path for m in ms])))
            cat_vars.append(v)
        n_total = sum(m.eqn.outs[0].shape[-1] for m in ms)
        out = Var(fresh("vc"), (*first.outs[0].shape[:-1], n_total), first.outs[0].dtype)
        made: list[Eqn] = []
        if first.prim in ("Matmul", "AddMM"):
            t = Var(fresh("vc"), (cat_vars[0].shape[1], cat_vars[0].shape[0]), cat_vars[0].dtype)
            made.append(Eqn(next_id, "Transpose", (cat_vars[0].name,), (t,), ((1, 0),)))
            next_id += 1
            if first.prim == "Matmul":
                made.append(Eqn(next_id, "Matmul", (first.ins[0], t.name), (out,)))
            else:  # the biases concatenated too, broadcast to the product's shape
                c = Var(fresh("vc"), out.shape, cat_vars[1].dtype)
                made.append(Eqn(next_id, "Broadcast", (cat_vars[1].name,), (c,), (out.shape,)))
                made.append(Eqn(next_id + 1, "AddMM", (first.ins[0], t.name, c.name), (out,), first.args))
                next_id += 1
            next_id += 1
        else:
            made.append(Eqn(next_id, first.prim, (first.ins[0], *(v.name for v in cat_vars)), (out,), first.args))
            next_id += 1
        start = 0
        for m in ms:
            o = m.eqn.outs[0]
            n = o.shape[-1]
            lo = (0,) * (len(o.shape) - 1) + (start,)
            hi = (*o.shape[:-1], start + n)
            made.append(Eqn(m.eqn.id, "Slice", (out.name,), (o,), (lo, hi, (1,) * len(o.shape))))
            start += n
            removed.add(m.eqn.id)
            dropped.update(m.drop)
        replace[first.id] = made
    if not replace:
        return g
    eqns: list[Eqn] = []
    for e in g.eqns:
        if e.id in replace:
            eqns.extend(replace[e.id])
        elif e.id in removed or (e.outs and all(o.name in dropped for o in e.outs)):
            continue
        else:
            eqns.append(e)
    used = {v for e in eqns for v in e.ins} | set(g.outputs)
    inputs = tuple(i for i in g.inputs if i.kind != "param" or i.var.name in used) + tuple(new_inputs)
    return g.replace(inputs=inputs, eqns=tuple(eqns))
