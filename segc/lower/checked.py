"""Device checks that a rewrite keeps a primitive's bytes (``dequantized.py``,
``experts.py``): each answered once per rewrite, shape key and device in a process, the
time they took summed in :data:`SPENT` (they compile and run MLX's kernels, so a first
call's report gives it apart from segc's own lowering)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import mlx.core as mx

SPENT = 0.0  # seconds the checks took in this process (MLX's compilation of their kernels included)
_KNOWN: dict[tuple, bool] = {}


def once(rewrite: str, key: Hashable, agree: Callable[[], bool]) -> bool:
    """``agree()``'s answer for ``key`` of ``rewrite`` on the default device, computed
    the first time it is asked in this process."""
    global SPENT
    full = (rewrite, key, str(mx.default_device()))  # an mx.Device compares by value but hashes by identity
    if full not in _KNOWN:
        t = time.perf_counter()
        _KNOWN[full] = agree()
        SPENT += time.perf_counter() - t
    return _KNOWN[full]
