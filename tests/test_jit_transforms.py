"""A jitted function under MLX's transforms (``mx.grad``, ``nn.value_and_grad``,
``mx.vmap``, ``mx.compile``): the call runs ``fn`` inlined into the transform's graph,
so values and gradients are eager's, bit for bit (docs/api.md, "Transforms")."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from conftest import Net, assert_same_bits, seeded
from mlx.utils import tree_flatten

import segc
from segc.models import tiny_llama


def _loss(out: mx.array) -> mx.array:
    return out.astype(mx.float32).square().mean()


def test_value_and_grad_of_a_segmented_llama_gives_eagers_gradients() -> None:
    model = tiny_llama(num_hidden_layers=2)
    step = segc.jit(model, boundaries="layers.*")
    x = mx.array([[1, 2, 3, 4]])
    want_loss, want = nn.value_and_grad(model, lambda m, t: _loss(m(t)))(model, x)
    got_loss, got = nn.value_and_grad(model, lambda m, t: _loss(step(t)))(model, x)
    assert_same_bits([got_loss], [want_loss], "loss")
    g, w = tree_flatten(got), tree_flatten(want)
    assert [k for k, _ in g] == [k for k, _ in w]
    assert_same_bits([v for _, v in g], [v for _, v in w], "gradients")
    assert step.cache_info().eager_calls == 1
    assert_same_bits([step(x)], [model(x)], "a plain call afterwards")


def test_grad_vmap_and_compile_of_a_jitted_module() -> None:
    net = seeded(lambda: Net(8, 2, 3), 0)
    step = segc.jit(net, boundaries="layers.*")
    x = mx.random.normal((4, 8), key=mx.random.key(1))
    cases = {
        "grad": (lambda f: mx.grad(lambda a: f(a).sum())(x)),
        "vmap": (lambda f: mx.vmap(f)(x)),
        "compile": (lambda f: mx.compile(f)(x)),
    }
    for name, run in cases.items():
        assert_same_bits([run(step)], [run(net)], name)
    assert step.cache_info().eager_calls == 3
