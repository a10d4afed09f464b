"""The trace cache is bounded (least recently used out, ``cache_size=``, default 64),
``clear_cache()`` frees the entries, and a ``QuantizedKVCache`` decode does not trace
per token (issue: 200 prompt lengths held 200 entries; QuantizedKVCache retraced on
every token)."""

from __future__ import annotations

import gc
import weakref

import mlx.core as mx
import pytest
from conftest import bits, eager_or_skip

import segc
from segc.staging import Jitted


def f(x: mx.array) -> mx.array:
    return mx.tanh(x) * 2


def test_the_default_bound_is_documented() -> None:
    assert Jitted(f).cache_size == 64


def test_least_recently_used_entries_leave_first_and_are_freed() -> None:
    step = segc.jit(f, cache_size=3)
    xs = {n: mx.ones((n,)) * 0.5 for n in range(1, 6)}
    for n in (1, 2, 3):
        step(xs[n])
    refs = {c.signature.leaves[0][0][0]: weakref.ref(c) for c in step.entries()}
    step(xs[1])  # a hit: 1 becomes the most recent
    step(xs[4])  # evicts 2, the least recently used
    assert sorted(c.signature.leaves[0][0][0] for c in step.entries()) == [1, 3, 4]
    gc.collect()
    assert refs[2]() is None and refs[1]() is not None
    info = step.cache_info()
    assert (info.traces, info.evictions) == (4, 1)
    assert bits(step(xs[2])) == bits(f(xs[2]))  # traced again, same bits
    assert len(step.entries()) == 3


def test_many_shapes_stay_within_the_bound() -> None:
    step = segc.jit(f, cache_size=8)
    for n in range(1, 41):
        x = mx.ones((n,)) * 0.25
        assert bits(step(x)) == bits(f(x))
        assert len(step.entries()) <= 8
    assert step.cache_info().evictions == 32


def test_clear_cache_frees_every_entry() -> None:
    step = segc.jit(f)
    for n in range(1, 6):
        step(mx.ones((n,)))
    refs = [weakref.ref(c) for c in step.entries()]
    step.clear_cache()
    assert step.entries() == [] and all(r() is None for r in refs)


def test_a_bad_cache_size_is_refused() -> None:
    with pytest.raises(segc.TraceError, match="cache_size"):
        segc.jit(f, cache_size=0)


def test_quantized_kv_cache_runs_eagerly_with_one_warning() -> None:
    pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")
    from mlx_lm.models.cache import QuantizedKVCache

    from segc.models import tiny_llama

    model = tiny_llama(hidden_size=128, num_attention_heads=4, num_key_value_heads=2)  # head_dim 32
    step = segc.jit(model, boundaries="layers.*")
    ce = [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]
    cs = [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]
    t = mx.array([[1, 2, 3, 4]])
    eager_or_skip(lambda a: model(a, cache=[QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]), [t])
    with pytest.warns(segc.SegcWarning, match="QuantizedKVCache") as record:
        for _ in range(6):
            le, ls = model(t, cache=ce), step(t, cache=cs)
            assert bits(le) == bits(ls)
            t = mx.argmax(le[:, -1:], axis=-1)
    assert len(record) == 1
    info = step.cache_info()
    assert info.traces == 0 and info.eager_calls == 6
    assert [c.offset for c in cs] == [c.offset for c in ce]
