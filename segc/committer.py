"""Commits on a thread of their own (``SEGC_COMMIT_THREAD``), so that MLX encodes one
part of a call while the host builds the next.

On MLX's CUDA build a decode step is the host's: building a stretch of the graph
(Python, MLX's compiled calls) and ``mx.async_eval`` (MLX encoding every kernel into a
CUDA graph and launching it) follow each other on one thread. ``mx.async_eval`` releases
Python's GIL while it encodes, so a second thread can commit one part while the calling
thread builds the next: the host's time becomes the longer of the two, not their sum.

MLX gives each thread its own default stream and a thread's streams are evaluated by
that thread alone; a stream made by ``mx.new_thread_unsafe_stream`` may be evaluated by
any thread, one at a time. A :class:`Committer` owns such a stream: the caller builds on it
(:meth:`Committer.building`), commits the first part itself with the call's inputs (an
input not yet computed is on the caller's own stream, which only the caller's thread
may evaluate), hands the later parts to :meth:`Committer.submit`, and waits for them
(:meth:`Committer.finish`) before it evaluates anything on the stream again: never two
threads encoding one stream. The kernels are the same on any stream, so the bytes are
too.

The committing thread must get the GIL back as soon as MLX returns, or its next commit
waits for the builder's whole call: while a part is being built :meth:`building` sets
Python's switch interval to ``SEGC_COMMIT_SWITCH`` microseconds (restored after).

One committer a device a process (:func:`committer`): MLX keeps its cuDNN and cuBLAS
caches per thread, so a long-lived thread keeps them warm.

Off by default: measured on an H100 and an H200 (sixtieth session, docs/runtime.md,
"Commits") it pays in plain MLX but not in segc's decode, where the GIL's hand-overs
and a later start of the device cost more than the building it hides."""

from __future__ import annotations

import atexit
import contextlib
import queue
import sys
import threading
from collections.abc import Iterator, Sequence

import mlx.core as mx

from .errors import WaitTimeout
from .settings import env_choice, env_count

FINISH_TIMEOUT = 60.0  # seconds a call waits for its commits (a deadlock is an error, not a hang)


def thread_wanted() -> bool:
    """The environment's ``SEGC_COMMIT_THREAD``: ``0`` (the default) or ``1``; read when
    segments are built."""
    return env_choice("SEGC_COMMIT_THREAD", ("0", "1"), "0") == "1"


def switch_interval() -> float:
    """``SEGC_COMMIT_SWITCH``: Python's switch interval while a call builds beside its
    committing thread, in microseconds (default 100: measured faster than 20 on an
    H100, sixtieth session)."""
    return env_count("SEGC_COMMIT_SWITCH", 100, 1, "a whole number of microseconds") * 1e-6


class Committer:
    """A thread that ``mx.async_eval``s what it is handed, in order, one commit each, on
    a stream any thread may evaluate (``stream``). (Putting what waits into one commit
    was measured too: the device then started later, docs/runtime.md.)"""

    def __init__(self, device: mx.Device):
        self.stream = mx.new_thread_unsafe_stream(device)
        self._todo: queue.SimpleQueue[list[mx.array] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._pending = 0
        self._thread = threading.Thread(target=self._loop, name="segc-committer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread (what was handed over first is committed), before MLX's own
        teardown at the process's exit."""
        self._todo.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            arrays = self._todo.get()
            if arrays is None:
                return
            try:
                mx.async_eval(arrays)
            except BaseException as exc:  # reported by finish(), in the caller's thread
                result: BaseException | None = exc
            else:
                result = None
            del arrays  # the arrays die with the caller's references, not with this frame
            self._done.put(result)

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Build on :attr:`stream`, with the switch interval short (see the module)."""
        old = sys.getswitchinterval()
        sys.setswitchinterval(switch_interval())
        try:
            with mx.stream(self.stream):
                yield
        finally:
            sys.setswitchinterval(old)

    def submit(self, arrays: Sequence[mx.array]) -> None:
        """Commit ``arrays`` on the thread, after what was handed before."""
        self._pending += 1
        self._todo.put(list(arrays))

    def finish(self, timeout: float = FINISH_TIMEOUT, where: str | None = None) -> None:
        """Wait until everything handed over is committed; raise the first exception a
        commit raised (after waiting for the rest), or :class:`WaitTimeout`."""
        first: BaseException | None = None
        total, n = self._pending, 0
        while self._pending:  # (after a timeout the next finish waits for what is left)
            try:
                exc = self._done.get(timeout=timeout)
            except queue.Empty:
                raise WaitTimeout("segc-committer", total, n, timeout, where) from None
            self._pending -= 1
            n += 1
            first = first or exc
        if first is not None:
            raise first


_COMMITTERS: dict[str, Committer] = {}
_MADE = threading.Lock()


@atexit.register
def _stop_all() -> None:
    for c in _COMMITTERS.values():
        c.stop()


def committer(device: mx.Device | None = None) -> Committer:
    """The process's committer for ``device`` (default: MLX's default device), made once."""
    d = device or mx.default_device()
    key = str(d)
    with _MADE:
        c = _COMMITTERS.get(key)
        if c is None:
            c = _COMMITTERS[key] = Committer(d)
        return c
