"""The rotated KV write's CUDA kernel (``segc.lower.cuda_kvwrite``) against MLX's own
kernels on the GPU, byte for byte: ``mx.fast.rope`` of the queries and keys (MLX's
``rope_single``) and ``mx.slice_update`` of both buffers at an array offset, as eager
MLX runs them (with ``SEGC_LIVE_ATTENTION=0``: segc's attention kernel after the write). On a
machine without CUDA these tests cannot run;
``tests/test_kvwrite.py`` checks the finder and the replay there."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import assert_decodes_agree, examples, same_bits, with_setting
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_kvwrite import DT, Counted, _eager, _layer, _replay, _values

import segc
from segc.lower import kvwrite
from segc.lower.shapes import SELECT_WRITE_BYTES
from segc.models.zoo import build

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
pytestmark = [
    pytest.mark.skipif(not CUDA, reason="the kernel is a CUDA kernel: needs MLX's CUDA backend and a GPU"),
    pytest.mark.timeout(300),
]


@pytest.fixture(autouse=True)
def _segc_s_own_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check segc's write-with-attention kernel, which by default the live
    attention replaces where a mask is one query's causal row (``SEGC_LIVE_ATTENTION``:
    ``tests/test_live_cuda.py`` checks that form against eager mlx-lm)."""
    monkeypatch.setenv("SEGC_LIVE_ATTENTION", "0")


@settings(max_examples=examples(40), deadline=None)
@given(
    h=hst.sampled_from([1, 2, 8]),
    rep=hst.sampled_from([1, 4]),
    c=hst.sampled_from([1, 7, 256, 1280, 4096]),
    d=hst.sampled_from([64, 128, 80, 12]),
    partial=hst.booleans(),
    trad=hst.booleans(),
    freqs=hst.booleans(),
    dt=hst.sampled_from(list(DT)),
    data=hst.data(),
)
def test_the_kernel_is_mlx_rope_and_slice_update(h, rep, c, d, partial, trad, freqs, dt, data) -> None:
    dims = d // 2 if partial and (d // 2) % 2 == 0 else d
    eqns, avals, ins, outs = _layer(h=h, hq=h * rep, c=c, d=d, dv=d, dims=dims, trad=trad, freqs=freqs, dt=dt)
    vals = _values(avals, ins, offset=data.draw(hst.integers(0, c - 1)), seed=data.draw(hst.integers(0, 999)))
    kernel = kvwrite.kv_write_kernel("auto")
    assert kernel is not None
    calls = []

    def counted(m, xs):
        calls.append(m)
        return kernel(m, xs)

    got = _replay(eqns, avals, ins, outs, vals, counted)
    want = _eager(dict(zip(ins, vals)), dims, trad, freqs)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert same_bits(a, b), f"output {outs[i]}"
    # (a buffer over the select's limit is MLX's own write: nothing to compare then)
    assert len(calls) == (h * c * d * DT[dt].size <= SELECT_WRITE_BYTES)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_decode_keeps_its_bits_with_the_kernel(arch, monkeypatch) -> None:
    """segc with the kernel against segc with MLX's kernels (``FUSED_KV_WRITE =
    "never"``): logits and caches byte for byte over a prompt and ten decode steps, and
    every layer's write taken with its queries."""
    model = build(arch, num_hidden_layers=2, hidden_size=256, intermediate_size=512, head_dim=64, dtype=mx.bfloat16)
    fused = segc.jit(model, validate=False, concat_projections=True)
    plain = segc.jit(model, validate=False, concat_projections=True)
    kernel = kvwrite.kv_write_kernel("auto")
    assert kernel is not None
    seen = Counted()

    def counted(m, ins):
        seen.matches.append(m)
        return kernel(m, ins)

    fused_call = with_setting(monkeypatch, kvwrite, "FUSED_KV_WRITE", counted, fused)
    assert_decodes_agree(model, fused_call, with_setting(monkeypatch, kvwrite, "FUSED_KV_WRITE", "never", plain))
    assert len(seen.matches) >= 2 and all(m.queries for m in seen.matches), seen.matches


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_decode_keeps_its_bits_with_the_write_and_the_attention_as_one_kernel(arch, monkeypatch) -> None:
    """The write-with-attention kernel (``cuda_kvattention.py``, the default) against the rotated
    write's kernel followed by the attention's: logits and caches byte for byte, and
    every layer's write paired with its attention."""
    model = build(arch, num_hidden_layers=2, hidden_size=256, intermediate_size=512, head_dim=64, dtype=mx.bfloat16)
    paired = segc.jit(model, validate=False, concat_projections=True)
    apart = segc.jit(model, validate=False, concat_projections=True)
    pairs = []

    def write(m, ins):
        return kvwrite.cuda_kv_write(m, ins)

    def with_attention(m, scale, ins):
        pairs.append(m)
        return kvwrite.cuda_kv_write_with_attention.with_attention(m, scale, ins)  # type: ignore[attr-defined]

    write.with_attention = with_attention  # type: ignore[attr-defined]
    one = with_setting(monkeypatch, kvwrite, "FUSED_KV_WRITE", write, paired)
    assert_decodes_agree(model, one, with_setting(monkeypatch, kvwrite, "FUSED_KV_WRITE", kvwrite.cuda_kv_write, apart))
    assert len(pairs) >= 2, pairs


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_decode_keeps_its_bits_with_the_write_in_place(arch, monkeypatch) -> None:
    """``SEGC_KV_IN_PLACE=1`` (the row written into the old buffers) against the copying
    kernel: logits and caches byte for byte over a prompt and ten decode steps, every
    layer's write taken alone (nothing else reads its buffers) and in place."""
    model = build(arch, num_hidden_layers=2, hidden_size=256, intermediate_size=512, head_dim=64, dtype=mx.bfloat16)
    pairs: list[tuple[kvwrite.KVWriteMatch, bool]] = []
    own = kvwrite.cuda_kv_write_with_attention.with_attention  # type: ignore[attr-defined]

    def with_attention(m, scale, ins):
        pairs.append((m, kvwrite.kv_in_place_wanted()))
        return own(m, scale, ins)

    monkeypatch.setattr(kvwrite.cuda_kv_write_with_attention, "with_attention", with_attention)

    in_place = _with_env({"SEGC_KV_IN_PLACE": "1"}, segc.jit(model, validate=False, concat_projections=True))
    copied = _with_env({"SEGC_KV_IN_PLACE": "0"}, segc.jit(model, validate=False, concat_projections=True))
    assert_decodes_agree(model, in_place, copied)
    assert sorted({w for _, w in pairs}) == [False, True] and all(m.alone for m, _ in pairs), pairs


