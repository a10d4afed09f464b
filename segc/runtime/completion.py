"""Signalling an event once a segment's work has completed, in dispatch order.

A segment's signal must fire when its outputs exist, never at dispatch: that is what
lets a reclaim thread free what the segment read. How the completer learns that is its
``mode`` (docs/runtime.md, "Completion"):

* ``"eval"``: a worker thread ``mx.eval``s one-element arrays computed from the outputs,
  made and committed by the dispatching thread and held by the worker alone (safe on the
  CPU build), and signals, so the dispatching thread never waits. The default on the CPU.
* ``"inline"``: the dispatching thread waits for the outputs itself before signalling:
  a host wait at the segments that signal, and only there. The default off the CPU:
  MLX 0.32.4's CUDA build segfaults when a helper thread evaluates arrays the main
  thread dispatched, a helper thread's ``mx.synchronize`` of the dispatching thread's
  stream never returned in our tests (the signals timed out), and ``mlx::core::Event``
  is not exported from ``libmlx.so``, so no extension can enqueue a device-side signal
  (docs/runtime.md, "Completion").
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from ..errors import ScheduleError

MODES = ("eval", "inline")


def default_mode() -> str:
    """``"eval"`` on the CPU; ``"inline"`` elsewhere (docs/runtime.md, "Completion")."""
    return "eval" if mx.default_device() == mx.cpu else "inline"


Job = tuple[list[mx.array], list[tuple[Any, int]], Callable[[], None] | None]


class Completer:
    """``signal_when_done(outputs, [(event, value), ...])`` signals each event with its
    value once ``outputs`` exist; jobs complete in the order they were given. The caller
    has dispatched and committed ``outputs`` already (``mx.async_eval``, as the executor
    does): the worker only waits for them. A value an event refuses is kept in
    ``errors``. ``threaded=False`` is ``mode="inline"``."""

    def __init__(self, *, threaded: bool | None = None, mode: str | None = None):
        if mode is None:
            mode = "inline" if threaded is False else default_mode()
        if mode not in MODES:
            raise ScheduleError(f"completer mode must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self.threaded = mode != "inline"
        self.errors: list[BaseException] = []  # what a worker could not evaluate
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def signal_when_done(
        self, outputs: Sequence[mx.array], signals: list[tuple[Any, int]], done: Callable[[], None] | None = None
    ) -> None:
        """``done`` (if given) is called once the outputs exist, before the signals."""
        if not self.threaded:
            mx.eval(list(outputs))
            if done is not None:
                done()
            self._signal(signals)
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="segc-completer", daemon=True)
                self._thread.start()
        # The worker waits on arrays made here from the outputs, which only it holds: an
        # array's wait writes to the array (its event and status), so the worker must not
        # wait on arrays the dispatching thread goes on using (a segfault, seen on the CPU
        # build with a completion per segment). One probe, a new one-element buffer from the
        # smallest output: a segment's outputs come from one compiled call (or, op by op,
        # in order on one stream), so they complete together, and the probe does not keep
        # a large output (a KV cache that the next call should update in place) alive.
        small = min(reversed(outputs), key=lambda o: o.size) if outputs else None
        probes = [] if small is None else [mx.sum(mx.reshape(small, (-1,))[:1])]
        mx.async_eval(probes)
        self._jobs.put((probes, signals, done))

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            outputs, signals, done = job
            try:
                mx.eval(outputs)
            except BaseException as exc:  # waiters time out, naming the event; the error is kept
                self.errors.append(exc)
                continue
            if done is not None:
                done()
            self._signal(signals)

    def _signal(self, signals: list[tuple[Any, int]]) -> None:
        for event, value in signals:
            try:
                event.signal(value)
            except Exception as exc:  # a refused value: kept, and the others still fire
                self.errors.append(exc)

    def close(self) -> None:
        """Let the worker finish the jobs it has and stop."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
