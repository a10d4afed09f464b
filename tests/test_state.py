"""State through segc.jit: KV caches found in the arguments or named with ``state=``.

After every call the caller's cache objects must hold exactly what eager mlx-lm's hold;
a failed call must leave them untouched; a decode loop must not trace once per token.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import examples, same_bits, state_close
from hypothesis import given, settings
from hypothesis import strategies as hst

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

import segc
from segc import StateError
from segc.models.zoo import build


@pytest.fixture(scope="module")
def llama():
    return build("llama")


def _tokens(n: int, seed: int = 0) -> mx.array:
    return mx.array([[(7 * i + 3 + seed) % 128 for i in range(n)]])


def _rotating(model, size: int) -> list:
    return [RotatingKVCache(max_size=size, keep=4) for _ in model.layers]


def _same(a: list, b: list) -> bool:
    for x, y in zip(a, b):
        if type(x) is not type(y) or vars(x).keys() != vars(y).keys():
            return False
        for k, v in vars(x).items():
            w = vars(y)[k]
            if isinstance(v, mx.array):
                if not state_close(v, w):
                    return False
            elif v != w:
                return False
    return True


def _lockstep(model, step, chunks: list[mx.array], decode: int, make_cache=make_prompt_cache) -> None:
    """Feed the same chunks, then greedy tokens, to eager and segc; compare every call."""
    ce, cs = make_cache(model), make_cache(model)
    le = ls = None
    for c in chunks:
        le, ls = model(c, cache=ce), step(c, cache=cs)
        assert state_close(le, ls)
        assert _same(ce, cs)
    assert le is not None and ls is not None
    for k in range(decode):
        te, ts = mx.argmax(le[:, -1:], -1), mx.argmax(ls[:, -1:], -1)
        assert same_bits(te, ts), f"greedy token {k} differs"
        le, ls = model(te, cache=ce), step(ts, cache=cs)
        assert state_close(le, ls), f"decode step {k}: logits differ"
        assert _same(ce, cs), f"decode step {k}: caches differ"


def test_decode_traces_once_per_capacity(llama) -> None:
    """250-token prompt, 300 decode steps: the KV buffer grows 256 -> 512 -> 768 as in
    mlx-lm; segc traces the prefill and one decode graph per capacity, nothing more."""
    step = segc.jit(llama, boundaries="auto")
    _lockstep(llama, step, [_tokens(250)], 300)
    info = step.cache_info()
    assert info.traces == 4, info.retraces
    assert "KVCache(f32[1,2,256,16]" in info.retraces[2] and "512" in info.retraces[2]
    assert info.aborted == []


@pytest.mark.slow
def test_greedy_64_steps_bf16() -> None:
    model = build("qwen3", dtype=mx.bfloat16)
    step = segc.jit(model, boundaries="auto")
    _lockstep(model, step, [_tokens(33)], 64)
    assert step.cache_info().traces == 2


def test_chunked_prefill(llama) -> None:
    step = segc.jit(llama, boundaries="auto")
    _lockstep(llama, step, [_tokens(33), _tokens(20, 5), _tokens(7, 9)], 4)


@settings(max_examples=examples(8), deadline=None)
@given(chunks=hst.lists(hst.integers(1, 40), min_size=1, max_size=3), decode=hst.integers(0, 5))
def test_chunks_property(chunks: list[int], decode: int) -> None:
    model = build("llama", num_hidden_layers=1)
    step = segc.jit(model, boundaries="auto")
    _lockstep(model, step, [_tokens(n, i) for i, n in enumerate(chunks)], max(decode, 1))


def test_rotating_cache_with_keep(llama) -> None:
    """mlx-lm's max_kv_size: a RotatingKVCache(keep=4) that trims and wraps while decoding."""
    step = segc.jit(llama, boundaries="auto")
    _lockstep(llama, step, [_tokens(33)], 20, make_cache=lambda m: _rotating(m, 40))
    info = step.cache_info()
    # the prefill (exact mode: mlx-lm concatenates), then one graph per buffer capacity
    assert info.traces <= 3, info.retraces


def test_rotating_chunk_after_prefill_falls_back_to_exact(llama) -> None:
    step = segc.jit(llama)
    _lockstep(llama, step, [_tokens(10), _tokens(5, 1)], 2, make_cache=lambda m: _rotating(m, 64))
    aborted = step.cache_info().aborted
    assert len(aborted) == 1 and "exact mode" in aborted[0]


def test_exact_mode_retraces_per_token(llama) -> None:
    step = segc.jit(llama, state_mode="exact")
    _lockstep(llama, step, [_tokens(33)], 3)
    info = step.cache_info()
    assert info.traces == 4
    assert "offset" in info.retraces[-1]


