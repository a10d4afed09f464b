"""The fused masked decode attention's CUDA kernels (``segc.lower.cuda_attention``) on
the GPU: one kernel (the default; the last block of each group merges the chunks) gives
the two kernels' bytes, call after call of one compiled function (its counter is set
back to zero by each call's last blocks), with two attentions in one compiled function
(a counter each), and within float32's rounding of softmax attention in float64. On a
machine without CUDA these tests cannot run; ``tests/test_fused_attention.py`` checks
the matching and the replay there with the float32 reference as the kernel."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_fused_attention import _f64_attention

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
pytestmark = [
    pytest.mark.skipif(not CUDA, reason="the kernels are CUDA kernels: need MLX's CUDA backend and a GPU"),
    pytest.mark.timeout(300),
]


def _inputs(hq: int, hkv: int, lq: int, cap: int, d: int, dt: mx.Dtype, rows: int, live: int, seed: int):
    """q, k, v and a mask of ``rows`` rows whose first ``live`` positions are visible
    (``live`` 0: a row that hides every key)."""
    mx.random.seed(seed)
    q = mx.random.normal((1, hq, lq, d)).astype(dt)
    k = mx.random.normal((1, hkv, cap, d)).astype(dt)
    v = mx.random.normal((1, hkv, cap, d)).astype(dt)
    lim = np.minimum(live + np.arange(rows), cap) if live else np.zeros(rows, dtype=np.int64)
    mask = mx.array(np.arange(cap)[None, :] < lim[:, None])
    return q, k, v, mask


@settings(max_examples=examples(20), deadline=None)
@given(
    heads=hst.sampled_from([(32, 8), (8, 2), (4, 4), (8, 1), (6, 3)]),
    lq=hst.integers(1, 3),
    cap=hst.sampled_from([1, 31, 32, 33, 300, 1280]),
    d=hst.sampled_from([64, 128]),
    dt=hst.sampled_from([mx.bfloat16, mx.float16, mx.float32]),
    per_row=hst.booleans(),
    data=hst.data(),
)
def test_one_kernel_gives_the_two_kernels_bytes_call_after_call(heads, lq, cap, d, dt, per_row, data) -> None:
    from segc.lower.cuda_attention import cuda_attention

    hq, hkv = heads
    scale = d**-0.5
    one = mx.compile(lambda q, k, v, m: cuda_attention(q, k, v, m, scale, kernels=1))
    two = mx.compile(lambda q, k, v, m: cuda_attention(q, k, v, m, scale, kernels=2))
    rows = lq if per_row else 1
    for call in range(3):  # one compiled function: its counter must be zero again at each call
        live = data.draw(hst.integers(0, cap), label=f"live positions, call {call}")
        xs = _inputs(hq, hkv, lq, cap, d, dt, rows, live, seed=data.draw(hst.integers(0, 999)))
        got, want = one(*xs), two(*xs)
        mx.eval(got, want)
        assert got.shape == (1, hq, lq, d) and got.dtype == dt
        assert same_bits(got, want), f"call {call}: one kernel differs from two"


def test_two_attentions_in_one_compiled_function_each_have_their_counter() -> None:
    """Two attentions with no data between them (MLX may run their kernels at once)."""
    from segc.lower.cuda_attention import cuda_attention

    def both(kernels):
        def f(a, b):
            return cuda_attention(*a, 0.125, kernels=kernels), cuda_attention(*b, 0.125, kernels=kernels)

        return mx.compile(lambda *xs: f(xs[:4], xs[4:]))

    one, two = both(1), both(2)
    for call in range(4):
        a = _inputs(32, 8, 1, 1280, 64, mx.bfloat16, 1, 1025 + call, seed=call)
        b = _inputs(32, 8, 1, 1280, 64, mx.bfloat16, 1, 17 + call, seed=100 + call)
        got, want = one(*a, *b), two(*a, *b)
        mx.eval(got, want)
        for x, y in zip(got, want, strict=True):
            assert same_bits(x, y), f"call {call}"


def test_one_compiled_function_called_again_before_an_eval() -> None:
    """Calls of one compiled function with no data between them, evaluated together (an
    engine stepping several sequences, or one model's layers through one segment): MLX
    may run their kernels at once, and each call must still give its bytes alone."""
    from segc.lower.cuda_attention import cuda_attention

    one = mx.compile(lambda q, k, v, m: cuda_attention(q, k, v, m, 0.125, kernels=1))
    two = mx.compile(lambda q, k, v, m: cuda_attention(q, k, v, m, 0.125, kernels=2))
    for rnd in range(6):
        xs = [_inputs(32, 8, 1, 1280, 64, mx.bfloat16, 1, 1025 - 7 * i, seed=10 * rnd + i) for i in range(8)]
        got = [one(*x) for x in xs]
        mx.eval(got)
        for i, (x, g) in enumerate(zip(xs, got, strict=True)):
            want = two(*x)
            mx.eval(want)
            assert same_bits(g, want), f"round {rnd}, call {i} of 8 evaluated together"


@pytest.mark.parametrize("live", [0, 1, 200, 300])
def test_one_kernel_is_softmax_attention(live: int) -> None:
    from segc.lower.cuda_attention import cuda_attention

    q, k, v, mask = _inputs(8, 2, 1, 300, 64, mx.float32, 1, live, seed=live)
    got = np.array(cuda_attention(q, k, v, mask, 0.125, kernels=1))
    # MLX's CUDA float32 products round like TF32; the kernel is float32 throughout
    np.testing.assert_allclose(got, _f64_attention(q, k, v, mask, 0.125), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dt", [mx.bfloat16, mx.float32])
def test_the_staged_chunk_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch, d: int, dt: mx.Dtype) -> None:
    """``SEGC_ATTENTION_STAGE=1`` (each block's keys and values read into shared memory
    first) against ``0``, one kernel and two, over a buffer of 1,280 positions."""
    from segc.lower.cuda_attention import cuda_attention

    xs = _inputs(32, 8, 1, 1280, d, dt, 1, 1025, seed=d)
    outs = {}
    for stage in ("0", "1"):
        monkeypatch.setenv("SEGC_ATTENTION_STAGE", stage)
        outs[stage] = [cuda_attention(*xs, d**-0.5, kernels=n) for n in (1, 2)]
        mx.eval(outs[stage])
    assert all(same_bits(a, b) for a, b in zip(outs["0"], outs["1"], strict=True))


@pytest.mark.parametrize("size", ["64", "128"])
@pytest.mark.parametrize("stage", ["0", "1"])
def test_larger_chunks_one_kernel_is_two_and_softmax_attention(
    monkeypatch: pytest.MonkeyPatch, size: str, stage: str
) -> None:
    """``SEGC_ATTENTION_CHUNK`` 64 and 128, staged and not: the one kernel gives the two
    kernels' bytes over 1,280 positions (1,025 live) and over 300 (a row hiding every
    key), and is softmax attention within float32's rounding."""
    from segc.lower.cuda_attention import cuda_attention

    monkeypatch.setenv("SEGC_ATTENTION_CHUNK", size)
    monkeypatch.setenv("SEGC_ATTENTION_STAGE", stage)
    for xs in (
        _inputs(32, 8, 1, 1280, 64, mx.bfloat16, 1, 1025, seed=7),
        _inputs(8, 2, 2, 300, 64, mx.float32, 2, 0, 8),
    ):
        one, two = (cuda_attention(*xs, 0.125, kernels=n) for n in (1, 2))
        mx.eval(one, two)
        assert same_bits(one, two)
    q, k, v, mask = _inputs(8, 2, 1, 300, 64, mx.float32, 1, 200, seed=9)
    got = np.array(cuda_attention(q, k, v, mask, 0.125, kernels=1))
    np.testing.assert_allclose(got, _f64_attention(q, k, v, mask, 0.125), rtol=1e-4, atol=1e-4)
