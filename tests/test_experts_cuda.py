"""A prefill's sorted expert products as every token's products (``segc.lower.experts``)
on a CUDA GPU: where its check lets a shape through, other values and routings give the
sorted ``gather_mm``'s (or 4-bit ``gather_qmm``'s) bytes too, and a bf16 and a 4-bit
mixtral's prefill through segc keeps eager mlx-lm's bytes with its expert products
rewritten. ``tests/test_experts.py`` checks the
wiring on any device."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_same_bits, examples, expert_rewrites, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst

import segc
from segc.lower import experts
from segc.models.zoo import build

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
pytestmark = [
    pytest.mark.skipif(not CUDA, reason="the rewrite is taken on CUDA only (the CPU's gather_mm takes float32 only)"),
    pytest.mark.timeout(300),
]


@settings(max_examples=examples(12), deadline=None)
@given(
    tokens=hst.sampled_from([32, 100, 512]),
    k=hst.sampled_from([64, 256, 2048]),
    n=hst.sampled_from([128, 1024]),
    n_experts=hst.sampled_from([4, 8]),
    kind=hst.sampled_from(["leaf", "down"]),
    bits=hst.sampled_from([0, 4]),
    seed=hst.integers(0, 2**31),
)
def test_where_the_check_agrees_other_values_agree(tokens, k, n, n_experts, kind, bits, seed) -> None:
    key = (kind, n_experts, tokens, k, n, 2, "bf16", 64 if bits else 0, bits)
    if not experts.same_bits(key):
        return  # refused: MLX's grouped product stays
    r = np.random.default_rng(seed)
    w = mx.array(r.standard_normal((n_experts, n, k)).astype(np.float32) * k**-0.5).astype(mx.bfloat16)
    ws, quant = experts.inputs_of(key, w)
    choice = np.argsort(r.standard_normal((tokens, n_experts)), axis=-1)[:, :2].reshape(-1)  # 2 distinct a token
    order = np.argsort(choice, kind="stable")
    idx, tok = mx.array(choice[order].astype(np.uint32)), mx.array((order // 2).astype(np.uint32))
    shape = (2 * tokens, 1, n)
    if kind == "leaf":
        x = mx.array(r.standard_normal((tokens, 1, k)).astype(np.float32)).astype(mx.bfloat16)
        rows, got = x[tok], experts.leaf(x, idx, tok, ws, quant, shape)[0]
    else:
        x = mx.array(r.standard_normal((n_experts, tokens, k)).astype(np.float32)).astype(mx.bfloat16)
        rows, got = x[idx, tok].reshape(2 * tokens, 1, k), experts.down(x, idx, tok, ws, quant, shape)
    want = experts.reference(rows, idx, ws, quant)
    assert same_bits(got, want)


@pytest.mark.parametrize("tokens,bits", [(64, 0), (300, 0), (300, 4)])
def test_a_mixtral_prefill_keeps_eagers_bytes(tokens: int, bits: int) -> None:
    quant = {"bits": bits, "group_size": 64} if bits else {}
    model = build(
        "mixtral",
        seed=0,
        dtype=mx.bfloat16,
        hidden_size=256,
        intermediate_size=1024,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=512,
        num_local_experts=8,
        num_experts_per_tok=2,
        **quant,
    )
    prompt = mx.array([[(7 * i + 3) % 500 for i in range(tokens)]], dtype=mx.int32)
    want = model(prompt)
    for boundaries in ("layers.*", None):
        with expert_rewrites() as taken:
            got = segc.jit(model, boundaries=boundaries, concat_projections=True)(prompt)
        assert_same_bits([got], [want], f"{tokens} tokens, boundaries {boundaries}")
        assert "leaf" in taken and "down" in taken, "nothing was rewritten: the test would not show it keeps the bytes"
