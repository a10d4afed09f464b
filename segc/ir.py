"""segc's IR: a flat list of equations over single-assignment values.

A :class:`Graph` holds its inputs (call arguments and module parameters), captured
constants with their bytes, an ordered tuple of :class:`Eqn` and its outputs. Values
are named by strings (``%v3``); every value has a shape and a dtype, hence a byte size.

Segmentation lives in the equation list itself: a ``segc.cut`` pseudo-equation (no
inputs, no outputs) ends the segment before it. Segments, their inputs and outputs are
derived from the cuts (:func:`segments`), never stored beside them, so no pass can
leave them stale. Equation ids are stable: the tracer numbers primitives in MLX's
(deterministic) export order, so the same function and signature give the same ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from . import dtypes
from .errors import IRError

CUT = "segc.cut"
# fences and windows (segc/passes/fences.py, segc/passes/windows.py): effects that no
# pass may drop or reorder; the verifier checks them (segc/passes/verify.py)
SIGNAL = "segc.signal"  # args (event, value): signal once this segment has completed
WAIT = "segc.wait"  # args (event, value): do not dispatch this segment before event >= value
HOST_EVENT = "segc.host_event"  # args (event,): the host (not the graph) signals this event
WINDOW = "segc.window"  # args (name, first_id, last_id, mode, entry values, exit values)
EFFECTS = frozenset({SIGNAL, WAIT, HOST_EVENT, WINDOW})
# pseudo-primitives that do not compute: they carry schedule information only
PSEUDO = frozenset({CUT}) | EFFECTS


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
    """A graph input: positional argument leaf ``arg`` or module parameter ``param``."""

    var: Var
    kind: str  # "arg" | "param" | "state"
    path: str  # pytree path of the leaf ("0", "1.k") or the parameter name


@dataclass(frozen=True, slots=True, eq=False)
class Const:
    """A captured constant and its value (an evaluated ``mx.array``).

    ``value`` is None only for a constant parsed from text that elided it (larger than
    ``ELIDE_BYTES``): such a graph can be inspected but not run. Equality compares bytes.
    """

    var: Var
    value: Any = field(repr=False)

    def data(self) -> bytes | None:
        return None if self.value is None else dtypes.to_bytes(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self.var == other.var and self.data() == other.data()

    def __hash__(self) -> int:
        return hash(self.var)


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


# --------------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True)
class Segment:
    """A derived view: equations ``eqns[start:stop]`` between two cuts.

    A segment is named by the cut that ends it (the seed's cut node: the segment ends
    after it); the last one is ``"tail"``.
    """

    index: int
    name: str
    start: int
    stop: int
    inputs: tuple[str, ...]  # values defined before the segment (or graph inputs) used in it
    outputs: tuple[str, ...]  # values defined in it and used later or returned

    def eqns(self, g: Graph) -> tuple[Eqn, ...]:
        return tuple(e for e in g.eqns[self.start : self.stop] if not e.is_pseudo)


def segments(g: Graph) -> list[Segment]:
    """Cut the equation list at every ``segc.cut``; derive each segment's boundary values.

    An empty segment (two cuts in a row, or a cut first or last) is dropped.
    """
    spans: list[tuple[str, int, int]] = []
    start = 0
    for i, e in enumerate(g.eqns):
        if e.prim == CUT:
            spans.append((str(e.args[0]) if e.args else f"cut{e.id}", start, i))
            start = i + 1
    spans.append(("tail", start, len(g.eqns)))
    spans = [s for s in spans if any(not e.is_pseudo for e in g.eqns[s[1] : s[2]])]

    const_names = {c.var.name for c in g.consts}
    defined_in: dict[str, int] = {}
    for k, (_, a, b) in enumerate(spans):
        for e in g.eqns[a:b]:
            for o in e.outs:
                defined_in[o.name] = k
    used_after: dict[int, set[str]] = {k: set() for k in range(len(spans))}
    needs: list[list[str]] = []
    for k, (_, a, b) in enumerate(spans):
        seen: dict[str, None] = {}
        for e in g.eqns[a:b]:
            for v in e.ins:
                if v in const_names or defined_in.get(v) == k:
                    continue
                seen.setdefault(v, None)
                if v in defined_in:
                    used_after[defined_in[v]].add(v)
        needs.append(list(seen))
    for v in g.outputs:
        if v in defined_in:
            used_after[defined_in[v]].add(v)
    result = []
    for k, (name, a, b) in enumerate(spans):
        outs = tuple(o.name for e in g.eqns[a:b] for o in e.outs if o.name in used_after[k])
        result.append(Segment(k, name, a, b, tuple(needs[k]), outs))
    return result


# --------------------------------------------------------------------------- verifier


def verify(g: Graph) -> Graph:
    """Check the IR's invariants; raise :class:`IRError` naming the first violation."""
    defined: set[str] = set()

    def define(v: Var, where: str) -> None:
        if v.name in defined:
            raise IRError(f"{where}: value {v.name} assigned twice")
        if not dtypes.is_dtype_name(v.dtype):
            raise IRError(f"{where}: unknown dtype {v.dtype!r} for {v.name}")
        if any((not isinstance(d, int)) or d < 0 for d in v.shape):
            raise IRError(f"{where}: bad shape {v.shape} for {v.name}")
        defined.add(v.name)

    for i in g.inputs:
        define(i.var, f"input {i.path!r}")
    for c in g.consts:
        define(c.var, "constant")
        if c.value is not None and (tuple(c.value.shape) != c.var.shape or dtypes.short(c.value.dtype) != c.var.dtype):
            raise IRError(f"constant {c.var.name}: value does not match {c.var.type_str()}")
    ids: set[int] = set()
    for e in g.eqns:
        where = f"equation #{e.id} ({e.prim})"
        if e.id in ids:
            raise IRError(f"{where}: duplicate equation id")
        ids.add(e.id)
        if e.is_pseudo and e.outs:
            raise IRError(f"{where}: a pseudo-equation has no outputs")
        for v in e.ins:
            if v not in defined:
                raise IRError(f"{where}: uses {v} before it is defined")
        for o in e.outs:
            define(o, where)
    for v in g.outputs:
        if v not in defined:
            raise IRError(f"graph output {v} is never defined")
    if any(e.prim in EFFECTS for e in g.eqns):
        from .passes.verify import verify_effects

        verify_effects(g)
    return g


