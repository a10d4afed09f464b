"""The :class:`Graph`: inputs, captured constants, an ordered tuple of equations in
A-normal form (each value assigned once) and outputs. Frozen: a pass returns a new one
(``replace`` returns ``self`` when nothing changes)."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from .nodes import Const, Eqn, Input, Var
from .printer import to_text


@dataclass(frozen=True, slots=True)
class Graph:
    name: str
    inputs: tuple[Input, ...]
    consts: tuple[Const, ...]
    eqns: tuple[Eqn, ...]
    outputs: tuple[str, ...]

    def replace(self, **kw: Any) -> Graph:
        if all(getattr(self, k) == v for k, v in kw.items()):
            return self
        return dataclasses.replace(self, **kw)

    def vars(self) -> dict[str, Var]:
        """Every value of the graph by name."""
        out = {i.var.name: i.var for i in self.inputs}
        out.update({c.var.name: c.var for c in self.consts})
        for e in self.eqns:
            for o in e.outs:
                out[o.name] = o
        return out

    def fingerprint(self) -> str:
        """A short hash of the graph's structure (not of parameter values)."""
        return hashlib.sha256(to_text(self, headers=False).encode()).hexdigest()[:16]

    def as_text(self) -> str:
        return to_text(self)

    def __str__(self) -> str:
        return to_text(self)
