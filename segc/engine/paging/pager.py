"""The pager: pages (the parameters of a band of layers) made resident ahead of the
segments that read them, within a byte limit, and reclaimed once those segments' work
has completed.

The engine asks for *tickets*: ticket ``t`` is one use of one page, in the order the
bands will run. Two :class:`~segc.runtime.events.Event` timelines record them:

- ``resident`` reaches ``t + 1`` when ticket ``t``'s page has been read (or when the
  pager failed: :meth:`Pager.admit` then raises its error); a band waits for it before
  it is dispatched (the admit fence, with a timeout: ``WaitTimeout``);
- ``reclaim`` reaches ``t + 1`` when ticket ``t``'s band has completed (its outputs
  exist): from then on its page may be evicted.

**Every MLX call stays on the dispatch thread** (MLX is not thread-safe). The pager
thread reads bytes into host memory (numpy) or into buffers the dispatch thread gave it
(an evicted page's, ``recycle.py``; on CUDA by DMA, ``cudacopy.py``); the dispatch
thread copies host copies in at the admit fence, waits for a band's outputs ``depth``
bands later and evicts completed pages to make room. The pager thread never evicts.

Loading a page waits until the ``depth + 1``-th run back that read its page is
complete (a *run*: consecutive tickets of one page, ``runs.py``; so at most ``depth``
pages are read ahead of the running one) and until it fits under the limit; a ticket
whose page is held, read in full, is resident at once (a banded prefill's later
chunks). Which completed page goes is ``evict``: ``"spread"`` (the default: the pages
a cyclic decode keeps are spread over its bands, ``runs.spread_ranks``; the draining pager uses
``"mru"``), ``"mru"`` (the most recently used first) or ``"lru"``. With ``threaded=False`` the dispatch thread
reads each page itself at ``admit`` (into evicted pages' buffers too, by the same
road) and waits for each band at ``complete`` (the host-draining baseline).

**KV blocks ride on the tickets** (``kvtickets.py``): the pager thread reads them with
the ticket's page, ``resident`` covers both; ``complete(ticket, outputs, done)`` runs
``done`` (the KV write-out) on the dispatch thread once the outputs exist.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from ...errors import PagingError, ScheduleError, WaitTimeout
from ...runtime.events import Event
from .drain import load_here
from .kvstore import KVBlock, KVStore
from .kvtickets import KVTickets
from .recycle import Held, fresh_buffers, recycle, upcoming
from .runs import Runs, spread_ranks
from .source import DiskSource
from .thread import run

_END = 2**62  # both events jump here when the pager ends: no waiter is left hanging
EVICT = ("spread", "lru", "mru")
Done = Callable[[], None] | None  # run once a ticket's outputs exist (the KV write-out)


class Pager:
    """Pages ``pages[k]`` (lists of tensor names of ``source``) under ``limit`` bytes."""

    def __init__(
        self,
        source: DiskSource,
        pages: Sequence[Sequence[str]],
        limit: int,
        *,
        depth: int = 1,
        evict: str = "spread",
        threaded: bool = True,
        timeout: float = 10.0,
        kv_store: KVStore | None = None,
        recycle: bool = True,
        direct: bool = False,
    ):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0 or evict not in EVICT:
            raise ScheduleError(f"prefetch depth must be an int >= 0 and evict one of {EVICT}: {depth!r}, {evict!r}")
        self.source = source
        self.pages = [list(p) for p in pages]
        self.sizes = [sum(source.tensors[n].nbytes for n in p) for p in self.pages]
        kinds = {n: (i.shape, i.dtype) for n, i in source.tensors.items()}  # which buffers serve which
        self._recycling = (self.pages, self.sizes, kinds)
        self.recycled_bytes = 0  # bytes read straight into recycled MLX buffers
        self.limit = limit
        if self.sizes and max(self.sizes) > limit:
            raise PagingError(f"a page of {max(self.sizes)} bytes does not fit under the pager's limit of {limit}")
        self.depth, self.evict, self.threaded, self.timeout, self.recycle = depth, evict, threaded, timeout, recycle
        self.resident = Event(name="resident")
        self.reclaim = Event(name="reclaim")
        self.error: PagingError | None = None
        self.held: dict[int, Held] = {}
        self.resident_bytes = 0  # pages held or being read
        self.peak_bytes = 0  # the most weight bytes held at once
        self.loaded_bytes = 0  # bytes read in all
        self.host_bytes = 0  # bytes of host copies not yet in MLX's memory (the pager's own buffers)
        self.peak_host_bytes = 0
        self.convert_peak = 0  # MLX's active memory plus host copies, sampled while copying in
        self._owner: dict[int, int] = {}  # ticket -> page
        self._runs = Runs()  # consecutive tickets of one page: the prefetch depth counts them
        self._order: dict[
            int, int
        ] = {}  # page -> its rank in the last call (``evict="spread"``: ``runs.spread_ranks``)
        self._next = 0  # the next ticket number
        self._cv = threading.Condition()  # guards everything above that both threads change
        self._queue: deque[int] = deque()  # tickets requested, not yet read
        self._landing: deque[tuple[int, Held | None, Any, float]] = deque()  # read, maybe in flight (thread.py)
        self._due, self._since, self._rate = 0.0, 0.0, 0.0  # when the copies should land (thread.py)
        self._pending: deque[tuple[int, list[mx.array], Done]] = deque()  # dispatched, not yet waited for
        self.kv_store = kv_store
        self.kv = KVTickets(kv_store, self)
        self._stop = False
        self._thread: threading.Thread | None = None
        self._consumer = threading.current_thread()
        # ``direct``: every page read into MLX buffers the dispatch thread gives it (recycle.py)
        self._fresh = fresh_buffers(source) if direct else None
        self.timeline: list[tuple[float, str, int]] | None = None  # a list: both threads' steps, timed

    def note(self, what: str, ticket: int) -> None:
        """A step, timed, in ``timeline`` if it is a list (``benchmarks/paging_timeline.py``)."""
        if self.timeline is not None:
            self.timeline.append((time.perf_counter(), what, ticket))

    # ------------------------------------------------------------ dispatch thread

    def request(self, pages: Sequence[int], kv: Sequence[Sequence[KVBlock] | None] | None = None) -> list[int]:
        """Tickets for ``pages``, in the order their bands will run; ``kv[j]``: the KV
        blocks ticket ``j`` reads beside its page (None: none)."""
        if kv is not None and (len(kv) != len(pages) or (any(kv) and self.kv_store is None)):
            raise ScheduleError("KV blocks need a KV store and one entry per page")
        with self._cv:
            if self.error is not None:
                raise self.error
            tickets = []
            self._order = spread_ranks(pages)
            for j, p in enumerate(pages):
                if kv is not None and kv[j]:
                    self.kv.assign(self._next, kv[j])  # type: ignore[arg-type]
                self._owner[self._next] = p
                self._runs.add(self._next, p)
                self._queue.append(self._next)
                tickets.append(self._next)
                self._next += 1
            if self.threaded and (self._thread is None or not self._thread.is_alive()) and not self._stop:
                self._consumer = threading.current_thread()  # the thread that dispatches the bands
                self._thread = threading.Thread(target=self._run, name="segc-pager", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return tickets

    def admit(self, ticket: int, where: str) -> dict[str, mx.array]:
        """Block until ``ticket``'s page has been read (at most ``timeout`` seconds:
        ``WaitTimeout``), copy it into MLX's memory; its arrays by tensor name. Raises
        the pager's error if it failed."""
        self.note("admit", ticket)
        if not self.threaded:
            while self._queue and self._queue[0] <= ticket:
                load_here(self, self._queue.popleft())
        else:
            self._wait_for(ticket - self.depth)  # outputs ``depth`` bands old: surely done
            mru_waits = self.evict == "mru" and self.resident.value <= ticket  # see below
            if not mru_waits:
                self._make_room(self._ahead(ticket))
            deadline = time.monotonic() + self.timeout
            seen = None  # what the pager waited for when we last helped
            with self._cv:
                while self.error is None and self.resident.value <= ticket:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise WaitTimeout("resident", ticket + 1, self.resident.value, self.timeout, where)
                    want, room = self._reclaim_wanted(), self._room_wanted(ticket)
                    state = (len(self._pending), self.resident_bytes, want, room, self._queue[0] if self._queue else -1)
                    if (want or room) and state != seen:  # the pager waits on us (for something new): help
                        seen = state
                        self._cv.release()  # (a notify while we help is seen by the next check)
                        try:  # no more than it waits for: the bands in flight keep the device busy
                            self._wait_for(want)
                            if mru_waits and self._room_wanted(ticket):  # we wait for the page anyway: the
                                self._wait_for(ticket)  # band dispatched last completes, and its page (the
                                # most recently used) makes the room, not an older one read again later
                            self._make_room(self._ahead(ticket))  # and room, for the pages after too
                            if self._room_wanted(ticket):  # none without the bands in flight
                                self._wait_for(ticket)
                                self._make_room(self._ahead(ticket))
                        finally:
                            self._cv.acquire()
                        continue  # check again; the same wants with nothing changed: wait, not spin
                    self._cv.wait(left)
        if self.error is not None:
            raise self.error
        held = self.held[self._owner[ticket]]
        if not held.device:
            self._copy_in(held)
        self.note("admitted", ticket)
        return held.arrays

    def _copy_in(self, held: Held) -> None:
        """Host copies into MLX's memory; tensors read into recycled buffers cost nothing."""
        for n in list(held.arrays):  # a tensor at a time: one host copy beside its array
            a = held.arrays[n]
            held.arrays[n] = mx.array(a)
            self.convert_peak = max(self.convert_peak, mx.get_active_memory() + self.host_bytes)
            with self._cv:
                self.host_bytes -= a.nbytes
            del a
        held.arrays.update(held.base)
        held.base, held.views = {}, {}
        held.device = True
        with self._cv:  # from here on, only the pages read ahead are host copies
            self.peak_host_bytes = self.host_bytes

    def take_kv(self, ticket: int) -> dict[int, dict[str, mx.array]]:
        """The KV blocks ``ticket`` reads, copied into MLX's memory (after its admit):
        per layer, its buffers by attribute name. A buffer at a time, as pages are."""
        return self.kv.take(ticket)

    def complete(self, ticket: int, outputs: list[mx.array], done: Done = None) -> None:
        """``ticket``'s band is dispatched and makes ``outputs``: once those exist,
        ``done()`` runs (on this thread) and its page may be reclaimed. Waited for
        ``depth`` bands later (or now, unthreaded)."""
        if not self.threaded:
            self.note("eval", ticket)
            mx.eval(outputs)  # the host drains: the baseline
            self.note("evaled", ticket)
            if done is not None:
                done()
            self.reclaim.signal(ticket + 1)
            return
        self._pending.append((ticket, outputs, done))
        self._wait_for(ticket + 1 - self.depth)
        # room for the pages the pager may read now (not those after: an older page than
        # this band's, still running, would be evicted for them)
        self._make_room(self._ahead(ticket))

    def _wait_for(self, upto: int) -> None:
        """Wait for the outputs of the dispatched tickets below ``upto``; signal reclaim."""
        while self._pending and self._pending[0][0] < upto:
            t, outs, done = self._pending.popleft()
            self.note("eval", t)
            mx.eval(outs)
            self.note("evaled", t)
            del outs
            if done is not None:
                done()
            with self._cv:
                self.reclaim.signal(t + 1)
                self._cv.notify_all()

    def _room_wanted(self, upto: int) -> bool:
        """The pager waits on us for a ticket up to ``upto`` (for a later one nothing but
        its own read frees room: spinning would take a core from it)."""
        upto = self._ahead(upto)  # the pages read ahead too
        return bool(self._queue) and self._queue[0] <= upto and self._waits(self._owner[self._queue[0]])

    def _ahead(self, ticket: int) -> int:
        """The last ticket whose page is read ahead of ``ticket``'s (``Runs.ahead``)."""
        return self._runs.ahead(ticket, self.depth, self.held.__contains__)

    def _reclaim_wanted(self) -> int:
        """The ``reclaim`` the pager's next ticket waits for (0: none): one that reads (its
        page, KV blocks) waits for the prefetch depth; one of a page held in full does not."""
        if not self._queue:
            return 0
        t = self._queue[0]
        h = self.held.get(self._owner[t])
        reads = h is None or not (h.ready or h.sent) or self.kv.has(t)
        need = self._runs.needs(t, self.depth, self.reclaim.value)
        return need if self.reclaim.value < need and reads else 0

    def _waits(self, p: int) -> bool:
        """Page ``p`` waits for the dispatch thread: for room, or (``direct``) for buffers."""
        return p not in self.held and (self._fresh is not None or self.resident_bytes + self.sizes[p] > self.limit)

    def _make_room(self, upto: int) -> None:
        """Evict completed pages until the pages of the tickets not yet read, up to
        ``upto``, fit beside the held ones."""
        self.note("room", upto)
        with self._cv:
            need, seen = 0, set()
            for t in self._queue:
                p = self._owner[t]
                if t > upto:
                    break
                if p not in self.held and p not in seen:
                    seen.add(p)
                    need += self.sizes[p]
            spare: list[tuple[str, Any]] = []  # evicted pages' MLX buffers, by tensor
            while self.resident_bytes + need > self.limit and self._evict_one(spare):
                pass
            wanted = upcoming(self._queue, self._owner, self.held, upto) if spare or self._fresh else []
            room = self.limit - self.resident_bytes
            for t, p, base, views, reused in recycle(spare, wanted, room, *self._recycling, self._fresh):
                self.held[p] = Held(self.sizes[p], t, base=base, views=views)
                self.resident_bytes += self.sizes[p]
                self.recycled_bytes += reused  # to be read into evicted pages' buffers
            self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
            self._cv.notify_all()
        self.note("roomed", upto)

    def shrink(self, limit: int) -> None:
        """Set the limit and evict completed pages until the held ones fit (between calls)."""
        self.finish()
        with self._cv:
            self.limit = limit
            queue, self._queue = self._queue, deque()
        try:
            self._make_room(-1)
            with self._cv:
                while self.resident_bytes > limit and self.held and self._evict_one():
                    pass
        finally:
            with self._cv:
                self._queue = queue

    def _evict_one(self, spare: list[tuple[str, Any]] | None = None) -> bool:
        """Evict one completed page (``evict`` picks which; False if none is); its MLX
        buffers go to ``spare`` (``recycle.py``) or MLX frees them here."""
        done = self.reclaim.value
        free = [(h.last, p) for p, h in self.held.items() if h.last < done and h.ready]
        if not free:
            return False
        if self.evict == "spread" and self.threaded:  # (the draining pager overlaps nothing: MRU)
            p = self._latest(free)
            if p < 0:
                return False
        else:
            _, p = max(free) if self.evict == "mru" else min(free)
        h = self.held.pop(p)
        self.resident_bytes -= h.nbytes
        if not h.device:
            self.host_bytes -= sum(a.nbytes for a in h.arrays.values())
        elif spare is not None and self.recycle:
            spare += h.arrays.items()
        h.arrays.clear()
        return True

    def _latest(self, free: list[tuple[int, int]]) -> int:
        """``evict="spread"``: of the completed pages ``free`` (``(last ticket, page)``),
        the one ranked last (``runs.spread_ranks``: rank 0 is kept longest); -1 if a band in
        flight, once complete, frees a page ranked later still (the room waits for it
        rather than evict a page the held set keeps)."""
        end = len(self.pages)
        at, _, p = max((self._order.get(p, end), last, p) for last, p in free)
        newest = self._pending[-1][0] if self._pending else -1
        for t, _, _ in self._pending:
            q = self._owner.get(t, -1)
            h = self.held.get(q)
            if h is not None and h.last <= newest and self._order.get(q, end) > at:
                return -1
        return p

    def finish(self) -> None:
        """Every dispatched ticket's outputs waited for and reclaimed (the end of a call)."""
        self._wait_for(self._next)
        with self._cv:  # nothing is left in flight: forget the tickets' pages and runs
            if not self._queue and not self._landing:
                self._owner.clear()
                self._runs = Runs()

    def close(self) -> None:
        """End the pager thread (it finishes the tensor it is reading) and drop every page."""
        with self._cv:
            self._stop = True
            self._queue.clear()
            self._cv.notify_all()
        self.reclaim.signal(max(self.reclaim.value, _END))
        if self._thread is not None:
            self._thread.join(timeout=2 * self.timeout)  # it flushes its copies first (thread.py)
        self._pending.clear()
        with self._cv:
            self.held.clear()
            self._landing.clear()
            self.kv.clear()
            self.resident_bytes = self.host_bytes = 0

    # ------------------------------------------------------------ pager thread

    def _run(self) -> None:
        run(self)  # thread.py

    def _fail(self, exc: BaseException) -> None:
        err = exc if isinstance(exc, PagingError) else PagingError(f"the pager failed: {type(exc).__name__}: {exc}")
        if err is not exc:
            err.__cause__ = exc
        with self._cv:
            self.error = err
            self.resident.signal(max(self.resident.value, _END))
            self._cv.notify_all()
