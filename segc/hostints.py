"""Arrays whose value the host already knows, by identity: a traced KV cache's offset is
``trace.kvcache.position(n)``, an ``int32`` array made from the host's ``n``, and the
lowering's attention over the live keys (``lower/live.py``) needs ``n`` on the host at
every call. Reading it back from the array would wait for the device (on CUDA, a read of
managed memory), so the maker of such an array records it here and the reader asks.

Kept by identity (``is``), not by value: an array nothing registered is unknown
(``None``), never guessed. The registry holds what it records alive, so an ``id`` is
never reused while recorded; makers forget what they drop."""

from __future__ import annotations

import mlx.core as mx

_KNOWN: dict[int, tuple[mx.array, int]] = {}


def remember(a: mx.array, n: int) -> None:
    """Record that ``a`` holds the integer ``n`` (its maker's host value)."""
    _KNOWN[id(a)] = (a, n)


def forget(a: mx.array) -> None:
    """Drop ``a``'s record, if any."""
    entry = _KNOWN.get(id(a))
    if entry is not None and entry[0] is a:
        del _KNOWN[id(a)]


def known(a: mx.array) -> int | None:
    """The host's value of ``a`` where its maker recorded one, else None."""
    entry = _KNOWN.get(id(a))
    return entry[1] if entry is not None and entry[0] is a else None
