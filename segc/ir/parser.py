"""Parse the text :func:`segc.ir.printer.to_text` prints back into a :class:`Graph`.

Graph names and input paths are read as the printer writes them: a graph name bare or
as a JSON string, an input's path always as a JSON string (read with a JSON decoder, so
any character, quotes, spaces and non-ASCII included, reads back as printed).
"""

from __future__ import annotations

import json
import re

from .. import dtypes
from ..errors import IRError
from .graph import Graph
from .nodes import Const, Eqn, Input, Var
from .printer import args_from_json
from .verify import verify

_JSON = json.JSONDecoder()


def _parse_type(t: str, ctx: str) -> tuple[str, tuple[int, ...]]:
    t = t.strip()
    if not t.endswith("]") or "[" not in t:
        raise IRError(f"{ctx}: bad type {t!r}")
    dt, dims = t[:-1].split("[", 1)
    if not dtypes.is_dtype_name(dt):
        raise IRError(f"{ctx}: unknown dtype {dt!r}")
    if not re.fullmatch(r"(\d+(,\d+)*)?", dims.replace(" ", "")):
        raise IRError(f"{ctx}: bad shape [{dims}] (whole numbers >= 0)")
    shape = tuple(int(d) for d in dims.split(",") if d.strip())
    return dt, shape


def _value_ref(s: str, ctx: str) -> str:
    """``%v3`` -> ``v3``; anything else is refused, naming what it got."""
    s = s.strip()
    if not s.startswith("%") or len(s) < 2:
        raise IRError(f"{ctx}: expected a %value, got {s!r}")
    return s[1:]


def _refs(s: str, ctx: str) -> tuple[str, ...]:
    return tuple(_value_ref(v, ctx) for v in s.split(",") if v.strip())


def _parse_var(s: str, ctx: str) -> Var:
    name, sep, t = s.partition(":")
    if not sep:
        raise IRError(f"{ctx}: expected '%value: type', got {s.strip()!r}")
    dt, shape = _parse_type(t, ctx)
    return Var(_value_ref(name, ctx), shape, dt)


_INPUT = re.compile(r"\s*(%[^:\s]*):\s*(\S+?)\s+(\w+)=")


def _parse_header(ln: str, ctx: str) -> tuple[str, list[Input]]:
    """``graph NAME(%a0: f32[2] arg="args[0]", ...) {``: the name and the inputs."""
    rest = ln[len("graph ") :].lstrip()
    if rest.startswith('"'):
        name, k = _JSON.raw_decode(rest)
        if not isinstance(name, str):
            raise IRError(f"{ctx}: the graph's name must be a string, got {name!r}")
    else:
        k = rest.find("(")
        if k < 0:
            raise IRError(f"{ctx}: expected 'graph NAME(inputs) {{', got {ln!r}")
        name = rest[:k].strip()
    if not rest[k:].startswith("("):
        raise IRError(f"{ctx}: expected '(' after the graph's name in {ln!r}")
    k += 1
    inputs: list[Input] = []
    while True:
        while k < len(rest) and rest[k] in " ,":
            k += 1
        if rest.startswith(")", k):
            break
        m = _INPUT.match(rest, k)
        if m is None:
            raise IRError(f"{ctx}: expected an input '%name: type kind=\"path\"' at {rest[k : k + 40]!r}")
        var = _parse_var(f"{m.group(1)}:{m.group(2)}", ctx)
        try:
            path, k = _JSON.raw_decode(rest, m.end())
        except ValueError:
            raise IRError(f"{ctx}: input %{var.name}: its path is not a JSON string: {rest[m.end() :]!r}") from None
        inputs.append(Input(var, m.group(3), path))
        if not rest.startswith((",", ")"), k):
            raise IRError(f"{ctx}: expected ',' or ')' after input %{var.name}'s path, got {rest[k : k + 20]!r}")
    return name, inputs


