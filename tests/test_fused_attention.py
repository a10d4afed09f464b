"""The fused masked decode attention (segc/lower/attention.py): which equations it finds
in a traced decode step, what it computes, and where segc lowers to it (``"auto"``: a
dynamic cache's attention where eager would run a fused kernel, on CUDA only).

On the CPU segc never uses it by default (the decomposition *is* eager MLX's computation
there, so bits are kept); these tests pass the float32 reference as the kernel to check
the matching and the replay around it. The CUDA kernel itself is checked on a CUDA
machine only (the last tests; MLX's CPU build has no ``mx.fast.cuda_kernel`` to run).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_env_setting, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.errors import UsageError
from segc.lower import attention_kernel
from segc.lower.attention import eager_fuses, find_attention, only_where_eager_fuses, reference_attention
from segc.models import tiny_llama
from segc.staging.validate import VALIDATE_TOL

pytestmark = pytest.mark.timeout(120)

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
# MLX's float32 matmuls on CUDA round their inputs like TF32: off the CPU, float32 is
# compared with the bound segc documents for the GPU (VALIDATE_TOL), not float32's rounding
F32_TOL = 1e-5 if mx.default_device() == mx.cpu else VALIDATE_TOL


def _f64_attention(q, k, v, mask, scale):
    """Softmax attention in float64 with numpy, written from the definition (a row that
    masks every key averages the values, as a softmax over equal scores does)."""
    qn, kn, vn = (np.array(x.astype(mx.float32)).astype(np.float64) for x in (q, k, v))
    _, hq, lq, _ = qn.shape
    hkv, cap = kn.shape[1], kn.shape[2]
    kn = np.repeat(kn, hq // hkv, axis=1)
    vn = np.repeat(vn, hq // hkv, axis=1)
    s = scale * qn @ kn.swapaxes(-1, -2)
    m = np.broadcast_to(np.array(mask).reshape(-1, cap), (lq, cap))
    s = np.where(m, s, -np.inf)
    s = np.where(m.any(axis=-1, keepdims=True), s, 0.0)  # every key hidden: equal weights
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ vn


@given(
    st.sampled_from([(4, 4), (8, 2), (6, 3), (4, 1)]),
    st.sampled_from([32, 64]),
    st.integers(1, 3),
    st.integers(1, 70),
    st.data(),
)
def test_the_reference_is_softmax_attention(heads, d, lq, cap, data):
    hq, hkv = heads
    mx.random.seed(data.draw(st.integers(0, 1000)))
    q = mx.random.normal((1, hq, lq, d))
    k = mx.random.normal((1, hkv, cap, d))
    v = mx.random.normal((1, hkv, cap, d))
    rows = data.draw(st.sampled_from([1, lq]))
    mask = mx.array(
        np.array(data.draw(st.lists(st.booleans(), min_size=rows * cap, max_size=rows * cap))).reshape(rows, cap)
    )
    got = np.array(reference_attention(q, k, v, mask, d**-0.5)).astype(np.float64)
    tol = 1e-5 if mx.default_device() == mx.cpu else VALIDATE_TOL
    np.testing.assert_allclose(got, _f64_attention(q, k, v, mask, d**-0.5), rtol=tol, atol=tol)


@pytest.mark.parametrize("hidden_rows", [(0,), (0, 1), (1,)])
def test_the_reference_is_mlx_attention_where_a_row_hides_every_key(hidden_rows):
    """MLX's attention (``mx.fast.scaled_dot_product_attention``, its masked fallback)
    averages the values for a row that hides every key; so do the reference and the
    CUDA kernel (``tests/test_attention_cuda.py``)."""
    mx.random.seed(3)
    q, k, v = (mx.random.normal(s) for s in ((1, 4, 2, 16), (1, 2, 9, 16), (1, 2, 9, 16)))
    mask = np.arange(9)[None, :] < np.array([[4], [6]])
    mask[list(hidden_rows)] = False
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mx.array(mask))
    got = reference_attention(q, k, v, mx.array(mask), 0.25)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    mean = np.repeat(np.array(v).mean(axis=2), 2, axis=1)  # (1, 4, 16): each query head's KV head
    for r in hidden_rows:
        np.testing.assert_allclose(np.array(got)[:, :, r], mean, rtol=1e-5, atol=1e-5)


def _model(heads: int, kv_heads: int, layers: int, dtype=mx.float32, hidden: int = 128, intermediate: int = 256):
    return tiny_llama(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=64,
        dtype=dtype,
    )


def _decode_graph(heads: int, kv_heads: int, layers: int = 2, dtype=mx.float32):
    model = _model(heads, kv_heads, layers, dtype)
    cache = make_prompt_cache(model)
    step = segc.jit(model, boundaries="layers.*")
    step(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    mx.eval([c.state for c in cache])
    return model, cache, step


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (4, 4), (4, 1)])
def test_every_layer_s_decode_attention_is_found(heads, kv_heads):
    layers = 3
    _, cache, step = _decode_graph(heads, kv_heads, layers)
    lowered = step.lower(mx.array([[7]]), cache=cache)
    g = lowered.graph
    consts = {c.var.name: c.value for c in g.consts}
    shapes = {n: v.shape for n, v in g.vars().items()}
    found = find_attention(g.eqns, g.outputs, consts, shapes)
    assert len(found) == layers  # one attention per layer, from the config
    # segment by segment, as the replay looks (the mask and the scale's broadcast are
    # made once, in the first layer's segment, and read by the others as inputs)
    assert len(lowered.segments) == layers + 1
    per_segment = [find_attention(s.eqns(g), s.outputs, consts, shapes, g.eqns) for s in lowered.segments]
    assert [len(f) for f in per_segment] == [1] * layers + [0]
    vs = g.vars()
    by_state = {i.var.name: i.path for i in g.inputs}
    for m in found:
        assert vs[m.q].shape == (1, heads, 1, 128 // heads)
        assert vs[m.k].shape == vs[m.v].shape == (1, kv_heads, 256, 128 // heads)
        assert vs[m.mask].dtype == "bool" and vs[m.mask].shape[-1] == 256
        assert m.scale == pytest.approx((128 // heads) ** -0.5, rel=1e-2)
    # the keys and values are this call's updated buffers, one layer's each
    written = {e.outs[0].name: e.ins[0] for e in g.eqns if e.prim == "DynamicSliceUpdate"}
    assert sorted(by_state[written[m.k]] for m in found) == sorted(f"state[{i}].keys" for i in range(layers))
    assert sorted(by_state[written[m.v]] for m in found) == sorted(f"state[{i}].values" for i in range(layers))


@pytest.mark.parametrize(("hidden", "heads", "eager_has_a_kernel"), [(128, 2, True), (256, 2, True), (128, 8, False)])
def test_auto_takes_only_the_caches_attentions_that_eager_would_fuse(hidden, heads, eager_has_a_kernel):
    """``"auto"`` replaces a decode attention only where eager MLX's CUDA SDPA would have
    run a fused kernel (head dimensions 64, 96, 128: MLX 0.32's ``supports_sdpa_vector``)
    and only a dynamic KV cache's (its keys written by a ``DynamicSliceUpdate``); head
    dimension 16 keeps the fallback, which is eager's own computation."""
    model = _model(heads, 1, 2, hidden=hidden)
    cache = make_prompt_cache(model)
    step = segc.jit(model, boundaries="layers.*")
    step(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    g = step.lower(mx.array([[7]]), cache=cache).graph
    consts = {c.var.name: c.value for c in g.consts}
    shapes = {n: v.shape for n, v in g.vars().items()}
    producers = {o.name: e for e in g.eqns for o in e.outs}
    found = find_attention(g.eqns, g.outputs, consts, shapes)
    assert len(found) == 2
    assert [eager_fuses(m, shapes, producers) for m in found] == [eager_has_a_kernel] * 2

    def masked(q, k, v, off):  # a model's own masked attention over keys it was given
        m = (off + mx.arange(1)[:, None]) >= mx.arange(16)[None]
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=m)

    args = (mx.ones((1, 4, 1, 64)), mx.ones((1, 2, 16, 64)), mx.ones((1, 2, 16, 64)), mx.array(3))
    g2 = segc.jit(masked).lower(*args).graph
    shapes2 = {n: v.shape for n, v in g2.vars().items()}
    found2 = find_attention(g2.eqns, g2.outputs, {c.var.name: c.value for c in g2.consts}, shapes2)
    # the CPU trace decomposes it (a GPU's may keep SDPA whole, leaving nothing to match);
    # where it is matched, "auto" never takes it
    assert found2 or mx.default_device() != mx.cpu
    producers2 = {o.name: e for e in g2.eqns for o in e.outs}
    assert not any(eager_fuses(m, shapes2, producers2) for m in found2)


@pytest.mark.parametrize(("hidden", "heads", "calls"), [(128, 2, 2), (128, 8, 0)])
def test_an_auto_kernel_is_calledonly_where_eager_fuses_and_bits_stay_elsewhere(hidden, heads, calls):
    """The replay with an ``"auto"``-marked kernel (the float32 reference, counting its
    calls, on the CPU): called once per layer at head dimension 64; at 16 never, and the
    decode step keeps eager mlx-lm's bits."""
    seen = []

    def counting(q, k, v, mask, scale):
        seen.append(q.shape)
        return reference_attention(q, k, v, mask, scale)

    model = _model(heads, 1, 2, hidden=hidden)
    prompt, tok = mx.array([[1, 2, 3, 4, 5]]), mx.array([[7]])
    cache, ref = make_prompt_cache(model), make_prompt_cache(model)
    step = segc.jit(model, boundaries="layers.*", attention=only_where_eager_fuses(counting), validate=False)
    step(prompt, cache=cache)
    model(prompt, cache=ref)
    y = step(tok, cache=cache)
    mx.eval(y)
    assert len(seen) == calls
    if calls == 0:
        assert np.array(y).tobytes() == np.array(model(tok, cache=ref)).tobytes()


def test_a_prefill_and_a_read_softmax_are_not_matched():
    _, _, step = _decode_graph(8, 2)
    cache = make_prompt_cache(step.module)
    g = step.lower(mx.array([[1, 2, 3, 4, 5, 6, 7, 8] * 3]), cache=cache).graph
    consts = {c.var.name: c.value for c in g.consts}
    assert find_attention(g.eqns, g.outputs, consts, {n: v.shape for n, v in g.vars().items()}) == []

    def probs(q, k, v, off):
        m = (off + mx.arange(1)[:, None]) >= mx.arange(16)[None]
        s = mx.where(m, (q * 0.5).reshape(1, 2, 2, 1, 8) @ k[:, :, None].swapaxes(-1, -2), mx.finfo(mx.float32).min)
        p = mx.softmax(s, axis=-1, precise=True)
        return (p @ v[:, :, None]).reshape(1, 4, 1, 8), p  # the weights are read: no match

    args = (mx.ones((1, 4, 1, 8)), mx.ones((1, 2, 16, 8)), mx.ones((1, 2, 16, 8)), mx.array(3))
    g2 = segc.jit(probs).lower(*args).graph
    consts2 = {c.var.name: c.value for c in g2.consts}
    assert find_attention(g2.eqns, g2.outputs, consts2, {n: v.shape for n, v in g2.vars().items()}) == []
    g3 = segc.jit(lambda *a: probs(*a)[0]).lower(*args).graph
    consts3 = {c.var.name: c.value for c in g3.consts}
    assert len(find_attention(g3.eqns, g3.outputs, consts3, {n: v.shape for n, v in g3.vars().items()})) == 1


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (4, 4)])
def test_a_decode_step_with_the_kernel_matches_eager_within_rounding(heads, kv_heads):
    """The reference in place of the kernel: every layer's attention runs through it, and
    the logits stay within float32 rounding of eager mlx-lm's (the kernel rounds once, at
    the end, where the decomposition rounds after each step)."""
    model, _, _ = _decode_graph(heads, kv_heads, layers=2)
    calls = []

    def counting(q, k, v, mask, scale):
        calls.append(q.shape)
        return reference_attention(q, k, v, mask, scale)

    fused = segc.jit(model, boundaries="layers.*", attention=counting, validate=False)
    cache, eager_cache = make_prompt_cache(model), make_prompt_cache(model)
    fused(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    model(mx.array([[1, 2, 3, 4, 5]]), cache=eager_cache)
    calls.clear()  # a short prefill may match too (a boolean causal mask): decode only
    for tok in (7, 9, 11):
        want = model(mx.array([[tok]]), cache=eager_cache)
        got = fused(mx.array([[tok]]), cache=cache)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=F32_TOL, atol=F32_TOL)
        assert cache[0].offset == eager_cache[0].offset
    # traced when the decode graph was compiled (layers of one shape may share a trace),
    # not per token: the buffer's capacity did not change
    assert calls and set(calls) == {(1, heads, 1, 128 // heads)} and len(calls) <= 2


@pytest.mark.parametrize("attention", [reference_attention, "off"], ids=["kernel", "decomposed"])
def test_segmented_and_unsegmented_agree_bit_for_bit(attention):
    """segc's promise, also where a kernel replaces eager's decomposition: cutting changes
    no bit."""
    model, _, _ = _decode_graph(8, 2, layers=3)
    segmented = segc.jit(model, boundaries="layers.*", attention=attention, validate=False)
    whole = segc.jit(model, attention=attention, validate=False)
    c1, c2 = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[1, 2, 3, 4, 5]])
    segmented(prompt, cache=c1)
    whole(prompt, cache=c2)
    assert len(segmented.lower(mx.array([[7]]), cache=c1).segments) > 1
    for tok in (7, 9):
        a = segmented(mx.array([[tok]]), cache=c1)
        b = whole(mx.array([[tok]]), cache=c2)
        assert np.array(a).tobytes() == np.array(b).tobytes()
        assert np.array(c1[2].keys).tobytes() == np.array(c2[2].keys).tobytes()


