"""Every slice of a short axis, starts and stops past either end included, read and
written, in one traced function each: eager's bits (``shapes.slices``: MLX states an
empty reversed slice whose start lies before the front with ``start = -1``)."""

from __future__ import annotations

import itertools

import mlx.core as mx
from conftest import assert_same_bits

import segc

N = 5
BOUNDS = [None, *range(-N - 3, N + 4)]
KEYS = [slice(a, b, s) for a, b, s in itertools.product(BOUNDS, BOUNDS, (1, 2, 3, -1, -2, -3))]


def test_every_slice_read() -> None:
    def f(x: mx.array) -> list[mx.array]:
        y = x + 1
        return [y[k] for k in KEYS]

    x = mx.arange(float(N))
    assert_same_bits(segc.jit(f)(x), f(x), "reads")


def test_every_slice_written_and_added_to() -> None:
    def f(x: mx.array) -> list[mx.array]:
        outs = []
        for k in KEYS:
            y = x + 1
            y[k] = mx.array(-7.0)
            outs += [y, (x + 1).at[k].add(10.0)]
        return outs

    x = mx.arange(float(N))
    assert_same_bits(segc.jit(f)(x), f(x), "writes")
