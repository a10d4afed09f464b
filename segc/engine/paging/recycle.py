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

On the CUDA road (a copier on the source, ``cudacopy.py``) every page is read this way:
the tensors no evicted buffer serves get new ones (:func:`fresh_buffers`), and the pager
thread sends the bytes by DMA; no page goes through a host copy and ``mx.array``, whose
managed memory the GPU would then migrate fault by fault.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from .source import DTYPES, DiskSource


@dataclass
class Held:
    """A page the pager holds (or is reading): its arrays, and the buffers given to it."""

    nbytes: int
    last: int  # the last ticket that uses it
    arrays: dict[str, Any] = field(default_factory=dict)  # numpy host copies, then mx.arrays
    ready: bool = False  # read in full
    device: bool = False  # its arrays are mx.arrays
    base: dict[str, Any] = field(default_factory=dict)  # recycled MLX buffers to read tensors into
    views: dict[str, Any] = field(default_factory=dict)  # and host views of them, made on the dispatch thread
    sent: bool = False  # its read has started (the pager thread); ``ready`` once it has landed


Fresh = Callable[[str], Any]  # a new MLX buffer for a tensor, by name (the CUDA road)
_STREAMS: dict[str, Any] = {}  # one stream per device for every pager's new buffers (MLX keeps streams)


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


def _by_kind(spare: list[tuple[str, Any]], kinds: dict[str, Any]) -> dict[Any, list[Any]]:
    """``spare``'s buffers by kind, taken out of the list (so dropping the pool frees them)."""
    pool: dict[Any, list[Any]] = {}
    for n, a in spare:
        pool.setdefault(kinds[n], []).append(a)
    spare.clear()
    return pool


def recycle(
    spare: list[tuple[str, Any]],
    wanted: Iterable[tuple[int, int]],
    room: int,
    pages: Sequence[Sequence[str]],
    sizes: Sequence[int],
    kinds: dict[str, Any],
    fresh: Fresh | None = None,
) -> list[tuple[int, int, dict[str, Any], dict[str, Any], int]]:
    """Give ``spare`` (evicted tensors' names and MLX arrays) to the ``wanted`` pages
    (:func:`upcoming`) while they fit in ``room`` bytes: a buffer to each tensor of the
    same kind (``kinds``: shape and dtype); stops at the first page it cannot serve. With
    ``fresh`` (the CUDA road) every tensor gets a buffer: ``fresh(name)`` makes the ones
    ``spare`` lacks, after the buffers not given are freed (the page's new buffers never
    stand beside them). Per page served: ``(ticket, page, buffers, host views, bytes of
    the evicted buffers among them)``, buffers and views by tensor name."""
    pool = _by_kind(spare, kinds)
    chosen = []
    for t, p in wanted:
        if sizes[p] > room:
            break
        base = {n: pool[kinds[n]].pop() for n in pages[p] if pool.get(kinds[n])}
        if not base and fresh is None:
            break
        chosen.append((t, p, base))
        room -= sizes[p]
    pool.clear()
    out = []
    for t, p, base in chosen:
        reused = sum(b.nbytes for b in base.values())
        base.update({n: fresh(n) for n in pages[p] if n not in base} if fresh is not None else {})
        out.append((t, p, base, {n: np.asarray(b) for n, b in base.items()}, reused))
    return out


def fresh_buffers(source: DiskSource) -> Fresh:
    """New MLX buffers for tensors of ``source`` to be read into by DMA (the CUDA road):
    made on a stream of their own (no wait for the bands in flight), their bytes moved
    to managed memory by the host view (MLX's ``raw_ptr``: a device copy), so a DMA can
    fill them without a host copy. Call it on the dispatch thread."""
    device = mx.default_device()
    stream = _STREAMS.get(str(device)) or _STREAMS.setdefault(str(device), mx.new_stream(device))

    def make(name: str) -> mx.array:
        info = source.tensors[name]
        raw = DTYPES[info.dtype]
        b = mx.zeros(info.shape, mx.uint16 if info.dtype == "BF16" else raw[1], stream=stream)
        mx.eval(b)
        return b

    return make


def fill(
    source: DiskSource,
    names: Sequence[str],
    spare: list[tuple[str, Any]],
    kinds: dict[str, Any],
    fresh: Fresh | None = None,
) -> tuple[dict[str, Any], int]:
    """The host-draining pager's page (on the dispatch thread): each of ``names`` read
    into a ``spare`` buffer of its kind where there is one (the others freed first, so
    the page's new arrays never stand beside them), else into a ``fresh`` one (the CUDA
    road) or a new array; the copies waited for. Returns the arrays by name and the
    bytes read into spare buffers."""
    pool = _by_kind(spare, kinds)
    given = {n: pool[kinds[n]].pop() for n in names if pool.get(kinds[n])}
    pool.clear()
    arrays: dict[str, Any] = {}
    for n in names:
        b = given[n] if n in given else fresh(n) if fresh is not None else None
        if b is not None:
            arrays[n] = b
            source.read_into(n, np.asarray(b))
        else:
            arrays[n] = source.read(n)
    source.flush()
    return arrays, sum(b.nbytes for b in given.values())