@pytest.mark.parametrize("in_place", ["0", "1"])
def test_a_decode_keeps_its_bits_with_the_chunk_staged(in_place, monkeypatch) -> None:
    """``SEGC_ATTENTION_STAGE=1`` (each block of the write with its attention reads its
    chunk into shared memory first) against ``0`` (never staged; ``auto``, the default,
    stages in place): logits and caches byte for byte, copying and in place."""
    monkeypatch.setenv("SEGC_KV_IN_PLACE", in_place)
    model = build("llama", num_hidden_layers=2, hidden_size=256, intermediate_size=512, head_dim=64, dtype=mx.bfloat16)

    staged = _with_env({"SEGC_ATTENTION_STAGE": "1"}, segc.jit(model, validate=False, concat_projections=True))
    direct = _with_env({"SEGC_ATTENTION_STAGE": "0"}, segc.jit(model, validate=False, concat_projections=True))
    assert_decodes_agree(model, staged, direct)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"SEGC_KV_IN_PLACE": "1"},
        {"SEGC_CHAIN_PRODUCTS": "1"},
        {"SEGC_CHAIN_PRODUCTS": "1", "SEGC_CHAIN_ATTENTION": "1"},
    ],
    ids=["defaults", "in place", "chains", "layer"],
)
def test_sequences_stepped_together_keep_their_bits(env) -> None:
    """Four sequences, a cache each, stepped through one jitted model and evaluated
    together (an engine's batch of requests: MLX may run their kernels at once, and
    kernels that count their blocks must each count on memory of their own), against
    kernels that count nothing (the write apart from the attention, the attention as two
    kernels, no chains) one sequence at a time: logits and caches byte for byte."""
    from mlx_lm.models.cache import make_prompt_cache

    model = build("llama", num_hidden_layers=2, hidden_size=256, intermediate_size=512, head_dim=64, dtype=mx.bfloat16)
    plain = {"SEGC_FUSED_KV_ATTENTION": "0", "SEGC_ATTENTION_KERNELS": "2", "SEGC_CHAIN_PRODUCTS": "0"}
    # commits only at fences: the four calls' kernels in one graph when evaluated together
    together = _with_env(env, segc.jit(model, validate=False, concat_projections=True, commit="fences"))
    alone = _with_env(plain, segc.jit(model, validate=False, concat_projections=True))
    n = 4
    ct, ca = [make_prompt_cache(model) for _ in range(n)], [make_prompt_cache(model) for _ in range(n)]
    toks = [mx.array([[(7 * i + 3 * s + 1) % 100 for i in range(12)]]) for s in range(n)]
    for step in range(6):
        got = [together(t, cache=c) for t, c in zip(toks, ct, strict=True)]
        mx.eval(got, [[x.keys, x.values] for c in ct for x in c])
        want = []
        for t, c in zip(toks, ca, strict=True):
            want.append(alone(t, cache=c))
            mx.eval(want[-1], [[x.keys, x.values] for x in c])
        for s in range(n):
            assert same_bits(got[s], want[s]), f"step {step}, sequence {s}: logits"
            for a, b in zip(ct[s], ca[s], strict=True):
                assert same_bits(a.keys, b.keys) and same_bits(a.values, b.values), f"step {step}, sequence {s}"
        toks = [mx.argmax(w[:, -1:], -1) for w in want]


def _with_env(env: dict[str, str], f):
    """``f`` called with the environment's variables ``env`` set (read when its segments
    are built, at its first call of each shape), and set back after."""

    def call(*a, **kw):
        with pytest.MonkeyPatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            return f(*a, **kw)

    return call
