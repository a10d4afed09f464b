"""``segc.jit(..., freeze_params=True)``: the module's parameters checked at the first
call, then taken as they were until ``clear_cache()`` (as ``mx.compile`` captures the
arrays a function closes over). Every result is compared with the module run eagerly
on the parameters the jit is meant to use, byte for byte."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import same_bits
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.errors import UsageError
from segc.models.zoo import build

pytestmark = pytest.mark.timeout(120)


def _mlp() -> nn.Module:
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    mx.eval(m.parameters())
    return m


@pytest.mark.parametrize("freeze", [False, True])
def test_a_replaced_weight_is_seen_now_or_after_clear_cache(freeze) -> None:
    m = _mlp()
    f = segc.jit(m, freeze_params=freeze)
    x = mx.random.normal((3, 8), key=mx.random.key(1))
    before = m(x)
    assert same_bits(f(x), before)
    old = m.layers[2].weight
    m.layers[2].weight = old * 2
    after = m(x)
    assert not same_bits(after, before)
    assert same_bits(f(x), before if freeze else after)  # frozen: the arrays it checked
    f.clear_cache()
    assert same_bits(f(x), after)


def test_a_frozen_decode_keeps_eagers_bits_and_does_not_see_a_new_weight() -> None:
    model = build("llama", num_hidden_layers=2)
    step = segc.jit(model, freeze_params=True, validate=False)
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5]])
    assert same_bits(step(prompt, cache=cs), model(prompt, cache=ce))
    t = mx.array([[2]])
    for _ in range(3):
        assert same_bits(step(t, cache=cs), model(t, cache=ce))
    w = model.model.norm.weight
    model.model.norm.weight = w + 1  # not seen by the frozen jit: compare with the old weight
    got = step(t, cache=cs)
    model.model.norm.weight = w
    assert same_bits(got, model(t, cache=ce))


def test_freeze_params_must_be_a_bool() -> None:
    with pytest.raises(UsageError, match="freeze_params"):
        segc.jit(_mlp(), freeze_params="yes")
