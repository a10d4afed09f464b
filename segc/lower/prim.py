"""The primitive table: one :class:`Prim` record per MLX primitive, in :data:`PRIMS`.

A record holds everything segc knows about a primitive, so a new primitive is added in
one place (a family module of this package):

- ``rule(ins, args, eqn) -> array | list[array]``: rebuilds the primitive with the MLX
  op that creates it (``args`` is its exported state in canonical form); ``None``: the
  primitive is known but not lowered, and ``unsupported`` says why;
- ``check(eqn, in_vars) -> reason | None``: arguments the rule cannot rebuild, checked
  before anything runs; ``refused`` says the same in words (docs/lowering.md);
- ``rebuilt``: when no Python op makes the primitive with that state, the rule computes
  the same values another way (pure data movement, a boolean, a constant): when, in words;
- ``fusible``: ``mx.compile`` fuses it (``is_unary``/``is_binary``/``Select``/
  ``Broadcast`` in ``mlx/compile.cpp``, whose own filing is kept: it lists ``Remainder``
  among the unary ops);
- ``memory``: ``"compute"`` (a new buffer, FLOPs and bytes), ``"move"`` (a new buffer,
  bytes only), ``"view"`` (aliases its input, no bytes), ``"view_keep"`` (a view that
  keeps a contiguous input contiguous), ``"reshape"`` (a view of a contiguous input,
  else a copy);
- ``flops(eqn, vars) -> int``.

:func:`lookup` is the one default: a primitive not in the table gets a record with no
rule, so lowering refuses it by name and analyses treat it as elementwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..ir import Eqn, Var

Rule = Callable[[list[mx.array], tuple, Eqn], Any]
Check = Callable[[Eqn, list[Var]], "str | None"]
Flops = Callable[[Eqn, dict[str, Var]], int]
MEMORY = ("compute", "move", "view", "view_keep", "reshape")


def elementwise_flops(e: Eqn, vs: dict[str, Var]) -> int:
    return sum(o.size for o in e.outs)


def no_flops(e: Eqn, vs: dict[str, Var]) -> int:
    return 0


def matmul_flops(e: Eqn, vs: dict[str, Var]) -> int:
    """2 * outputs * K (a multiply-add counts two)."""
    x = vs[e.ins[0]]
    k = x.shape[-1] if x.shape else 1
    return 2 * sum(o.size for o in e.outs) * k


def reduce_flops(e: Eqn, vs: dict[str, Var]) -> int:
    return vs[e.ins[0]].size if e.ins else 0


def normalize_flops(e: Eqn, vs: dict[str, Var]) -> int:
    return 5 * sum(o.size for o in e.outs)


@dataclass(frozen=True, slots=True)
class Prim:
    name: str
    rule: Rule | None = None
    check: Check | None = None
    refused: str | None = None
    rebuilt: str | None = None
    unsupported: str | None = None
    fusible: bool = False
    memory: str = "compute"
    flops: Flops = elementwise_flops
    # the equation's enum arguments in words ("sum" for a Reduce of type 2), for the
    # printed IR; the arguments themselves stay MLX's integers
    describe: Callable[[tuple], str] | None = None

    def __post_init__(self) -> None:
        if self.memory not in MEMORY:
            raise ValueError(f"{self.name}: memory must be one of {MEMORY}, got {self.memory!r}")
        if (self.check is None) != (self.refused is None):
            raise ValueError(f"{self.name}: a check and its refusal in words go together")
        if self.rule is None and self.unsupported is None:
            raise ValueError(f"{self.name}: a primitive without a rule says why (unsupported=)")


PRIMS: dict[str, Prim] = {}


def define(p: Prim) -> Prim:
    if p.name in PRIMS:
        raise ValueError(f"primitive {p.name!r} defined twice")
    PRIMS[p.name] = p
    return p


def rule(*names: str, **facts: Any) -> Callable[[Rule], Rule]:
    """Decorator: define each of ``names`` with this rule and ``facts`` (Prim fields)."""

    def deco(f: Rule) -> Rule:
        for n in names:
            define(Prim(n, f, **facts))
        return f

    return deco


def describe(e: Eqn) -> str:
    """What ``e``'s enum arguments mean, in words ("" when it has none, or they do not
    parse): the printer's comment after an equation (``segc.ir.to_text(describe=...)``)."""
    p = PRIMS.get(e.prim)
    if p is None or p.describe is None or not e.args:
        return ""
    try:
        return p.describe(e.args)
    except (KeyError, IndexError, TypeError):
        return ""


def lookup(name: str) -> Prim:
    """The record of ``name``; an unknown primitive gets the default (no rule)."""
    p = PRIMS.get(name)
    return p if p is not None else Prim(name, unsupported="no lowering rule")
