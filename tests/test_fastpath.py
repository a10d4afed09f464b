"""The fast path of a repeated call with KV caches (segc/staging/fastpath.py): taken in a
decode loop, left for the general path on any change, and the same bits as eager mlx-lm
either way (the reference is eager mlx-lm on the CPU, unsegmented segc on a GPU, as
docs/models.md promises)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import same_bits, same_caches

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.staging import Jitted


@pytest.fixture
def model() -> Any:
    from segc.models import tiny_llama

    return tiny_llama(num_hidden_layers=2)


class Binds:
    """Counts ``step``'s bindings through the general path (``Jitted._bind``); not the
    reference's (on a GPU the reference is a ``Jitted`` too)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, step: Jitted) -> None:
        self.n = 0
        real = Jitted._bind

        def counting(this: Jitted, *a: Any, **k: Any) -> Any:
            self.n += this is step
            return real(this, *a, **k)

        monkeypatch.setattr(Jitted, "_bind", counting)


def _ref(model: Any) -> Any:
    return model if mx.default_device() == mx.cpu else segc.jit(model)


def test_a_decode_loop_takes_the_fast_path_with_eager_bits(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _ref(model)
    step = segc.jit(model, boundaries="layers.*")
    binds = Binds(monkeypatch, step)
    cache, ref_cache = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5]])
    assert same_bits(step(prompt, cache=cache), ref(prompt, cache=ref_cache))
    for t in range(8):
        x = mx.array([[t + 2]])
        assert same_bits(step(x, cache=cache), ref(x, cache=ref_cache))
        assert same_caches(cache, ref_cache)
    # the prefill, the first decode call (a miss) and the second (the hit that teaches
    # the pattern) bind the general way; the other six take the fast path
    assert binds.n == 3
    assert step.cache_info().traces == 2


def test_the_fast_path_is_left_on_any_change(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _ref(model)
    step = segc.jit(model, boundaries="layers.*")
    cache, ref_cache = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5]])
    step(prompt, cache=cache)
    ref(prompt, cache=ref_cache)
    for t in range(3):
        step(mx.array([[t]]), cache=cache)
        ref(mx.array([[t]]), cache=ref_cache)
    binds = Binds(monkeypatch, step)

    def both(x: mx.array, c: Any, r: Any) -> None:
        assert same_bits(step(x, cache=c), ref(x, cache=r))

    both(mx.array([[9]]), list(cache), ref_cache)  # another list object, same caches
    assert binds.n == 1
    both(mx.array([[9, 8]]), cache, ref_cache)  # another token count
    assert binds.n == 2
    # a new weight array of the same shape: no retrace, but the general path reads it
    # (the eager reference shares the module, so it sees the same weight)
    w = model.model.layers[0].mlp.up_proj.weight
    model.model.layers[0].mlp.up_proj.weight = w * 2
    both(mx.array([[7]]), cache, ref_cache)
    both(mx.array([[6]]), cache, ref_cache)
    assert binds.n >= 3
    # across the buffer's capacity: the cache grows (on the host) through the general path
    n = binds.n
    cap = cache[0].keys.shape[2]
    while cache[0].offset < cap:
        both(mx.array([[5]]), cache, ref_cache)
    both(mx.array([[4]]), cache, ref_cache)
    assert cache[0].keys.shape[2] > cap
    assert binds.n > n
    # a cache swapped for a fresh one
    fresh, fresh_ref = make_prompt_cache(model), make_prompt_cache(model)
    both(prompt, fresh, fresh_ref)
    both(mx.array([[1]]), fresh, fresh_ref)


def test_quantizing_the_model_leaves_the_fast_path(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    cache = make_prompt_cache(model)
    step(mx.array([[3, 1, 4]]), cache=cache)
    for t in range(3):
        step(mx.array([[t]]), cache=cache)
    nn.quantize(model, group_size=32, bits=8)
    ref_cache = make_prompt_cache(model)
    cache2 = make_prompt_cache(model)
    ref = _ref(model)
    x = mx.array([[3, 1, 4]])
    assert same_bits(step(x, cache=cache2), ref(x, cache=ref_cache))
    assert same_bits(step(mx.array([[2]]), cache=cache2), ref(mx.array([[2]]), cache=ref_cache))


def test_calls_of_alternating_shapes_through_the_same_caches_take_the_fast_path(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A banded prefill runs chunks of two shapes through the same cache objects: both
    patterns are kept (``fastpath.Recent``), and every call has eager's bits."""
    ref = _ref(model)
    step = segc.jit(model, boundaries="layers.*")
    cache, ref_cache = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5]])
    assert same_bits(step(prompt, cache=cache), ref(prompt, cache=ref_cache))
    binds = Binds(monkeypatch, step)
    for t in range(12):
        x = mx.array([[t + 1]] if t % 2 else [[t + 1, t + 2]])
        assert same_bits(step(x, cache=cache), ref(x, cache=ref_cache))
    # each shape binds the general way twice (its miss, then the hit that teaches its
    # pattern); the other eight calls take the fast path
    assert binds.n == 4


def test_the_fast_path_lets_go_of_caches_it_no_longer_sees(model: Any) -> None:
    import gc
    import weakref

    step = segc.jit(model, boundaries="layers.*")
    cache = make_prompt_cache(model)
    step(mx.array([[3, 1, 4]]), cache=cache)
    for t in range(3):
        step(mx.array([[t]]), cache=cache)
    gone = weakref.ref(cache[0])
    del cache
    fresh = make_prompt_cache(model)
    step(mx.array([[3, 1, 4]]), cache=fresh)
    gc.collect()
    assert gone() is None
