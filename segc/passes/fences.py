"""``fences``: put a boundary schedule's events into the IR as effects.

The seed's schedule, matched by equation id instead of tensor pointer:

- a **cut node** ends a segment after equation ``after``; optionally that segment,
  once it has *completed*, signals ``event`` with ``value`` (``segc.signal``, placed
  just after the equation, before the ``segc.cut``);
- a **wait node** keeps the segment holding equation ``at`` from being dispatched
  before ``event`` reaches ``value`` (``segc.wait``, placed at the segment's start);
- **host events** are signalled by the host (a pager thread), not by the graph: a
  ``segc.host_event`` declares each, so waits on it are satisfiable.

Events are timeline semaphores with explicit values. Nodes whose equation is not in
this graph are skipped (a schedule covers every graph of a call). The
pass is idempotent: a fence already in place is not added again. Fences are effects:
no other pass drops or reorders them, and the verifier (``verify.py``) rejects waits
that nothing can satisfy, waits that deadlock and signal values that do not increase.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import ScheduleError, ScheduleWarning
from ..ir import CUT, HOST_EVENT, SIGNAL, WAIT, Eqn, Graph
from .legalize import illegal_points
from .registry import register

_SPLITS = "splits a chain mx.compile fuses (or a kernel of segc's lowering)"  # legalize.pinned_groups


@dataclass(frozen=True, slots=True)
class CutNode:
    after: int
    signal: tuple[str, int] | None = None  # (event, value)
    name: str | None = None


@dataclass(frozen=True, slots=True)
class WaitNode:
    at: int
    event: str
    value: int


@dataclass(frozen=True, slots=True)
class Schedule:
    cuts: tuple[CutNode, ...] = ()
    waits: tuple[WaitNode, ...] = ()
    host_events: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "cuts": [
                    {"after": c.after, "signal": list(c.signal) if c.signal else None, "name": c.name}
                    for c in self.cuts
                ],
                "waits": [{"at": w.at, "event": w.event, "value": w.value} for w in self.waits],
                "host_events": list(self.host_events),
            },
            indent=1,
        )

    @staticmethod
    def from_json(text: str) -> Schedule:
        try:
            d = json.loads(text)
            return Schedule(
                tuple(
                    CutNode(
                        int(c["after"]),
                        (str(c["signal"][0]), int(c["signal"][1])) if c.get("signal") else None,
                        c.get("name"),
                    )
                    for c in d.get("cuts", [])
                ),
                tuple(WaitNode(int(w["at"]), str(w["event"]), int(w["value"])) for w in d.get("waits", [])),
                tuple(str(h) for h in d.get("host_events", [])),
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ScheduleError(f"cannot read schedule: {exc}") from None


def _check_value(what: str, event: Any, value: Any) -> None:
    if not isinstance(event, str) or not event:
        raise ScheduleError(f"{what}: event name must be a non-empty string, got {event!r}")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError(f"{what}: event value must be an int >= 1, got {value!r}")


def _legal_after(g: Graph, c: CutNode, legalize: bool) -> int:
    """The equation the cut node's cut follows: ``c.after`` (also when the graph is cut
    there already), or, when a new cut there would split a chain ``mx.compile`` fuses (or
    a kernel of segc's lowering, ``legalize.pinned_groups``), the next legal point
    (a later one, so a signal never fires before ``c.after`` has run), with a warning;
    refused when ``legalize`` is off or no legal point follows."""
    pos = next(p for p, e in enumerate(g.eqns) if e.id == c.after and not e.is_pseudo)
    for e in g.eqns[pos + 1 :]:
        if not e.is_pseudo:
            break
        if e.prim == CUT:
            return c.after  # the graph is cut there already (a marker): nothing new is split
    os_ = [e for e in g.eqns if not e.is_pseudo]
    k = next(i for i, e in enumerate(os_) if e.id == c.after) + 1
    bad = illegal_points(g)
    if k not in bad:
        return c.after
    later = [p for p in range(k + 1, len(os_)) if p not in bad]  # legalize.legal_points after k
    what = f"cut node after #{c.after} {_SPLITS}"
    if not legalize or not later:
        why = "legalize=False" if not legalize else "the chain runs to the end of the graph"
        raise ScheduleError(f"{what} ({why}); put it after #{os_[later[0] - 1].id if later else os_[-1].id}")
    return os_[later[0] - 1].id


@register("fences")
def fences(g: Graph, schedule: Schedule | None = None, legalize: bool = True) -> Graph:
    """Place the schedule's cuts, signals, waits and host events in ``g``. A cut node
    inside a fused chain moves to the chain's end, its signal with it (a
    :class:`~segc.errors.ScheduleWarning`), or is refused with ``legalize=False``."""
    if schedule is None:
        return g
    eqns = list(g.eqns)
    next_id = [max((e.id for e in eqns), default=-1) + 1]

    def fresh() -> int:
        next_id[0] += 1
        return next_id[0] - 1

    def index(eid: int) -> int:
        return next(k for k, e in enumerate(eqns) if e.id == eid and not e.is_pseudo)

    present = {e.id for e in eqns if not e.is_pseudo}
    declared = [e.args[0] for e in eqns if e.prim == HOST_EVENT]
    for h in schedule.host_events:
        if not isinstance(h, str) or not h:
            raise ScheduleError(f"host event name must be a non-empty string, got {h!r}")
        if h not in declared:
            eqns.insert(len(declared), Eqn(fresh(), HOST_EVENT, (), (), (h,)))
            declared.append(h)
    for c in schedule.cuts:
        if c.after not in present:
            continue
        moved = CutNode(_legal_after(g, c, legalize), c.signal, c.name or f"fence{c.after}")
        if moved.after != c.after and c.signal is not None:
            lo, hi = index(c.after), index(moved.after)
            for w in schedule.waits:
                ours = w.event == c.signal[0] and w.value <= c.signal[1]
                if ours and w.at in present and lo < index(w.at) <= hi:
                    raise ScheduleError(
                        f"cut node after #{c.after} {_SPLITS}, and moving it after "
                        f"#{moved.after} would put the wait at #{w.at} on {w.event!r} >= {w.value} in the segment "
                        "that signals it (a deadlock); put the cut at a legal point"
                    )
        if moved.after != c.after:
            warnings.warn(
                f"cut node after #{c.after} {_SPLITS}; moved after #{moved.after}, the end of the chain",
                ScheduleWarning,
                stacklevel=3,
            )
        c = moved
        pos = index(c.after) + 1
        while pos < len(eqns) and eqns[pos].prim == SIGNAL:
            pos += 1
        if c.signal is not None:
            ev, val = c.signal
            _check_value(f"cut node after #{c.after}", ev, val)
            if not any(e.args == (ev, val) for e in eqns[index(c.after) + 1 : pos]):
                eqns.insert(pos, Eqn(fresh(), SIGNAL, (), (), (ev, val)))
                pos += 1
        if pos >= len(eqns) or eqns[pos].prim != CUT:
            eqns.insert(pos, Eqn(fresh(), CUT, (), (), (c.name or f"fence{c.after}",)))
    for w in schedule.waits:
        if w.at not in present:
            continue
        _check_value(f"wait node at #{w.at}", w.event, w.value)
        pos = index(w.at)
        start = pos
        while start > 0 and eqns[start - 1].prim != CUT:
            start -= 1
        if any(e.prim == WAIT and e.args == (w.event, w.value) for e in eqns[start:pos]):
            continue
        while start < pos and eqns[start].prim in (WAIT, HOST_EVENT):
            start += 1
        eqns.insert(start, Eqn(fresh(), WAIT, (), (), (w.event, w.value)))
    return g.replace(eqns=tuple(eqns))
