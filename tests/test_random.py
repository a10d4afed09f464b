"""Random ops draw from MLX's global key exactly as eager does (issue: the key was frozen
into the graph as a constant, so every call returned the same values)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from conftest import assert_matches, bits

import segc


def noisy(x: mx.array) -> mx.array:
    return x + mx.random.normal(x.shape) * 0.5 + mx.random.uniform(shape=x.shape)


def test_global_key_is_consumed_as_eager_consumes_it() -> None:
    step = segc.jit(noisy)
    x = mx.ones((4, 2))
    mx.random.seed(7)
    want = [bits(noisy(x)) for _ in range(4)]
    key_after_eager = bits(mx.random.state[0])
    mx.random.seed(7)
    got = [bits(step(x)) for _ in range(4)]
    assert got == want, "segc drew other values than eager"
    assert bits(mx.random.state[0]) == key_after_eager, "the global key was left elsewhere"
    assert len({g[2] for g in got}) == 4, "values repeated: the key was frozen"
    assert step.cache_info().traces == 1


def test_dropout_in_training_mode_changes_per_call() -> None:
    drop = nn.Dropout(0.5)
    drop.train()
    step = segc.jit(drop)
    x = mx.ones((8, 8))
    mx.random.seed(3)
    want = [bits(drop(x)) for _ in range(3)]
    mx.random.seed(3)
    assert [bits(step(x)) for _ in range(3)] == want


def test_segmented_random_program_and_explicit_keys() -> None:
    """Bit for bit with eager; off the CPU, where a fused kernel may contract the normal
    distribution's arithmetic (docs/lowering.md), with eager or with ``mx.compile`` of
    the same function (given MLX's random state, as MLX documents)."""

    def f(x: mx.array, k: mx.array) -> mx.array:
        h = segc.boundary(x * mx.random.normal(x.shape, key=k), "a")
        return h + mx.random.normal(h.shape)

    step = segc.jit(f)
    x, k = mx.ones((2, 4)), mx.random.key(11)
    mx.random.seed(5)
    eager = [f(x, k) for _ in range(2)]
    compiled = None
    if mx.default_device() != mx.cpu:
        g = mx.compile(f, inputs=mx.random.state, outputs=mx.random.state)
        mx.random.seed(5)
        compiled = [g(x, k) for _ in range(2)]
    mx.random.seed(5)
    assert_matches([step(x, k) for _ in range(2)], eager, compiled, "segmented random program")


def test_a_function_without_randomness_keeps_its_graph() -> None:
    g = segc.jit(lambda a: a * 2).trace(mx.ones((3,))).graph
    assert [i.path for i in g.inputs] == ["args[0]"]
