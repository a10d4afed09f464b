"""The cache objects a band call is given, and what its window stash must not keep."""

from __future__ import annotations

from typing import Any

import mlx.core as mx


class Tiles:
    """Per band, copies of the band's caches and proxies of its first for the other
    layers (the jitted model takes every layer's cache; the window reads only the
    band's), in the same list of the same objects every band: the jitted call then takes
    its fast path (``staging/fastpath.py``), which knows a repeated call by its objects'
    identity. ``clear`` empties them after the call, so they keep no buffer alive."""

    def __init__(self) -> None:
        self.objs: list[Any] = []

    def fill(self, caches: list[Any], members: range) -> list[Any]:
        if list(map(type, self.objs)) != list(map(type, caches)):
            self.objs = [object.__new__(type(c)) for c in caches]
        like = caches[members[0]]
        for i, (o, c) in enumerate(zip(self.objs, caches)):
            o.__dict__.clear()
            o.__dict__.update(vars(c if i in members else like))
        return self.objs

    def clear(self) -> None:
        for o in self.objs:
            o.__dict__.clear()


def drop_outputs(stash: dict[str, mx.array], outputs: list[Any]) -> None:
    """The window wrote the call's outputs (new KV buffers, logits) to the stash too; no
    later band reads them, and the caches and the caller hold them: drop them, or the
    stash would keep every tile's KV buffers alive until the end of a banded prefill."""
    ids = {id(a) for a in outputs if a is not None}
    for name in [n for n, a in stash.items() if id(a) in ids]:
        del stash[name]
