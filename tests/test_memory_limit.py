"""A segment whose outputs exceed MLX's memory limit is refused with a segc error before
anything is dispatched (docs/runtime.md, "Failure"); the caller's state is untouched and
the function runs again once the limit allows. Expected values come from eager MLX."""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import pytest
from conftest import same_bits

import segc


@pytest.fixture
def limit() -> Iterator[None]:
    prev = mx.set_memory_limit(0)
    mx.set_memory_limit(prev)
    yield
    mx.set_memory_limit(prev)


def grow(x: mx.array, buf: mx.array) -> tuple[mx.array, mx.array]:
    """16 MiB of outputs in the second segment (a float32 [2048, 2048])."""
    y = segc.boundary(x * 2 + buf[:1])
    big = mx.broadcast_to(y, (2048, 2048)) + 1
    return big, big.sum(axis=0)


def test_a_segment_over_the_limit_is_refused_and_nothing_runs(limit: None) -> None:
    x, buf = mx.ones((2048,)), mx.zeros((4, 2048))
    want = grow(x, buf)
    step = segc.jit(grow)
    assert all(same_bits(a, b) for a, b in zip(step(x, buf), want))
    mx.set_memory_limit(8 << 20)  # 8 MiB: the second segment makes 16 MiB + 8 KiB
    with pytest.raises(
        segc.MemoryLimitError, match=r"segment 1 .* makes 16\.0 MiB of outputs, more than .*8\.0 MiB"
    ) as e:
        step(x, buf)
    assert isinstance(e.value, MemoryError)
    mx.set_memory_limit(1 << 30)
    assert all(same_bits(a, b) for a, b in zip(step(x, buf), want))


def test_the_check_reads_the_limit_without_setting_it(limit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check reads MLX's limit and never sets it: a limit set to 0 for a moment (the
    old way to read it) would let an allocation on another thread empty MLX's cache."""
    x, buf = mx.ones((2048,)), mx.zeros((4, 2048))
    want = grow(x, buf)
    step = segc.jit(grow)
    assert all(same_bits(a, b) for a, b in zip(step(x, buf), want))
    mx.set_memory_limit(8 << 20)
    sets: list[int] = []
    monkeypatch.setattr(mx, "set_memory_limit", lambda n: sets.append(n) or 0)
    with pytest.raises(segc.MemoryLimitError):  # the check ran, and read 8 MiB
        step(x, buf)
    assert sets == []


def test_a_refused_decode_leaves_the_caches_as_they_were(limit: None) -> None:
    pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")
    from mlx_lm.models.cache import make_prompt_cache

    from segc.models import tiny_llama

    # after a 1000-token prompt, K/V buffers of 1 MiB (1024 positions x 4 heads x 64 x
    # float32) each
    model = tiny_llama(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2)
    ref = model if mx.default_device() == mx.cpu else segc.jit(model)
    cache, ref_cache = make_prompt_cache(model), make_prompt_cache(model)
    step = segc.jit(model, boundaries="layers.*")
    prompt = mx.array([[(7 * i + 3) % 128 for i in range(1000)]])
    assert same_bits(step(prompt, cache=cache), ref(prompt, cache=ref_cache))
    for t in range(2):
        x = mx.array([[t + 1]])
        assert same_bits(step(x, cache=cache), ref(x, cache=ref_cache))
    before = [(c.offset, c.keys, c.values) for c in cache]
    mx.set_memory_limit(1 << 20)  # below a layer's two 1 MiB buffers
    with pytest.raises(segc.MemoryLimitError, match=r"model\.layers\.0"):
        step(mx.array([[9]]), cache=cache)
    assert all(c.offset == o and c.keys is k and c.values is v for c, (o, k, v) in zip(cache, before))
    mx.set_memory_limit(1 << 32)
    for t in range(2):
        x = mx.array([[t + 9]])
        assert same_bits(step(x, cache=cache), ref(x, cache=ref_cache))
