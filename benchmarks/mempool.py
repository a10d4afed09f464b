"""CUDA's default memory pool as MLX's CUDA allocator uses it (issue 13: does a decode
step's slow device mode follow the pool's releases?).

MLX 0.32's CUDA allocator takes device buffers from the device's default memory pool
(``cudaMallocAsync``) and keeps freed ones in its own cache; what it evicts goes back to
the pool (``cudaFreeAsync``). The pool's release threshold is 0 by default: past it, the
pool hands memory back to the driver at the next synchronization, and a later allocation
maps memory afresh. :func:`keep` raises the threshold so that the pool keeps what it has
reserved; :func:`reserved` reads the bytes it holds (both through the driver API's
``libcuda.so.1`` with ctypes, which every CUDA process has loaded: no extra package).
``None`` where there is no CUDA driver (the CPU)."""

from __future__ import annotations

import ctypes
from typing import Any

import mlx.core as mx

RELEASE_THRESHOLD, RESERVED_CURRENT = 4, 5  # CUmemPool_attribute


_FOUND: list[tuple[Any, ctypes.c_void_p]] = []  # the driver and device 0's default pool, once found


def _pool() -> tuple[Any, ctypes.c_void_p] | None:
    if _FOUND:
        return _FOUND[0]
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev, pool = ctypes.c_int(), ctypes.c_void_p()
    if lib.cuDeviceGet(ctypes.byref(dev), 0) != 0 or lib.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev) != 0:
        return None  # the driver not initialised (MLX has not used the GPU yet): asked again next time
    _FOUND.append((lib, pool))
    return _FOUND[0]


def keep() -> bool:
    """The pool's release threshold raised to the most: it keeps every byte it has
    reserved (MLX runs an op first, which initialises the driver); True where set, and
    said on the standard output (a benchmark's log)."""
    mx.eval(mx.zeros((1,)) + 1)
    got = _pool()
    v = ctypes.c_uint64(2**64 - 1)
    kept = got is not None and got[0].cuMemPoolSetAttribute(got[1], RELEASE_THRESHOLD, ctypes.byref(v)) == 0
    print(f"CUDA's default pool keeps what it reserves: {kept}")
    return kept


def reserved() -> int | None:
    """The bytes the pool holds now (reserved from the driver), or None."""
    got = _pool()
    if got is None:
        return None
    lib, pool = got
    v = ctypes.c_uint64()
    return int(v.value) if lib.cuMemPoolGetAttribute(pool, RESERVED_CURRENT, ctypes.byref(v)) == 0 else None