# --------------------------------------------------------------------------- printer


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
        return DTypeArg(a["dtype"])
    return a


@dataclass(frozen=True, slots=True)
class DTypeArg:
    """A dtype appearing among a primitive's arguments (e.g. ``AsType``)."""

    name: str


def args_to_json(args: tuple[Any, ...]) -> str:
    return json.dumps(_enc_arg(args), separators=(", ", ": "))


def args_from_json(text: str) -> tuple[Any, ...]:
    return _dec_arg(json.loads(text))


_SMALL = 16
ELIDE_BYTES = 1 << 16


def _const_text(c: Const) -> str:
    v = c.var
    if c.value is None or v.nbytes > ELIDE_BYTES:
        return "elided"
    data = c.data()
    assert data is not None
    if v.size <= _SMALL and v.dtype != "c64":
        vals = dtypes.to_numpy(data, v.shape, v.dtype).reshape(-1).tolist()
        return json.dumps(vals)
    return "hex:" + data.hex()


def segment_header(g: Graph, s: Segment) -> str:
    vs = g.vars()
    n = sum(1 for e in g.eqns[s.start : s.stop] if not e.is_pseudo)
    inb = sum(vs[v].nbytes for v in s.inputs)
    outb = sum(vs[v].nbytes for v in s.outputs)
    from .passes.analysis import header_stats  # cost, live and boundary bytes, effects

    head = f"  -- segment {s.index} {s.name!r}: {n} eqns, in {len(s.inputs)} ({inb} B), out {len(s.outputs)} ({outb} B)"
    return head + header_stats(g, s)


def to_text(g: Graph, headers: bool = True) -> str:
    """Print the graph; ``parse(to_text(g)) == g``. Header lines start with ``--``."""
    ins = ", ".join(f"%{i.var.name}: {i.var.type_str()} {i.kind}={json.dumps(i.path)}" for i in g.inputs)
    lines = [f"graph {g.name}({ins}) {{"]
    for c in g.consts:
        lines.append(f"  const %{c.var.name}: {c.var.type_str()} = {_const_text(c)}")
    starts: dict[int, Segment] = {}
    if headers:
        starts = {s.start: s for s in segments(g)}
    for k, e in enumerate(g.eqns):
        if k in starts:
            lines.append(segment_header(g, starts[k]))
        outs = ", ".join(f"%{o.name}: {o.type_str()}" for o in e.outs)
        lhs = f"{outs} = " if outs else ""
        ins_s = ", ".join(f"%{v}" for v in e.ins)
        args = f" {args_to_json(e.args)}" if e.args else ""
        lines.append(f"  {lhs}{e.prim}({ins_s}){args} #{e.id}")
    lines.append(f"  return ({', '.join('%' + v for v in g.outputs)})")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- parser


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


def parse(text: str) -> Graph:
    """Parse the text :func:`to_text` prints. Raises :class:`IRError` with a line number."""
    lines = [ln for ln in text.splitlines()]
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
                body, _, eid = ln.rpartition(" #")
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
        except (ValueError, KeyError, IndexError) as exc:
            raise IRError(f"{ctx}: cannot parse {raw.strip()!r}: {exc}") from None
    if name is None or outputs is None:
        raise IRError("not a segc graph: missing 'graph' header or 'return'")
    return verify(Graph(name, tuple(inputs), tuple(consts), tuple(eqns), outputs))


# --------------------------------------------------------------------------- views


def users(g: Graph) -> dict[str, list[int]]:
    """Value name -> indices (into ``g.eqns``) of the equations that read it."""
    out: dict[str, list[int]] = {}
    for k, e in enumerate(g.eqns):
        for v in e.ins:
            out.setdefault(v, []).append(k)
    return out


def to_networkx(g: Graph) -> Any:
    """A ``networkx.DiGraph``: one node per equation id (plus ``in:``/``const:`` nodes);
    an edge per value use, with the value's name and byte size."""
    import networkx as nx

    dg = nx.DiGraph(name=g.name)
    producer: dict[str, Any] = {}
    for i in g.inputs:
        node = f"in:{i.var.name}"
        dg.add_node(node, kind="input", var=i.var)
        producer[i.var.name] = node
    for c in g.consts:
        node = f"const:{c.var.name}"
        dg.add_node(node, kind="const", var=c.var)
        producer[c.var.name] = node
    vs = g.vars()
    for pos, e in enumerate(g.eqns):
        dg.add_node(e.id, kind="eqn", prim=e.prim, pos=pos, eqn=e)
        for v in e.ins:
            dg.add_edge(producer[v], e.id, var=v, nbytes=vs[v].nbytes)
        for o in e.outs:
            producer[o.name] = e.id
    return dg
