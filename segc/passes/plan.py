"""Cut plans: the one serialisable result of every cut-placement strategy.

A :class:`Plan` names the graph it was made for (:func:`plan_key`: the fingerprint of
the graph's computing equations, so cuts, fences and windows already in it do not
change the key), lists its cuts (each *after* a computing equation, by id), the moves
that legalisation made, and optionally a new order of the computing equations (the
minimum-cut strategy may put one side of a cut first). Plans are saved as JSON, diffed
(:func:`diff`) and re-applied (:func:`apply_plan`, a pass).

Applying a plan removes every ``segc.cut`` and inserts the plan's cuts. Other
pseudo-equations keep their place relative to the computing equations: a
``segc.signal`` stays after the equation before it (it ends that segment), a
``segc.wait``, ``segc.window`` or ``segc.host_event`` stays before the equation after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ScheduleError
from ..ir import CUT, EFFECTS, SIGNAL, Eqn, Graph

VERSION = 1


@dataclass(frozen=True, slots=True)
class Cut:
    after: int  # id of the computing equation that ends the segment
    name: str
    id: int | None = None  # id of the segc.cut equation; None: allocated on apply


@dataclass(frozen=True, slots=True)
class Move:
    """A cut that legalisation moved (``placed``) or dropped (``placed`` None)."""

    requested: int
    placed: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    fingerprint: str
    strategy: str
    cuts: tuple[Cut, ...]
    moved: tuple[Move, ...] = ()
    order: tuple[int, ...] | None = None
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    # ----------------------------------------------------------------- JSON

    def to_json(self) -> str:
        d: dict[str, Any] = {
            "segc_plan": VERSION,
            "fingerprint": self.fingerprint,
            "strategy": self.strategy,
            "cuts": [asdict(c) for c in self.cuts],
            "moved": [asdict(m) for m in self.moved],
        }
        if self.order is not None:
            d["order"] = list(self.order)
        if self.info:
            d["info"] = self.info
        return json.dumps(d, indent=1) + "\n"

    @staticmethod
    def from_json(text: str) -> Plan:
        try:
            d = json.loads(text)
            if d.get("segc_plan") != VERSION:
                raise ScheduleError(f"not a segc plan (version {d.get('segc_plan')!r}, expected {VERSION})")
            cuts = tuple(
                Cut(_eqn_id(c["after"], f"cut {k} 'after'"), str(c["name"]), _cut_id(c.get("id"), f"cut {k} 'id'"))
                for k, c in enumerate(d["cuts"])
            )
            return Plan(
                d["fingerprint"],
                d["strategy"],
                cuts,
                tuple(Move(int(m["requested"]), m["placed"], str(m["reason"])) for m in d.get("moved", [])),
                tuple(_eqn_id(i, "order") for i in d["order"]) if d.get("order") is not None else None,
                dict(d.get("info", {})),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ScheduleError(f"cannot read plan: {exc}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @staticmethod
    def load(path: str | Path) -> Plan:
        return Plan.from_json(Path(path).read_text())


def _eqn_id(x: Any, what: str) -> int:
    """An equation id read from a plan: an int >= 0 (JSON's 3.0 or "3" are refused)."""
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise ScheduleError(f"plan: {what} must be an equation id (an int >= 0), got {x!r}")
    return x


def _cut_id(x: Any, what: str) -> int | None:
    return None if x is None else _eqn_id(x, what)


def plan_key(g: Graph) -> str:
    """The key a plan is filed under: the fingerprint of ``g``'s computing equations in
    id order (trace order), so neither cuts, fences, windows nor a plan's reordering
    change it."""
    return g.replace(eqns=tuple(sorted((e for e in g.eqns if not e.is_pseudo), key=lambda e: e.id))).fingerprint()


def plan_of(g: Graph, strategy: str = "graph") -> Plan:
    """The plan that reproduces the cuts already in ``g`` (each after the computing
    equation before it; cuts with no computing equation before them are left out)."""
    cuts: list[Cut] = []
    last: int | None = None
    for e in g.eqns:
        if e.prim == CUT:
            if last is not None and not (cuts and cuts[-1].after == last):
                cuts.append(Cut(last, str(e.args[0]) if e.args else f"cut{e.id}", e.id))
        elif not e.is_pseudo:
            last = e.id
    return Plan(plan_key(g), strategy, tuple(cuts))


def marker_points(g: Graph) -> list[tuple[int, str, int]]:
    """(cut point, name, cut id) of every marker cut with ops on both sides."""
    out: list[tuple[int, str, int]] = []
    k = 0
    for e in g.eqns:
        if e.prim == CUT:
            if k > 0 and (not out or out[-1][0] != k):
                out.append((k, str(e.args[0]) if e.args else f"cut{e.id}", e.id))
        elif not e.is_pseudo:
            k += 1
    return [m for m in out if m[0] < k]


def plan_at(  # the plan cutting before each op index in points; marker names and ids kept
    g: Graph, name: str, points: Iterable[int], names: Mapping[int, str] | None = None, os_: Any = None, **kw: Any
) -> Plan:
    os_ = os_ if os_ is not None else [e for e in g.eqns if not e.is_pseudo]
    names = names or {}
    marks = {p: (n, i) for p, n, i in marker_points(g)}
    cuts = []
    for i, p in enumerate(sorted(set(points))):
        nm, cid = marks.get(p, (names.get(p, f"cut{i}"), None))
        cuts.append(Cut(os_[p - 1].id, names.get(p, nm), cid))
    return Plan(plan_key(g), name, tuple(cuts), **kw)


def diff(a: Plan, b: Plan) -> str:
    """A readable difference of two plans ('' when they cut alike)."""
    lines = []
    if a.fingerprint != b.fingerprint:
        lines.append(f"graphs differ: {a.fingerprint} vs {b.fingerprint}")
    ca = {c.after: c for c in a.cuts}
    cb = {c.after: c for c in b.cuts}
    for k in sorted(ca.keys() | cb.keys()):
        if k not in cb:
            lines.append(f"- cut after #{k} {ca[k].name!r}")
        elif k not in ca:
            lines.append(f"+ cut after #{k} {cb[k].name!r}")
        elif ca[k].name != cb[k].name:
            lines.append(f"~ cut after #{k}: {ca[k].name!r} -> {cb[k].name!r}")
    if a.order != b.order:
        lines.append("~ equation order differs")
    return "\n".join(lines)


# --------------------------------------------------------------------------- applying


def _units(g: Graph) -> list[list[Eqn]]:
    """Group the equations (cuts left out) into units of one computing equation with the
    pseudo-equations that stick to it: signals after it, the rest before it."""
    units: list[list[Eqn]] = []
    pending: list[Eqn] = []
    for e in g.eqns:
        if e.prim == CUT:
            continue
        if e.prim == SIGNAL and units and not pending:
            units[-1].append(e)
        elif e.is_pseudo:
            pending.append(e)
        else:
            units.append([*pending, e])
            pending = []
    if pending:
        if units:
            units[-1].extend(pending)
        else:
            units.append(pending)
    return units


def _compute_id(unit: list[Eqn]) -> int | None:
    return next((e.id for e in unit if not e.is_pseudo), None)


def apply_plan(g: Graph, plan: Plan) -> Graph:
    """Replace ``g``'s cuts by ``plan``'s (and reorder, if the plan says so)."""
    key = plan_key(g)
    if plan.fingerprint != key:
        raise ScheduleError(
            f"plan {plan.strategy!r} was made for graph {plan.fingerprint}, not for {g.name} ({key}); "
            "re-plan for this graph"
        )
    units = _units(g)
    by_id = {_compute_id(u): u for u in units}
    if plan.order is not None:
        if sorted(plan.order) != sorted(i for i in by_id if i is not None):
            raise ScheduleError(f"plan {plan.strategy!r}: its order is not a permutation of the graph's equations")
        lead = [u for u in units if _compute_id(u) is None]
        units = lead + [by_id[i] for i in plan.order]
    used = {e.id for e in g.eqns if e.prim != CUT}
    base = max(used, default=-1) + 1
    after: dict[int, Cut] = {}
    for k, c in enumerate(plan.cuts):
        _eqn_id(c.after, f"{plan.strategy!r}: cut {k} 'after'")
        _cut_id(c.id, f"{plan.strategy!r}: cut {k} 'id'")
        if not isinstance(c.name, str):
            raise ScheduleError(f"plan {plan.strategy!r}: cut {k}'s name must be a string, got {c.name!r}")
        if c.after not in by_id:
            raise ScheduleError(f"plan {plan.strategy!r}: cut {c.name!r} after #{c.after}, which is not in {g.name}")
        after[c.after] = c
    taken = set(used)
    eqns: list[Eqn] = []
    for u in units:
        eqns.extend(u)
        cid = _compute_id(u)
        cut = after.get(cid) if cid is not None else None
        if cut is not None:
            eid = cut.id if cut.id is not None and cut.id not in taken else None
            if eid is None:
                while base in taken:
                    base += 1
                eid = base
            taken.add(eid)
            eqns.append(Eqn(eid, CUT, (), (), (cut.name,)))
    if plan.order is not None:
        _check_order(g, eqns)
        if [e for e in eqns if e.prim in EFFECTS] != [e for e in g.eqns if e.prim in EFFECTS]:
            raise ScheduleError(f"plan {plan.strategy!r} reorders equations across fences or windows; cut first")
    return g.replace(eqns=tuple(eqns))


def _check_order(g: Graph, eqns: list[Eqn]) -> None:
    defined = {i.var.name for i in g.inputs} | {c.var.name for c in g.consts}
    for e in eqns:
        for v in e.ins:
            if v not in defined:
                raise ScheduleError(f"plan order puts equation #{e.id} before the equation defining %{v}")
        defined.update(o.name for o in e.outs)