def test_auto_is_the_kernel_on_cuda_and_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEGC_FUSED_ATTENTION", raising=False)
    if CUDA:
        from segc.lower.cuda_attention import cuda_attention

        auto = attention_kernel("auto")
        assert auto.kernel is cuda_attention and auto.where_eager_fuses  # type: ignore[union-attr]
    else:
        assert attention_kernel("auto") is None  # the CPU keeps eager's decomposition
    monkeypatch.setenv("SEGC_FUSED_ATTENTION", "0")
    assert attention_kernel("auto") is None


@pytest.mark.parametrize(("value", "want"), [(None, 1), ("1", 1), ("2", 2), ("", 1), ("3", None), ("two", None)])
def test_the_number_of_attention_kernels_is_read_and_checked(monkeypatch: pytest.MonkeyPatch, value, want) -> None:
    from segc.lower.cuda_attention import attention_kernels  # importable without CUDA

    assert_env_setting(monkeypatch, "SEGC_ATTENTION_KERNELS", value, attention_kernels, want)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize(
    ("value", "want"), [(None, "auto"), ("auto", "auto"), ("0", False), ("1", True), ("", "auto"), ("yes", None)]
)
def test_the_attentions_staging_is_read_and_checked(monkeypatch: pytest.MonkeyPatch, value, want, in_place) -> None:
    """``auto`` (the default) stages the write in place with its attention alone."""
    from segc.lower.cuda_stage import staged  # importable without CUDA

    expected = in_place if want == "auto" else want
    assert_env_setting(monkeypatch, "SEGC_ATTENTION_STAGE", value, lambda: staged(in_place), expected)