def test_explicit_state_captured_cache(llama) -> None:
    cache = make_prompt_cache(llama)
    eager = make_prompt_cache(llama)

    def forward(x: mx.array) -> mx.array:
        return llama(x, cache=cache)

    step = segc.jit(forward, state=cache)
    for x in (_tokens(33), _tokens(1), _tokens(1, 3)):
        assert same_bits(llama(x, cache=eager), step(x))
        assert _same(eager, cache)
    assert step.cache_info().traces == 2


def test_failed_call_leaves_state_untouched(llama) -> None:
    cache = make_prompt_cache(llama)
    llama(_tokens(33), cache=cache)
    before = [(c.keys, c.values, c.offset) for c in cache]

    def broken(x: mx.array, cache: list) -> mx.array:
        llama(x, cache=cache)
        raise RuntimeError("boom after the cache update")

    with pytest.raises(RuntimeError, match="boom"):
        segc.jit(broken)(_tokens(1), cache)
    for c, (k, v, off) in zip(cache, before):
        assert type(c) is KVCache
        assert c.keys is k and c.values is v and c.offset == off

    def unsupported(x: mx.array, cache: list) -> mx.array:
        y = llama(x, cache=cache)
        return mx.contiguous(y)  # MLX cannot export Contiguous

    with pytest.raises(segc.SegcError):
        segc.jit(unsupported)(_tokens(1), cache)
    for c, (k, v, off) in zip(cache, before):
        assert c.keys is k and c.values is v and c.offset == off


def test_staged_compile_with_state(llama) -> None:
    step = segc.jit(llama, boundaries="auto")
    ce, cs = make_prompt_cache(llama), make_prompt_cache(llama)
    llama(_tokens(33), cache=ce)
    step(_tokens(33), cache=cs)
    compiled = step.lower(_tokens(1), cache=cs).compile()
    assert any(i.kind == "state" for i in compiled.graph.inputs)
    out = compiled(_tokens(1), cache=cs)
    assert same_bits(out, llama(_tokens(1), cache=ce))
    assert _same(ce, cs)


class Accumulator:
    """A user state object: an array and a host counter (exact mode)."""

    def __init__(self) -> None:
        self.total = mx.zeros((3,))
        self.calls = 0

    def update_and_fetch(self, x: mx.array) -> mx.array:
        self.total = self.total + x
        self.calls += 1
        return self.total


def test_user_state_object_exact_mode() -> None:
    acc, ref = Accumulator(), Accumulator()

    def f(x: mx.array, acc: Accumulator) -> mx.array:
        return acc.update_and_fetch(x) * 2

    step = segc.jit(f)
    for k in range(3):
        x = mx.array([1.0, 2.0, 3.0]) * (k + 1)
        assert same_bits(step(x, acc), f(x, ref))
        assert acc.calls == ref.calls and same_bits(acc.total, ref.total)
    assert "calls" in step.cache_info().retraces[-1]


def test_bad_state_is_a_segc_error() -> None:
    class Weird:
        def __init__(self) -> None:
            self.table = {"a": mx.zeros((2,))}

        def update_and_fetch(self, x: mx.array) -> mx.array:
            return x

    with pytest.raises(StateError, match="table"):
        segc.jit(lambda x, s: s.update_and_fetch(x))(mx.zeros((2,)), Weird())
    with pytest.raises(StateError, match="state="):
        segc.jit(lambda x: x, state=[mx.zeros((2,))])(mx.zeros((2,)))


def test_rotating_cache_class_is_kept(llama) -> None:
    cache = _rotating(llama, 40)
    step = segc.jit(llama)
    step(_tokens(33), cache=cache)
    step(_tokens(1), cache=cache)
    assert all(type(c) is RotatingKVCache for c in cache)


def test_cache_list_container() -> None:
    """mlx-lm's CacheList (hybrid models): its child caches are state of their own."""
    from mlx_lm.models.cache import CacheList

    def f(k: mx.array, cl: CacheList) -> mx.array:
        a, _ = cl[0].update_and_fetch(k, k)
        b, _ = cl[1].update_and_fetch(k * 2, k)
        return a.sum(axis=2) + b.sum(axis=2)

    ours, ref = CacheList(KVCache(), KVCache()), CacheList(KVCache(), KVCache())
    step = segc.jit(f)
    for n in (5, 1, 1, 1):
        k = mx.random.normal((1, 2, n, 4))
        assert state_close(step(k, ours), f(k, ref))
        assert _same(list(ours.caches), list(ref.caches))
    assert step.cache_info().traces == 2


