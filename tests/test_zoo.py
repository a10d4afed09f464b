"""The model zoo: mlx-lm architectures through segc, bit-identical to eager mlx-lm.

Each model is built from a tiny random configuration (segc.models.zoo), then a 33-token
prompt is prefilled and 16 tokens are decoded greedily, eagerly and through segc: one
segment per layer (boundaries found from the model's ``layers`` list) and unsegmented.
After every call the logits and every cache (keys, values, offset) must be identical to
eager mlx-lm's.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import STATE_BIT_IDENTICAL, same_bits, state_close

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.models.zoo import ZOO, build

PROMPT = mx.array([[(7 * i + 3) % 128 for i in range(33)]])
DECODE_STEPS = 16


def _cache_arrays(cache: list) -> list:
    out = []
    for c in cache:
        out.append((c.offset, getattr(c, "_idx", None), c.keys, c.values))
    return out


def _same_caches(a: list, b: list) -> bool:
    for (oa, ia, ka, va), (ob, ib, kb, vb) in zip(_cache_arrays(a), _cache_arrays(b)):
        if oa != ob or ia != ib or ka.shape != kb.shape:
            return False
        if not (same_bits(ka, kb) and same_bits(va, vb)):
            return False
    return True


def _run(step, model, steps: int = DECODE_STEPS) -> tuple[list[mx.array], list]:
    """Greedy prefill + decode; returns the logits of every call and the final caches."""
    cache = make_prompt_cache(model)
    logits = [step(PROMPT, cache=cache)]
    for _ in range(steps):
        tok = mx.argmax(logits[-1][:, -1:], axis=-1)
        logits.append(step(tok, cache=cache))
    mx.eval(logits)
    return logits, cache


# On a GPU the promise is: segmented == unsegmented bit for bit, greedy tokens identical
# to eager, logits within VALIDATE_TOL of eager's (conftest.state_close says why).


def _tokens(logits: list[mx.array]) -> list[int]:
    return [int(mx.argmax(x[0, -1]).item()) for x in logits]


def _check(model) -> None:
    eager_logits, eager_cache = _run(model, model)
    n_layers = len(model.layers)
    runs = []
    for boundaries, n_segments in (("auto", n_layers + 1), (None, 1)):
        step = segc.jit(model, boundaries=boundaries)
        logits, cache = _run(step, model)
        runs.append((logits, cache))
        if STATE_BIT_IDENTICAL:
            for k, (a, b) in enumerate(zip(eager_logits, logits)):
                assert same_bits(a, b), f"boundaries={boundaries}: call {k} logits differ"
            assert _same_caches(eager_cache, cache), f"boundaries={boundaries}: caches differ"
        else:
            assert _tokens(logits) == _tokens(eager_logits)
            for k, (a, b) in enumerate(zip(eager_logits, logits)):
                assert state_close(a, b), f"boundaries={boundaries}: call {k} logits beyond the tolerance"
        info = step.cache_info()
        assert info.traces == 2, info.retraces  # the prefill, and one decode graph for all 16 tokens
        compiled = step.entries()
        assert all(len(c.segments) == n_segments for c in compiled)
    (seg, seg_cache), (whole, whole_cache) = runs
    assert all(same_bits(a, b) for a, b in zip(seg, whole)), "segmented != unsegmented"
    assert _same_caches(seg_cache, whole_cache), "segmented != unsegmented caches"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ZOO)
def test_zoo_bit_identical(arch: str) -> None:
    _check(build(arch))


@pytest.mark.slow
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_zoo_quantized_bit_identical(arch: str, bits: int) -> None:
    model = build(arch, bits=bits)
    assert "QuantizedLinear" in {type(m).__name__ for m in model.modules()}
    _check(model)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_resized_model_gets_mlx_lms_own_head_size(arch: str) -> None:
    """Set the hidden size or the heads and not the head size, and the head size is what
    mlx-lm makes of an unset one (hidden size over heads: 256 / 4 = 64), not the tiny
    configuration's 16; set it, or resize nothing, and it is what was asked."""
    from segc.models.zoo import tiny_config

    attn = build(arch, hidden_size=256, num_attention_heads=4).model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (4 * 64, 256)
    assert tiny_config(arch, hidden_size=256, num_attention_heads=4, head_dim=8)["head_dim"] == 8
    assert tiny_config(arch)["head_dim"] == 16
    assert tiny_config(arch, num_hidden_layers=3)["head_dim"] == 16
