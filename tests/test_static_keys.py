"""Static arguments key the trace cache by what eager MLX would treat differently
(issue: ``2`` and ``2.0``, ``1`` and ``True``, ``0.0`` and ``-0.0`` shared an entry; a
NaN retraced on every call), and ``static_argnums`` are normalised like ``jax.jit``'s."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from conftest import bits

import segc


def scale(x: mx.array, s: float) -> mx.array:
    return x * s


@pytest.mark.parametrize(("a", "b"), [(2, 2.0), (1, True), (0.0, -0.0), (2.0, 2)])
def test_equal_but_different_statics_get_their_own_trace(a: object, b: object) -> None:
    step = segc.jit(scale, static_argnums=1)
    x = mx.array([1.0, -2.0, 0.5])
    for s in (a, b, a):
        want = scale(x, s)  # eager: the dtype and the sign of zero follow the Python value
        assert bits(step(x, s)) == bits(want), f"static {s!r}"
    assert step.cache_info().traces == 2


def test_division_by_signed_zero_statics() -> None:
    step = segc.jit(lambda x, s: x / s, static_argnums=1)
    x = mx.array([1.0, -1.0])
    assert bits(step(x, 0.0)) == bits(x / 0.0)
    assert bits(step(x, -0.0)) == bits(x / -0.0)


def test_equal_nans_hit_the_cache() -> None:
    step = segc.jit(scale, static_argnums=1)
    x = mx.array([1.0, 2.0])
    for _ in range(3):
        assert bits(step(x, float("nan"))) == bits(scale(x, math.nan))
    assert step.cache_info().traces == 1


@pytest.mark.parametrize("nums", [-1, (1, -1), (1, 1), (-1, 1, -1)])
def test_negative_and_repeated_static_argnums(nums: object) -> None:
    """Each names the second of two arguments: it must be passed once, as static."""
    step = segc.jit(scale, static_argnums=nums)
    x = mx.array([1.0, 3.0])
    assert bits(step(x, 3.0)) == bits(scale(x, 3.0))
    assert bits(step(x, 5.0)) == bits(scale(x, 5.0))
    assert step.cache_info().traces == 2


def test_static_argnums_out_of_range_is_a_signature_error() -> None:
    step = segc.jit(scale, static_argnums=-3)
    with pytest.raises(segc.SignatureError, match="static_argnums has -3"):
        step(mx.array([1.0]), 2.0)


@pytest.mark.parametrize("value", [-0.0, -math.nan])
def test_captured_negative_zero_and_nan_keep_their_sign(value: float) -> None:
    """MLX 0.32.4's mx.compile writes a captured scalar into its kernel as a literal and
    drops the sign bit of -0.0 and of a negative NaN; segc passes such constants to the
    compiled segment as arguments, so the bits stay eager's."""
    c = mx.array(value)
    x = mx.array([1.0, -1.0, 0.0, -0.0])
    step = segc.jit(lambda a: a * c + c)
    assert bits(step(x)) == bits(x * c + c)
