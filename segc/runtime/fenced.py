"""The dispatch loop with the IR's effects executed: waits gate a segment's dispatch,
signals fire once a segment's work has completed, and a window runs only its segments,
its entry values read from the activation stash and its exit values written to it.

The stock loop (``Executor.__call__`` without fences or a window) does none of this and
pays nothing for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx

from .. import dtypes
from ..errors import ScheduleError
from ..ir import Graph, Var
from .aborted import Aborted
from .completion import Completer
from .events import Event, checked_timeout
from .interrupts import allowed


class _Steps(Protocol):
    """What the loop reads of an ``Executor`` (typed so, as ``executor.py`` imports this)."""

    graph: Graph
    steps: tuple[Any, ...]
    windows: dict[str, tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]]
    cell: dict[str, int]
    n_inputs: int
    first_output: int  # env's first cell that holds a segment output
    stash_vars: dict[str, Var]  # the windows' entry values, for their shapes and dtypes
    commit_after: tuple[bool, ...]  # per step: commit its outputs right after it
    output_cells: tuple[int, ...]


@dataclass
class Fences:
    """What executing a graph's fences needs: the events by name (``segc.Event``s: the
    graph's own signals and the host's), how long a wait may block, and the completer
    that signals after a segment's work."""

    events: Mapping[str, Event]
    timeout: float = 10.0
    completer: Completer = field(default_factory=Completer)
    stride: int = 0  # call k signals and waits for value + k * stride
    calls: int = 0  # calls run so far (a call that raised before its end does not count)

    def __post_init__(self) -> None:
        """Refuse, up front, what a wait or a signal would trip over later."""
        self.timeout = checked_timeout(self.timeout, "boundary schedule")
        if not isinstance(self.events, Mapping):
            raise ScheduleError(f"events must map event names to segc.Events, got {type(self.events).__name__}")
        for name, ev in self.events.items():
            if not isinstance(name, str) or not name:
                raise ScheduleError(f"events: an event's name must be a non-empty str, got {name!r}")
            if not isinstance(ev, Event):
                raise ScheduleError(f"events[{name!r}] must be a segc.Event, got {type(ev).__name__} {ev!r}")
        if not isinstance(self.stride, int) or isinstance(self.stride, bool) or self.stride < 0:
            raise ScheduleError(f"stride must be an int >= 0, got {self.stride!r}")

    def event(self, name: str, where: str) -> Any:
        try:
            return self.events[name]
        except KeyError:
            raise ScheduleError(
                f"{where} uses event {name!r}, but no Event of that name was given (events: {sorted(self.events)})"
            ) from None


@dataclass(frozen=True)
class WindowRun:
    """Which window to run and where its activations live."""

    name: str
    stash: MutableMapping[str, mx.array]


Timeline = list[tuple[float, str, int, str]]  # (time.perf_counter(), what, segment, detail)


def run_effects(
    ex: _Steps,
    env: list,
    sync: Callable[[Any], Any],
    fences: Fences | None,
    window: WindowRun | None,
    timeline: Timeline | None = None,
    consume: bool = False,
) -> list[mx.array | None]:
    """Dispatch ``ex``'s steps honouring effects; outputs a window did not compute are None.
    ``timeline`` receives ``(time, what, segment, detail)`` for the call (``call``, segment
    -1), every wait (``wait`` before, ``waited`` after), stash read, dispatch and stash
    write, and, for every segment, ``complete`` when its outputs exist (from a completer
    thread, so it may come after later entries; off the CPU, a segment that does not
    signal is noted complete at the call's end, after one synchronize).

    ``sync`` commits a segment's outputs after it (``mx.async_eval``, or ``mx.eval`` for
    the draining baseline) where ``ex.commit_after`` says so. Whatever the policy,
    outputs are committed where the schedule observes them: before a wait (everything
    dispatched since the last commit, so that it runs while the host blocks) and after a
    segment that signals (its completion is what the signal reports).

    ``consume``: ``env``'s inputs are the only references to the caller's donated
    buffers (``Executor.__call__``); an exception then arrives as :class:`Aborted`, with
    the inputs no segment read and the outputs already made, and the segments after it
    are not run (unlike the stock loop, which finishes the call: a wait that timed out
    must not be passed over)."""
    try:
        with allowed():  # an interrupt here is handled below (interrupts.py)
            return _run(ex, env, sync, fences, window, timeline)
    except BaseException as exc:
        if not consume:
            raise
        alive = {i: env[i] for i in range(ex.n_inputs) if env[i] is not None}
        made = {j: env[c] for j, c in enumerate(ex.output_cells) if env[c] is not None}
        raise Aborted(exc, inputs=alive, partial=made) from None