def test_attention_settings_are_checked():
    with pytest.raises(UsageError, match="attention must be one of"):
        attention_kernel("fast")
    with pytest.raises(UsageError, match="attention must be one of"):
        segc.jit(lambda x: x, attention="fast")
    if not CUDA:
        with pytest.raises(UsageError, match="CUDA"):
            attention_kernel("on")
        assert attention_kernel("auto") is None  # the CPU keeps eager's decomposition
    assert attention_kernel("off") is None


@pytest.mark.skipif(not CUDA, reason="the CUDA kernel runs only on MLX's CUDA build with a GPU")
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_the_cuda_kernel_on_a_decode_step(dtype):
    from segc.lower.cuda_attention import cuda_attention

    model, _, _ = _decode_graph(8, 2, layers=3, dtype=dtype)
    step = segc.jit(model, boundaries="layers.*", attention="on", validate=False)
    whole = segc.jit(model, attention="on", validate=False)
    cache = make_prompt_cache(model)
    step(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    cache2 = make_prompt_cache(model)
    whole(mx.array([[1, 2, 3, 4, 5]]), cache=cache2)
    eager_cache = make_prompt_cache(model)
    model(mx.array([[1, 2, 3, 4, 5]]), cache=eager_cache)
    tol = VALIDATE_TOL if dtype == mx.float32 else 2e-2
    for tok in (7, 9):
        got = step(mx.array([[tok]]), cache=cache)
        one = whole(mx.array([[tok]]), cache=cache2)
        want = model(mx.array([[tok]]), cache=eager_cache)
        # segmented and unsegmented: the same kernel, the same bits (segc's GPU promise)
        assert np.array(got.astype(mx.float32)).tobytes() == np.array(one.astype(mx.float32)).tobytes()
        np.testing.assert_allclose(
            np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)), rtol=tol, atol=tol
        )
    q = mx.random.normal((1, 8, 1, 64)).astype(dtype)
    k = mx.random.normal((1, 2, 300, 64)).astype(dtype)
    v = mx.random.normal((1, 2, 300, 64)).astype(dtype)
    mask = mx.arange(300)[None] <= 200
    got = np.array(cuda_attention(q, k, v, mask, 0.125).astype(mx.float32))
    np.testing.assert_allclose(got, _f64_attention(q, k, v, mask, 0.125), rtol=tol, atol=tol)


