"""A prefill's expert products as each expert's product over every token, where a device
check finds this keeps the sorted ``gather_mm``'s bytes (issue 13: the MoE prefill).

mlx-lm's ``SwitchGLU`` sorts a prefill's (token, expert) rows by expert and runs each
expert product as ``gather_mm(rows, W.swapaxes(-1, -2), rhs_indices=idx,
sorted_indices=True)``, one row a slot. MLX 0.32's CUDA build runs that as CUTLASS's
grouped GEMM, whose operands it loads one element at a time: 515 us for the mixtral
preset's 512-token gate product (2048 to 8192, 8 experts, 2 a token), where MLX's batched
cuBLAS product of every token by every expert, four times the work, takes 262 us
(``benchmarks/prefill_moe.py``). Both accumulate each output element in float32 over the
inner dimension in the same order, so the picked rows have the same bytes at the
reference shapes; each shape is still checked (:func:`same_bits`) before it is taken.
A quantized model's sorted ``gather_qmm`` is worse off: MLX runs it a slot at a time
(6.8 ms for that gate product at 4 bits), and MLX's dequantize of the experts' weights
then the same batched product gives its bytes in 0.25 ms.

Two rewrites, each of one ``GatherMM`` (sorted, one row a slot, ``lhs`` the slots' arange,
the weight a transposed ``(E, N, K)`` array) or ``GatherQMM`` (the same, affine, with
biases; ``W`` its weights dequantized):

- a *leaf*, whose rows are gathered from ``src`` (``(T, 1, K)``, mlx-lm's flattened
  tokens) by ``tok``: ``every = src @ W.T`` (``(E, T, N)``), its rows ``every[idx, tok]``;
- a *down* product, whose rows are an elementwise function of leaves of the same ``idx``
  and ``tok`` (the SwiGLU between gate and up): the function replayed on the leaves'
  ``every`` arrays, then ``every_h @ W.T`` batched over the experts and picked the same way.

An expert product over every token does ``E * T`` rows of work for ``R`` rows; taken only
where that is at most :data:`MAX_WORK` times and an ``(E, T, N)`` array at most
:data:`MAX_BYTES` (it is a temporary: a prefill's peak grows by a few of them).

Setting: :data:`DENSE_EXPERTS`, ``"auto"`` (a CUDA GPU with MLX of the series the check was
built on, unless ``SEGC_DENSE_EXPERTS=0``) or ``"never"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..ir import Eqn
from . import checked
from .pattern import SegmentGraph
from .products import cuda_wanted

DENSE_EXPERTS = "auto"  # read when a graph is lowered
MAX_WORK = 4  # E * T rows of work for R rows: the mixtral's 8 experts, 2 a token
MAX_BYTES = 1 << 30  # one (E, T, N) temporary
DRAWS = 4  # normal and mixed powers of two, each with even and with skewed routing
SUFFIX = "@every"  # the name of a value's (E, T, N) form in a replay's environment
LIFTED = frozenset(
    {"Abs", "Add", "AsType", "Divide", "Erf", "Exp", "Maximum", "Minimum", "Multiply", "Negative", "Sigmoid"}
    | {"Square", "Subtract", "Tanh"}
)

# (kind, E, T, K, N, slots a token, dtype, group size, bits): the last two 0 for unquantized
Key = tuple[str, int, int, int, int, int, str, int, int]


def wanted(setting: str | None = None) -> bool:
    """Whether lowering looks for expert products at all (``setting`` defaults to
    :data:`DENSE_EXPERTS`)."""
    return cuda_wanted(DENSE_EXPERTS if setting is None else setting, "DENSE_EXPERTS")


Quant = tuple[int, int] | None  # (group size, bits) of affine-quantized experts, or None


@dataclass(frozen=True)
class Rewrite:
    """One expert product rewritten: its rule's inputs (``(src or every_h, idx, tok,
    *weights)``: ``W.T`` for a ``GatherMM``, ``(w, scales, biases)`` for a ``GatherQMM``),
    outputs (a leaf also names its ``every``) and quantization."""

    kind: str  # "leaf" or "down"
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    quant: Quant = None


def weight(ws: Sequence[mx.array], quant: Quant, dt: mx.Dtype) -> mx.array:
    """The experts' weights as ``(E, K, N)`` of type ``dt``: ``W.T`` itself, or the
    quantized weights dequantized (MLX's ``dequantize``) and transposed."""
    if quant is None:
        return ws[0]
    w, scales, biases = ws
    return mx.dequantize(w, scales, biases, group_size=quant[0], bits=quant[1], dtype=dt).swapaxes(-1, -2)


def leaf(
    src: mx.array, idx: mx.array, tok: mx.array, ws: Sequence[mx.array], quant: Quant, shape: Sequence[int]
) -> list[mx.array]:
    """Every expert's product over every token (``src`` of ``(T, 1, K)``) and the rows
    ``(idx, tok)`` of it, shaped as the product's output."""
    every = src.reshape(src.shape[0], src.shape[-1]) @ weight(ws, quant, src.dtype)
    return [every[idx, tok].reshape(shape), every]


def down(
    h: mx.array, idx: mx.array, tok: mx.array, ws: Sequence[mx.array], quant: Quant, shape: Sequence[int]
) -> mx.array:
    """Each expert's product over its own ``(T, K)`` rows of ``h`` (``(E, T, K)``), picked."""
    return (h @ weight(ws, quant, h.dtype))[idx, tok].reshape(shape)


def _arange(g: SegmentGraph, v: str, n: int) -> bool:
    e = g.anywhere.get(v)
    return e is not None and e.prim == "Arange" and [float(x) for x in e.args[:3]] == [0.0, float(n), 1.0]


def _sorted_mm(g: SegmentGraph, e: Eqn) -> tuple[str, tuple[str, ...], str, int, int, int, int, Quant] | None:
    """``(a, weights, idx, R, E, K, N, quant)`` of a sorted ``GatherMM`` (of a transposed
    ``(E, N, K)`` weight) or ``GatherQMM`` (affine, transposed, with biases) of one row a
    slot."""
    weights: tuple[str, ...]
    quant: Quant
    if e.prim == "GatherMM" and len(e.ins) == 4 and list(e.args[:2]) == [False, True]:
        a, bt, lhs, idx = e.ins
        tr = g.anywhere.get(bt)
        if tr is None or tr.prim != "Transpose" or list(tr.args[0]) != [0, 2, 1]:
            return None
        ws, weights, quant = g.shape.get(tr.ins[0], ()), (bt,), None
    elif e.prim == "GatherQMM" and len(e.ins) == 6 and list(e.args[2:]) == [0, True, False, True]:
        a, w, sc, bi, lhs, idx = e.ins
        if g.dtype.get(w) != "u32" or not g.dtype.get(a) == g.dtype.get(sc) == g.dtype.get(bi):
            return None
        ws, weights, quant = g.shape.get(w, ()), (w, sc, bi), (int(e.args[0]), int(e.args[1]))
    else:
        return None
    xs, out = g.shape.get(a, ()), tuple(e.outs[0].shape)
    if len(ws) != 3 or len(xs) != 3:
        return None
    r, n_e, n, k = xs[0], ws[0], ws[1], xs[2]
    if quant is None and ws[2] != k:
        return None
    if xs != (r, 1, k) or out != (r, 1, n) or g.shape.get(idx) != (r,) or not _arange(g, lhs, r):
        return None
    if g.dtype.get(idx) != "u32" or not {g.dtype.get(a), e.outs[0].dtype} <= {"bf16", "f16", "f32"}:
        return None
    return a, weights, idx, r, n_e, k, n, quant


def _gathered_rows(g: SegmentGraph, a: str, r: int, k: int) -> tuple[str, str, int] | None:
    """``(src, tok, T)`` where ``a = squeeze(gather(src, tok))``, ``src`` of ``(T, 1, K)``."""
    sq = g.eqn(a, "Squeeze")
    ga = g.eqn(sq.ins[0], "Gather") if sq is not None else None
    if ga is None or len(ga.ins) != 2 or list(ga.args[0]) != [0]:
        return None
    src, tok = ga.ins
    ss = g.shape.get(src, ())
    if len(ss) != 3 or ss[1:] != (1, k) or list(ga.args[1]) != [1, 1, k] or g.shape.get(tok) != (r,):
        return None
    return src, tok, ss[0]


def _fits(n_e: int, t: int, r: int, k: int, n: int, dt: str) -> bool:
    """Work at most :data:`MAX_WORK` times the rows', the ``(E, T, N)`` array and the
    experts' weights (dequantized) at most :data:`MAX_BYTES` each."""
    size = dtypes.itemsize(dt)
    return r % t == 0 and n_e * t <= MAX_WORK * r and n_e * max(t, k) * n * size <= MAX_BYTES


def find(
    eqns: Sequence[Eqn], keep: Sequence[str], avals: Mapping[str, tuple[tuple[int, ...], Any]]
) -> tuple[dict[int, Rewrite], set[int]]:
    """The rewrites of ``eqns`` (by equation id) that :func:`same_bits` lets through, and
    the ids of the elementwise equations to replay on ``every`` arrays too (``avals``:
    every value's shape and type, the segment's inputs' included)."""
    g = SegmentGraph(eqns, keep)
    for v in {v for e in eqns for v in e.ins} - g.shape.keys():  # the segment's inputs
        if v in avals:
            shape, dt = avals[v]
            g.shape[v] = tuple(shape)
            if dt is not None:
                g.dtype[v] = str(dt)
    out: dict[int, Rewrite] = {}
    lifts: set[int] = set()
    leaves: dict[str, tuple[str, str, int]] = {}  # output -> (idx, tok, T)
    for e in eqns:
        mm = _sorted_mm(g, e)
        if mm is None:
            continue
        a, weights, idx, r, n_e, k, n, quant = mm
        dt = e.outs[0].dtype
        q = quant or (0, 0)
        rows = _gathered_rows(g, a, r, k)
        if rows is not None:
            src, tok, t = rows
            if _fits(n_e, t, r, k, n, dt) and same_bits(("leaf", n_e, t, k, n, r // t, dt, *q)):
                names = (e.outs[0].name, e.outs[0].name + SUFFIX)
                out[e.id] = Rewrite("leaf", (src, idx, tok, *weights), names, quant)
                leaves[e.outs[0].name] = (idx, tok, t)
            continue
        chain = _chain(g, a, leaves, idx)
        if chain is None:
            continue
        tok, t, lifted = chain
        if _fits(n_e, t, r, k, n, dt) and same_bits(("down", n_e, t, k, n, r // t, dt, *q)):
            out[e.id] = Rewrite("down", (a + SUFFIX, idx, tok, *weights), (e.outs[0].name,), quant)
            lifts |= lifted
    return out, lifts


def _chain(
    g: SegmentGraph, a: str, leaves: dict[str, tuple[str, str, int]], idx: str
) -> tuple[str, int, set[int]] | None:
    """``(tok, T, equation ids)`` where ``a`` is an elementwise function (of :data:`LIFTED`
    primitives, each of ``a``'s shape) of leaves of rows ``(idx, tok)``."""
    shape, found, lifted = g.shape.get(a), set(), set()
    stack = [a]
    while stack:
        v = stack.pop()
        if v in leaves:
            if leaves[v][0] != idx:
                return None
            found.add(leaves[v][1:])
            continue
        e = g.prod.get(v)
        if e is None or e.prim not in LIFTED or len(e.outs) != 1 or e.outs[0].shape != shape:
            return None
        if e.id not in lifted:
            lifted.add(e.id)
            stack.extend(e.ins)
    if len(found) != 1:
        return None
    ((tok, t),) = found
    return tok, t, lifted


def _routing(t: int, n_e: int, top: int, seed: int) -> tuple[mx.array, mx.array]:
    """mlx-lm's sorted slots of ``t`` tokens: each row's expert and token; odd seeds
    skewed, most tokens to expert 0 and some experts empty."""
    k = mx.random.split(mx.random.key(seed), 2)
    logits = mx.random.normal((t, n_e), key=k[0])
    if seed % 2:
        logits = logits - mx.arange(n_e, dtype=mx.float32) * 2.0
    inds = mx.argpartition(-logits, kth=top - 1, axis=-1)[:, :top].flatten()
    order = mx.argsort(inds)
    return inds[order].astype(mx.uint32), (order // top).astype(mx.uint32)


def _values(shape: tuple[int, ...], dt: mx.Dtype, key: mx.array, powers: bool) -> mx.array:
    k = mx.random.split(key, 2)
    if not powers:  # normal
        return mx.random.normal(shape, key=k[0]).astype(dt)
    e = mx.random.randint(0, 7, shape, key=k[0]).astype(mx.float32)  # +-2**-6..2**0
    return (mx.where(mx.random.bernoulli(0.5, shape, key=k[1]), 1.0, -1.0) * mx.power(2.0, e - 6)).astype(dt)


def inputs_of(key: Key, w: mx.array) -> tuple[list[mx.array], Quant]:
    """``w`` (``(E, N, K)``) as the product's weight inputs for ``key``."""
    gs, bits = key[7], key[8]
    if not bits:
        return [w.swapaxes(-1, -2)], None
    return list(mx.quantize(w, group_size=gs, bits=bits)), (gs, bits)


def reference(rows: mx.array, idx: mx.array, ws: Sequence[mx.array], quant: Quant) -> mx.array:
    """MLX's sorted product (``gather_mm`` or ``gather_qmm``): the bytes to keep."""
    if quant is None:
        return mx.gather_mm(rows, ws[0], rhs_indices=idx, sorted_indices=True)
    gs, bits = quant
    w, scales, biases = ws
    return mx.gather_qmm(
        rows, w, scales, biases, rhs_indices=idx, transpose=True, group_size=gs, bits=bits, sorted_indices=True
    )


def agree(key: Key, form: Callable[..., mx.array] | None = None) -> bool:
    """Whether the rewrite of ``key``'s kind (or ``form(x, idx, tok, weights, quant,
    shape)``) gives the sorted product's bytes on ``DRAWS`` draws at ``key``'s shapes."""
    kind, n_e, t, k, n, top, dt_name = key[:7]
    dt = dtypes.to_mx(dt_name)
    for seed in range(DRAWS):
        idx, tok = _routing(t, n_e, top, seed)
        ks = mx.random.split(mx.random.key(1000 + seed), 2)
        powers = seed // 2 % 2 == 1
        ws, quant = inputs_of(key, _values((n_e, n, k), dt, ks[0], powers) * (1 if powers else k**-0.5))
        shape = (t * top, 1, n)
        if kind == "leaf":
            x = _values((t, 1, k), dt, ks[1], powers)
            rows = x[tok]
            got = form(x, idx, tok, ws, quant, shape) if form else leaf(x, idx, tok, ws, quant, shape)[0]
        else:
            x = _values((n_e, t, k), dt, ks[1], powers)
            rows = x[idx, tok].reshape(t * top, 1, k)
            got = form(x, idx, tok, ws, quant, shape) if form else down(x, idx, tok, ws, quant, shape)
        want = reference(rows, idx, ws, quant)
        mx.eval(want, got)
        if not dtypes.same_bytes(want, got):
            return False
    return True


def same_bits(key: Key) -> bool:
    """Whether the rewrite gives the sorted product's bytes at ``key``'s shapes on
    the default device (the answer kept for the process)."""
    return checked.once("experts", key, lambda: agree(key))


def rule(w: Rewrite) -> Callable[[list[mx.array], tuple, Eqn], Any]:
    """The replay rule of rewrite ``w``."""
    if w.kind == "leaf":
        return lambda ins, args, e: leaf(ins[0], ins[1], ins[2], ins[3:], w.quant, e.outs[0].shape)
    return lambda ins, args, e: down(ins[0], ins[1], ins[2], ins[3:], w.quant, e.outs[0].shape)
