"""The dequantized form of quantized products (``segc.lower.dequantized``) on a CUDA GPU:
where its check lets it through it gives ``quantized_matmul``'s bytes on other values
too, and a 4-bit model's prefill through segc keeps eager mlx-lm's bytes with its
products rewritten. ``tests/test_dequantized.py`` checks the wiring on any device."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_same_bits, examples, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst

import segc
from segc.dtypes import short
from segc.lower import dequantized
from segc.models.zoo import build

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
pytestmark = [
    pytest.mark.skipif(not CUDA, reason="the form is taken on CUDA only (the CPU's quantized products sum otherwise)"),
    pytest.mark.timeout(300),
]


# few weight widths and one type: MLX compiles a quantized product kernel per type, bit
# width and output tile (from the width) on first use, about 20 s each on a fresh machine
@settings(max_examples=examples(12), deadline=None)
@given(
    rows=hst.sampled_from([2, 16, 64, 100, 512]),
    k=hst.sampled_from([128, 256, 1024, 2048, 8192]),
    n=hst.sampled_from([192, 512, 2048]),
    nbits=hst.sampled_from([4, 8]),
    dt=hst.just(mx.bfloat16),
    seed=hst.integers(0, 2**31),
)
def test_where_the_check_agrees_other_values_agree(rows, k, n, nbits, dt, seed) -> None:
    r = np.random.default_rng(seed)
    w0 = mx.array(r.standard_normal((n, k)).astype(np.float32) * k**-0.5).astype(dt)
    w, s, b = mx.quantize(w0, group_size=64, bits=nbits)
    x = mx.array(r.standard_normal((1, rows, k)).astype(np.float32)).astype(dt)
    key = ((1, rows, k), tuple(w.shape), short(dt), "u32", 64, nbits, True)
    if not dequantized.same_bits(key):
        return  # refused: MLX's quantized product stays
    want = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=nbits)
    assert same_bits(dequantized.product(x, w, s, b, 64, nbits, True), want)


@pytest.mark.parametrize("tokens", [64, 300])
def test_a_4bit_prefill_keeps_eagers_bytes(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = build(
        "llama",
        bits=4,
        group_size=64,
        dtype=mx.bfloat16,
        hidden_size=256,
        intermediate_size=1024,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    )
    taken = []

    def counted(ins, args, e):
        taken.append(e.id)
        return dequantized.product(*ins, int(args[0]), int(args[1]), bool(args[3]))

    monkeypatch.setattr(dequantized, "rule", counted)
    prompt = mx.array([[(7 * i + 3) % 500 for i in range(tokens)]], dtype=mx.int32)
    want = model(prompt)
    for boundaries in ("layers.*", None):
        taken.clear()
        got = segc.jit(model, boundaries=boundaries)(prompt)
        assert_same_bits([got], [want], f"{tokens} tokens, boundaries {boundaries}")
        assert taken, "no product was rewritten: the test would not show the form keeps eager's bytes"
