"""The engine's hooks on a jitted function: a persistent boundary schedule and a
persistent window with its activation stash (docs/runtime.md). Both are applied when a
trace is lowered, so they reach every graph of the function, re-traced ones included;
setting or clearing one lowers the cached traces again, without re-tracing."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import replace
from typing import Any

import mlx.core as mx

from ..errors import ScheduleError
from ..ir import Graph
from ..passes.fences import Schedule
from ..runtime import DISPATCH_LOCK
from ..runtime.completion import Completer
from ..runtime.fenced import Fences, WindowRun
from .concat import Concats
from .signature import Signature
from .stages import Compiled, Effects


class EngineHooks:
    """Mixed into ``Jitted``: ``set_boundary_schedule`` / ``clear_boundary_schedule`` and
    ``set_window`` / ``clear_window``."""

    _effects: Effects
    _active: WindowRun | None
    _cache: OrderedDict[Signature, Compiled]
    drain: bool
    commit: str
    attention: Any
    _concats: Concats
    freeze_params: bool

    def set_boundary_schedule(
        self,
        schedule: Schedule | str,
        events: Mapping[str, Any],
        *,
        timeout: float = 10.0,
        stride: int = 0,
        completion: str | None = None,
    ) -> None:
        """Apply a boundary schedule (a ``segc.passes.Schedule`` or its JSON) to every
        later call, until :meth:`clear_boundary_schedule`: cut nodes (with a signal that
        fires once the segment's work has completed), wait nodes (the segment is not
        dispatched before the event reaches the value) and host events, matched by
        equation id in every graph of the function, re-traced ones included. ``events``
        maps each event name the schedule uses to a ``segc.Event``; a wait that nothing
        signals within ``timeout`` seconds raises ``segc.WaitTimeout``. With ``stride``, the
        k-th call from now signals and waits for each value plus ``k * stride``: an
        event's value only grows, so a schedule that fences every call of a decode loop
        moves its values on (the host's signals move with them). ``completion`` is how a
        signal learns that its segment's work has completed (``"eval"``, ``"inline"``; default: the backend's, see :mod:`segc.runtime.completion`)."""
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 0:
            raise ScheduleError(f"stride must be an int >= 0, got {stride!r}")
        if isinstance(schedule, str):
            schedule = Schedule.from_json(schedule)
        if not isinstance(schedule, Schedule):
            raise ScheduleError(f"set_boundary_schedule takes a Schedule or its JSON, got {type(schedule).__name__}")
        used = {c.signal[0] for c in schedule.cuts if c.signal} | {w.event for w in schedule.waits}
        missing = sorted(used - set(events))
        if missing:
            raise ScheduleError(f"the schedule uses events {missing} that events= does not give")
        completer = Completer(mode=completion)
        with DISPATCH_LOCK:
            fences = Fences(dict(events), timeout, completer, stride=stride)
            self._relower(replace(self._effects, schedule=schedule, fences=fences))

    def clear_boundary_schedule(self) -> None:
        """Back to the stock path, bit-identical to it and with no added cost."""
        with DISPATCH_LOCK:
            self._relower(replace(self._effects, schedule=None, fences=None))

    def set_window(
        self, first: int, last: int, stash: MutableMapping[str, mx.array] | None = None, *, name: str = "window"
    ) -> MutableMapping[str, mx.array]:
        """Run only the segments that intersect equations ``[first, last]`` (ids) in every
        later call, until :meth:`clear_window`: the window's entry values are read from
        ``stash`` (value name -> array), its exit values written to it. A graph holding
        neither endpoint runs in full; one holding one endpoint only raises
        ``ScheduleError``. Outputs the window does not compute come back as None, and
        state objects whose segments it leaves out are left as they were. Returns the
        stash (a new dict if none was given)."""
        self.set_windows(lambda g: {name: (first, last)})
        return self.use_window(name, stash)

    def set_windows(self, windows: Callable[[Graph], Mapping[str, tuple[int, int]]]) -> None:
        """Place windows in every graph: ``windows(graph)`` gives ``{name: (first id,
        last id)}`` for that graph (ids differ between graphs of one function, so an
        engine computes them per graph, e.g. from its layer markers). Placed windows run
        only when chosen with :meth:`use_window`, which changes nothing else."""
        if windows == self._effects.windows:
            return  # placed already: nothing to lower again
        with DISPATCH_LOCK:
            self._relower(replace(self._effects, windows=windows))

    def use_window(
        self, name: str | None, stash: MutableMapping[str, mx.array] | None = None
    ) -> MutableMapping[str, mx.array]:
        """Run window ``name`` (placed by :meth:`set_windows`) from and to ``stash`` in the
        following calls; ``None``: run every segment again, the windows staying placed.
        No lowering, so an engine may switch per call. Returns the stash."""
        stash = {} if stash is None else stash
        self._active = None if name is None else WindowRun(name, stash)
        return stash

    def clear_window(self) -> None:
        """Every segment runs again, as without a window."""
        with DISPATCH_LOCK:
            self._active = None
            self._relower(replace(self._effects, windows=None))

    def record_timeline(self, timeline: list | None) -> None:
        """Every later call appends ``(time, what, segment, detail)`` to ``timeline``: its
        stash reads, waits (``wait``/``waited``), dispatches and stash writes; None stops."""
        with DISPATCH_LOCK:
            self._relower(replace(self._effects, timeline=timeline))

    def _relower(self, effects: Effects) -> None:
        """Lower every cached trace again with ``effects`` (no re-trace); on an error
        (a window endpoint missing from one graph) nothing changes."""
        fresh = OrderedDict(
            (
                sig,
                c.lowered.traced.lower(effects=effects).compile(
                    drain=self.drain,
                    commit=self.commit,
                    attention=self.attention,
                    concats=self._concats,
                    capture_params=self.freeze_params,
                ),
            )
            for sig, c in self._cache.items()
        )
        self._effects = effects
        self._cache = fresh
