"""The gathered products' CUDA kernels (``segc.lower.cuda_gather``: a mixture-of-experts
decode step) against MLX's own kernels on the GPU, byte for byte: the experts' gate and
up products and SwiGLU, and their down products weighted by the scores, summed over the
slots, plus the residual, each as MLX runs it eagerly (``gather_mm``'s ``gather_mv``,
then its elementwise and reduction kernels). On a machine without CUDA these tests
cannot run; ``tests/test_products.py`` checks the finder and the replay there and
``tests/test_cuda_emulated.py`` the kernels' logic."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples, products_in_agreeing_decodes, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst

from segc.lower import products
from segc.lower.products import ProductMatch
from segc.models.zoo import build

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
pytestmark = [
    pytest.mark.skipif(not CUDA, reason="the kernels are CUDA kernels: needs MLX's CUDA backend and a GPU"),
    pytest.mark.timeout(300),
]


def _values(shape, dtype, seed: int, odd: bool) -> mx.array:
    r = np.random.default_rng(seed)
    if odd:  # random bytes: NaNs with payloads, infinities, -0.0, subnormals
        raw = r.integers(0, 256, size=int(np.prod(shape)) * dtype.size, dtype=np.uint8)
        return mx.array(raw).view(dtype).reshape(shape)
    return mx.array(r.standard_normal(shape).astype(np.float32)).astype(dtype)


def _indices(experts: int, slots: int, seed: int) -> mx.array:
    r = np.random.default_rng(seed)
    return mx.array(r.integers(0, experts, size=slots).astype(np.uint32)).reshape(1, 1, slots)


@settings(max_examples=examples(25), deadline=None)
@given(
    dt=hst.sampled_from([mx.bfloat16, mx.float16, mx.float32]),
    k=hst.sampled_from([64, 96, 128, 200, 256, 2048]),
    n=hst.sampled_from([1, 5, 8, 33, 128, 700]),
    experts=hst.integers(1, 8),
    slots=hst.integers(1, 4),
    orders=hst.tuples(hst.booleans(), hst.booleans()),
    odd=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_gglu_is_mlx_gather_mm_then_silu_times_up(dt, k, n, experts, slots, orders, odd, seed) -> None:
    x = _values((1, 1, 1, 1, k), dt, seed, odd)
    wg, wu = _values((experts, n, k), dt, seed + 1, odd), _values((experts, n, k), dt, seed + 2, odd)
    idx = _indices(experts, slots, seed)
    g = mx.gather_mm(x, mx.swapaxes(wg, -1, -2), rhs_indices=idx)
    u = mx.gather_mm(x, mx.swapaxes(wu, -1, -2), rhs_indices=idx)
    s = mx.sigmoid(g)
    gs = g * s if orders[0] else s * g
    want = gs * u if orders[1] else u * gs
    m = ProductMatch("gglu", ("x", "wg", "wu", "i"), (0, 0), n, orders, "o", want.shape, 0, frozenset())
    got = products.product_kernel("auto")(m, [x, wg, wu, idx])  # type: ignore[misc]
    assert same_bits(got, want)


@settings(max_examples=examples(25), deadline=None)
@given(
    dt=hst.sampled_from([mx.bfloat16, mx.float16, mx.float32]),
    k=hst.sampled_from([64, 96, 128, 200, 256, 2048]),
    n=hst.sampled_from([8, 64, 128, 256, 704]),  # rows a multiple of 16 bytes: gather_match
    experts=hst.integers(1, 8),
    slots=hst.integers(1, 6),
    orders=hst.tuples(hst.booleans(), hst.booleans()),
    odd=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_gmoe_is_mlx_gather_mm_weighted_summed_and_added(dt, k, n, experts, slots, orders, odd, seed) -> None:
    h = _values((1, 1, slots, 1, k), dt, seed, odd)
    w = _values((experts, n, k), dt, seed + 1, odd)
    scores = mx.softmax(_values((1, 1, slots), mx.float32, seed + 2, False), axis=-1).astype(dt)
    r = _values((1, 1, n), dt, seed + 3, odd)
    idx = _indices(experts, slots, seed)
    y = mx.gather_mm(h, mx.swapaxes(w, -1, -2), rhs_indices=idx).squeeze(-2)
    b = scores[..., None]
    total = (y * b if orders[0] else b * y).sum(axis=-2)
    want = r + total if orders[1] else total + r
    m = ProductMatch("gmoe", ("h", "w", "s", "r", "i"), (0,), n, orders, "o", want.shape, 0, frozenset())
    got = products.product_kernel("auto")(m, [h, w, scores, r, idx])  # type: ignore[misc]
    assert same_bits(got, want)


@pytest.mark.parametrize("freeze", [False, True])
def test_a_mixtral_decode_keeps_its_bits_with_the_kernels(freeze, monkeypatch) -> None:
    """segc with the kernels against segc with MLX's (``FUSED_PRODUCTS = "never"``),
    bfloat16: logits and caches byte for byte over ten decode steps; each layer's
    experts go to ``gglu`` and ``gmoe``."""
    model = build("mixtral", num_hidden_layers=2, hidden_size=256, intermediate_size=512, dtype=mx.bfloat16)
    seen = [m.kind for m in products_in_agreeing_decodes(monkeypatch, model, freeze_params=freeze)]
    assert seen.count("gglu") >= 2 and seen.count("gmoe") >= 2, seen
