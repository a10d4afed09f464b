"""The first call of each dynamic-KV-cache graph is checked against eager mlx-lm.

phi3small's block-sparse attention derives token positions from the length of the keys
its cache returns; a dynamic cache returns the whole (masked) buffer, so the model would
compute something else. segc must notice, roll the caches back, and fall back to exact
state, bit-identical to eager.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import same_bits

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.models.zoo import build

PROMPT = mx.array([[(5 * i + 1) % 97 for i in range(9)]])


def _greedy(step, model, steps: int = 4) -> tuple[list[mx.array], list[mx.array], list, list]:
    eager_cache, segc_cache = make_prompt_cache(model), make_prompt_cache(model)
    want = [model(PROMPT, cache=eager_cache)]
    got = [step(PROMPT, cache=segc_cache)]
    for _ in range(steps):
        tok = mx.argmax(want[-1][:, -1:], axis=-1)
        want.append(model(tok, cache=eager_cache))
        got.append(step(tok, cache=segc_cache))
    return want, got, eager_cache, segc_cache


def _same_cache(a, b) -> bool:
    # a cache's state holds its arrays and, for some caches, plain numbers
    return a.offset == b.offset and all(
        same_bits(x, y) if isinstance(x, mx.array) else x == y for x, y in zip(a.state, b.state)
    )


@pytest.fixture(scope="module")
def phi3small():
    return build("phi3small")


@pytest.mark.slow
def test_a_model_that_reads_the_key_length_falls_back_to_exact_state(phi3small) -> None:
    step = segc.jit(phi3small, boundaries="auto")
    want, got, eager_cache, segc_cache = _greedy(step, phi3small)
    for k, (a, b) in enumerate(zip(want, got)):
        assert same_bits(a, b), f"call {k}"
    assert all(_same_cache(a, b) for a, b in zip(eager_cache, segc_cache))
    info = step.cache_info()
    assert any("disagree with eager" in r and "exact" in r for r in info.aborted), info.aborted
    assert step.state_mode == "exact"


@pytest.mark.slow
def test_without_validation_the_dynamic_cache_would_be_wrong_there(phi3small) -> None:
    """Why the check exists: the same model through the dynamic cache, unchecked."""
    step = segc.jit(phi3small, boundaries="auto", validate=False)
    want, got, _, _ = _greedy(step, phi3small, steps=2)
    assert same_bits(want[0], got[0])  # the prefill is traced with eager's shapes
    assert not all(same_bits(a, b) for a, b in zip(want[1:], got[1:]))


def test_models_that_agree_keep_the_dynamic_cache() -> None:
    model = build("llama")
    step = segc.jit(model, boundaries="auto")
    want, got, eager_cache, segc_cache = _greedy(step, model, steps=6)
    assert all(same_bits(a, b) for a, b in zip(want, got))
    assert all(_same_cache(a, b) for a, b in zip(eager_cache, segc_cache))
    info = step.cache_info()
    assert not info.aborted and step.state_mode == "auto"
    assert info.traces == 2  # the prefill and one decode graph, validated once each
