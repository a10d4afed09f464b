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
from hypothesis import given, settings
from hypothesis import strategies as hst

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


_DTYPES = (mx.float32, mx.bfloat16, mx.float16)


@settings(max_examples=40, deadline=None)
@given(
    caches=hst.lists(
        hst.tuples(hst.sampled_from((0, 1, 2)), hst.sampled_from((1, 2, 3)), hst.integers(0, 2)), min_size=1, max_size=5
    ),
    change=hst.one_of(hst.none(), hst.tuples(hst.integers(0, 4), hst.sampled_from(("shape", "dtype", "empty")))),
)
def test_a_repeated_calls_kv_slots_are_the_general_paths(caches: list[tuple[int, int, int]], change: Any) -> None:
    """``kvcache._kv_rebind`` (the fast path's loop over a run of KV caches) makes the
    slots that ``_kv_slot`` (the general path) makes for each cache, from the keys of
    their last slots, and refuses (None) a run where one cache's buffers changed shape
    or dtype or were emptied, whose key would differ. Heads of 0: an empty cache (a
    prefill's first chunk), whose slot is the general one."""
    from mlx_lm.models.cache import KVCache

    from segc.trace import state as st

    objs = []
    for heads, steps, dt in caches:
        c = KVCache()
        if heads:
            c.keys = mx.zeros((1, heads, 256 * steps, 8), _DTYPES[dt])
            c.values = mx.zeros((1, heads, 256 * steps, 4), _DTYPES[dt])
            c.offset = 100 * steps + heads
        objs.append(c)
    kind = st.KINDS["kv"]
    keys = [kind.slot(i, o, None).key for i, o in enumerate(objs)]  # the last call's keys
    for c in objs:
        c.offset += 1 if c.keys is not None else 0  # the next call
    changed = change is not None and change[0] < len(objs) and objs[change[0]].keys is not None
    if changed:
        c = objs[change[0]]
        if change[1] == "shape":
            c.keys = mx.zeros((1, c.keys.shape[1], c.keys.shape[2] + 256, 8), c.keys.dtype)
        elif change[1] == "dtype":
            other = mx.float32 if c.values.dtype != mx.float32 else mx.float16
            c.values = c.values.astype(other)
        else:
            c.keys = c.values = None
    got = kind.rebind(3, objs, keys)
    if changed:
        assert got is None
        return
    assert got is not None
    want = [kind.slot(3 + i, o, None) for i, o in enumerate(objs)]
    for g, w in zip(got, want, strict=True):
        assert (g.index, g.obj, g.mode, g.kind, g.names, g.key, g.host) == (
            w.index,
            w.obj,
            w.mode,
            w.kind,
            w.names,
            w.key,
            w.host,
        )
        assert len(g.inputs) == len(w.inputs) == (3 if g.obj.keys is not None else 1)
        if g.obj.keys is not None:
            assert g.inputs[0] is w.inputs[0] and g.inputs[1] is w.inputs[1]  # the cache's own buffers
        off = g.inputs[-1]
        assert off.dtype == mx.int32 and off.shape == () and off.item() == g.obj.offset


def test_a_repeated_calls_kv_slot_refuses_an_offset_past_its_buffer() -> None:
    """The fast path's slots raise the general path's error for an offset beyond a
    cache's buffer (a caller's mistake), naming the cache."""
    from mlx_lm.models.cache import KVCache

    from segc.errors import StateError
    from segc.trace import state as st

    c = KVCache()
    c.keys, c.values, c.offset = mx.zeros((1, 1, 256, 8)), mx.zeros((1, 1, 256, 8)), 10
    kind = st.KINDS["kv"]
    key = kind.slot(0, c, None).key
    c.offset = 300
    with pytest.raises(StateError, match=r"state\[2\]: KVCache offset 300 exceeds its buffer \(256 positions\)"):
        kind.rebind(2, [c], [key])
