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
from ..passes.fences import Schedule, check_schedule
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
    kv_in_place: bool | None

    def set_boundary_schedule(
        self,
        schedule: Schedule | str | Callable[[Graph], Schedule],
        events: Mapping[str, Any],
        *,
        timeout: float = 10.0,
        stride: int = 0,
        completion: str | None = None,
    ) -> None:
        """Apply a boundary schedule to every later call, until
        :meth:`clear_boundary_schedule`: cut nodes (with a signal that fires once the
        segment's work has completed), wait nodes (the segment is not dispatched before
        the event reaches the value) and host events. ``schedule`` is a
        ``segc.passes.Schedule`` (or its JSON), whose nodes name an equation id (one
        graph's: ids differ between a function's graphs, and a node whose id a graph lacks
        is skipped there) or a boundary (a cut marker's name, the same in every graph; one
        a graph lacks is refused); or a function ``graph -> Schedule`` applied to each
        graph as it is lowered. ``events`` maps each event name the schedule uses to a
        ``segc.Event``; a wait that nothing signals within ``timeout`` seconds raises
        ``segc.WaitTimeout``. With ``stride``, the k-th call from now that completes
        signals and waits for each value plus ``k * stride`` (a call that raised, such as
        a wait that timed out, does not count: its retry waits for the same values).
        ``completion`` is how a signal learns that its segment's work has completed
        (``"eval"``, ``"inline"``; default: the backend's, see
        :mod:`segc.runtime.completion`). Everything is checked before anything changes."""
        if isinstance(schedule, str):
            schedule = Schedule.from_json(schedule)
        if not isinstance(schedule, Schedule) and not callable(schedule):
            raise ScheduleError(
                "set_boundary_schedule takes a Schedule, its JSON or a function graph -> Schedule, "
                f"got {type(schedule).__name__}"
            )
        fences = Fences(events, timeout, Completer(mode=completion), stride=stride)  # checks events, timeout, stride
        if isinstance(schedule, Schedule):
            check_schedule(schedule, set(fences.events))
        with DISPATCH_LOCK:
            fences.events = dict(fences.events)  # the caller's mapping may change later; this one will not
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
        for what, i in (("first", first), ("last", last)):
            if isinstance(i, bool) or not isinstance(i, int):
                raise ScheduleError(f"set_window: {what} must be an equation id (an int), got {i!r}")
        if not isinstance(name, str) or not name:
            raise ScheduleError(f"set_window: name must be a non-empty str, got {name!r}")
        _check_stash(stash)
        self.set_windows(lambda g: {name: (first, last)})
        return self.use_window(name, stash)

    def set_windows(self, windows: Callable[[Graph], Mapping[str, tuple[int, int]]]) -> None:
        """Place windows in every graph: ``windows(graph)`` gives ``{name: (first id,
        last id)}`` for that graph (ids differ between graphs of one function, so an
        engine computes them per graph, e.g. from its layer markers). Placed windows run
        only when chosen with :meth:`use_window`, which changes nothing else."""
        if not callable(windows):
            raise ScheduleError(f"set_windows takes a function graph -> {{name: (first, last)}}, got {windows!r}")
        if windows == self._effects.windows:
            return  # placed already: nothing to lower again
        with DISPATCH_LOCK:
            self._relower(replace(self._effects, windows=windows))

    def use_window(
        self, name: str | None, stash: MutableMapping[str, mx.array] | None = None
    ) -> MutableMapping[str, mx.array]:
        """Run window ``name`` (placed by :meth:`set_windows`) from and to ``stash`` in the
        following calls; ``None``: run every segment again, the windows staying placed.
        No lowering, so an engine may switch per call. Returns the stash. A name that no
        cached graph places is refused here (naming the placed ones), and one that the
        graph a call runs does not place, at that call (before anything runs)."""
        if name is not None:
            if not isinstance(name, str):
                raise ScheduleError(f"use_window: name must be a str or None, got {name!r}")
            if self._effects.windows is None:
                raise ScheduleError(f"use_window({name!r}): no windows are placed; place them with set_windows first")
            placed = {w for c in self._cache.values() for w in c.placed}
            if self._cache and name not in placed:
                raise ScheduleError(f"use_window: no window {name!r} is placed; placed: {sorted(placed)}")
        _check_stash(stash)
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
        if timeline is not None and not isinstance(timeline, list):
            raise ScheduleError(f"record_timeline takes a list (or None), got {type(timeline).__name__}")
        with DISPATCH_LOCK:
            self._relower(replace(self._effects, timeline=timeline))

    def _compile_options(self) -> dict[str, Any]:
        """The jit's options every ``Lowered.compile`` of its traces takes."""
        return {
            "drain": self.drain,
            "commit": self.commit,
            "attention": self.attention,
            "concats": self._concats,
            "capture_params": self.freeze_params,
            "kv_in_place": self.kv_in_place,
        }

    def _relower(self, effects: Effects) -> None:
        """Lower every cached trace again with ``effects`` (no re-trace); on an error
        (a window endpoint missing from one graph) nothing changes."""
        fresh = OrderedDict(
            (
                sig,
                c.lowered.traced.lower(effects=effects).compile(**self._compile_options()),
            )
            for sig, c in self._cache.items()
        )
        self._effects = effects
        self._cache = fresh


def _check_stash(stash: Any) -> None:
    if stash is not None and not isinstance(stash, MutableMapping):
        raise ScheduleError(f"an activation stash is a mutable mapping (a dict), got {type(stash).__name__}")
