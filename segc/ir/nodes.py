"""The IR's node types: values, graph inputs, constants and equations.

Values are named by strings (``%v3``); every value has a shape and a dtype, hence a
byte size. An :class:`Eqn` applies one primitive; a *pseudo-equation* (``segc.cut``
and the effects below) computes nothing and carries schedule information only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import dtypes

CUT = "segc.cut"  # ends the segment before it
# fences and windows (passes/fences.py, passes/windows.py): effects that no pass may
# drop or reorder; the verifier (ir/verify.py) checks them
SIGNAL = "segc.signal"  # args (event, value): signal once this segment has completed
WAIT = "segc.wait"  # args (event, value): do not dispatch this segment before event >= value
HOST_EVENT = "segc.host_event"  # args (event,): the host (not the graph) signals this event
WINDOW = "segc.window"  # args (name, first_id, last_id, mode, entry values, exit values)
EFFECTS = frozenset({SIGNAL, WAIT, HOST_EVENT, WINDOW})
PSEUDO = frozenset({CUT}) | EFFECTS
INPUT_KINDS = ("arg", "param", "state")  # an Input's kind


@dataclass(frozen=True, slots=True)
class Var:
    name: str
    shape: tuple[int, ...]
    dtype: str  # short name, see segc.dtypes

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * dtypes.itemsize(self.dtype)

    def type_str(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True, slots=True)
class Input:
    """A graph input: an argument leaf (``arg``), a module parameter (``param``) or an
    array of a state object (``state``), with its pytree path or parameter name."""

    var: Var
    kind: str  # one of INPUT_KINDS: "arg" | "param" | "state"
    path: str


@dataclass(frozen=True, slots=True, eq=False)
class Const:
    """A captured constant and its value (an evaluated ``mx.array``).

    ``value`` is None only for a constant parsed from text that elided it (larger than
    ``printer.ELIDE_BYTES``): such a graph can be inspected but not run. Equality
    compares bytes.
    """

    var: Var
    value: Any = field(repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Const) or self.var != other.var:
            return False
        if self.value is None or other.value is None:
            return self.value is None and other.value is None
        mine, theirs = dtypes.to_bytes_many([self.value, other.value])  # one read of both
        return mine == theirs

    def __hash__(self) -> int:
        return hash(self.var)


@dataclass(frozen=True, slots=True)
class DTypeArg:
    """A dtype appearing among a primitive's arguments (e.g. ``AsType``)."""

    name: str


@dataclass(frozen=True, slots=True)
class Eqn:
    id: int
    prim: str
    ins: tuple[str, ...]
    outs: tuple[Var, ...]
    args: tuple[Any, ...] = ()

    def replace(self, **kw: Any) -> Eqn:
        if all(getattr(self, k) == v for k, v in kw.items()):
            return self
        return dataclasses.replace(self, **kw)

    @property
    def is_pseudo(self) -> bool:
        return self.prim in PSEUDO


class GraphLike(Protocol):
    """What the segment, printer and verifier code reads of a graph (``graph.Graph`` has
    it): typed this way so that those modules need not import ``graph.py``, which
    imports the printer."""

    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> Sequence[Input]: ...
    @property
    def consts(self) -> Sequence[Const]: ...
    @property
    def eqns(self) -> Sequence[Eqn]: ...
    @property
    def outputs(self) -> Sequence[str]: ...
    def vars(self) -> dict[str, Var]: ...
