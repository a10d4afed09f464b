"""Check that each equation's declared outputs are what its rule builds.

A traced graph is right by construction; a graph parsed from text may claim anything:
``Add`` with one input, a ``Matmul`` whose output shape does not follow from its
inputs. :func:`check_types` builds every equation's rule on placeholder inputs of the
declared shapes and dtypes (lazily: nothing is evaluated or allocated) and compares the
outputs with the declared ones, so such a graph is refused by name before it runs
instead of failing inside MLX with an ``IndexError``. An equation given more inputs
than its rule reads (``Exp(%a0, %a0)``) is refused too: the rule's inputs are a list
that records which of them the rule touched.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .. import dtypes
from ..errors import IRError
from ..ir import Graph
from .prim import lookup
from .replay import check_supported


class _Seen(list):
    """A rule's inputs, recording which it reads (an index, a slice, or all of them by
    iterating)."""

    def __init__(self, items: list[Any]):
        super().__init__(items)
        self.read: set[int] = set()

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            self.read.update(range(len(self))[k])
        elif isinstance(k, int):
            self.read.add(k % len(self) if len(self) else k)
        return super().__getitem__(k)

    def __iter__(self) -> Any:
        self.read.update(range(len(self)))
        return super().__iter__()

    def unread(self) -> list[int]:
        return [k for k in range(len(self)) if k not in self.read]


def check_types(g: Graph) -> None:
    """Raise :class:`IRError` for the first equation whose rule cannot take its inputs or
    builds other outputs than it declares."""
    check_supported(g)
    env: dict[str, Any] = {}
    for i in g.inputs:
        env[i.var.name] = mx.zeros(i.var.shape, dtypes.to_mx(i.var.dtype))
    for c in g.consts:
        env[c.var.name] = c.value if c.value is not None else mx.zeros(c.var.shape, dtypes.to_mx(c.var.dtype))
    for e in g.eqns:
        if e.is_pseudo:
            continue
        where = f"equation #{e.id} ({e.prim})"
        rule = lookup(e.prim).rule
        assert rule is not None  # check_supported refused it otherwise
        ins = _Seen([env[v] for v in e.ins])
        try:
            res = rule(ins, e.args, e)
        except (ValueError, TypeError, IndexError, KeyError, RuntimeError, AttributeError) as exc:
            raise IRError(f"{where}: its inputs {list(e.ins)} do not fit the primitive: {exc}") from None
        if ins.unread():
            extra = [e.ins[k] for k in ins.unread()]
            raise IRError(
                f"{where}: the primitive takes {len(e.ins) - len(extra)} inputs, got {len(e.ins)}: {extra} unused"
            )
        outs = [res] if isinstance(res, mx.array) else list(res)
        if len(outs) != len(e.outs):
            raise IRError(f"{where}: declares {len(e.outs)} outputs, the primitive makes {len(outs)}")
        for o, r in zip(e.outs, outs):
            got = f"{dtypes.short(r.dtype)}[{','.join(map(str, r.shape))}]"
            if got != o.type_str():
                raise IRError(f"{where}: declares %{o.name}: {o.type_str()}, the primitive makes {got}")
            env[o.name] = r