def test_growth_found_while_tracing(llama) -> None:
    """A 300-token chunk after a 33-token prefill: the capacity need is discovered inside
    the trace; the cache grows (mlx-lm's way: trim to 33, add 512) and the trace reruns."""
    step = segc.jit(llama, boundaries="auto")
    _lockstep(llama, step, [_tokens(33), _tokens(300, 1)], 3)
    info = step.cache_info()
    assert any("grows" in a for a in info.aborted), info.aborted


def test_growth_found_while_tracing_is_remembered(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same chunks again, through fresh caches: the call that had to grow grows
    before its lookup, without tracing again (an engine's banded prefill makes such a
    call for every band of every prompt), and still gives eager's results."""
    from segc.staging import Jitted

    step = segc.jit(llama, boundaries="auto")
    chunks = [_tokens(33), _tokens(300, 1)]
    _lockstep(llama, step, chunks, 1)
    traced = []
    real = Jitted._trace
    monkeypatch.setattr(Jitted, "_trace", lambda self, *a, **k: traced.append(1) or real(self, *a, **k))
    aborted = len(step.cache_info().aborted)
    for _ in range(2):
        _lockstep(llama, step, chunks, 1)
    assert traced == [] and len(step.cache_info().aborted) == aborted


def test_caches_over_the_same_buffers_grow_once() -> None:
    """``state.grow``: slots whose caches share their buffers (the paging engine's
    stand-ins for the layers outside a band) share one grown copy; others get their own,
    each as mlx-lm would grow it."""
    from segc.trace import state as tst

    def filled(seed: int) -> KVCache:
        c = KVCache()
        k = mx.random.normal((1, 2, 256, 4), key=mx.random.key(seed))
        c.update_and_fetch(k, k * 2)
        return c

    a, b = filled(0), filled(1)
    proxy = object.__new__(KVCache)
    proxy.__dict__.update(vars(a))
    slots = [tst.make_slot(i, o, exact=False) for i, o in enumerate([a, proxy, b])]
    grown: dict = {}
    assert tst.grow(slots, 10, grown)
    assert grown[0] is grown[1] and grown[2] is not grown[0]
    for i, c in ((0, a), (2, b)):
        ref = object.__new__(KVCache)
        ref.__dict__.update(vars(c))
        ref.update_and_fetch(mx.zeros((1, 2, 10, 4)), mx.zeros((1, 2, 10, 4)))  # mlx-lm grows it
        assert grown[i]["keys"].shape == ref.keys.shape
        assert same_bits(grown[i]["keys"][..., :256, :], c.keys)
        assert same_bits(grown[i]["values"][..., :256, :], c.values)
    assert not tst.grow(slots, 0, {})  # room enough: nothing grows


@settings(max_examples=30, deadline=None)
@given(
    offsets=hst.lists(hst.integers(0, 8), min_size=1, max_size=6),
    capacity=hst.integers(1, 8),
    n=hst.integers(0, 3),
)
def test_writes_decide_as_the_per_object_functions(offsets: list[int], capacity: int, n: int) -> None:
    """``Writes`` (one signature's commits, each kind's functions looked up once) finds
    that a call must grow exactly when some cache's offset plus the tokens written passes
    its buffer, donates when the call writes, and commits each object its own outputs."""
    from segc.trace import state as st
    from segc.trace.writes import Writes

    caches = []
    for off in offsets:
        c = KVCache()
        c.keys = mx.zeros((1, 1, max(capacity, off), 4))
        c.values = mx.ones((1, 1, max(capacity, off), 4))
        c.offset = off
        caches.append(c)
    commits = tuple(st.Commit("kv", ("keys", "values"), n) for _ in caches)
    writes = Writes(commits)
    slots = [st.make_slot(i, c, exact=False) for i, c in enumerate(caches)]
    want = n > 0 and any(off + n > max(capacity, off) for off in offsets)
    assert writes.needs_growth(slots) == want
    if want:
        return
    before = [(c.keys, c.values) for c in caches]
    assert writes.donate(slots) == (n > 0)
    outs = [mx.full((1, 1, 2, 4), float(k)) for k in range(2 * len(caches))]
    writes.commit(slots, outs)
    for i, (c, off, (k, v)) in enumerate(zip(caches, offsets, before)):
        if n:  # the call's new buffers, one object's pair each
            assert c.keys is outs[2 * i] and c.values is outs[2 * i + 1]
        else:  # a call that writes no token leaves the buffers as they were
            assert c.keys is k and c.values is v
        assert c.offset == off + n