_EQN_ID = re.compile(r"^(.*) #(\d+)(?:\s+--.*)?$")
_RETURN = re.compile(r"^return\s*\((.*)\)$")


def _join_header(lines: list[str]) -> list[str]:
    """The graph header as one line (``to_text`` prints many inputs one per line); the
    lines it spanned become blank, so that later line numbers stay right."""
    out = list(lines)
    for k, raw in enumerate(out):
        ln = raw.strip()
        if ln.startswith("graph ") and ln.endswith("("):
            for j in range(k + 1, len(out)):
                if out[j].strip().startswith(")"):
                    out[k] = ln + " ".join(x.strip() for x in out[k + 1 : j]) + out[j].strip()
                    for i in range(k + 1, j + 1):
                        out[i] = ""
                    break
            break
    return out


def _parse_const(ln: str, ctx: str) -> Const:
    lhs, _, val = ln[len("const ") :].partition(" = ")
    var = _parse_var(lhs, ctx)
    if val == "elided":
        return Const(var, None)
    if val.startswith("hex:"):
        return Const(var, dtypes.from_bytes(bytes.fromhex(val[4:]), var.shape, var.dtype))
    raw_c = dtypes.from_values(json.loads(val), var.shape, var.dtype)
    return Const(var, dtypes.from_bytes(raw_c, var.shape, var.dtype))


def _parse_eqn(ln: str, ctx: str) -> Eqn:
    m = _EQN_ID.match(ln)
    if m is None:
        raise ValueError("no equation id (' #N', a whole number >= 0) at the end")
    body, eid = m.group(1), m.group(2)
    lhs, rhs = "", body
    if body.startswith("%"):  # outputs' names and types hold no ' = '; arguments may
        lhs, sep, rhs = body.partition(" = ")
        if not sep:
            raise IRError(f"{ctx}: expected '%value: type = Primitive(...)', got {body!r}")
    outs = tuple(_parse_var(p, ctx) for p in re.split(r",\s*(?=%)", lhs)) if lhs else ()
    prim, paren, rest = rhs.partition("(")
    ins_s, close, args_s = rest.partition(")")
    if not paren or not close:
        raise IRError(f"{ctx}: expected 'Primitive(%inputs)', got {rhs!r}")
    args = args_from_json(args_s.strip()) if args_s.strip() else ()
    return Eqn(int(eid), prim.strip(), _refs(ins_s, ctx), outs, args)


def parse(text: str) -> Graph:
    """Parse the text :func:`to_text` prints. Raises :class:`IRError` with a line number."""
    lines = _join_header(text.splitlines())
    inputs: list[Input] = []
    consts: list[Const] = []
    eqns: list[Eqn] = []
    outputs: tuple[str, ...] | None = None
    name = None
    for no, raw in enumerate(lines, 1):
        ln = raw.strip()
        ctx = f"line {no}"
        if not ln or ln.startswith("--") or ln == "}":
            continue
        try:
            if ln.startswith("graph "):
                if name is not None:
                    raise IRError(f"{ctx}: a second 'graph' header; the text holds one graph")
                name, inputs = _parse_header(ln, ctx)
            elif ln.startswith("const "):
                consts.append(_parse_const(ln, ctx))
            elif ln == "return" or ln.startswith("return "):
                r = _RETURN.match(ln)
                if r is None:
                    raise IRError(f"{ctx}: expected 'return (%value, ...)', got {ln!r}")
                outputs = _refs(r.group(1), ctx)
            else:
                eqns.append(_parse_eqn(ln, ctx))
        except IRError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, OverflowError, RecursionError) as exc:
            raise IRError(f"{ctx}: cannot parse {raw.strip()!r}: {exc}") from None
    if name is None or outputs is None:
        raise IRError("not a segc graph: missing 'graph' header or 'return'")
    return verify(Graph(name, tuple(inputs), tuple(consts), tuple(eqns), outputs))
