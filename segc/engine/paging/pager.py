"""The pager: pages (the parameters of a band of layers) made resident ahead of the
segments that read them, within a byte limit, and reclaimed once those segments' work
has completed.

The engine asks for *tickets*: ticket ``t`` is one use of one page, in the order the
segments will run. Two :class:`~segc.runtime.events.Event` timelines order them:

- ``resident`` reaches ``t + 1`` when ticket ``t``'s page is in memory (or when the pager
  failed: :meth:`Pager.admit` then raises its error); a segment waits for it before it
  is dispatched (the admit fence);
- ``reclaim`` reaches ``t + 1`` when ticket ``t``'s segments have completed (their
  outputs exist): from then on that page may be evicted, its memory given back.

Loading ticket ``t`` waits until ``reclaim >= t - depth`` (at most ``depth`` tickets
ahead of the ones still running) and until the page fits under the limit, evicting
pages whose tickets have completed (``evict``: ``"lru"``, the least recently used
first, or ``"mru"``, the most recently used first, which keeps a prefix of a cyclic
decode resident). With ``threaded=True`` a pager thread loads; otherwise the dispatch
thread loads at :meth:`admit` (the host-draining baseline, with ``Pager.complete``
evaluating the outputs at once).

Reclaim, when threaded: on the CPU a ``Completer`` thread waits for the outputs and
signals; on a GPU (where a helper thread may not evaluate arrays the dispatch thread
made, docs/runtime.md) the dispatch thread evaluates a ticket's outputs only when
``depth`` later tickets have been dispatched after it, or when the pager needs the room.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ...errors import PagingError, ScheduleError
from ...runtime.completion import Completer
from ...runtime.events import Event
from .source import DiskSource

_END = 2**62  # both events jump here when the pager ends: no waiter is left hanging
EVICT = ("lru", "mru")


@dataclass
class _Held:
    arrays: dict[str, mx.array]
    nbytes: int
    last: int  # the last ticket that uses it
    device: bool = True  # False: host copies (numpy), made mx.arrays at admit


class Pager:
    """Pages ``pages[k]`` (lists of tensor names of ``source``) under ``limit`` bytes."""

    def __init__(
        self,
        source: DiskSource,
        pages: Sequence[Sequence[str]],
        limit: int,
        *,
        depth: int = 1,
        evict: str = "lru",
        threaded: bool = True,
        reclaim_thread: bool | None = None,
        convert_thread: bool | None = None,
        timeout: float = 10.0,
    ):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise ScheduleError(f"prefetch depth must be an int >= 0, got {depth!r}")
        if evict not in EVICT:
            raise ScheduleError(f"evict must be one of {EVICT}, got {evict!r}")
        self.source = source
        self.pages = [list(p) for p in pages]
        self.sizes = [sum(source.tensors[n].nbytes for n in p) for p in self.pages]
        self.limit = limit
        if self.sizes and max(self.sizes) > limit:
            raise PagingError(f"a page of {max(self.sizes)} bytes does not fit under the pager's limit of {limit}")
        self.depth, self.evict, self.threaded, self.timeout = depth, evict, threaded, timeout
        self.resident = Event(name="resident")
        self.reclaim = Event(name="reclaim")
        self.error: PagingError | None = None
        self.held: dict[int, _Held] = {}
        self.resident_bytes = 0
        self.peak_bytes = 0  # the most weight bytes held at once
        self.host_bytes = 0  # bytes of host copies not yet made mx.arrays (the pager's own buffers)
        self.peak_host_bytes = 0
        self.convert_peak = 0  # MLX's active memory plus host copies, sampled while converting
        self._counts = threading.Lock()  # guards host_bytes (both threads change it)
        self.loaded_bytes = 0  # bytes read in all
        self._owner: dict[int, int] = {}  # ticket -> page
        self._next = 0  # the next ticket number
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[int] = deque()  # tickets requested, not yet loaded
        self._stop = False
        self._thread: threading.Thread | None = None
        on_cpu = mx.default_device() == mx.cpu
        # the pager thread makes the mx.arrays itself (CPU), or reads host copies that the
        # dispatch thread turns into mx.arrays at admit (elsewhere: no MLX call off it)
        self.convert_thread = on_cpu if convert_thread is None else convert_thread
        self._completer = (
            Completer(threaded=True) if (reclaim_thread if reclaim_thread is not None else on_cpu) else None
        )
        self._pending: deque[tuple[int, list[mx.array]]] = deque()  # completed on the host, later

    # ------------------------------------------------------------ dispatch thread

    def request(self, pages: Sequence[int]) -> list[int]:
        """Tickets for ``pages``, in the order their segments will run."""
        with self._wake:
            if self.error is not None:
                raise self.error
            tickets = []
            for p in pages:
                t = self._next
                self._next += 1
                self._owner[t] = p
                self._queue.append(t)
                tickets.append(t)
            if self.threaded and (self._thread is None or not self._thread.is_alive()) and not self._stop:
                self._thread = threading.Thread(target=self._run, name="segc-pager", daemon=True)
                self._thread.start()
            self._wake.notify_all()
        return tickets

    def admit(self, ticket: int, where: str) -> dict[str, mx.array]:
        """Block until ``ticket``'s page is resident (at most ``timeout`` seconds:
        ``WaitTimeout``); its arrays by tensor name. Raises the pager's error if it failed."""
        if not self.threaded:
            while self._queue and self._queue[0] <= ticket:
                self._load(self._queue.popleft())
        else:
            self._flush(ticket - self.depth)  # outputs ``depth`` tickets old: surely done
            if self.resident.value <= ticket:
                self._flush(ticket)  # the pager may need their room
            self.resident.wait(ticket + 1, self.timeout, where=where)
        if self.error is not None:
            raise self.error
        held = self.held[self._owner[ticket]]
        if not held.device:
            for n in list(held.arrays):  # a tensor at a time: one host copy beside its array
                a = held.arrays[n]
                held.arrays[n] = mx.array(a)
                total = mx.get_active_memory() + self.host_bytes
                with self._counts:
                    self.host_bytes -= a.nbytes
                del a
                self.convert_peak = max(self.convert_peak, total)
            held.device = True
            with self._counts:  # the page's copies are gone: from here on, the next page's
                self.peak_host_bytes = self.host_bytes
        return held.arrays

    def complete(self, ticket: int, outputs: list[mx.array]) -> None:
        """``ticket``'s segments are dispatched and make ``outputs``: once those exist,
        its page may be reclaimed."""
        if not self.threaded:
            mx.eval(outputs)  # the host drains: the baseline
            self.reclaim.signal(ticket + 1)
        elif self._completer is not None:
            # dispatched here first (some outputs are new arrays of the caches' commit, not
            # yet scheduled): the completer thread must only wait, never schedule a graph
            # while this thread dispatches (MLX segfaults; Completer's contract)
            mx.async_eval(outputs)
            self._completer.signal_when_done(outputs, [(self.reclaim, ticket + 1)])
        else:
            self._pending.append((ticket, outputs))

    def _flush(self, upto: int) -> None:
        while self._pending and self._pending[0][0] < upto:
            t, outs = self._pending.popleft()
            mx.eval(outs)
            self.reclaim.signal(t + 1)

    def finish(self) -> None:
        """Every dispatched ticket's outputs waited for and reclaimed (the end of a call)."""
        self._flush(self._next)
        if self._completer is not None and self._next:
            self.reclaim.wait(self._next, self.timeout, where="the end of a paged call")

    def shrink(self, limit: int) -> None:
        """Set the limit; evict completed pages until the resident ones fit under it.
        Between calls (every ticket has completed)."""
        self.limit = limit
        with self._wake:
            while self.held and self.resident_bytes > limit:
                self._evict_one(self._next)

    def close(self) -> None:
        """End the pager thread (it finishes the page it is reading) and drop every page."""
        with self._wake:
            self._stop = True
            self._queue.clear()
            self._wake.notify_all()
        self.reclaim.signal(max(self.reclaim.value, _END))
        if self._thread is not None:
            self._thread.join(timeout=self.timeout)
        if self._completer is not None:
            self._completer.close()
        self.held.clear()
        self.resident_bytes = 0

    # ------------------------------------------------------------ pager thread

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stop:
                    self._wake.wait()
                if self._stop:
                    return
                t = self._queue.popleft()
            try:
                if t - self.depth > 0:  # at most ``depth`` tickets ahead of the running ones
                    self.reclaim.wait(t - self.depth, self.timeout, where=f"the pager, before ticket {t}")
                if self._stop:
                    return
                self._load(t)
            except BaseException as exc:
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        err = exc if isinstance(exc, PagingError) else PagingError(f"the pager failed: {type(exc).__name__}: {exc}")
        if err is not exc:
            err.__cause__ = exc
        self.error = err
        self.held.clear()
        self.resident_bytes = 0
        self.resident.signal(max(self.resident.value, _END))

    def _load(self, t: int) -> None:
        p = self._owner[t]
        h = self.held.get(p)
        if h is None:
            need = self.sizes[p]
            while self.resident_bytes + need > self.limit:
                self._evict_one(t)
            on_device = self.convert_thread or not self.threaded
            read: Callable[[str], Any] = self.source.read if on_device else self.source.host
            arrays = {n: read(n) for n in self.pages[p]}  # raises PagingError
            h = self.held[p] = _Held(arrays, need, t, on_device)
            self.resident_bytes += need
            self.loaded_bytes += need
            if not on_device:
                with self._counts:
                    self.host_bytes += need
                    self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)
            self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
        h.last = t
        self.resident.signal(t + 1)

    def _evict_one(self, t: int) -> None:
        """Drop one page whose tickets have completed, waiting for one if none has."""
        if not self.held:
            raise PagingError(f"ticket {t}: nothing left to evict under the limit of {self.limit} bytes")
        done = self.reclaim.value
        free = [(h.last, p) for p, h in self.held.items() if h.last < done]
        if not free:
            oldest = min(h.last for h in self.held.values())
            if not self.threaded:
                raise PagingError(f"ticket {t}: the page of ticket {oldest} is still in use")  # pragma: no cover
            self.reclaim.wait(oldest + 1, self.timeout, where=f"the pager, making room for ticket {t}")
            if self._stop:
                raise PagingError("the pager was closed")
            return
        _, p = max(free) if self.evict == "mru" else min(free)
        h = self.held.pop(p)
        if not h.device:
            with self._counts:
                self.host_bytes -= sum(a.nbytes for a in h.arrays.values() if not isinstance(a, mx.array))
        self.resident_bytes -= h.nbytes
        h.arrays.clear()
