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

RELEASE_THRESHOLD, RESERVED_CURRENT, USED_CURRENT = 4, 5, 7  # CUmemPool_attribute


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


def _get(attr: int) -> int | None:
    got = _pool()
    if got is None:
        return None
    lib, pool = got
    v = ctypes.c_uint64()
    return int(v.value) if lib.cuMemPoolGetAttribute(pool, attr, ctypes.byref(v)) == 0 else None


def keep() -> bool:
    """The pool's release threshold raised to the most: it keeps every byte it has
    reserved. After MLX's first GPU work (the driver initialised); True where set."""
    got = _pool()
    if got is None:
        return False
    lib, pool = got
    v = ctypes.c_uint64(2**64 - 1)
    return bool(lib.cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, ctypes.byref(v)) == 0)


def reserved() -> int | None:
    """The bytes the pool holds now (reserved from the driver), or None."""
    return _get(RESERVED_CURRENT)


def used() -> int | None:
    """The bytes of the pool's memory allocated now, or None."""
    return _get(USED_CURRENT)
