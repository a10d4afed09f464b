"""Signalling an event once a segment's work has completed, in dispatch order.

A segment's signal must fire when its outputs exist, never at dispatch: that is what
lets a reclaim thread free what the segment read. On the CPU build a worker thread waits
for the outputs (``mx.eval`` of arrays another thread dispatched is safe there) and
signals, so the dispatching thread never waits. MLX 0.32.4's CUDA build segfaults when a
helper thread evaluates arrays the main thread dispatched, so off the CPU the
dispatching thread waits for the segment itself before signalling: a host wait at the
segments that signal, and only there (docs/runtime.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

Job = tuple[list[mx.array], list[tuple[Any, int]], Callable[[], None] | None]


class Completer:
    """``signal_when_done(outputs, [(event, value), ...])`` signals each event with its
    value once ``outputs`` exist; jobs complete in the order they were given. The caller
    has dispatched ``outputs`` already (``mx.async_eval``, as the executor does): the
    worker only waits for them. A value an event refuses is kept in ``errors``."""

    def __init__(self, *, threaded: bool | None = None):
        self.threaded = mx.default_device() == mx.cpu if threaded is None else threaded
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
        self._jobs.put((list(outputs), signals, done))

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
