"""Parse the text :func:`segc.ir.printer.to_text` prints back into a :class:`Graph`."""

from __future__ import annotations

import json
import re

from .. import dtypes
from ..errors import IRError
from .graph import Graph
from .nodes import Const, Eqn, Input, Var
from .printer import args_from_json
from .verify import verify


def _parse_type(t: str, ctx: str) -> tuple[str, tuple[int, ...]]:
    t = t.strip()
    if not t.endswith("]") or "[" not in t:
        raise IRError(f"{ctx}: bad type {t!r}")
    dt, dims = t[:-1].split("[", 1)
    if not dtypes.is_dtype_name(dt):
        raise IRError(f"{ctx}: unknown dtype {dt!r}")
    shape = tuple(int(d) for d in dims.split(",") if d.strip())
    return dt, shape


def _parse_var(s: str, ctx: str) -> Var:
    name, t = s.split(":", 1)
    name = name.strip()
    if not name.startswith("%"):
        raise IRError(f"{ctx}: expected a %value, got {name!r}")
    dt, shape = _parse_type(t, ctx)
    return Var(name[1:], shape, dt)


def _split_top(s: str) -> list[str]:
    """Split on commas that are not inside brackets or quotes."""
    out: list[str] = []
    cur: list[str] = []
    depth, q = 0, False
    for ch in s:
        if ch == '"':
            q = not q
        elif not q and ch in "[({":
            depth += 1
        elif not q and ch in "])}":
            depth -= 1
        if ch == "," and depth == 0 and not q:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


_EQN_ID = re.compile(r"^(.*) #(\d+)(?:\s+--.*)?$")


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
                head, _, rest = ln[6:].partition("(")
                name = head.strip()
                body = rest.rsplit(")", 1)[0]
                for part in _split_top(body):
                    if not part.strip():  # the trailing comma of a header one input a line
                        continue
                    vpart, _, meta = part.strip().rpartition(" ")
                    kind, _, path = meta.partition("=")
                    inputs.append(Input(_parse_var(vpart, ctx), kind, json.loads(path)))
            elif ln.startswith("const "):
                lhs, _, val = ln[6:].partition(" = ")
                var = _parse_var(lhs, ctx)
                if val == "elided":
                    value = None
                elif val.startswith("hex:"):
                    value = dtypes.from_bytes(bytes.fromhex(val[4:]), var.shape, var.dtype)
                else:
                    raw_c = dtypes.from_values(json.loads(val), var.shape, var.dtype)
                    value = dtypes.from_bytes(raw_c, var.shape, var.dtype)
                consts.append(Const(var, value))
            elif ln.startswith("return "):
                inner = ln[len("return ") :].strip()[1:-1]
                outputs = tuple(v.strip()[1:] for v in inner.split(",") if v.strip())
            else:
                m = _EQN_ID.match(ln)
                if m is None:
                    raise ValueError("no equation id (' #N') at the end")
                body, eid = m.group(1), m.group(2)
                lhs, sep, rhs = body.partition(" = ")
                if not sep:
                    lhs, rhs = "", body
                outs = tuple(_parse_var(p, ctx) for p in _split_top(lhs)) if lhs else ()
                prim, _, rest = rhs.partition("(")
                ins_s, _, args_s = rest.partition(")")
                ins = tuple(v.strip()[1:] for v in ins_s.split(",") if v.strip())
                args = args_from_json(args_s.strip()) if args_s.strip() else ()
                eqns.append(Eqn(int(eid), prim.strip(), ins, outs, args))
        except IRError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, OverflowError, RecursionError) as exc:
            raise IRError(f"{ctx}: cannot parse {raw.strip()!r}: {exc}") from None
    if name is None or outputs is None:
        raise IRError("not a segc graph: missing 'graph' header or 'return'")
    return verify(Graph(name, tuple(inputs), tuple(consts), tuple(eqns), outputs))
