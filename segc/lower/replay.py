"""Replay: run a segment's equations through their rules, after checking them all.

Each rule builds *the same primitive* the trace recorded (same kernel, same arguments),
so replaying a segment is bit-identical to running the model eagerly. Inputs arrive
already broadcast and cast: the trace records those steps as their own primitives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from ..errors import UnsupportedPrimitive
from ..ir import Const, Eqn, Graph, Segment
from .prim import Rule, lookup


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


def segment_fn(g: Graph, seg: Segment, const_args: Sequence[str] = ()) -> Callable[..., list[mx.array]]:
    """A function of the segment's inputs, then of the constants named in ``const_args``,
    returning its outputs by replaying its equations; other constants are captured."""
    consts = {c.var.name: c.value for c in g.consts if c.var.name not in const_args}
    return replay_fn(seg.eqns(g), (*seg.inputs, *const_args), seg.outputs, consts)


def _rule(e: Eqn) -> Rule:
    p = lookup(e.prim)
    if p.rule is None:
        raise UnsupportedPrimitive(e.prim, f"{p.unsupported} (equation #{e.id})")
    return p.rule


def replay_fn(
    eqns: Sequence[Eqn], in_names: Sequence[str], out_names: Sequence[str], consts: dict[str, Any]
) -> Callable[..., list[mx.array]]:
    plan = [(_rule(e), e, e.ins, tuple(o.name for o in e.outs)) for e in eqns]

    def run(*xs: mx.array) -> list[mx.array]:
        env: dict[str, Any] = dict(consts)
        env.update(zip(in_names, xs))
        for r, e, ins, outs in plan:
            res = r([env[v] for v in ins], e.args, e)
            if isinstance(res, mx.array):
                env[outs[0]] = res
            else:
                env.update(zip(outs, res))
        return [env[v] for v in out_names]

    return run
