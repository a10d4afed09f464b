"""The ``add`` and ``glu`` CUDA kernels (``segc.lower.cuda_products``) against MLX's own
kernels on the GPU, byte for byte: a product, then the residual addition or the gated
activation, each as MLX runs it eagerly (its ``gemv``, then its elementwise kernels).
On a machine without CUDA these tests cannot run; ``tests/test_products.py`` checks the
finder and the replay there."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import examples, products_in_agreeing_decodes, same_bits
from hypothesis import assume, given, settings
from hypothesis import strategies as hst
from test_cuda_emulated import chain_match
from test_layer_emulated import _layer

from segc.dtypes import short
from segc.lower import products
from segc.lower.products import ProductMatch
from segc.models.zoo import build

CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
pytestmark = [
    pytest.mark.skipif(not CUDA, reason="the kernels are CUDA kernels: needs MLX's CUDA backend and a GPU"),
    pytest.mark.timeout(300),
]

DTYPES = [mx.bfloat16, mx.float16, mx.float32]


def _values(shape, dtype, seed: int, odd: bool) -> mx.array:
    r = np.random.default_rng(seed)
    if odd:  # random bytes: NaNs with payloads, infinities, -0.0, subnormals
        raw = r.integers(0, 256, size=int(np.prod(shape)) * dtype.size, dtype=np.uint8)
        return mx.array(raw).view(dtype).reshape(shape)
    return mx.array(r.standard_normal(shape).astype(np.float32)).astype(dtype)


@settings(max_examples=examples(25), deadline=None)
@given(
    dt=hst.sampled_from(DTYPES),
    k=hst.sampled_from([1, 7, 64, 96, 128, 200, 256, 2048, 8192]),
    n=hst.sampled_from([1, 5, 8, 33, 128, 1000]),
    p_first=hst.booleans(),
    odd=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_add_is_mlx_gemv_then_add(dt, k, n, p_first, odd, seed) -> None:
    x = _values((1, k), dt, seed, odd)
    w = _values((n, k), dt, seed + 1, odd)
    r = _values((1, 1, n), dt, seed + 2, odd)
    y = (x @ w.T).reshape(1, 1, n)
    want = y + r if p_first else r + y
    m = ProductMatch("add", ("x", "w", "r"), (0,), n, (p_first,), "o", (1, 1, n), 0, frozenset())
    got = products.product_kernel("auto")(m, [x, w, r])  # type: ignore[misc]
    assert same_bits(got, want)


@settings(max_examples=examples(25), deadline=None)
@given(
    dt=hst.sampled_from(DTYPES),
    k=hst.sampled_from([1, 7, 64, 96, 128, 256, 2048]),
    n=hst.sampled_from([1, 5, 8, 33, 128, 1000]),
    concat=hst.booleans(),
    orders=hst.tuples(hst.booleans(), hst.booleans()),
    odd=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_glu_is_mlx_gemv_then_silu_times_up(dt, k, n, concat, orders, odd, seed) -> None:
    x = _values((1, k), dt, seed, odd)
    wg, wu = _values((n, k), dt, seed + 1, odd), _values((n, k), dt, seed + 2, odd)
    if concat:
        w = mx.concatenate([wu, wg])  # the up rows first: the offsets must be read
        y = x @ w.T
        gv, uv = y[:, n:], y[:, :n]
        m = ProductMatch("glu", ("x", "w"), (n, 0), n, orders, "o", (1, 1, n), 0, frozenset())
        ins = [x, w]
    else:
        gv, uv = x @ wg.T, x @ wu.T
        m = ProductMatch("glu", ("x", "wg", "wu"), (0, 0), n, orders, "o", (1, 1, n), 0, frozenset())
        ins = [x, wg, wu]
    gv, uv = gv.reshape(1, 1, n), uv.reshape(1, 1, n)
    s = mx.sigmoid(gv)
    gs = gv * s if orders[0] else s * gv
    want = gs * uv if orders[1] else uv * gs
    got = products.product_kernel("auto")(m, ins)  # type: ignore[misc]
    assert same_bits(got, want)


@settings(max_examples=examples(30), deadline=None)
@given(
    dt=hst.sampled_from(DTYPES),
    k=hst.sampled_from([7, 64, 100, 512, 1536, 1600, 2048, 4096, 8192]),
    n=hst.sampled_from([1, 5, 33, 256]),
    kind=hst.sampled_from(["gemv", "add", "glu"]),
    eps=hst.sampled_from([1e-5, 1e-6, 0.5]),
    odd=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_a_norm_first_is_mlx_rms_norm_then_the_product(dt, k, n, kind, eps, odd, seed) -> None:
    assume(products.norm_blocks(k, short(dt)) is not None)  # else MLX's other norm kernel: never taken
    xin = _values((1, 1, k), dt, seed, odd)
    nw = _values((k,), dt, seed + 1, odd)
    w = _values((2 * n if kind == "glu" else n, k), dt, seed + 2, odd)
    r = _values((1, 1, n), dt, seed + 3, odd)
    x = mx.fast.rms_norm(xin, nw, eps).reshape(1, k)
    y = x @ w.T
    if kind == "gemv":
        want, ins, shape = y, [xin, w, nw], (1, n)
    elif kind == "add":
        want, ins, shape = y.reshape(1, 1, n) + r, [xin, w, r, nw], (1, 1, n)
    else:
        gv, uv = y[:, :n].reshape(1, 1, n), y[:, n:].reshape(1, 1, n)
        want, ins, shape = (gv * mx.sigmoid(gv)) * uv, [xin, w, nw], (1, 1, n)
    rows = (0, n) if kind == "glu" else (0,)
    order = (True, True) if kind == "glu" else (True,) if kind == "add" else ()
    m = ProductMatch(kind, tuple(f"i{i}" for i in range(len(ins))), rows, n, order, "o", shape, 0, frozenset(), eps)
    got = products.product_kernel("auto")(m, ins)  # type: ignore[misc]
    assert same_bits(got, want)


def _qweight(rows: int, k: int, dt, group: int, bits: int, seed: int, odd: bool) -> list[mx.array]:
    """A packed weight of random words (every word is some quantized weight) and its
    scales and biases."""
    r = np.random.default_rng(seed)
    w = mx.array(r.integers(0, 2**32, size=(rows, k * bits // 32), dtype=np.uint32))
    return [w, _values((rows, k // group), dt, seed + 1, odd), _values((rows, k // group), dt, seed + 2, odd)]


@settings(max_examples=examples(30), deadline=None)
@given(
    dt=hst.sampled_from(DTYPES),
    bits=hst.sampled_from([2, 3, 4, 5, 6, 8]),
    group=hst.sampled_from([32, 64, 128]),
    k=hst.sampled_from([128, 384, 640, 2048, 8192]),
    n=hst.sampled_from([1, 5, 33, 256, 1000]),
    kind=hst.sampled_from(["gemv", "add", "glu", "glu2"]),
    eps=hst.sampled_from([None, 1e-5]),
    orders=hst.tuples(hst.booleans(), hst.booleans()),
    odd=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_quantized_kernels_are_mlx_qmv_then_the_rest(dt, bits, group, k, n, kind, eps, orders, odd, seed) -> None:
    """Over quantized weights: (a norm first, then) MLX's ``qmv`` for each row, then the
    residual addition or the gated activation (one concatenated weight, or two:
    ``glu2``), byte for byte MLX's own kernels one after another."""
    assume(eps is None or products.norm_blocks(k, short(dt)) is not None)
    xin = _values((1, 1, k), dt, seed, odd)
    nw = _values((k,), dt, seed + 3, odd)
    r = _values((1, 1, n), dt, seed + 4, odd)
    x = xin if eps is None else mx.fast.rms_norm(xin, nw, eps)

    def qmm(w):
        return mx.quantized_matmul(x, *w, transpose=True, group_size=group, bits=bits)

    if kind == "glu2":
        wg, wu = _qweight(n, k, dt, group, bits, seed + 5, odd), _qweight(n, k, dt, group, bits, seed + 8, odd)
        gv, uv, ws, rows = qmm(wg), qmm(wu), [*wg, *wu], (0, 0)
    elif kind == "glu":
        w = _qweight(2 * n, k, dt, group, bits, seed + 5, odd)
        y = qmm(w)
        gv, uv, ws, rows = y[..., n:], y[..., :n], w, (n, 0)  # the up rows first: the offsets must be read
    else:
        w = _qweight(n, k, dt, group, bits, seed + 5, odd)
        y, ws, rows = qmm(w), w, (0,)
    if kind == "gemv":
        want, ins, order = y, [xin, *ws], ()
    elif kind == "add":
        want, ins, order = (y + r if orders[0] else r + y), [xin, *ws, r], orders[:1]
    else:
        s = mx.sigmoid(gv)
        gs = gv * s if orders[0] else s * gv
        want, ins, order = (gs * uv if orders[1] else uv * gs), [xin, *ws], orders
    ins += [nw] if eps is not None else []
    m = ProductMatch(
        "glu" if kind == "glu2" else kind,
        tuple(f"i{i}" for i in range(len(ins))),
        rows,
        n,
        order,
        "o",
        (1, 1, n),
        0,
        frozenset(),
        eps,
        (group, bits),
    )
    got = products.product_kernel("auto")(m, ins)  # type: ignore[misc]
    assert same_bits(got, want)


