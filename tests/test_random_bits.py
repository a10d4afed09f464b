"""Random draws in a segc call give eager's bits for every shape and dtype: a draw of
an odd number of 32-bit words (or of one row: ``mx.random.categorical`` at batch 1) is
MLX's kernel rebuilt from uint32 operations (``segc/lower/threefry.py``); the global key
is told from a key the function makes itself; ``nan`` and ``-nan`` static values key
their own entries."""

from __future__ import annotations

import mlx.core as mx
from conftest import assert_same_bits, examples
from hypothesis import given, settings
from hypothesis import strategies as hs

import segc
from segc.lower.threefry import random_bits

DRAWS = {
    "uniform f32": lambda n, k: mx.random.uniform(shape=(n,), key=k),
    "uniform f16": lambda n, k: mx.random.uniform(shape=(n,), key=k, dtype=mx.float16),
    "uniform bf16": lambda n, k: mx.random.uniform(shape=(n,), key=k, dtype=mx.bfloat16),
    "normal": lambda n, k: mx.random.normal(shape=(n, 1), key=k),
    "randint u8": lambda n, k: mx.random.randint(0, 200, shape=(n,), key=k, dtype=mx.uint8),
    "randint i16": lambda n, k: mx.random.randint(-9, 9, shape=(n,), key=k, dtype=mx.int16),
    "bernoulli": lambda n, k: mx.random.bernoulli(0.3, shape=(n,), key=k),
    "categorical": lambda n, k: mx.random.categorical(mx.arange(float(n))[None, :], key=k),
}


@settings(max_examples=examples(40))
@given(hs.sampled_from(sorted(DRAWS)), hs.integers(1, 40), hs.integers(0, 2**32 - 1))
def test_every_draw_gives_eagers_bits(kind: str, n: int, seed: int) -> None:
    k = mx.random.key(seed)
    draw = DRAWS[kind]

    def f(x: mx.array) -> mx.array:
        return draw(n, k) + x * 0

    x = mx.zeros(())
    assert_same_bits([segc.jit(f)(x)], [f(x)], f"{kind} of {n}")


def test_the_rebuilt_kernel_against_split_where_split_applies() -> None:
    """An even number of words from one key: the rebuilt kernel gives split's words."""
    for seed in (0, 7, 2**31 + 5):
        k = mx.random.key(seed)
        for n in (1, 2, 5, 8):
            want = mx.random.split(k, n)
            got = random_bits(k, (n, 2), mx.uint32)
            assert_same_bits([got], [want], f"seed {seed}, {n} keys")


def test_odd_draws_from_the_global_key_follow_eager_call_after_call() -> None:
    def f(x: mx.array) -> mx.array:
        return x + mx.random.uniform(shape=(3,))

    step = segc.jit(f)
    x = mx.zeros((3,))
    mx.random.seed(5)
    want = [f(x) for _ in range(3)]
    want_key = mx.random.state[0]
    mx.random.seed(5)
    got = [step(x) for _ in range(3)]
    assert_same_bits(got, want)
    assert_same_bits([mx.random.state[0]], [want_key], "the key after the calls")


def test_a_fixed_key_equal_to_the_global_one_stays_fixed() -> None:
    mx.random.seed(0)
    fixed = mx.random.key(0)  # the same words as the global key right now

    def f(x: mx.array) -> mx.array:
        return x + mx.random.normal(x.shape) + 100 * mx.random.uniform(shape=x.shape, key=fixed)

    x = mx.zeros((4,))
    step = segc.jit(f)
    mx.random.seed(0)
    want = [f(x) for _ in range(3)]
    mx.random.seed(0)
    assert_same_bits([step(x) for _ in range(3)], want)


def test_nan_and_minus_nan_static_values_key_apart() -> None:
    step = segc.jit(lambda x, s: x * s, static_argnums=(1,))
    x = mx.ones((2,))
    for s in (float("nan"), -float("nan"), float("nan")):
        assert_same_bits([step(x, s)], [x * s], repr(s))
    assert step.cache_info().misses == 2
