"""MLX's ``RandomBits`` rebuilt from MLX operations, for any output and any keys.

Python reaches the primitive only as ``mx.random.split(key, n)``: one key, an even number
of 32-bit words. A draw of an odd number of words (``mx.random.uniform(shape=(3,))``,
``mx.random.categorical`` of one row) or with a batch of keys has other counters, so it
is computed here as MLX's CPU and CUDA kernels compute it (``mlx/backend/cpu/
primitives.cpp``, ``RandomBits::eval_cpu``; ``mlx/backend/cuda/random.cu``, ``rbitsc``):
for ``n`` words a key, ``half = n // 2``, word ``i < half`` is the first half of
``threefry2x32(key, (i, i + half + odd))`` and word ``i + half + odd`` its second; an odd
``n`` takes word ``half`` from ``threefry2x32(key, (half, 0))``; a key's output is the
first bytes of its words. The hash is uint32 arithmetic, which MLX wraps as C does, so
the bits are the primitive's (``tests/test_random_bits.py``).
"""

from __future__ import annotations

import math

import mlx.core as mx

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x: mx.array, r: int) -> mx.array:
    return mx.bitwise_or(mx.left_shift(x, r), mx.right_shift(x, 32 - r))


def threefry2x32(k0: mx.array, k1: mx.array, c0: mx.array, c1: mx.array) -> tuple[mx.array, mx.array]:
    """MLX's ``threefry2x32_hash`` of counters ``(c0, c1)`` under key ``(k0, k1)``
    (uint32 arrays that broadcast)."""
    u = mx.uint32
    ks = (k0, k1, mx.bitwise_xor(mx.bitwise_xor(k0, k1), mx.array(0x1BD11BDA, dtype=u)))
    x, y = c0 + ks[0], c1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x = x + y
            y = mx.bitwise_xor(_rotl(y, r), x)
        x = x + ks[(i + 1) % 3]
        y = y + ks[(i + 2) % 3] + mx.array(i + 1, dtype=u)
    return x, y


def random_bits(keys: mx.array, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    """The output of ``RandomBits(shape, width)`` for ``keys`` (``(..., 2)`` uint32: one
    key per leading index), as ``dtype`` (the width's unsigned type)."""
    u = mx.uint32
    nk = keys.size // 2
    nbytes = math.prod(shape) * mx.zeros((), dtype=dtype).itemsize
    if nbytes == 0 or nk == 0:
        return mx.zeros(shape, dtype=dtype)
    per_key = nbytes // nk
    n = -(-per_key // 4)  # words a key
    half, odd = n // 2, n % 2
    flat = mx.reshape(keys, (nk, 2))
    k0, k1 = flat[:, :1], flat[:, 1:]
    i = mx.arange(half, dtype=u)[None, :]
    first, second = threefry2x32(k0, k1, i, i + mx.array(half + odd, dtype=u)) if half else (None, None)
    middle = threefry2x32(k0, k1, mx.array(half, dtype=u), mx.array(0, dtype=u))[0] if odd else None
    parts = [w for w in (first, middle, second) if w is not None]  # words [0, half), half, [half + odd, n)
    words = mx.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    raw = mx.reshape(words, (nk, n)).view(mx.uint8)[:, :per_key]
    return mx.reshape(mx.reshape(raw, (-1,)).view(dtype), shape)
