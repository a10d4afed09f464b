"""The host-draining baseline's reads (``Pager(threaded=False)``): the dispatch thread
reads each page itself at the admit fence, into evicted pages' buffers where there are
some (``recycle.fill``), and waits for the copies before the band is dispatched."""

from __future__ import annotations

from typing import Any

from .recycle import Held, fill


def load_here(pager: Any, t: int) -> None:
    """Read ticket ``t``'s page into ``pager`` (a :class:`~.pager.Pager`) on this thread."""
    p = pager._owner[t]
    h = pager.held.get(p)
    if h is None:
        spare: list[tuple[str, Any]] = []  # evicted pages' buffers, read into here too
        while pager.resident_bytes + pager.sizes[p] > pager.limit and pager._evict_one(spare):
            pass
        pager.note("read", t)
        arrays, recycled = fill(pager.source, pager.pages[p], spare, pager._recycling[2], pager._fresh)
        pager.note("read done", t)
        h = pager.held[p] = Held(pager.sizes[p], t, arrays, True, True)
        pager.resident_bytes += h.nbytes
        pager.loaded_bytes += h.nbytes
        pager.recycled_bytes += recycled
        pager.peak_bytes = max(pager.peak_bytes, pager.resident_bytes)
    h.last = t
    pager.kv.read(t)
    pager.resident.signal(t + 1)
