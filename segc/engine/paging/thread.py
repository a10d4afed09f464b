"""The pager thread (``Pager(threaded=True)``): reads the requested pages in ticket
order, no MLX call (MLX is not thread-safe).

A page read into MLX buffers by DMA (``cudacopy.py``) is not waited for before the next
page's copies start: its copies are marked (a CUDA event) and the page *lands* (is read
in full, ``resident`` moves) once the mark is passed, checked whenever the thread would
wait. So the copy engine is never idle between pages the depth and the room allow (a
wait per page cost 8% of the DMA's bandwidth on the H200: ``benchmarks/dma_pages.py``).
Tickets land in order: ``resident`` is a count.
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import WaitTimeout
from .recycle import Held

_POLL = 2e-4  # seconds between checks of the marks in flight (a page's copies end a band's wait)


def run(pager: Any) -> None:
    """The thread's body for ``pager`` (a :class:`~.pager.Pager`)."""
    try:
        while True:
            with pager._cv:
                t, p = _next(pager)
                if t < 0:
                    return
                pager._queue.popleft()
                h = pager.held.get(p)
                if h is not None:  # still resident, or being read
                    h.last = t
                else:
                    h = pager.held[p] = Held(pager.sizes[p], t)
                    pager.resident_bytes += h.nbytes
                    pager.peak_bytes = max(pager.peak_bytes, pager.resident_bytes)
            pager.note("read", t)
            mark, reads = None, not (h.ready or h.sent)
            pager._runs.reached(t, reads)
            if reads:
                h.sent = True
                for n in pager.pages[p]:  # each raises PagingError naming the file and tensor
                    view = h.views.get(n)
                    if view is not None:  # an MLX buffer given to it: the bytes go straight in
                        pager.source.read_into(n, view)
                        continue
                    a = pager.source.host(n)
                    with pager._cv:
                        h.arrays[n] = a
                        pager.host_bytes += a.nbytes
                        pager.peak_host_bytes = max(pager.peak_host_bytes, pager.host_bytes)
                mark = pager.source.mark() if h.views else None  # the DMAs started (cudacopy.py)
            pager.kv.read(t)
            with pager._cv:
                now = time.monotonic()
                pager._landing.append((t, h if reads else None, mark, now))
                if mark is not None and pager._rate:  # when it should land (at the best rate seen), less 10%
                    pager._due = max(pager._due, now) + 0.9 * h.nbytes / pager._rate
                _land(pager)
    except BaseException as exc:
        pager._fail(exc)
    finally:
        try:
            pager.source.flush()  # no copy may outlive the thread: its buffers go with ``close``
        except BaseException as exc:
            if pager.error is None:  # the first error is the one to report
                pager._fail(exc)


def _next(pager: Any) -> tuple[int, int]:
    """The next ticket and its page, once it may be read: at most ``depth`` pages ahead of
    the running ones, with room (or buffers) for it. ``(-1, -1)``: the pager stops. No
    deadline (a band's first call may compile for seconds): it ends when the dispatch
    thread reclaims, ``close()`` stops the pager, or that thread is gone; ``admit``'s
    waits carry the timeouts a caller sees. Lands pages meanwhile."""
    told = None
    while True:
        _land(pager)
        if pager._stop:
            return -1, -1
        if pager._queue:
            t = pager._queue[0]
            p = pager._owner[t]
            want = pager._reclaim_wanted()
            if not want and not pager._waits(p):
                return t, p
            pager.note("wait reclaim" if want else "wait room", t)
            if told != (t, want):  # the dispatch thread helps with what we wait for (admit)
                told = (t, want)
                pager._cv.notify_all()
            if not pager._consumer.is_alive():
                raise WaitTimeout(
                    "reclaim",
                    want,
                    pager.reclaim.value,
                    pager.timeout,
                    f"the pager, before ticket {t} (the thread that dispatched the bands has ended)",
                )
        # copies in flight: checked from when they should land on (woken early by a notify)
        pager._cv.wait(max(_POLL, pager._due - time.monotonic()) if pager._landing else pager.timeout)


def _land(pager: Any) -> None:
    """Tickets whose pages' copies are done, in order: read in full, ``resident`` moves."""
    moved = False
    while pager._landing:
        t, h, mark, start = pager._landing[0]
        if mark is not None and not pager.source.landed(mark):
            break
        pager._landing.popleft()
        if h is not None:
            h.ready = True
            pager.loaded_bytes += h.nbytes
        if mark is not None and h is not None:  # the rate it landed at (from when the copy engine was its)
            now = time.monotonic()
            if h.nbytes >= 1 << 20:  # late checks only lower it: the best is the nearest
                pager._rate = max(pager._rate, h.nbytes / max(now - max(start, pager._since), 1e-6))
            pager._since = now
        pager.note("read done", t)
        pager.resident.signal(t + 1)
        moved = True
    if moved:
        pager._cv.notify_all()
