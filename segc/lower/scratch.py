"""Zeroed memory of its own for each launch of segc's CUDA kernels that count their blocks
(``cuda_attention.counter``, ``cuda_chain.state``, ``cuda_layer.state``), fresh at
every call of a compiled segment.

Such a kernel's blocks count themselves done on an array the kernel writes: it must be
zero when the kernel starts, and no other launch may count on it meanwhile. Made as a
constant at trace time, it was one array for every call of the compiled function, and
calls with no data between them evaluated together (an engine stepping two sequences
through one segment) had MLX run their kernels at once on it: each counted the other's
blocks, and groups were never merged (zeros; an H100, forty-fourth session,
``tests/test_attention_cuda.py``). So the arrays come from here, made by an op the
compiled function runs at each call: a broadcast zero copied into fresh memory, from a
1-d constant of its own (never merged with another by ``mx.compile``, which merges equal
scalars). Inside :func:`per_call` (a replayed segment's call: its trace under
``mx.compile``) every request is a slice of one such bank, a copy a call rather than a
copy a kernel; each slice starts a 128-byte line of its own (counters of different
kernels never share a line, and a state's 16-byte alignment holds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

ALIGN = 32  # words (128 bytes): where each slice of a bank starts
BANK = 1024  # words a bank holds at least


@dataclass
class _Bank:
    array: mx.array
    used: int = 0  # words handed out


_BANKS: ContextVar[list[_Bank] | None] = ContextVar("segc_scratch_banks", default=None)


def _fresh(words: int) -> mx.array:
    return mx.contiguous(mx.broadcast_to(mx.array(np.zeros(1, dtype=np.uint32)), (words,)))


@contextmanager
def per_call() -> Iterator[None]:
    """Requests inside share banks made for this call (module docstring)."""
    token = _BANKS.set([])
    try:
        yield
    finally:
        _BANKS.reset(token)


def zeros(words: int) -> mx.array:
    """``words`` uint32 zeros of this call's own, made at each call (module docstring)."""
    banks = _BANKS.get()
    if banks is None:
        return _fresh(words)
    need = -(-words // ALIGN) * ALIGN
    if not banks or banks[-1].used + need > banks[-1].array.size:
        banks.append(_Bank(_fresh(max(need, BANK))))
    bank = banks[-1]
    bank.used += need
    return bank.array[bank.used - need : bank.used - need + words]
