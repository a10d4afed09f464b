"""Replay: run a segment's equations through their rules, after checking them all.

Each rule builds *the same primitive* the trace recorded (same kernel, same arguments),
so replaying a segment is bit-identical to running the model eagerly. Inputs arrive
already broadcast and cast: the trace records those steps as their own primitives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import mlx.core as mx

from ..errors import UnsupportedPrimitive
from ..ir import Const, Eqn, Graph, Segment
from . import dequantized, experts, live
from .attention import AttentionMatch, rows_mask
from .attention import Kernel as Attention
from .fused import find_all
from .kvwrite import Kernel as KVWrite
from .kvwrite import KVWriteMatch, WithAttention
from .prim import Rule, lookup
from .product_chain import chains_wanted
from .products import Kernel as Products
from .products import fused_rule


def check_supported(g: Graph) -> None:
    """Raise for the first equation without a rule, or whose arguments its rule cannot
    rebuild (its record's ``check``), before anything runs."""
    where = "start"
    vs = g.vars()
    for e in g.eqns:
        if e.is_pseudo:
            where = str(e.args[0]) if e.args else where
            continue
        at = f"{g.name}, after boundary {where!r}"
        p = lookup(e.prim)
        if p.rule is None:
            raise UnsupportedPrimitive(e.prim, f"{p.unsupported} (equation #{e.id})", where=at)
        reason = p.check(e, [vs[v] for v in e.ins]) if p.check is not None else None
        if reason is not None:
            raise UnsupportedPrimitive(e.prim, f"{reason} (equation #{e.id}, arguments {list(e.args)})", where=at)


def compile_loses(c: Const) -> bool:
    """Whether ``mx.compile`` would change this constant if the segment captured it: MLX
    0.32.4 writes a captured scalar into its fused kernels as a literal and loses the sign
    bit of ``-0.0`` and of a negative NaN (``x * -0.0`` gives ``+0.0``). Such constants
    are passed to the compiled segment as arguments instead, which keeps eager's bits."""
    if c.value is None or c.var.shape != () or not mx.issubdtype(c.value.dtype, mx.floating):
        return False
    v = c.value.astype(mx.float32).item()
    return (v == 0.0 or math.isnan(v)) and math.copysign(1.0, v) < 0


def segment_fn(
    g: Graph,
    seg: Segment,
    const_args: Sequence[str] = (),
    attention: Attention | None = None,
    products: Products | None = None,
    kv_write: KVWrite | None = None,
    dequantize: bool = False,
    dense_experts: bool = False,
    inputs: Sequence[str] | None = None,
    prologue: Sequence[Eqn] = (),
) -> Callable[..., list[mx.array]]:
    """A function of the segment's inputs (``inputs`` where given: the segment's own less
    those ``prologue``'s equations, replayed first, make from constants), then of the
    constants named in ``const_args``, returning its outputs by replaying its
    equations; other constants are captured.
    With ``attention`` (a kernel), each decomposed masked attention the segment holds
    (``attention.py``) is computed by it instead; with ``products``, each one-row product
    and the elementwise work after it (``products.py``); with ``kv_write``, each rotated
    KV-cache write (``kvwrite.py``), and where that kernel has a ``with_attention``, the
    write with the attention reading it as one step (``fused.py``); with ``dequantize``,
    each quantized product of many rows whose dequantized weight's product keeps its
    bytes here (``dequantized.py``); with ``dense_experts``, each sorted expert product
    whose product over every token keeps its bytes here (``experts.py``)."""
    consts = {c.var.name: c.value for c in g.consts if c.var.name not in const_args}
    fused = attention is not None or products is not None or kv_write is not None
    vs = g.vars() if fused or dequantize or dense_experts else {}
    shapes = {n: v.shape for n, v in vs.items()}
    typed = products is not None or kv_write is not None or dequantize or dense_experts
    avals = {n: (v.shape, v.dtype) for n, v in vs.items()} if typed else None
    return replay_fn(
        [*prologue, *seg.eqns(g)],
        (*(seg.inputs if inputs is None else inputs), *const_args),
        seg.outputs,
        consts,
        attention,
        shapes,
        g.eqns,
        products,
        avals,
        kv_write,
        dequantize,
        dense_experts,
        g.outputs,
    )


def _rule(e: Eqn) -> Rule:
    p = lookup(e.prim)
    if p.rule is None:
        raise UnsupportedPrimitive(e.prim, f"{p.unsupported} (equation #{e.id})")
    return p.rule


def _fused(m: AttentionMatch, kernel: Attention) -> Rule:
    def run(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
        q, k, v, mask = ins
        return kernel(q, k, v, rows_mask(mask), m.scale)

    return run


def _kv_rule(m: KVWriteMatch, kernel: KVWrite) -> Rule:
    def run(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
        return kernel(m, ins)

    return run


def _pair_rule(w: KVWriteMatch, m: AttentionMatch, kernel: WithAttention) -> Rule:
    def run(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
        *rest, mask = ins
        return kernel(w, m.scale, [*rest, rows_mask(mask)])

    return run


def _live_rule(scale: float) -> Rule:
    def run(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
        q, k, v, off = ins
        return live.attend(q, k, v, off, scale)

    return run


Step = tuple[Rule, Eqn, Sequence[str], tuple[str, ...]]


def _in_order(plan: list[Step], ready: set[str]) -> list[Step]:
    """``plan`` with each step moved after the steps making its inputs: a fused KV write
    runs where its last equation was, and a reader of the rotated queries it also makes
    (earlier in the trace) waits for it. Replay builds a lazy graph, so only the
    dependencies matter."""
    out: list[Step] = []
    waiting: list[Step] = []
    for step in plan:
        waiting.append(step)
        moved = True
        while moved:
            moved = False
            for w in waiting:
                if all(v in ready for v in w[2]):
                    out.append(w)
                    ready.update(w[3])
                    waiting.remove(w)
                    moved = True
                    break
    if waiting:  # a finder's bug (a cycle through a fused kernel), not a user's mistake
        raise AssertionError(f"replay: equations {[w[1].id for w in waiting]} wait for values never made")
    return out


def replay_fn(
    eqns: Sequence[Eqn],
    in_names: Sequence[str],
    out_names: Sequence[str],
    consts: dict[str, Any],
    attention: Attention | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    context: Sequence[Eqn] = (),
    products: Products | None = None,
    avals: Mapping[str, tuple] | None = None,
    kv_write: KVWrite | None = None,
    dequantize: bool = False,
    dense_experts: bool = False,
    program_outputs: Collection[str] = (),
) -> Callable[..., list[mx.array]]:
    with_attention: WithAttention | None = getattr(kv_write, "with_attention", None)
    live_write: KVWrite | None = getattr(kv_write, "live", None)  # SEGC_LIVE_ATTENTION (live.py)
    av = dict(avals or {})
    for n, shape in (shapes or {}).items():
        av.setdefault(n, (shape, None))
    found = find_all(
        eqns,
        out_names,
        consts,
        av,
        context,
        program_outputs,
        attention=attention is not None,
        where_eager_fuses=getattr(attention, "where_eager_fuses", False),  # "auto": attention.eager_fuses
        products=products is not None,
        chains=products is not None and chains_wanted(),
        writes=kv_write is not None,
        pairs=with_attention is not None,
        live=live_write is not None,
    )
    skip = found.skip()
    at = {m.last: m for m in found.attention}
    prod_at = {p.last: p for p in found.products}
    writes, pairs = found.writes, found.pairs
    paired = {id(w) for w, _ in pairs}
    write_at = {w.eqns[-1].id: w for w in writes if id(w) not in paired}
    pair_at = {m.last: (w, m) for w, m in pairs}
    rewrites, lifts = experts.find(eqns, out_names, av) if dense_experts else ({}, set())
    if (set(rewrites) | lifts) & (skip | set(pair_at) | set(write_at) | set(at) | set(prod_at)):
        rewrites, lifts = {}, set()  # a fused kernel took part of it: MLX's products stay
    lives = {id(w) for w, _ in found.live}  # pairs whose mask is one query's causal row
    live_rules: set[int] = set()
    plan: list[Step] = []
    for e in eqns:
        if e.id in pair_at and id(pair_at[e.id][0]) in lives:
            assert live_write is not None
            w, m = pair_at[e.id]  # the write (compiled with the rest), then MLX's attention over the live keys
            plan.append((_kv_rule(w, live_write), w.eqns[-1], w.ins, w.outs))
            rule = _live_rule(m.scale)
            live_rules.add(id(rule))
            plan.append((rule, e, (w.outs[2], w.outs[0], w.outs[1], w.ins[4]), (m.out,)))
        elif e.id in pair_at:
            w, m = pair_at[e.id]
            assert with_attention is not None
            plan.append((_pair_rule(w, m, with_attention), e, (*w.ins, m.mask), (w.outs[0], w.outs[1], m.out)))
        elif e.id in write_at:
            w = write_at[e.id]
            assert kv_write is not None
            plan.append((_kv_rule(w, kv_write), e, w.ins, w.outs))
        elif e.id in at:
            m = at[e.id]
            assert attention is not None
            plan.append((_fused(m, attention), e, (m.q, m.k, m.v, m.mask), (m.out,)))
        elif e.id in prod_at:
            p = prod_at[e.id]
            assert products is not None
            plan.append((fused_rule(p, products), e, p.ins, p.outs))
        elif e.id in rewrites:
            x = rewrites[e.id]
            plan.append((experts.rule(x), e, x.ins, x.outs))
        elif e.id not in skip:
            key = dequantized.candidate(e, av) if dequantize else None
            r = dequantized.rule if key is not None and dequantized.same_bits(key) else _rule(e)
            plan.append((r, e, e.ins, tuple(o.name for o in e.outs)))
            if e.id in lifts:  # also on the (E, T, N) forms of its inputs
                lifted = tuple(v + experts.SUFFIX for v in e.ins)
                plan.append((r, e, lifted, tuple(o.name + experts.SUFFIX for o in e.outs)))
    if writes:
        plan = _in_order(plan, {*consts, *in_names})
    if live_rules:  # steps that read the host's offset at each call: compiled around, not in
        return live.staged(
            plan, {i for i, st in enumerate(plan) if id(st[0]) in live_rules}, consts, in_names, out_names
        )
    return live.steps_fn(plan, consts, in_names, out_names)
