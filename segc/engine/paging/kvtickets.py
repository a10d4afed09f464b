"""The KV blocks that ride on the pager's tickets (KV paging, docs/paging.md).

A ticket may name blocks of the KV store (the cache buffers of its band's layers,
written out after the band's last call): :meth:`KVTickets.read` reads their bytes into
host memory on the pager thread, with the ticket's page (no MLX call: MLX is not
thread-safe), and :meth:`KVTickets.take` copies them into MLX's memory on the dispatch
thread after the ticket's admit fence, a buffer at a time. Both count the host copies
among the pager's own buffers (``host_bytes``), under the pager's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx

from .kvstore import KVBlock, KVStore
from .source import as_dtype


class Counts(Protocol):
    """What the tickets count in (the pager): its lock and its host-buffer counters."""

    _cv: threading.Condition
    host_bytes: int
    peak_host_bytes: int
    convert_peak: int


class KVTickets:
    def __init__(self, store: KVStore | None, pager: Counts):
        self.store = store
        self.pager = pager
        self._blocks: dict[int, Sequence[KVBlock]] = {}  # ticket -> the KV blocks it reads
        self._host: dict[int, dict[int, dict[str, tuple[Any, mx.Dtype]]]] = {}  # ticket -> layer -> host copies

    def assign(self, ticket: int, blocks: Sequence[KVBlock]) -> None:
        self._blocks[ticket] = blocks

    def has(self, ticket: int) -> bool:
        return bool(self._blocks.get(ticket))

    def read(self, ticket: int) -> None:
        """Read ``ticket``'s blocks into host memory (either thread: no MLX call)."""
        blocks = self._blocks.pop(ticket, None)
        if not blocks:
            return
        assert self.store is not None
        p = self.pager
        host: dict[int, dict[str, tuple[Any, mx.Dtype]]] = {}
        for b in blocks:
            arrays = self.store.host(b)  # raises PagingError naming the file and the layer
            infos = dict(b.tensors)
            with p._cv:
                host[b.layer] = {n: (a, infos[n].mx_dtype) for n, a in arrays.items()}
                p.host_bytes += sum(a.nbytes for a in arrays.values())
                p.peak_host_bytes = max(p.peak_host_bytes, p.host_bytes)
        with p._cv:
            self._host[ticket] = host

    def take(self, ticket: int) -> dict[int, dict[str, mx.array]]:
        """``ticket``'s blocks copied into MLX's memory (the dispatch thread, after its
        admit): per layer, its buffers by attribute name."""
        p = self.pager
        with p._cv:
            host = self._host.pop(ticket, None)
        out: dict[int, dict[str, mx.array]] = {}
        for layer, arrays in (host or {}).items():
            d = out[layer] = {}
            for name in list(arrays):
                a, dtype = arrays.pop(name)
                d[name] = as_dtype(mx.array(a), dtype)
                p.convert_peak = max(p.convert_peak, mx.get_active_memory() + p.host_bytes)
                with p._cv:
                    p.host_bytes -= a.nbytes
                del a
        return out

    def clear(self) -> None:
        self._blocks.clear()
        self._host.clear()
