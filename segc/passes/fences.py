"""``fences``: put a boundary schedule's events into the IR as effects.

The seed's schedule, matched by equation id instead of tensor pointer:

- a **cut node** ends a segment after equation ``after``; optionally that segment,
  once it has *completed*, signals ``event`` with ``value`` (``segc.signal``, placed
  just after the equation, before the ``segc.cut``);
- a **wait node** keeps the segment holding equation ``at`` from being dispatched
  before ``event`` reaches ``value`` (``segc.wait``, placed at the segment's start);
- **host events** are signalled by the host (a pager thread), not by the graph: a
  ``segc.host_event`` declares each, so waits on it are satisfiable.

``after`` and ``at`` are an equation id (an ``int``: one graph's, since ids differ
between a function's graphs) or a boundary name (a ``str``: the segment that cut
marker ends, e.g. ``"model.layers.0"``, the same in every graph that has the marker):
a cut node then signals once that segment completes, a wait node holds that segment.
A node whose id is not in this graph is skipped; a name that no marker of the graph has
is refused (a :class:`~segc.errors.ScheduleError` naming it and the markers there).

Events are timeline semaphores with explicit values. The
pass is idempotent: a fence already in place is not added again. Fences are effects:
no other pass drops or reorders them, and the verifier (``verify.py``) rejects waits
that nothing can satisfy, waits that deadlock and signal values that do not increase.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..errors import ScheduleError, ScheduleWarning
from ..ir import CUT, HOST_EVENT, SIGNAL, WAIT, Eqn, Graph
from .legalize import illegal_points
from .registry import register

_SPLITS = "splits a chain mx.compile fuses (or a kernel of segc's lowering)"  # legalize.pinned_groups


Where = int | str  # an equation id (one graph's) or a boundary name (a cut marker's)


@dataclass(frozen=True, slots=True)
class CutNode:
    after: Where  # the equation the segment ends after, or the boundary whose segment signals
    signal: tuple[str, int] | None = None  # (event, value)
    name: str | None = None


@dataclass(frozen=True, slots=True)
class WaitNode:
    at: Where  # the equation whose segment waits, or the boundary whose segment waits
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

    def events(self) -> set[str]:
        """The names of the events the schedule signals or waits on."""
        return {c.signal[0] for c in self.cuts if c.signal} | {w.event for w in self.waits}

    @staticmethod
    def from_json(text: str) -> Schedule:
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise TypeError(f"a schedule's JSON is an object, not {type(d).__name__}")
            return Schedule(
                tuple(
                    CutNode(
                        _where_from_json(c["after"]),
                        (str(c["signal"][0]), int(c["signal"][1])) if c.get("signal") else None,
                        c.get("name"),
                    )
                    for c in d.get("cuts", [])
                ),
                tuple(
                    WaitNode(_where_from_json(w["at"]), str(w["event"]), int(w["value"])) for w in d.get("waits", [])
                ),
                tuple(str(h) for h in d.get("host_events", [])),
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ScheduleError(f"cannot read schedule: {exc}") from None


def _where_from_json(v: Any) -> Where:
    """A node's place from JSON: a boundary name stays a name, a number is an id."""
    if isinstance(v, bool):
        raise TypeError(f"a node's place is an id or a boundary name, not {v!r}")
    return v if isinstance(v, str) else int(v)


def _where(w: Any) -> str:
    return f"#{w}" if isinstance(w, int) else repr(w)