def _run(
    ex: _Steps,
    env: list,
    sync: Callable[[Any], Any],
    fences: Fences | None,
    window: WindowRun | None,
    timeline: Timeline | None,
) -> list[mx.array | None]:
    note = (
        (lambda what, k, detail="": timeline.append((time.perf_counter(), what, k, detail)))
        if timeline is not None
        else None
    )
    selected: Sequence[int] = range(len(ex.steps))
    entry: tuple[str, ...] = ()
    exit_: tuple[str, ...] = ()
    if window is not None:
        spec = ex.windows.get(window.name)
        if spec is None:
            raise ScheduleError(f"{ex.graph.name} has no window {window.name!r}; windows: {sorted(ex.windows)}")
        selected, entry, exit_ = spec
    first, last = (selected[0], selected[-1]) if len(selected) else (-1, -1)
    to_note: list[tuple[int, list]] = []  # recording: segments whose completion the call's end notes
    completer = (fences.completer if fences is not None else timeline_completer()) if note else None
    if note:
        note("call", -1, ex.graph.name if window is None else f"{ex.graph.name} window {window.name!r}")
    base = 0 if fences is None else fences.calls * fences.stride  # counted at the end: a failed call's retry lines up
    pending = False  # whether outputs were dispatched and not committed (``sync is None``)

    def commit(extra: Sequence[mx.array] = ()) -> None:
        # every value dispatched so far is a live segment output or an ancestor of one
        mx.async_eval([v for v in env[ex.first_output :] if v is not None] + list(extra))

    for k in selected:
        st = ex.steps[k]
        where = f"segment {k} {st.segment.name!r} of {ex.graph.name}"
        if fences is not None and st.effects.waits and pending:
            commit()
            pending = False
        if fences is not None:  # the waits first: the stash copy is the segment's first work
            for ev, value in st.effects.waits:
                if note:
                    note("wait", k, f"{ev} >= {value + base}")
                fences.event(ev, where).wait(value + base, fences.timeout, where=where)
                if note:
                    note("waited", k, f"{ev} >= {value + base}")
        if k == first:
            for name in entry:
                if note:
                    note("stash_in", k, name)
                value = _stash_value(window.stash, name, ex.stash_vars[name], where)  # type: ignore[union-attr]
                env[ex.cell[name]] = value
        if note:
            note("dispatch", k, st.segment.name)
        res = st.fn(*(env[i] for i in st.reads))
        for i in st.dead:
            env[i] = None
        for i, r in zip(st.writes, res):
            env[i] = r
        if ex.commit_after[k]:
            sync(res)
            pending = False
        elif fences is not None and st.effects.signals:
            commit(res)  # ``res`` too: an output nothing reads later may be released already
            pending = False
        else:
            pending = True
        if fences is not None and st.effects.signals:
            signals = [(fences.event(ev, where), v + base) for ev, v in st.effects.signals]
            done = None
            if note is not None:
                detail = ", ".join(f"{ev} = {v + base}" for ev, v in st.effects.signals)

                def done(k: int = k, detail: str = detail) -> None:  # runs once the outputs exist
                    note("complete", k, detail)

            fences.completer.signal_when_done(res, signals, done)
        elif completer is not None:  # recording: every segment's completion
            if pending and completer.threaded:  # a worker may wait only for committed work
                commit(res)
                pending = False
            _note_completion(completer, note, k, res, to_note)  # type: ignore[arg-type]
        if k == last:
            for name in exit_:
                if note:
                    note("stash_out", k, name)
                window.stash[name] = env[ex.cell[name]]  # type: ignore[union-attr]
    if to_note:  # no completer thread (off the CPU): one synchronize at the call's end
        mx.eval([x for _, res in to_note for x in res])
        for k, _ in to_note:
            note("complete", k, "synchronized at the end of the call")  # type: ignore[misc]
    if fences is not None:
        fences.calls += 1
    return [env[c] for c in ex.output_cells]


def _stash_value(stash: Mapping[str, Any], name: str, var: Var, where: str) -> mx.array:
    """The stash's array for entry value ``name``, of ``var``'s shape and dtype."""
    if name not in stash:
        raise ScheduleError(f"{where}: the stash holds no %{name}, an entry value of its window")
    value = stash[name]
    if not isinstance(value, mx.array):
        raise ScheduleError(f"{where}: the stash's %{name} must be an mx.array, got {type(value).__name__}")
    if tuple(value.shape) != var.shape or dtypes.short(value.dtype) != var.dtype:
        got = f"{dtypes.short(value.dtype)}[{','.join(map(str, value.shape))}]"
        raise ScheduleError(
            f"{where}: the stash's %{name} is {got}, but its window reads a {var.type_str()} there "
            "(a stash filled by a call of another shape?)"
        )
    return value


_TIMELINE_COMPLETER: list[Completer] = []


def timeline_completer() -> Completer:
    """The completer that notes segment completions for a timeline recorded without
    fences (made on first use: a call that records nothing never starts its thread)."""
    if not _TIMELINE_COMPLETER:
        _TIMELINE_COMPLETER.append(Completer())
    return _TIMELINE_COMPLETER[0]


def _note_completion(
    completer: Completer, note: Callable[..., None], k: int, res: list, pending: list[tuple[int, list]]
) -> None:
    """Note ``complete`` for segment ``k`` once its outputs exist: from the completer's
    thread where it has one (the CPU), else at the call's end (``pending``), so that
    recording adds no host wait between segments."""
    if completer.threaded:
        completer.signal_when_done(res, [], lambda: note("complete", k, ""))
    else:
        pending.append((k, res))
