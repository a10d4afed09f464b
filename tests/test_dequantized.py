"""The dequantized form of a quantized product of many rows (``segc.lower.dequantized``):
which products it may take, its device check, and its wiring through lowering.

On the CPU MLX's ``quantized_matmul`` sums otherwise than its dequantize-then-product,
so the form is never taken there by itself; these tests force it and compare with the
same form written with MLX's ops. ``tests/test_dequantized_cuda.py`` checks eager's bytes
on a GPU.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import assert_same_bits, bits
from hypothesis import given, settings
from hypothesis import strategies as hst

import segc
from segc.errors import UsageError
from segc.lower import dequantized
from segc.models.zoo import build
from segc.runtime import executor

pytestmark = pytest.mark.timeout(120)


def quantized(n: int, k: int, b: int, dt: mx.Dtype, seed: int = 0) -> tuple[mx.array, ...]:
    mx.random.seed(seed)
    w = (mx.random.normal((n, k)) * k**-0.5).astype(dt)
    return tuple(mx.quantize(w, group_size=64, bits=b))


def graph_of(model: nn.Module, tokens: int) -> segc.Graph:
    prompt = mx.array([[(5 * i + 1) % 97 for i in range(tokens)]], dtype=mx.int32)
    return segc.jit(model).trace(prompt).graph


def avals(g: segc.Graph) -> dict:
    return {n: (v.shape, v.dtype) for n, v in g.vars().items()}


def test_candidates_are_the_quantized_products_of_many_rows() -> None:
    model = build("llama", bits=4, group_size=64, hidden_size=128, intermediate_size=256)
    for tokens, taken in ((dequantized.MIN_ROWS, True), (dequantized.MIN_ROWS - 1, False)):
        g = graph_of(model, tokens)
        qmm = [e for e in g.eqns if e.prim == "QuantizedMatmul"]
        assert len(qmm) == 2 * 7 + 1  # two layers' q, k, v, o, gate, up, down and the head
        av = avals(g)
        keys = [dequantized.candidate(e, av) for e in qmm]
        assert all((k is not None) == taken for k in keys), (tokens, keys)
        if taken:
            assert {k[0][-2] for k in keys if k} == {tokens}  # (1, tokens, hidden)
            assert {(k[4], k[5], k[6]) for k in keys if k} == {(64, 4, True)}
    g = graph_of(build("llama"), 70)
    plain = [e for e in g.eqns if dequantized.candidate(e, avals(g)) is not None]
    assert plain == []  # no quantized products, nothing taken


def _halves(x: mx.array, w: mx.array, s: mx.array, b: mx.array, gs: int, nbits: int, t: bool) -> mx.array:
    """The same product with its inner dimension summed in two halves: another order."""
    full = mx.dequantize(w, s, b, group_size=gs, bits=nbits, dtype=x.dtype)
    full = full.T if t else full
    h = x.shape[-1] // 2
    return (x[..., :h] @ full[:h]).astype(mx.float32) + (x[..., h:] @ full[h:]).astype(mx.float32)


@settings(max_examples=6, deadline=None)
@given(k=hst.sampled_from([256, 512]), dt=hst.sampled_from(["bf16", "f16", "f32"]), nbits=hst.sampled_from([4, 8]))
def test_the_check_tells_another_summation_order(k: int, dt: str, nbits: int) -> None:
    key = ((1, 64, k), (32, k * nbits // 32), dt, "u32", 64, nbits, True)
    assert dequantized.agree(key, dequantized.product, dequantized.product)

    def other(*a):  # rounded back to the type: only the order differs
        return _halves(*a).astype(a[0].dtype)

    assert not dequantized.agree(key, dequantized.product, other)


def test_the_check_refuses_where_the_forms_differ_here() -> None:
    """Where one draw of this device's ``quantized_matmul`` and its dequantized form
    differ (the CPU's), the check must say no."""
    x = mx.random.normal((1, 64, 256)).astype(mx.bfloat16)
    w, s, b = quantized(48, 256, 4, mx.bfloat16)
    a = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)
    c = x @ mx.dequantize(w, s, b, group_size=64, bits=4).T
    key = ((1, 64, 256), tuple(w.shape), "bf16", "u32", 64, 4, True)
    if bits(a) != bits(c):
        assert not dequantized.same_bits(key)
    else:  # a device where they agree on this draw: the check agrees with itself
        assert dequantized.same_bits(key) == dequantized.agree(key, dequantized.product, dequantized.reference)


def test_the_setting_is_checked_by_name() -> None:
    with pytest.raises(UsageError, match="DEQUANTIZED_PRODUCTS"):
        dequantized.wanted("sometimes")
    assert dequantized.wanted("never") is False


def _as_dequantized(x, w, scales, biases=None, transpose=True, group_size=64, bits=4, mode="affine"):
    """``mx.quantized_matmul`` written as its dequantized weight's product (MLX's ops)."""
    full = mx.dequantize(w, scales, biases, group_size=group_size, bits=bits, mode=mode, dtype=x.dtype)
    return x @ (full.T if transpose else full)


def test_forced_it_computes_the_dequantized_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced on (the CPU's check says no), segc's prefill is eager mlx-lm's with every
    ``QuantizedLinear`` written as its dequantized weight's product, byte for byte; a
    shorter prompt keeps MLX's quantized products."""
    model = build("llama", bits=4, group_size=64, dtype=mx.bfloat16, hidden_size=128, intermediate_size=256)
    monkeypatch.setattr(executor, "dequantized_wanted", lambda: True)
    monkeypatch.setattr(dequantized, "same_bits", lambda key: True)
    for tokens in (dequantized.MIN_ROWS + 8, 9):
        prompt = mx.array([[(3 * i + 2) % 90 for i in range(tokens)]], dtype=mx.int32)
        got = segc.jit(model, boundaries="layers.*")(prompt)
        plain = model(prompt)
        with monkeypatch.context() as m:
            m.setattr(mx, "quantized_matmul", _as_dequantized)  # every QuantizedLinear and the tied head
            rewritten = model(prompt)
        want = rewritten if tokens >= dequantized.MIN_ROWS else plain
        assert_same_bits([got], [want], f"{tokens} tokens")
        if bits(rewritten) != bits(plain):  # the two forms differ here, so the test tells them apart
            other = plain if tokens >= dequantized.MIN_ROWS else rewritten
            assert bits(got) != bits(other)