def check_schedule(schedule: Any, events: Collection[str] | None = None, *, where: str = "schedule") -> Schedule:
    """``schedule`` checked without a graph: a :class:`Schedule` whose nodes name an
    equation id (an int) or a boundary (a non-empty str), whose event names are non-empty
    strings and values ints >= 1, and, given ``events`` (the names an engine's
    ``events=`` gives), whose every event is among them. Else ScheduleError."""
    if not isinstance(schedule, Schedule):
        raise ScheduleError(f"{where}: expected a segc.passes.Schedule, got {type(schedule).__name__}")
    for c in schedule.cuts:
        if not isinstance(c, CutNode):
            raise ScheduleError(f"{where}: cuts must be CutNodes, got {type(c).__name__}")
        _check_place(f"{where}: cut node", c.after, "after")
        if c.signal is not None:
            if not isinstance(c.signal, tuple | list) or len(c.signal) != 2:
                raise ScheduleError(f"{where}: cut node after {_where(c.after)}: signal must be (event, value)")
            _check_value(f"{where}: cut node after {_where(c.after)}", *c.signal)
    for w in schedule.waits:
        if not isinstance(w, WaitNode):
            raise ScheduleError(f"{where}: waits must be WaitNodes, got {type(w).__name__}")
        _check_place(f"{where}: wait node", w.at, "at")
        _check_value(f"{where}: wait node at {_where(w.at)}", w.event, w.value)
    for h in schedule.host_events:
        if not isinstance(h, str) or not h:
            raise ScheduleError(f"{where}: host event name must be a non-empty string, got {h!r}")
    if events is not None:
        missing = sorted(schedule.events() - set(events))
        if missing:
            raise ScheduleError(f"{where} uses events {missing} that events= does not give (it gives {sorted(events)})")
    return schedule


def schedule_for(
    g: Graph, schedule: Schedule | Callable[[Graph], Any], events: Collection[str] | None = None
) -> Schedule:
    """The schedule for graph ``g``: ``schedule`` itself, or what the function
    ``schedule(g)`` gives for it (a Schedule or its JSON), checked (:func:`check_schedule`)."""
    if isinstance(schedule, Schedule):
        return check_schedule(schedule, events)
    fn = getattr(schedule, "__qualname__", None) or repr(schedule)
    got = schedule(g)
    if isinstance(got, str):
        got = Schedule.from_json(got)
    if not isinstance(got, Schedule):
        raise ScheduleError(
            f"the boundary schedule function {fn} returned {type(got).__name__} for graph {g.name!r}, "
            "not a segc.passes.Schedule"
        )
    return check_schedule(got, events, where=f"the schedule {fn} gives for graph {g.name!r}")


def _check_place(what: str, place: Any, field: str) -> None:
    if isinstance(place, bool) or not isinstance(place, int | str) or place == "":
        raise ScheduleError(
            f"{what}: {field} must be an equation id (an int) or a boundary name (a non-empty str), got {place!r}"
        )


def _marker_spans(g: Graph) -> dict[str, list[tuple[int, int]]]:
    """Each cut marker's name -> the (first, last) computing equation ids of the
    segment it ends (empty segments left out)."""
    out: dict[str, list[tuple[int, int]]] = {}
    span: list[int] = []
    for e in g.eqns:
        if e.prim == CUT:
            if span and e.args:
                out.setdefault(str(e.args[0]), []).append((span[0], span[-1]))
            span = []
        elif not e.is_pseudo:
            span.append(e.id)
    return out


def resolve_names(g: Graph, schedule: Schedule) -> Schedule:
    """``schedule`` with every boundary name replaced by ``g``'s ids: a cut node's by
    the last equation of the segment that marker ends (its signal goes before the
    marker's cut), a wait node's by its first. A name no marker of ``g`` has, or one
    that several markers share, is a ScheduleError naming it."""
    if not any(isinstance(c.after, str) for c in schedule.cuts) and not any(
        isinstance(w.at, str) for w in schedule.waits
    ):
        return schedule
    spans = _marker_spans(g)

    def span(name: str, what: str) -> tuple[int, int]:
        found = spans.get(name, [])
        if not found:
            have = sorted(spans)
            shown = ", ".join(map(repr, have[:12])) + (", ..." if len(have) > 12 else "")
            raise ScheduleError(
                f"{what}: graph {g.name!r} has no boundary {name!r} (no cut marker of that name ends a segment; "
                f"its markers: {shown or 'none'})"
            )
        if len(found) > 1:
            raise ScheduleError(
                f"{what}: boundary {name!r} ends {len(found)} segments of graph {g.name!r}; "
                "name the boundaries apart or use equation ids"
            )
        return found[0]

    cuts = tuple(
        CutNode(span(c.after, f"cut node after {c.after!r}")[1], c.signal, c.name or c.after)
        if isinstance(c.after, str)
        else c
        for c in schedule.cuts
    )
    waits = tuple(
        WaitNode(span(w.at, f"wait node at {w.at!r}")[0], w.event, w.value) if isinstance(w.at, str) else w
        for w in schedule.waits
    )
    return Schedule(cuts, waits, schedule.host_events)


