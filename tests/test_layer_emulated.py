"""A decode layer as one kernel (``segc.lower.cuda_layer``) run on the CPU by
``tests/cuda_emu.py``: against the rotated write with its attention
(``cuda_kvattention.py``) followed by the chain (``cuda_chain.py``), each emulated, the
same bytes for every output (the same host arithmetic, so what differs is indexing, a
stage's wait, what it reads or a thread's share of the work), in two launches (the
counters back to zero). The bytes against MLX's kernels: ``tests/test_products_cuda.py``
on a GPU."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples
from cuda_emu import GXX, recording, run
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_cuda_emulated import _as_mx, chain_match

from segc.lower import cuda_chain, cuda_kvattention, cuda_layer
from segc.lower.attention import AttentionMatch
from segc.lower.kvwrite import KVWriteMatch
from segc.lower.product_match import ProductMatch

pytestmark = [
    pytest.mark.skipif(GXX is None, reason="needs a C++ compiler (g++) to run the kernels on the CPU"),
    pytest.mark.timeout(300),
]

recorded = pytest.fixture(name="recorded")(recording)
D = 64  # a head's size


def _layer(hq: int, hkv: int, h: int, n: int, nq: int, dims: int, trad: bool, freqs: bool) -> ProductMatch:
    """A layer's match as ``layer_chain.chain_layers`` makes it (names stand for values)."""
    ins = ("kb", "k", "vb", "v", "off", "q", *(["freqs"] if freqs else []))
    w = KVWriteMatch(ins, ("ko", "vo", "qr"), dims, trad, None if freqs else 10000.0, 1.0, True, freqs, ())
    att = AttentionMatch("qr", "ko", "vo", "mask", 0.125, "att", 0, frozenset())
    c = chain_match(h, n, True, (True, True, False, True))
    parts = c.parts
    if nq:
        parts = (*parts, ProductMatch("gemv", ("out", "wq", "nw2"), (0,), nq, (), "yq", (1, nq), 3, frozenset(), 1e-6))
    ins = (*w.ins, "mask", *c.ins[1:], *(["wq", "nw2"] if nq else []))
    return ProductMatch("layer", ins, c.rows, n, c.order, "out", c.shape, 3, frozenset(), c.eps, None, parts, (w, att))


@pytest.mark.parametrize(
    ("dt", "hq", "hkv", "cap", "pos", "h", "n", "nq", "freqs", "blocks"),
    [
        (mx.float32, 4, 2, 70, 37, 96, 40, 0, False, None),
        (mx.bfloat16, 8, 2, 40, 39, 64, 24, 52, False, None),  # the last position written
        (mx.float16, 4, 4, 33, 0, 48, 9, 20, True, "5"),  # fewer blocks than tickets
        (mx.bfloat16, 2, 1, 300, 150, 32, 16, 8, False, None),  # the attention's tickets the most
    ],
)
def test_the_layer_kernel_is_the_pair_then_the_chain(
    recorded, monkeypatch, dt, hq, hkv, cap, pos, h, n, nq, freqs, blocks
):
    _layer_against_apart(recorded, monkeypatch, dt, hq, hkv, cap, pos, h, n, nq, freqs, blocks)


@settings(max_examples=examples(4), deadline=None)
@given(
    dt=hst.sampled_from([mx.float32, mx.bfloat16, mx.float16]),
    heads=hst.sampled_from([(4, 2), (2, 2), (8, 1)]),
    cap=hst.integers(1, 80),
    h=hst.integers(8, 72),
    n=hst.integers(1, 40),
    nq=hst.sampled_from([0, 1, 30]),
    data=hst.data(),
)
def test_the_layer_kernel_over_shapes(dt, heads, cap, h, n, nq, data) -> None:
    """Hypothesis over dtypes, head layouts, buffer sizes, offsets and row counts."""
    pos = data.draw(hst.integers(0, cap - 1), label="offset")
    freqs = data.draw(hst.booleans(), label="freqs")
    with pytest.MonkeyPatch.context() as patch:
        rec = recording(patch)
        calls = next(rec)
        _layer_against_apart(calls, patch, dt, *heads, cap, pos, h, n, nq, freqs, None)
        next(rec, None)


