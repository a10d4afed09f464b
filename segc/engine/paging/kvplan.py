"""What KV paging needs to know before a call runs: which caches it can page, how far
each cache grows during the call, stand-in caches of the call's largest shapes (so the
plan of a long banded prefill is traced at the capacity its last chunks reach, not at
the first chunk's), and the bytes the call needs beside its pages with KV paged.

mlx-lm's ``KVCache`` grows its buffers in steps of ``step`` positions before a write
that would not fit: from ``offset`` (cut back to it when it is not a multiple of the
step) by the write's length rounded up to the step. :func:`capacity_after` mirrors it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ... import dtypes
from ...errors import PagingError
from ...trace import kvcache
from .plan import CallPlan, stub


def shallow_copy(c: Any) -> Any:
    """A cache object with the same attributes (its arrays shared): what a band writes."""
    p = object.__new__(type(c))
    p.__dict__.update(vars(c))
    return p


def cache_arrays(c: Any) -> list[mx.array]:
    return [v for v in vars(c).values() if isinstance(v, mx.array)]


def kv_cache_type() -> Any:
    from mlx_lm.models.cache import KVCache

    return KVCache


def grow_ahead(c: Any, n: int) -> None:
    """Grow an mlx-lm ``KVCache`` that cannot take ``n`` more tokens, as mlx-lm would
    (and as ``segc.jit`` would on the host before the call): done by the engine before a
    band's call, the call then finds its graph without the jit's general path."""
    if type(c) is kv_cache_type() and c.keys is not None and c.offset + n > c.keys.shape[2]:
        c.__dict__.update(kvcache.grow(c, n))


def unpageable(cache: Sequence[Any]) -> str | None:
    """Why KV paging cannot hold these caches (None: it can): it pages mlx-lm's
    ``KVCache`` (exactly that class), whose buffers are ``keys`` and ``values``."""
    kv = kv_cache_type()
    for i, c in enumerate(cache):
        if type(c) is not kv:
            return f"layer {i}'s cache is a {type(c).__name__}; KV paging pages mlx-lm's KVCache"
    return None


def capacity_after(offset: int, capacity: int | None, n: int, step: int) -> int:
    """A ``KVCache``'s buffer capacity after writing ``n`` positions at ``offset``."""
    if capacity is not None and offset + n <= capacity:
        return capacity
    base = 0 if capacity is None else (offset if offset % step else capacity)
    return base + (n + step - 1) // step * step


def grows(cache: Sequence[Any], n: int) -> tuple[bool, ...]:
    """Per cache: whether a write of ``n`` positions grows it first (part of a plan's key:
    the traced graph then reads the grown buffers)."""
    out = []
    for c in cache:
        keys = getattr(c, "keys", None)
        out.append(isinstance(keys, mx.array) and int(c.offset) + n > keys.shape[2])
    return tuple(out)


@dataclass(frozen=True)
class Growth:
    """How a call of chunks ``sizes`` changes the caches: each one's capacity at the end
    (``final``, None for a cache KV paging does not hold), and whether any grows."""

    final: tuple[int | None, ...]
    any: bool


def growth(cache: Sequence[Any], sizes: Sequence[int]) -> Growth:
    kv = kv_cache_type()
    final: list[int | None] = []
    changed = False
    for c in cache:
        if type(c) is not kv:
            final.append(None)
            continue
        off = int(c.offset)
        cap = None if c.keys is None else int(c.keys.shape[2])
        start = cap
        for n in sizes:
            cap = capacity_after(off, cap, n, int(c.step))
            off += n
        final.append(cap)
        changed |= cap != start
    return Growth(tuple(final), changed)


def at_capacity(cache: Sequence[Any], first: CallPlan, caps: Sequence[int | None], n: int) -> list[Any]:
    """Stand-ins for ``cache`` with buffers of capacity ``caps[i]`` (broadcast stubs: no
    memory) and ``n`` positions free at the end: a chunk of ``n`` there traces the
    call's largest graph. Buffer shapes come from the cache or, for an empty one, from
    the state outputs of the call's first graph ``first``."""
    out = []
    for i, c in enumerate(cache):
        cap = caps[i]
        if cap is None:
            raise PagingError(f"layer {i}: no capacity for a cache KV paging does not hold")
        if c.keys is not None:
            avals = [(tuple(c.keys.shape), c.keys.dtype), (tuple(c.values.shape), c.values.dtype)]
        else:
            if len(first.kv_avals[i]) != 2:
                raise PagingError(
                    f"layer {i}: its segment makes {len(first.kv_avals[i])} cache buffers, not keys and values"
                )
            avals = [(shape, dtypes.to_mx(dt)) for shape, dt in first.kv_avals[i]]
        (ks, kd), (vs, vd) = avals
        p = shallow_copy(c)
        p.keys = stub((*ks[:2], cap, *ks[3:]), kd)
        p.values = stub((*vs[:2], cap, *vs[3:]), vd)
        p.offset = cap - n
        out.append(p)
    return out


def given_bytes(cache: Sequence[Any], members: range) -> int:
    """The KV bytes the layers ``members`` hold before the call (read back from the
    store, or the caller's own buffers)."""
    return sum(a.nbytes for i in members for a in vars(cache[i]).values() if isinstance(a, mx.array))


def paged_reserve(plans: Sequence[CallPlan], chunks: int, in_flight: int, ahead: int, grown: bool) -> int:
    """The bytes a call with KV paged needs beside its pages, an upper bound: the widest
    band's temporaries, the logits, the activation stash of every chunk, the KV of
    ``in_flight`` bands at once (the bands dispatched and not yet waited for, and the
    running one: each band's buffers as read, its new buffers, and, in a call that grows
    the caches, the buffers it grows from), and ``ahead`` bytes read ahead into host
    memory by the pager (one band's buffers)."""
    temps = max(max(p.temps) for p in plans)
    head = max(p.head for p in plans)
    stash = chunks * max(sum(p.stash) for p in plans)
    n_bands = len(plans[0].kept)
    live = 0
    for p in plans:
        for k in range(n_bands):
            new = p.band_kv(k) - p.band_state[k]
            live = max(live, p.band_kv(k) + (new if grown else 0))
    return temps + head + stash + in_flight * live + ahead