@settings(max_examples=examples(6))
@given(
    st.sampled_from([(8, 2), (4, 4), (8, 1), (6, 3), (2, 2)]),
    st.sampled_from([mx.float32, mx.bfloat16, mx.float16]),
    st.integers(1, 300),
    st.integers(1, 3),
)
def test_decode_with_the_kernel_over_shapes(heads, dtype, prompt, layers):
    """Over head layouts, dtypes, prompt lengths (buffers of 256 and 512 positions) and
    depths: every layer segment's attention is found, the logits stay within the dtype's
    rounding of eager mlx-lm's, and cutting changes no bit."""
    hq, hkv = heads
    model = _model(hq, hkv, layers, dtype, hidden=16 * hq, intermediate=64)
    seg = segc.jit(model, boundaries="layers.*", attention=reference_attention, validate=False)
    whole = segc.jit(model, attention=reference_attention, validate=False)
    caches = [make_prompt_cache(model) for _ in range(3)]
    tokens = mx.array([[(7 * i) % 64 for i in range(prompt)]])
    seg(tokens, cache=caches[0])
    whole(tokens, cache=caches[1])
    model(tokens, cache=caches[2])
    lowered = seg.lower(mx.array([[3]]), cache=caches[0])
    g = lowered.graph
    consts = {c.var.name: c.value for c in g.consts}
    shapes = {n: v.shape for n, v in g.vars().items()}
    found = [len(find_attention(s.eqns(g), s.outputs, consts, shapes, g.eqns)) for s in lowered.segments]
    assert sum(found) == layers and max(found) == 1
    tol = {mx.float32: F32_TOL, mx.float16: 1e-2, mx.bfloat16: 5e-2}[dtype]
    for tok in (3, 5):
        a = seg(mx.array([[tok]]), cache=caches[0])
        b = whole(mx.array([[tok]]), cache=caches[1])
        want = model(mx.array([[tok]]), cache=caches[2])
        assert np.array(a.astype(mx.float32)).tobytes() == np.array(b.astype(mx.float32)).tobytes()
        np.testing.assert_allclose(
            np.array(a.astype(mx.float32)), np.array(want.astype(mx.float32)), rtol=tol, atol=tol
        )


def test_an_engine_hook_keeps_the_attention_setting():
    """``record_timeline`` (like ``set_boundary_schedule`` and ``set_window``) compiles
    the cached graphs again: the jit's kernel must stay in them, not fall back to
    ``"auto"``."""
    model, _, _ = _decode_graph(4, 2, layers=2)
    calls = []

    def counting(q, k, v, mask, scale):
        calls.append(q.shape)
        return reference_attention(q, k, v, mask, scale)

    step = segc.jit(model, boundaries="layers.*", attention=counting, validate=False)
    cache = make_prompt_cache(model)
    step(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    step(mx.array([[7]]), cache=cache)
    calls.clear()
    step.record_timeline([])
    step(mx.array([[9]]), cache=cache)  # the recompiled decode graph traces the kernel again
    assert calls and set(calls) == {(1, 4, 1, 32)}