def _check_value(what: str, event: Any, value: Any) -> None:
    if not isinstance(event, str) or not event:
        raise ScheduleError(f"{what}: event name must be a non-empty string, got {event!r}")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError(f"{what}: event value must be an int >= 1, got {value!r}")


def _legal_after(g: Graph, after: int, legalize: bool) -> int:
    """The equation the cut node's cut follows: ``after`` (also when the graph is cut
    there already), or, when a new cut there would split a chain ``mx.compile`` fuses (or
    a kernel of segc's lowering, ``legalize.pinned_groups``), the next legal point
    (a later one, so a signal never fires before ``after`` has run), with a warning;
    refused when ``legalize`` is off or no legal point follows."""
    pos = next(p for p, e in enumerate(g.eqns) if e.id == after and not e.is_pseudo)
    for e in g.eqns[pos + 1 :]:
        if not e.is_pseudo:
            break
        if e.prim == CUT:
            return after  # the graph is cut there already (a marker): nothing new is split
    os_ = [e for e in g.eqns if not e.is_pseudo]
    k = next(i for i, e in enumerate(os_) if e.id == after) + 1
    bad = illegal_points(g)
    if k not in bad:
        return after
    later = [p for p in range(k + 1, len(os_)) if p not in bad]  # legalize.legal_points after k
    what = f"cut node after #{after} {_SPLITS}"
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
    schedule = resolve_names(g, check_schedule(schedule))
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
        asked = c.after
        assert isinstance(asked, int)  # names resolved above
        if asked not in present:
            continue
        after = _legal_after(g, asked, legalize)
        if after != asked and c.signal is not None:
            lo, hi = index(asked), index(after)
            for w in schedule.waits:
                ours = w.event == c.signal[0] and w.value <= c.signal[1]
                if ours and isinstance(w.at, int) and w.at in present and lo < index(w.at) <= hi:
                    raise ScheduleError(
                        f"cut node after #{asked} {_SPLITS}, and moving it after "
                        f"#{after} would put the wait at #{w.at} on {w.event!r} >= {w.value} in the segment "
                        "that signals it (a deadlock); put the cut at a legal point"
                    )
        if after != asked:
            warnings.warn(
                f"cut node after #{asked} {_SPLITS}; moved after #{after}, the end of the chain",
                ScheduleWarning,
                stacklevel=3,
            )
        pos = index(after) + 1
        while pos < len(eqns) and eqns[pos].prim == SIGNAL:
            pos += 1
        if c.signal is not None:
            ev, val = c.signal
            _check_value(f"cut node after #{after}", ev, val)
            if not any(e.args == (ev, val) for e in eqns[index(after) + 1 : pos]):
                eqns.insert(pos, Eqn(fresh(), SIGNAL, (), (), (ev, val)))
                pos += 1
        if pos >= len(eqns) or eqns[pos].prim != CUT:
            eqns.insert(pos, Eqn(fresh(), CUT, (), (), (c.name or f"fence{asked}",)))
    for w in schedule.waits:
        at = w.at
        assert isinstance(at, int)  # names resolved above
        if at not in present:
            continue
        _check_value(f"wait node at #{at}", w.event, w.value)
        pos = index(at)
        start = pos
        while start > 0 and eqns[start - 1].prim != CUT:
            start -= 1
        if any(e.prim == WAIT and e.args == (w.event, w.value) for e in eqns[start:pos]):
            continue
        while start < pos and eqns[start].prim in (WAIT, HOST_EVENT):
            start += 1
        eqns.insert(start, Eqn(fresh(), WAIT, (), (), (w.event, w.value)))
    return g.replace(eqns=tuple(eqns))
