"""The IR's text form. ``parse(to_text(g)) == g`` (``parser.py``); header lines, which
start with ``--``, and the `` -- ...`` after an equation's ``#id`` are comments to the
parser. The graph's inputs go one per line when there are more than a few.

A segment header names the segment, its equation count, its boundary values with their
bytes and the effects the runtime honours for it. Callers may append their own figures
(``Lowered.as_text`` adds the cost model's) through ``annotate``: the IR knows no cost
model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from .. import dtypes
from ..units import fmt_bytes
from .nodes import HOST_EVENT, SIGNAL, WAIT, WINDOW, Const, DTypeArg, Eqn, GraphLike
from .segments import Segment, segments

Annotate = Callable[[Segment], str]
Describe = Callable[[Eqn], str]

_SMALL = 16  # constants of at most this many elements print as a JSON list
_ONE_LINE = 4  # graphs with at most this many inputs print them on the header line
ELIDE_BYTES = 1 << 16  # larger constants print as "elided"
# a graph name printed as it is; any other name prints as a JSON string ("f(x)", "a b")
BARE_NAME = re.compile(r"[A-Za-z0-9_.<>\-]+")


def name_text(name: str) -> str:
    """A graph's name as the header prints it: bare (``f``, ``<lambda>``) or, when the
    parser could not read it back bare, as a JSON string."""
    return name if BARE_NAME.fullmatch(name) else json.dumps(name)


def _enc_arg(a: Any) -> Any:
    if isinstance(a, tuple | list):
        return [_enc_arg(x) for x in a]
    if isinstance(a, DTypeArg):
        return {"dtype": a.name}
    return a


def _dec_arg(a: Any) -> Any:
    if isinstance(a, list):
        return tuple(_dec_arg(x) for x in a)
    if isinstance(a, dict):
        if set(a) != {"dtype"} or not isinstance(a["dtype"], str):
            raise ValueError(f'an object among the arguments must be {{"dtype": name}}, got {a}')
        return DTypeArg(a["dtype"])
    return a


def args_to_json(args: tuple[Any, ...]) -> str:
    return json.dumps(_enc_arg(args), separators=(", ", ": "))


def args_from_json(text: str) -> tuple[Any, ...]:
    return _dec_arg(json.loads(text))


def _shown(c: Const) -> bool:
    return c.value is not None and c.var.nbytes <= ELIDE_BYTES


def _const_texts(consts: Sequence[Const]) -> list[str]:
    """Each constant's text; the bytes of those shown read together (on CUDA one
    evaluation and one emptying of MLX's cache for the graph, not one a constant)."""
    shown = [c for c in consts if _shown(c)]
    raws = iter(dtypes.to_bytes_many([c.value for c in shown]))
    return [_const_text(c, next(raws)) if _shown(c) else "elided" for c in consts]


def _const_text(c: Const, data: bytes) -> str:
    """A JSON list of values (small constants whose values read back to the same bytes),
    or ``hex:`` and the raw bytes: a NaN other than the dtype's canonical one (a sign, a
    payload) does not survive a list, so such a constant prints as hex."""
    v = c.var
    if v.size <= _SMALL and v.dtype != "c64":
        vals = json.dumps(dtypes.to_numpy(data, v.shape, v.dtype).reshape(-1).tolist())
        if dtypes.from_values(json.loads(vals), v.shape, v.dtype) == data:
            return vals
    return "hex:" + data.hex()


def effect_text(e: Eqn) -> str:
    """A fence or window in words, for segment headers."""
    if e.prim == WAIT:
        return f"waits {e.args[0]} >= {e.args[1]}"
    if e.prim == SIGNAL:
        return f"signals {e.args[0]} = {e.args[1]} when done"
    if e.prim == HOST_EVENT:
        return f"host signals {e.args[0]}"
    if e.prim == WINDOW:
        text = f"window {e.args[0]!r} [#{e.args[1]}, #{e.args[2]}] {e.args[3]}"
        if e.args[3] == "range":
            entry = " ".join("%" + v for v in e.args[4]) or "-"
            exit_ = " ".join("%" + v for v in e.args[5]) or "-"
            text += f", entry {entry}, exit {exit_}"
        return text
    return ""


def segment_header(g: GraphLike, s: Segment, annotate: Annotate | None = None) -> str:
    """``-- segment 0 'l0': 12 eqns, in 3 (1.5 KiB), out 1 (512 B)[annotation][; effects]``."""
    vs = g.vars()
    n = sum(1 for e in g.eqns[s.start : s.stop] if not e.is_pseudo)
    inb = sum(vs[v].nbytes for v in s.inputs)
    outb = sum(vs[v].nbytes for v in s.outputs)
    head = (
        f"  -- segment {s.index} {s.name!r}: {n} eqns, in {len(s.inputs)} ({fmt_bytes(inb)}), "
        f"out {len(s.outputs)} ({fmt_bytes(outb)})"
    )
    if annotate is not None:
        head += annotate(s)
    effects = [effect_text(e) for e in g.eqns[s.start : s.stop] if e.is_pseudo]
    effects = [x for x in effects if x]
    return head + (f"; {'; '.join(effects)}" if effects else "")


def to_text(
    g: GraphLike, headers: bool = True, annotate: Annotate | None = None, describe: Describe | None = None
) -> str:
    """Print the graph; ``parse(to_text(g)) == g``. Header lines start with ``--``.
    ``describe(eqn)`` (e.g. ``segc.lower.describe``: ``sum`` for a ``Reduce`` of type 2)
    is printed after an equation's id as a comment."""
    ins = [f"%{i.var.name}: {i.var.type_str()} {i.kind}={json.dumps(i.path)}" for i in g.inputs]
    if len(ins) <= _ONE_LINE:
        lines = [f"graph {name_text(g.name)}({', '.join(ins)}) {{"]
    else:
        lines = [f"graph {name_text(g.name)}(", *(f"    {x}," for x in ins), ") {"]
    for c, text in zip(g.consts, _const_texts(g.consts), strict=True):
        lines.append(f"  const %{c.var.name}: {c.var.type_str()} = {text}")
    starts: dict[int, Segment] = {}
    if headers:
        starts = {s.start: s for s in segments(g)}
    for k, e in enumerate(g.eqns):
        if k in starts:
            lines.append(segment_header(g, starts[k], annotate))
        outs = ", ".join(f"%{o.name}: {o.type_str()}" for o in e.outs)
        lhs = f"{outs} = " if outs else ""
        ins_s = ", ".join(f"%{v}" for v in e.ins)
        args = f" {args_to_json(e.args)}" if e.args else ""
        note = describe(e) if describe is not None else ""
        lines.append(f"  {lhs}{e.prim}({ins_s}){args} #{e.id}" + (f"  -- {note}" if note else ""))
    lines.append(f"  return ({', '.join('%' + v for v in g.outputs)})")
    lines.append("}")
    return "\n".join(lines) + "\n"