def _layer_against_apart(recorded, monkeypatch, dt, hq, hkv, cap, pos, h, n, nq, freqs, blocks) -> None:
    mx.random.seed(cap + pos)
    kb, vb = (mx.random.normal((1, hkv, cap, D)).astype(dt) for _ in range(2))
    k, v = (mx.random.normal((1, hkv, 1, D)).astype(dt) for _ in range(2))
    q = mx.random.normal((1, hq, 1, D)).astype(dt)
    fr = [mx.random.uniform(1.0, 9.0, (D // 2,))] if freqs else []
    off, mask = mx.array(pos, dtype=mx.int32), mx.array(np.arange(cap)[None, :] <= pos)
    r = mx.random.normal((1, 1, h)).astype(dt)
    wo, wgu = (mx.random.normal((h, hq * D)) * 0.1).astype(dt), (mx.random.normal((2 * n, h)) * 0.1).astype(dt)
    nw, nw2 = (mx.random.uniform(0.5, 1.5, (h,)).astype(dt) for _ in range(2))
    wd, wq = (mx.random.normal((h, n)) * 0.1).astype(dt), (mx.random.normal((max(nq, 1), h)) * 0.1).astype(dt)
    m = _layer(hq, hkv, h, n, nq, D, False, freqs)
    chain_w = [r, wgu, nw, wd, *([wq, nw2] if nq else [])]
    # apart: the pair's kernel, then the chain's over its output as a row
    cuda_kvattention.kv_attention([kb, k, vb, v, off, q, *fr], mask, D, False, m.pair[0].base, 1.0, freqs, 0.125)
    ((made, call),) = recorded
    ((att, ko, vo, *_),) = run(made, call)
    recorded.clear()
    chain = replace(m, kind="chain", pair=None)  # (the layer's chain, as product_match.layer_parts makes it)
    cuda_chain.chain(chain, [_as_mx(att, dt).reshape(1, hq * D), wo, *chain_w])
    ((made, call),) = recorded
    (want,) = run(made, call)
    recorded.clear()
    if blocks:
        monkeypatch.setenv("SEGC_CHAIN_BLOCKS", blocks)  # the grid, as for a chain
    got = cuda_layer.layer(m, [kb, k, vb, v, off, q, *fr, mask, wo, *chain_w])
    assert len(got) == (4 if nq else 3)
    ((made, call),) = recorded
    assert made["name"].startswith("segc_layer4" if nq else "segc_layer_")
    tickets = [hkv * -(-cap // 32), -(-h // 8), -(-n // 8), -(-h // 8), *([-(-nq // 8)] if nq else [])]
    assert call["grid"][0] == 32 * (int(blocks) if blocks else max(tickets))
    launches = run(made, call, launches=2, inputs=True)
    for launch in launches:
        assert launch[0].tobytes() == ko.tobytes() and launch[1].tobytes() == vo.tobytes()
        assert [x.tobytes() for x in launch[2 : 3 + bool(nq)]] == [x.tobytes() for x in want]
        assert launch[-1][: cuda_chain.COUNTERS].tolist() == [0] * cuda_chain.COUNTERS
        count = launch[6 + bool(nq) + 7]  # the attention's counters: the 8th input, after the outputs
        assert count.tolist() == [0] * hkv


def test_the_finder_knows_the_attention_kernels_chunk() -> None:
    """``layer_chain`` sizes a block's shared memory with the attention's chunk without
    importing the CUDA module that defines it."""
    from segc.lower import cuda_attention, layer_chain

    assert layer_chain.CHUNK == cuda_attention.CHUNK
