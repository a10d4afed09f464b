"""The attention over the live keys (``SEGC_LIVE_ATTENTION=1``, ``segc.lower.live``) on the
GPU, end to end: a jitted mlx-lm model's decode against **eager mlx-lm**, logits and
caches byte for byte at every step. Eager runs MLX's vector kernel below 256 cached
positions and cuDNN's fused kernel from 256 (``use_cudnn_for_decoding``); segc now makes
the same call on the same buffers, so both ranges are checked (a 12-token prompt, and a
300-token prompt in a buffer of 512). Copying and in place. On a machine without CUDA
these cannot run; ``tests/test_live.py`` checks the lowering there."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import same_bits
from test_kvwrite_cuda import _with_env

import segc
from segc.lower import live
from segc.models.zoo import build

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
pytestmark = [
    pytest.mark.skipif(not CUDA, reason="the live attention is taken on CUDA only: needs MLX's CUDA backend and a GPU"),
    pytest.mark.timeout(300),
]


@pytest.mark.parametrize(
    "arch, in_place, prompt, cuts",
    [(a, i, p, None) for a in ("llama", "qwen3") for i in ("0", "1") for p in (12, 300)]
    + [("llama", "1", 300, "layers.*"), ("llama", "0", 12, "layers.*")],
)
def test_a_decode_is_eager_mlx_lm_s_bytes(arch, in_place, prompt, cuts, monkeypatch) -> None:
    """``cuts=None``: one segment, its stretches joining one layer's end to the next's
    attention; ``"layers.*"``: a segment a layer, two stretches in each."""
    from mlx_lm.models.cache import make_prompt_cache

    model = build(arch, num_hidden_layers=2, hidden_size=256, intermediate_size=512, head_dim=64, dtype=mx.bfloat16)
    env = {"SEGC_LIVE_ATTENTION": "1", "SEGC_KV_IN_PLACE": in_place}
    jitted = segc.jit(model, boundaries=cuts, validate=False, concat_projections=True, freeze_params=True)
    step = _with_env(env, jitted)
    lives: list[int] = []
    real = live.offset_value
    monkeypatch.setattr(live, "offset_value", lambda off: lives.append(1) or real(off))
    mine, theirs = make_prompt_cache(model), make_prompt_cache(model)
    tokens = mx.array([[(7 * i + 3) % 100 for i in range(prompt)]])
    for k in range(6):
        got, want = step(tokens, cache=mine), model(tokens, cache=theirs)
        assert same_bits(got, want), f"call {k}: logits"
        for a, b in zip(mine, theirs, strict=True):
            assert a.offset == b.offset == prompt + k
            assert same_bits(a.keys, b.keys) and same_bits(a.values, b.values), f"call {k}: caches"
        tokens = mx.argmax(want[:, -1:], axis=-1)
    assert len(lives) == 2 * 5, lives  # every layer of every decode step took the live attention


def test_a_validated_jit_keeps_one_decode_graph() -> None:
    """``validate=True`` (the default) checks the first decode call against eager: with the
    live attention (the default) its bytes are eager's, so the dynamic graph is kept (one trace for the
    prompt, one for every decode step) and no call falls back to exact mode."""
    from mlx_lm.models.cache import make_prompt_cache

    model = build("llama", num_hidden_layers=2, hidden_size=256, intermediate_size=512, head_dim=64, dtype=mx.bfloat16)
    step = segc.jit(model)  # SEGC_LIVE_ATTENTION's default

    mine, theirs = make_prompt_cache(model), make_prompt_cache(model)
    tokens = mx.array([[(5 * i + 1) % 100 for i in range(12)]])
    for k in range(6):
        got, want = step(tokens, cache=mine), model(tokens, cache=theirs)
        assert same_bits(got, want), f"call {k}: logits"
        tokens = mx.argmax(want[:, -1:], axis=-1)
    info = step.cache_info()
    assert info.traces == 2 and not info.aborted, info
