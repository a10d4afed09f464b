"""Recycled page buffers: an evicted page's MLX buffers read into by the next pages.

When the dispatch thread evicts a completed page to make room for the next ones
(``Pager._make_room``), it does not let MLX free that page's buffers if the pages the
pager reads next have tensors of the same shapes and dtypes (a model's layers do): it
hands them over, with host views of them (numpy over MLX's memory; making a view is an
MLX call, so it happens here, on the dispatch thread). The pager thread then copies a
tensor's bytes from the file straight into its view: writing host memory that no graph
reads, no MLX call. Such tensors cost the admit fence no copy, and the fenced pager
makes one copy of them where it makes two otherwise (a host copy, then MLX's).

Safe because nothing reads an evicted page's buffers any more: its band's outputs exist
(``reclaim``), and a band's outputs do not alias its weights; ``CallPlan.aliased``
checks that on the traced graph, and the engine turns recycling off for a graph where
a segment hands on a parameter or a view of one. Pages are given buffers in ticket
order only, and only while they fit under the limit: a page prepared ahead of an
earlier one would hold the room that one needs (it cannot be evicted before it is read).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

import numpy as np


def upcoming(queue: Iterable[int], owner: dict[int, int], held: Container[int], upto: int) -> list[tuple[int, int]]:
    """``(ticket, page)`` of the queued tickets up to ``upto`` whose pages are not held,
    each page once, in ticket order."""
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for t in queue:
        if t > upto:
            break
        p = owner[t]
        if p not in held and p not in seen:
            seen.add(p)
            out.append((t, p))
    return out


def recycle(
    spare: list[tuple[str, Any]],
    wanted: Iterable[tuple[int, int]],
    room: int,
    pages: Sequence[Sequence[str]],
    sizes: Sequence[int],
    kinds: dict[str, Any],
) -> list[tuple[int, int, dict[str, Any], dict[str, Any]]]:
    """Give ``spare`` (evicted tensors' names and MLX arrays) to the ``wanted`` pages
    (:func:`upcoming`) while they fit in ``room`` bytes: a buffer to each tensor of the
    same kind (``kinds``: shape and dtype); stops at the first page it cannot serve. Per
    page served: ``(ticket, page, buffers, host views)`` by tensor name. The buffers not
    given are freed when ``spare`` goes."""
    pool: dict[Any, list[Any]] = {}
    for n, a in spare:
        pool.setdefault(kinds[n], []).append(a)
    out = []
    for t, p in wanted:
        if sizes[p] > room:
            break
        base = {n: pool[kinds[n]].pop() for n in pages[p] if pool.get(kinds[n])}
        if not base:
            break
        out.append((t, p, base, {n: np.asarray(b) for n, b in base.items()}))
        room -= sizes[p]
    return out
