"""A recorded call timeline (``fenced.Timeline``) as a Chrome trace, which Perfetto
(ui.perfetto.dev) and ``chrome://tracing`` load.

The host's work is one thread: each call (``call``), each wait (from ``wait`` to
``waited``), each dispatch (from ``dispatch`` to the host's next entry) and each stash
copy. Each segment's life, from its dispatch to its completion, is an async slice on
its own track (segments overlap: segment k+1 is dispatched before k completes); its
dispatch and completion are also instant events (``dispatch``, ``complete``), and a
completion that signals names the values it signalled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..errors import SegcError

Entry = tuple[float, str, int, str]
HOST, SEGMENTS = 1, 2  # thread ids


def wait_complete(timeline: Sequence[Entry], timeout: float = 10.0) -> None:
    """Wait until every dispatched segment has its ``complete`` entry (completions are
    noted from a completer thread); a ``SegcError`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        entries = list(timeline)
        dispatched = sum(1 for e in entries if e[1] == "dispatch")
        completed = sum(1 for e in entries if e[1] == "complete")
        if completed >= dispatched:
            return
        if time.monotonic() > end:
            raise SegcError(f"timeline: {dispatched - completed} of {dispatched} segments never noted completion")
        time.sleep(0.001)


def to_chrome_trace(timeline: Sequence[Entry], names: Sequence[str] = (), *, process: str = "segc") -> dict[str, Any]:
    """The Chrome trace-event JSON object of ``timeline`` (times in microseconds from its
    first entry). ``names[k]`` names segment ``k`` where the entries do not."""
    entries = sorted(timeline, key=lambda e: e[0])
    if not entries:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = entries[0][0]

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    meta = [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": process}},
        {"ph": "M", "pid": 1, "tid": HOST, "name": "thread_name", "args": {"name": "host (dispatch)"}},
        {"ph": "M", "pid": 1, "tid": SEGMENTS, "name": "thread_name", "args": {"name": "segments (completion)"}},
    ]
    events: list[dict[str, Any]] = []
    seg_name = dict(enumerate(names))
    host = [e for e in entries if e[1] != "complete"]
    call = -1
    open_waits: dict[tuple[int, str], float] = {}
    dispatched: dict[tuple[int, int], float] = {}  # (call, segment) -> time
    for i, (t, what, k, detail) in enumerate(host):
        nxt = host[i + 1][0] if i + 1 < len(host) else t
        args: dict[str, Any] = {"call": call, "segment": k}
        if what == "call":
            call += 1
            events.append({"ph": "i", "s": "p", "pid": 1, "tid": HOST, "ts": us(t), "name": f"call {call}"})
            events[-1]["args"] = {"graph": detail}
        elif what == "wait":
            open_waits[(k, detail)] = t
        elif what == "waited":
            start = open_waits.pop((k, detail), t)
            events.append(_slice(us(start), round(us(t) - us(start), 3), f"wait {detail}", HOST, args))
        elif what == "dispatch":
            name = detail or seg_name.get(k, f"segment {k}")
            seg_name.setdefault(k, name)
            dispatched[(call, k)] = t
            events.append(_slice(us(t), max(round(us(nxt) - us(t), 3), 0.0), f"dispatch {name}", HOST, args))
            events.append(_instant(us(t), f"dispatch {k}", HOST, {**args, "name": name}))
        elif what in ("stash_in", "stash_out"):
            events.append(_instant(us(t), f"{what} %{detail}", HOST, args))
        else:
            events.append(_instant(us(t), what, HOST, {**args, "detail": detail}))
    # a completion belongs to the earliest call that dispatched its segment and has none yet
    done: set[tuple[int, int]] = set()
    for t, _, k, detail in (e for e in entries if e[1] == "complete"):
        cands = [(c, s) for c, s in dispatched if s == k and (c, s) not in done and dispatched[(c, s)] <= t]
        if not cands:
            raise SegcError(f"timeline: segment {k} completed at {us(t)} us but was not dispatched before")
        key = min(cands)
        done.add(key)
        name = seg_name.get(k, f"segment {k}")
        args = {"call": key[0], "segment": k, "name": name}
        if detail:
            args["detail"] = detail
        ident = f"{key[0]}.{k}"
        start = us(dispatched[key])
        events.append({"ph": "b", "cat": "segment", "id": ident, "pid": 1, "tid": SEGMENTS, "ts": start, "name": name})
        events[-1]["args"] = args
        events.append({"ph": "e", "cat": "segment", "id": ident, "pid": 1, "tid": SEGMENTS, "ts": us(t), "name": name})
        events.append(_instant(us(t), f"complete {k}", SEGMENTS, args))
        if detail.startswith("synchronized"):
            continue
        for sig in filter(None, (s.strip() for s in detail.split(","))):
            events.append(_instant(us(t), f"signal {sig}", SEGMENTS, args))
    missing = sorted(set(dispatched) - done)
    if missing:
        raise SegcError(f"timeline: no completion for (call, segment) {missing[:5]}; record until every call completes")
    events.sort(key=lambda e: e["ts"])
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": {"producer": "segc"}}


def _slice(ts: float, dur: float, name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": args}


def _instant(ts: float, name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "i", "s": "t", "pid": 1, "tid": tid, "ts": ts, "name": name, "args": args}