@settings(max_examples=examples(30), deadline=None)
@given(
    dt=hst.sampled_from(DTYPES),
    k=hst.sampled_from([7, 64, 2048]),
    h=hst.sampled_from([64, 100, 512, 2048, 4096]),
    n=hst.sampled_from([1, 5, 33, 1000, 8192]),
    concat=hst.booleans(),
    orders=hst.tuples(*[hst.booleans()] * 4),
    eps=hst.sampled_from([1e-5, 0.5]),
    odd=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_a_chain_is_mlx_s_kernels_for_a_layers_mlp(dt, k, h, n, concat, orders, eps, odd, seed) -> None:
    """A layer's MLP as one kernel (``cuda_chain.py``): the output product and the
    residual, the norm, the gate and up products and the gated activation, the down
    product and the residual, each as MLX runs it eagerly, byte for byte; and with the
    next normed product as its fourth stage (of 1 to 3,000 rows)."""
    assume(max(2 * h, n) * dt.size <= 40 * 1024)  # what the finder takes (product_chain.SHARED_MAX)
    o, wo = _values((1, k), dt, seed, odd), _values((h, k), dt, seed + 1, odd)
    r, nw = _values((1, 1, h), dt, seed + 2, odd), _values((h,), dt, seed + 3, odd)
    wg, wu = _values((n, h), dt, seed + 4, odd), _values((n, h), dt, seed + 5, odd)
    wd = _values((h, n), dt, seed + 6, odd)
    pfa, gfirst, gsfirst, pfc = orders
    y = (o @ wo.T).reshape(1, 1, h)
    hh = y + r if pfa else r + y
    hn = mx.fast.rms_norm(hh, nw, eps).reshape(1, h)
    if concat:
        w = mx.concatenate([wg, wu] if orders[1] else [wu, wg])
        yy = hn @ w.T
        gv, uv = (yy[:, :n], yy[:, n:]) if orders[1] else (yy[:, n:], yy[:, :n])
        ws = [w]
    else:
        gv, uv, ws = hn @ wg.T, hn @ wu.T, [wg, wu]
    s = mx.sigmoid(gv)
    gs = gv * s if gfirst else s * gv
    act = gs * uv if gsfirst else uv * gs
    d = (act.reshape(1, n) @ wd.T).reshape(1, 1, h)
    want = d + hh if pfc else hh + d
    m = chain_match(h, n, concat, orders, eps, (1, 1, h))
    got = products.product_kernel("auto")(m, [o, wo, r, *ws, nw, wd])  # type: ignore[misc]
    assert same_bits(got, want)
    # with its fourth part: the normed product of what it wrote, as MLX runs it eagerly
    nq = 1 + seed % 3000
    wq, nw2 = _values((nq, h), dt, seed + 7, odd), _values((h,), dt, seed + 8, odd)
    q = mx.fast.rms_norm(want, nw2, 1e-6).reshape(1, h) @ wq.T
    d = ProductMatch("gemv", (m.out, "wq", "nw2"), (0,), nq, (), "q", (1, nq), 3, frozenset(), eps=1e-6)
    m4 = ProductMatch(
        "chain", (*m.ins, "wq", "nw2"), m.rows, n, m.order, m.out, m.shape, 3, frozenset(), m.eps, None, (*m.parts, d)
    )
    got4 = products.product_kernel("auto")(m4, [o, wo, r, *ws, nw, wd, wq, nw2])  # type: ignore[misc]
    assert same_bits(got4[0], want) and same_bits(got4[1], q)


@settings(max_examples=examples(20), deadline=None)
@given(
    dt=hst.sampled_from(DTYPES),
    heads=hst.sampled_from([(32, 8), (8, 8), (4, 1)]),
    d=hst.sampled_from([64, 128]),
    cap=hst.sampled_from([1, 33, 256, 1025]),
    h=hst.sampled_from([64, 2048]),
    n=hst.sampled_from([5, 8192]),
    nq=hst.sampled_from([0, 3072, 7]),
    data=hst.data(),
)
def test_a_layer_kernel_is_the_pair_then_the_chain(dt, heads, d, cap, h, n, nq, data) -> None:
    """A decode layer as one kernel (``cuda_layer.py``) against the rotated write with
    its attention (``cuda_kvattention.py``) followed by the chain (``cuda_chain.py``),
    each as it runs alone: every output byte for byte."""

    from segc.lower import cuda_chain, cuda_kvattention, cuda_layer

    hq, hkv = heads
    assume(max(2 * h, n, hq * d) * dt.size <= 40 * 1024)
    pos = data.draw(hst.integers(0, cap - 1), label="offset")
    seed = data.draw(hst.integers(0, 2**31), label="seed")
    kb, vb = _values((1, hkv, cap, d), dt, seed, False), _values((1, hkv, cap, d), dt, seed + 1, False)
    k, v, q = (_values((1, x, 1, d), dt, seed + 2 + i, False) for i, x in enumerate((hkv, hkv, hq)))
    off, mask = mx.array(pos, dtype=mx.int32), mx.array(np.arange(cap)[None, :] <= pos)
    r, nw, nw2 = (_values(s, dt, seed + 5 + i, False) for i, s in enumerate([(1, 1, h), (h,), (h,)]))
    wo, wgu = _values((h, hq * d), dt, seed + 8, False) * 0.1, _values((2 * n, h), dt, seed + 9, False) * 0.1
    wd, wq = _values((h, n), dt, seed + 10, False) * 0.1, _values((max(nq, 1), h), dt, seed + 11, False) * 0.1
    m = _layer(hq, hkv, h, n, nq, d, False, False)
    rest = [r, wgu, nw, wd, *([wq, nw2] if nq else [])]
    ko, vo, att = cuda_kvattention.kv_attention([kb, k, vb, v, off, q], mask, d, False, 10000.0, 1.0, False, 0.125)
    chain = replace(m, kind="chain", pair=None)  # (the layer's chain, as product_match.layer_parts makes it)
    want = cuda_chain.chain(chain, [att.reshape(1, hq * d), wo, *rest])
    want = want if isinstance(want, list) else [want]
    got = cuda_layer.layer(m, [kb, k, vb, v, off, q, mask, wo, *rest])
    assert same_bits(got[0], ko) and same_bits(got[1], vo)
    assert all(same_bits(a, b) for a, b in zip(got[2:], want, strict=True))


@pytest.mark.parametrize("chains", ["1", "0"])
@pytest.mark.parametrize("concat", [False, True])
@pytest.mark.parametrize("bits", [None, 4])
def test_a_llama_decode_keeps_its_bits_with_the_kernels(bits, concat, chains, monkeypatch) -> None:
    """segc with the kernels against segc with MLX's kernels (``FUSED_PRODUCTS =
    "never"``): logits and caches byte for byte over a prompt and ten decode steps; also
    quantized (4 bits, mlx-lm's groups of 64; every product's row longer than a group: the
    prompt's products with a row no longer than a group go to MLX's ``qmm_sm90``, whose
    results change from call to call, docs/gpu.md)."""
    model = build("llama", num_hidden_layers=2, hidden_size=256, intermediate_size=1024, head_dim=64, dtype=mx.bfloat16)
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
    monkeypatch.setenv("SEGC_CHAIN_PRODUCTS", chains)
    matches = products_in_agreeing_decodes(monkeypatch, model, concat_projections=concat)
    seen = [(m.kind, m.quant) for m in matches]
    q = (64, bits) if bits else None
    # q/k/v (one product or three) with their norm, and the logits with the final norm
    gemvs = 3 if concat else 7
    if chains == "1" and not bits:  # each layer's MLP one kernel (the quantized ones stay three)
        chained = [m for m in matches if m.kind in ("chain", "layer")]
        # with the attention before it: a layer (layer_chain.py), the write's kernel not called
        assert len(chained) >= 2 and {m.kind for m in chained} == {"layer"} and ("glu", q) not in seen, seen
        # the last layer's chain takes the head; with q, k and v concatenated the first's
        # takes the next layer's (one segment: no cut between them)
        assert sum(len(m.parts) == 4 for m in chained) >= (2 if concat else 1), seen
        gemvs -= 2 if concat else 1
    else:
        assert seen.count(("glu", q)) >= 2 and seen.count(("add", q)) >= 4, seen
    assert seen.count(("gemv", q)) >= gemvs, seen
