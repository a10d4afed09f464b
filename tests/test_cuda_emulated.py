"""segc's CUDA kernels (the attention, the rotated write, both as one, the one-row
products) run on the CPU (``tests/cuda_emu.py``: a fiber per CUDA thread, the
host's arithmetic), called through segc's own wrappers with ``mx.fast.cuda_kernel``
recorded. What the GPU tests check byte for byte is checked here for the logic, before a
device call: the one attention kernel against the two (the same host arithmetic: the
same bytes), call after call of one kernel (its counter set back to zero), both against
MLX's attention on the CPU within float32's rounding; the rotated write's copies byte
for byte and its rotations against ``mx.fast.rope`` within rounding; the write with its
attention against the two kernels; the products against MLX's ops."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples
from cuda_emu import CONTRACTED, GXX, NP, recording, run
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_attention_cuda import _inputs as _attention_inputs

from segc import dtypes
from segc.errors import UsageError
from segc.lower import cuda_attention, cuda_chain, cuda_gather, cuda_kvattention, cuda_kvwrite, cuda_products, products
from segc.lower.attention import reference_attention
from segc.lower.cuda_kernel import expand
from segc.lower.product_match import ProductMatch, norm_blocks

pytestmark = [
    pytest.mark.skipif(GXX is None, reason="needs a C++ compiler (g++) to run the kernels on the CPU"),
    pytest.mark.timeout(300),
]


recorded = pytest.fixture(name="recorded")(recording)


def _as_mx(x: np.ndarray, dt: mx.Dtype) -> mx.array:
    return mx.array(x).view(mx.bfloat16) if dt == mx.bfloat16 else mx.array(x)


def _bits(x: mx.array) -> bytes:
    return np.array(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x).tobytes()


@pytest.mark.parametrize(
    ("hq", "hkv", "lq", "rows", "cap", "live", "dt"),
    [
        (8, 2, 1, 1, 70, 40, mx.float32),
        (4, 4, 3, 3, 33, 0, mx.float32),  # a row hiding every key (live 0 for the first)
        (6, 3, 2, 1, 64, 64, mx.bfloat16),
        (4, 1, 1, 1, 1, 1, mx.float16),
        (32, 1, 1, 1, 600, 550, mx.float32),  # 32 rows a group: the merge's chunks in two tiles (cuda_merge.py)
    ],
)
def test_one_kernel_matches_two_and_mlx_call_after_call(recorded, hq, hkv, lq, rows, cap, live, dt) -> None:
    q, k, v, mask = _attention_inputs(hq, hkv, lq, cap, 64, dt, rows, live, seed=cap)
    cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=1)
    ((made1, call1),) = recorded
    one = run(made1, call1, launches=2)  # the same kernel twice: the counter must be back at zero
    recorded.clear()
    cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=2)
    (made_p, call_p), (made_c, call_c) = recorded
    (partials,) = run(made_p, call_p)
    pmx = [mx.array(x) for x in partials]
    (two,) = run(made_c, dict(call_c, inputs=[*pmx, call_c["inputs"][3]]))
    want = reference_attention(q, k, v, mask, 0.125)
    tol = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-2}[dt]
    for launch in one:
        out = _as_mx(launch[0], dt)
        assert _bits(out) == _bits(_as_mx(two[0], dt)), "one kernel differs from two"
        # the partial results too, in one output: weighted sums, maxima, sums of exponentials
        assert len(launch) == 2 and launch[1].tobytes() == b"".join(p.tobytes() for p in partials)
        np.testing.assert_allclose(
            np.array(out.astype(mx.float32)), np.array(want.astype(mx.float32)), rtol=tol, atol=tol
        )


@settings(max_examples=examples(6), deadline=None)
@given(
    heads=hst.sampled_from([(8, 2), (4, 4), (4, 1), (6, 3)]),
    lq=hst.integers(1, 3),
    per_row=hst.booleans(),
    cap=hst.integers(1, 100),
    data=hst.data(),
)
def test_one_kernel_is_two_over_shapes(heads, lq, per_row, cap, data) -> None:
    """Hypothesis over head layouts, query rows, masks and buffer sizes (chunks of 32 and
    a partial last one): the one kernel gives the two kernels' bytes, launch after launch."""
    hq, hkv = heads
    rows = lq if per_row else 1
    q, k, v, mask = _attention_inputs(hq, hkv, lq, cap, 64, mx.float32, rows, data.draw(hst.integers(0, cap)), seed=cap)
    with pytest.MonkeyPatch.context() as patch:
        rec = recording(patch)
        calls = next(rec)
        cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=1)
        cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=2)
        next(rec, None)  # the kernel makers' caches emptied again
    (m1, c1), (mp, cp), (mc, cc) = calls
    one = run(m1, c1, launches=2)
    (partials,) = run(mp, cp)
    (two,) = run(mc, dict(cc, inputs=[*(mx.array(x) for x in partials), cc["inputs"][3]]))
    for launch in one:
        assert launch[0].tobytes() == two[0].tobytes()


@pytest.mark.parametrize("form", ["one", "two", "copying", "in place"])
@pytest.mark.parametrize("dt", [mx.bfloat16, mx.float32])
def test_the_chunk_staged_in_shared_memory_changes_no_byte(recorded, monkeypatch, form, dt) -> None:
    """With ``SEGC_STAGE`` (``SEGC_ATTENTION_STAGE=1``) each block reads its chunk's keys
    and values into shared memory first where they fit: the attention's kernels, alone
    and with the write, copying or in place, give the bytes they give reading every key
    and value from memory where it is used (the default), outputs and buffers alike."""
    monkeypatch.delenv("SEGC_ATTENTION_STAGE", raising=False)
    cap, pos = 70, 45
    q, k, v, mask = _attention_inputs(8, 2, 1, cap, 64, dt, 1, pos + 1, seed=3)
    kn, vn = (mx.random.normal((1, 2, 1, 64)).astype(dt) for _ in range(2))
    ins = [k, kn, v, vn, mx.array(pos, dtype=mx.int32), q]
    if form in ("one", "two"):
        cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=1 if form == "one" else 2)
    else:
        cuda_kvattention.kv_attention(ins, mask, 64, False, 10000.0, 1.0, False, 0.125, form == "in place")
    made, call = recorded[0]
    # staged by default (SEGC_ATTENTION_STAGE=auto) for the write in place alone
    assert ("#define SEGC_STAGE\n" in expand(made["header"])) == (form == "in place")
    monkeypatch.setenv("SEGC_ATTENTION_STAGE", "0")
    recorded.clear()
    if form in ("one", "two"):
        cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=1 if form == "one" else 2)
    else:
        cuda_kvattention.kv_attention(ins, mask, 64, False, 10000.0, 1.0, False, 0.125, form == "in place")
    made, call = recorded[0]
    assert "SEGC_STAGE" not in expand(made["header"])
    monkeypatch.setenv("SEGC_ATTENTION_STAGE", "1")  # the setting makes the same kernel with the define
    recorded.clear()
    if form in ("one", "two"):
        cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=1 if form == "one" else 2)
    else:
        cuda_kvattention.kv_attention(ins, mask, 64, False, 10000.0, 1.0, False, 0.125, form == "in place")
    assert "#define SEGC_STAGE\n" in expand(recorded[0][0]["header"])
    direct = run(made, call, inputs=True)
    staged = run(dict(made, header="#define SEGC_STAGE\n" + made["header"]), call, inputs=True)
    assert [a.tobytes() for a in staged[0]] == [a.tobytes() for a in direct[0]]


@pytest.mark.parametrize("size", ["64", "128"])
def test_larger_chunks_keep_one_kernel_two_kernels_and_the_write_together(recorded, monkeypatch, size) -> None:
    """``SEGC_ATTENTION_CHUNK``: with chunks of 64 or 128 keys (a partial last one, a row
    hiding every key, a masked tail) the one kernel still gives the two kernels' bytes,
    within rounding of MLX's attention, and the write with its attention (copying and in
    place) still gives the rotated write's and the attention's bytes; the chunk is in
    the kernels' template, and their grid has a block per KV head and chunk."""
    monkeypatch.setenv("SEGC_ATTENTION_CHUNK", size)
    cap = 300
    q, k, v, mask = _attention_inputs(8, 2, 2, cap, 64, mx.float32, 2, 0, seed=5)  # row 0 hides every key
    mask = mx.concatenate([mask[:1], mx.array(np.arange(cap)[None, :] < 170)])
    cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=1)
    cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=2)
    (m1, c1), (mp, cp), (mc, cc) = recorded
    assert ("CHUNK", int(size)) in c1["template"] and c1["grid"][0] == 2 * -(-cap // int(size)) * 128
    (one,) = run(m1, c1, launches=1)
    (partials,) = run(mp, cp)
    (two,) = run(mc, dict(cc, inputs=[*(mx.array(x) for x in partials), cc["inputs"][3]]))
    assert one[0].tobytes() == two[0].tobytes()
    want = np.array(reference_attention(q, k, v, mask, 0.125))
    np.testing.assert_allclose(one[0], want, rtol=1e-5, atol=1e-5)
    recorded.clear()
    _write_with_attention_against_apart(recorded, mx.bfloat16, 8, 2, 200, 130, 64, False, False)


def test_a_counter_left_at_its_count_is_seen(recorded) -> None:
    """The check can fail: started from a counter that was not set back, no block of a
    group is the last, and the output is never written."""
    q, k, v, mask = _attention_inputs(8, 2, 1, 70, 64, mx.float32, 1, 40, seed=1)
    cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=1)
    ((made, call),) = recorded
    (good,) = run(made, call)
    stuck = mx.array(np.full(2, 99, dtype=np.uint32))
    (bad,) = run(made, dict(call, inputs=[*call["inputs"][:4], stuck]))
    assert bad[0].tobytes() != good[0].tobytes()


@pytest.mark.parametrize("dt", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize(("d", "dims", "trad", "pos", "queries"), [(64, 64, False, 5, True), (16, 8, True, 0, False)])
def test_the_rotated_write_copies_bytes_and_rotates_as_mlx(recorded, dt, d, dims, trad, pos, queries) -> None:
    mx.random.seed(pos)
    kb, vb = mx.random.normal((1, 2, 12, d)).astype(dt), mx.random.normal((1, 2, 12, d)).astype(dt)
    k, v = mx.random.normal((1, 2, 1, d)).astype(dt), mx.random.normal((1, 2, 1, d)).astype(dt)
    q = mx.random.normal((1, 8, 1, d)).astype(dt)
    ins = [kb, k, vb, v, mx.array(pos, dtype=mx.int32), *([q] if queries else [])]
    cuda_kvwrite.kv_write(ins, dims, trad, 10000.0, 1.0, queries, False)
    ((made, call),) = recorded
    (outs,) = run(made, call)
    ko, vo = (_as_mx(o, dt) for o in outs[:2])
    rows = [i for i in range(12) if i != pos]
    assert _bits(ko[:, :, rows]) == _bits(kb[:, :, rows]) and _bits(vo[:, :, rows]) == _bits(vb[:, :, rows])
    assert _bits(vo[:, :, pos : pos + 1]) == _bits(v)
    tol = 1e-5 if dt == mx.float32 else 1e-2
    rope = lambda x: mx.fast.rope(x, dims, traditional=trad, base=10000.0, scale=1.0, offset=pos)  # noqa: E731
    got_k = np.array(ko[:, :, pos : pos + 1].astype(mx.float32))
    np.testing.assert_allclose(got_k, np.array(rope(k).astype(mx.float32)), rtol=tol, atol=tol)
    if queries:
        got_q = np.array(_as_mx(outs[2], dt).astype(mx.float32))
        np.testing.assert_allclose(got_q, np.array(rope(q).astype(mx.float32)), rtol=tol, atol=tol)


@pytest.mark.parametrize("trad", [False, True])
def test_the_rotation_keeps_its_bytes_whatever_the_compiler_contracts(recorded, trad) -> None:
    """The rotated write at float32, compiled with every product the compiler likes
    contracted into its sum (``CONTRACTED``: as NVRTC may) and with none: the same
    bytes, as the rotation's two sums are spelled out as MLX's build compiled them
    (which product each fuses; docs/lowering.md). The check can fail: the same kernel
    with its sums written plainly, ``x1 * cos - x2 * sin``, differs between the two."""
    mx.random.seed(3)
    d, cap, pos = 64, 12, 7
    kb, vb = (mx.random.normal((1, 2, cap, d)) * 4 for _ in range(2))
    k, v, q = (mx.random.normal((1, h, 1, d)) * 4 for h in (2, 2, 8))
    cuda_kvwrite.kv_write([kb, k, vb, v, mx.array(pos, dtype=mx.int32), q], d, trad, 10000.0, 1.0, True, False)
    ((made, call),) = recorded
    (plain,), (fused,) = run(made, call), run(made, call, flags=CONTRACTED)
    assert [a.tobytes() for a in fused] == [a.tobytes() for a in plain]
    pinned = expand(made["header"])
    loose = pinned.replace("__fmaf_rn(x1, costheta, -__fmul_rn(x2, sintheta))", "x1 * costheta - x2 * sintheta")
    loose = loose.replace("__fmaf_rn(x1, sintheta, __fmul_rn(x2, costheta))", "x1 * sintheta + x2 * costheta")
    assert loose != pinned
    made = dict(made, header=loose)
    (plain,), (fused,) = run(made, call), run(made, call, flags=CONTRACTED)
    assert [a.tobytes() for a in fused] != [a.tobytes() for a in plain]


@settings(max_examples=examples(4), deadline=None)
@given(
    dt=hst.sampled_from([mx.float32, mx.bfloat16, mx.float16]),
    heads=hst.sampled_from([(8, 2), (4, 4), (6, 3), (4, 1)]),
    cap=hst.integers(1, 90),
    data=hst.data(),
)
def test_the_write_with_the_attention_over_shapes(dt, heads, cap, data) -> None:
    """Hypothesis over dtypes, head layouts, buffer sizes, offsets and rotations."""
    pos = data.draw(hst.integers(0, cap - 1), label="offset")
    dims = data.draw(hst.sampled_from([64, 32]), label="rotated dims")
    trad, freqs = data.draw(hst.booleans(), label="traditional"), data.draw(hst.booleans(), label="freqs")
    with pytest.MonkeyPatch.context() as patch:
        rec = recording(patch)
        calls = next(rec)
        _write_with_attention_against_apart(calls, dt, *heads, cap, pos, dims, trad, freqs)
        next(rec, None)


@pytest.mark.parametrize(
    ("dt", "hq", "hkv", "cap", "pos", "dims", "trad", "freqs"),
    [
        (mx.float32, 8, 2, 70, 37, 64, False, False),
        (mx.bfloat16, 4, 4, 32, 0, 32, True, False),
        (mx.float16, 6, 3, 40, 39, 64, False, True),
    ],
)
def test_the_write_with_the_attention_is_the_write_then_the_attention(
    recorded, dt, hq, hkv, cap, pos, dims, trad, freqs
):
    """One kernel against the rotated write's kernel followed by the attention's, on the
    same inputs: the same bytes for the new buffers and the output."""
    _write_with_attention_against_apart(recorded, dt, hq, hkv, cap, pos, dims, trad, freqs)


@pytest.mark.parametrize(
    ("dt", "pos", "dims", "trad", "freqs", "in_place"),
    [
        (mx.bfloat16, 37, 64, False, False, False),
        (mx.float32, 0, 32, True, False, True),
        (mx.float16, 39, 64, False, True, True),
    ],
)
def test_queries_rotated_first_change_no_byte(recorded, monkeypatch, dt, pos, dims, trad, freqs, in_place) -> None:
    """``SEGC_FUSED_QUERY_ROPE=mlx``: the kernel reads its queries as given, rotated first
    by MLX's ``rope`` (on the GPU the kernel's rotation is ``rope_single``'s arithmetic);
    handed the queries the rotated write's kernel rotates, it gives the bytes of the
    kernel that rotates them itself: output and buffers."""
    monkeypatch.delenv("SEGC_FUSED_QUERY_ROPE", raising=False)
    mx.random.seed(pos)
    kb, vb = (mx.random.normal((1, 2, 40, 64)).astype(dt) for _ in range(2))
    k, v = (mx.random.normal((1, 2, 1, 64)).astype(dt) for _ in range(2))
    q = mx.random.normal((1, 8, 1, 64)).astype(dt)
    f = [mx.random.uniform(1.0, 9.0, (dims // 2,))] if freqs else []
    ins = [kb, k, vb, v, mx.array(pos, dtype=mx.int32), q, *f]
    mask = mx.array(np.arange(40)[None, :] <= pos)
    base = None if freqs else 10000.0
    cuda_kvattention.kv_attention(ins, mask, dims, trad, base, 1.0, freqs, 0.125, in_place)
    ((made, call),) = recorded
    want = run(made, call, inputs=True)
    recorded.clear()
    cuda_kvwrite.kv_write(ins, dims, trad, base, 1.0, True, freqs)
    ((mw, cw),) = recorded
    ((*_, qw),) = run(mw, cw)
    recorded.clear()
    monkeypatch.setenv("SEGC_FUSED_QUERY_ROPE", "mlx")
    cuda_kvattention.kv_attention(ins, mask, dims, trad, base, 1.0, freqs, 0.125, in_place)
    ((mq, cq),) = recorded
    assert mq["name"] != made["name"] and "#define SEGC_Q(row, d) q[(size_t)(row) * D + (d)]" in expand(mq["header"])
    got = run(mq, dict(cq, inputs=[_as_mx(qw, dt), *cq["inputs"][1:]]), inputs=True)
    n = len(cq["output_shapes"])  # the outputs, then the inputs as the launch left them (the queries differ)
    assert n == (2 if in_place else 4)
    assert [a.tobytes() for a in got[0][:n] + got[0][n + 1 :]] == [a.tobytes() for a in want[0][:n] + want[0][n + 1 :]]
    monkeypatch.setenv("SEGC_FUSED_QUERY_ROPE", "yes")
    with pytest.raises(UsageError, match="SEGC_FUSED_QUERY_ROPE must be kernel or mlx"):
        cuda_kvattention.kv_attention(ins, mask, dims, trad, base, 1.0, freqs, 0.125, in_place)


@pytest.mark.parametrize(("dt", "d", "dims"), [(mx.float16, 36, 32), (mx.float32, 18, 16)])
def test_the_write_with_the_attention_copies_rows_of_any_size(recorded, dt, d, dims) -> None:
    """Rows whose bytes are no multiple of 16 (the copy's vectors): element by element,
    the same bytes as the write's kernel followed by the attention's."""
    _write_with_attention_against_apart(recorded, dt, 4, 2, 45, 33, dims, False, False, d)


def _write_with_attention_against_apart(recorded, dt, hq, hkv, cap, pos, dims, trad, freqs, d=64) -> None:
    mx.random.seed(pos)
    kb, vb = (mx.random.normal((1, hkv, cap, d)).astype(dt) for _ in range(2))
    k, v = (mx.random.normal((1, hkv, 1, d)).astype(dt) for _ in range(2))
    q = mx.random.normal((1, hq, 1, d)).astype(dt)
    ins = [
        kb,
        k,
        vb,
        v,
        mx.array(pos, dtype=mx.int32),
        q,
        *([mx.random.uniform(1.0, 9.0, (dims // 2,))] if freqs else []),
    ]
    mask = mx.array(np.arange(cap)[None, :] <= pos)
    base = None if freqs else 10000.0
    cuda_kvattention.kv_attention(ins, mask, dims, trad, base, 1.0, freqs, 0.125)
    ((made, call),) = recorded
    ((out, ko, vo, *_),) = run(made, call)
    recorded.clear()
    cuda_kvwrite.kv_write(ins, dims, trad, base, 1.0, True, freqs)
    ((mw, cw),) = recorded
    ((kw, vw, qw),) = run(mw, cw)
    kw, vw, qw = (_as_mx(x, dt) for x in (kw, vw, qw))
    recorded.clear()
    cuda_attention.cuda_attention(qw, kw, vw, mask, 0.125, kernels=1)
    ((ma, ca),) = recorded
    ((want, *_),) = run(ma, ca)
    assert ko.tobytes() == np.array(kw.view(mx.uint16) if dt == mx.bfloat16 else kw).tobytes()
    assert vo.tobytes() == np.array(vw.view(mx.uint16) if dt == mx.bfloat16 else vw).tobytes()
    assert out.tobytes() == want.tobytes()
    # in place (SEGC_KV_IN_PLACE=1): no new buffers; the old ones as the launch left
    # them are the copies' bytes, and the output is the same
    recorded.clear()
    cuda_kvattention.kv_attention(ins, mask, dims, trad, base, 1.0, freqs, 0.125, in_place=True)
    ((mi, ci),) = recorded
    assert len(ci["output_shapes"]) == 2 and mi["name"].startswith("segc_kv_attention")
    ((oi, _, *left),) = run(mi, ci, inputs=True)
    assert oi.tobytes() == out.tobytes()
    assert left[2].tobytes() == ko.tobytes() and left[4].tobytes() == vo.tobytes()


@pytest.mark.parametrize("kind", ["gemv", "add", "glu"])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(("dt", "k", "n"), [(mx.float32, 256, 24), (mx.bfloat16, 512, 10), (mx.float16, 64, 9)])
def test_the_product_kernels_compute_mlx_s_products(recorded, kind, norm, dt, k, n) -> None:
    """The one-row products (``cuda_products.py``: ``gemv``, with a residual, the gate
    and up with SwiGLU; each after an RMS norm or not) against MLX's ops on the CPU,
    within the dtype's rounding (row counts not a multiple of the block's 8 rows)."""
    mx.random.seed(k + n)
    x = mx.random.normal((1, k)).astype(dt)
    w, wu = (mx.random.normal((n, k)).astype(dt) * 0.1 for _ in range(2))
    r = mx.random.normal((1, n)).astype(dt)
    nw = mx.random.uniform(0.5, 1.5, (k,)).astype(dt)
    ins = {"gemv": [x, w], "add": [x, w, r], "glu": [x, w, wu]}[kind] + ([nw] if norm else [])
    order = {"gemv": (), "add": (True,), "glu": (True, True)}[kind]
    rows = (0, 0) if kind == "glu" else (0,)
    blocks = norm_blocks(k, dtypes.short(dt))
    assert blocks is not None  # MLX launches its norm kernel for each of these row sizes
    cuda_products.product(kind, ins, rows, n, (1, n), order, (1e-5, blocks) if norm else None)
    ((made, call),) = recorded
    ((out,),) = run(made, call)
    got = np.array(_as_mx(out, dt).astype(mx.float32))
    xn = mx.fast.rms_norm(x, nw, 1e-5) if norm else x
    y = xn @ w.T
    want = {"gemv": y, "add": y + r, "glu": (y * mx.sigmoid(y)) * (xn @ wu.T)}[kind]
    tol = {mx.float32: 1e-4, mx.float16: 1e-2, mx.bfloat16: 5e-2}[dt]
    np.testing.assert_allclose(got, np.array(want.astype(mx.float32)), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["gglu", "gmoe"])
@pytest.mark.parametrize("orders", [(True, True), (False, False)])
@pytest.mark.parametrize(
    ("dt", "k", "n", "experts", "slots"),
    [(mx.float32, 256, 24, 8, 2), (mx.bfloat16, 512, 10, 4, 3), (mx.float16, 64, 9, 3, 1)],
)
def test_the_gathered_kernels_compute_mlx_s_gather_mm(recorded, kind, orders, dt, k, n, experts, slots) -> None:
    """A mixture-of-experts step's kernels (``cuda_gather.py``: the experts' gate and up
    with SwiGLU; their down products weighted by the scores, summed, plus the residual)
    against MLX's ops (``products.reference_products``, float32 on the CPU) within the
    dtype's rounding; experts picked out of order, one twice."""
    mx.random.seed(k + n + slots)
    idx = mx.array([(3 * j + 1) % experts if j != 2 else 1 for j in range(slots)], dtype=mx.uint32).reshape(1, 1, slots)
    if kind == "gglu":
        ins = [
            mx.random.normal((1, 1, 1, 1, k)).astype(dt),
            *(mx.random.normal((experts, n, k)).astype(dt) * 0.1 for _ in range(2)),
            idx,
        ]
        shape: tuple[int, ...] = (1, 1, slots, 1, n)
    else:
        ins = [
            mx.random.normal((1, 1, slots, 1, k)).astype(dt),
            mx.random.normal((experts, n, k)).astype(dt) * 0.1,
            mx.softmax(mx.random.normal((1, 1, slots)), axis=-1).astype(dt),
            mx.random.normal((1, 1, n)).astype(dt),
            idx,
        ]
        shape = (1, 1, n)
    m = ProductMatch(kind, ("x",) * len(ins), (0, 0), n, orders, "o", shape, 0, frozenset())
    cuda_gather.gathered(kind, ins, n, shape, orders)
    ((made, call),) = recorded
    ((out,),) = run(made, call)
    got = np.array(_as_mx(out, dt).astype(mx.float32))
    want = products.reference_products(m, [x if x.dtype == mx.uint32 else x.astype(mx.float32) for x in ins])
    tol = {mx.float32: 1e-4, mx.float16: 1e-2, mx.bfloat16: 5e-2}[dt]
    np.testing.assert_allclose(got, np.array(want), rtol=tol, atol=tol)


def _emulated_decode(monkeypatch: pytest.MonkeyPatch, model: Any, makers: tuple[Any, ...], **jit: Any) -> list[str]:
    """``model`` decoded by ``segc.jit(model, validate=False, **jit)`` with segc's product
    kernels (and any attention kernel ``jit`` names) as the CUDA build would call them,
    each run by the emulator (``mx.fast.cuda_kernel`` replaced; segments not
    ``mx.compile``d, so that each kernel call sees its inputs' data; ``makers``' caches
    emptied before and after), against eager mlx-lm within float32's rounding (the
    emulator's arithmetic is the host's) over a prompt and three steps; the names of the
    kernels called, in order."""
    from mlx_lm.models.cache import make_prompt_cache

    import segc
    from segc.lower import cuda_kernel

    called: list[str] = []

    def make(**made):
        def call(**kw):
            mx.eval(kw["inputs"])
            called.append(made["name"])
            (outs,) = run(made, kw)
            return [_as_mx(o, t) for o, t in zip(outs, kw["output_dtypes"], strict=True)]

        return call

    monkeypatch.setattr(cuda_kernel.mx.fast, "cuda_kernel", make)
    monkeypatch.setattr(mx, "compile", lambda f, *a, **k: f)
    monkeypatch.setattr(products, "FUSED_PRODUCTS", products.cuda_products)
    for f in makers:
        f.cache_clear()
    step = segc.jit(model, validate=False, **jit)
    mine, theirs = make_prompt_cache(model), make_prompt_cache(model)
    tokens = mx.array([[3, 1, 4, 1, 5]])
    try:
        for k in range(4):
            got, want = step(tokens, cache=mine), model(tokens, cache=theirs)
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4, err_msg=f"call {k}")
            tokens = mx.argmax(want[:, -1:], axis=-1)
    finally:
        for f in makers:
            f.cache_clear()
    return called


def test_a_decode_through_segc_with_its_kernels_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lowering's wiring, before a GPU: a tiny llama decoded through the attention
    and product kernels, each run by the emulator (:func:`_emulated_decode`)."""
    from segc.models import tiny_llama

    model = tiny_llama(
        hidden_size=128, num_hidden_layers=2, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2
    )
    makers = (cuda_attention._one_kernel, cuda_products._kernel)
    called = _emulated_decode(
        monkeypatch, model, makers, boundaries="layers.*", attention=cuda_attention.cuda_attention
    )
    attn = [n for n in called if n.startswith("segc_attention_one")]
    # every layer's attention in every call: a callable kernel takes the prompt's too (at
    # most 16 query rows, docs/lowering.md), "auto" on a GPU only the decode steps'
    assert len(attn) == 2 * 4, called
    assert any(n.startswith("segc_gemv") for n in called), called  # and products


def test_a_mixtral_decode_through_segc_with_its_gathered_kernels_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gathered kernels' wiring (``cuda_gather.py`` through ``products.cuda_products``):
    a tiny float32 mixtral decoded through the product kernels, each run by the emulator
    (:func:`_emulated_decode`)."""
    from segc.models.zoo import build

    model = build("mixtral", num_hidden_layers=2, hidden_size=128, intermediate_size=256, dtype=mx.float32)
    called = _emulated_decode(monkeypatch, model, (cuda_products._kernel, cuda_gather._kernel), attention="off")
    kinds = [n.rsplit("_", 1)[0] for n in called]  # the name without its source's hash
    assert kinds.count("segc_gather_gglu") == kinds.count("segc_gather_gmoe") == 2 * 3, called


def _chain_rows(state: np.ndarray, h: int, n: int, dt: mx.Dtype) -> tuple[np.ndarray, np.ndarray]:
    """``h`` and ``a`` as the chain kernel left them in its state (after the counters,
    ``a`` 16-byte aligned; bfloat16 as its uint16 bits)."""
    words = state[cuda_chain.COUNTERS :].view(NP[dt])
    step = 16 // dt.size
    start = -(-h // step) * step
    return words[:h], words[start : start + n]


def chain_match(
    h: int, n: int, concat: bool, orders: tuple[bool, ...], eps: float = 1e-5, shape: tuple[int, ...] = ()
) -> ProductMatch:
    """A chain (``product_chain.py``): ``h`` hidden rows, ``n`` inner, its output of
    ``shape`` (default ``(1, h)``); concatenated, the gate's rows first where the gate's
    value comes first in its product with the sigmoid (``orders[1]``)."""
    shape = shape or (1, h)
    a = ProductMatch("add", ("o", "wo", "r"), (0,), h, orders[:1], "h", shape, 0, frozenset())
    rows = ((0, n) if orders[1] else (n, 0)) if concat else (0, 0)
    ws = ("wgu",) if concat else ("wg", "wu")
    b = ProductMatch("glu", ("h", *ws, "nw"), rows, n, orders[1:3], "a", (1, 1, n), 1, frozenset(), eps=eps)
    c = ProductMatch("add", ("a", "wd", "h"), (0,), h, orders[3:], "out", shape, 2, frozenset())
    ins = ("o", "wo", "r", *ws, "nw", "wd")
    return ProductMatch("chain", ins, rows, n, orders, "out", shape, 2, frozenset(), eps, None, (a, b, c))


@pytest.mark.parametrize(
    ("dt", "k", "h", "n", "concat", "orders"),
    [
        (mx.float32, 64, 96, 40, False, (True, True, True, False)),
        (mx.bfloat16, 128, 256, 72, True, (False, True, False, True)),
        (mx.bfloat16, 96, 128, 12, False, (True, False, True, True)),
        (mx.float16, 32, 64, 9, True, (False, False, False, False)),
        (mx.bfloat16, 48, 100, 20, True, (True, False, True, False)),  # `a` 16-byte aligned after `h`
    ],
)
def test_the_chain_kernel_is_the_three_product_kernels(recorded, dt, k, h, n, concat, orders) -> None:
    """A layer's MLP as one kernel (``cuda_chain.py``) against the three product kernels
    it stands for (``add``, the normed ``glu``, ``add``), each run by the emulator: the
    same bytes (the same host arithmetic, so what differs is indexing, a stage's wait or
    what it reads), in two launches (the counters back to zero), and against MLX's ops
    within the dtype's rounding. Row counts not a multiple of the block's 8 rows; the
    attention's width ``k`` not the hidden size."""
    m = chain_match(h, n, concat, orders)
    mx.random.seed(k + h + n)
    o, r = mx.random.normal((1, k)).astype(dt), mx.random.normal((1, h)).astype(dt)
    wo = (mx.random.normal((h, k)) * 0.1).astype(dt)
    ws = (
        [(mx.random.normal((2 * n, h)) * 0.1).astype(dt)]
        if concat
        else [(mx.random.normal((n, h)) * 0.1).astype(dt) for _ in range(2)]
    )
    nw = mx.random.uniform(0.5, 1.5, (h,)).astype(dt)
    wd = (mx.random.normal((h, n)) * 0.1).astype(dt)
    ins = [o, wo, r, *ws, nw, wd]
    cuda_chain.chain(m, ins)
    ((made, call),) = recorded
    launches = run(made, call, launches=2, inputs=True)
    rows = [_chain_rows(launch[-1], h, n, dt) for launch in launches]
    assert launches[0][0].tobytes() == launches[1][0].tobytes()
    assert [x.tobytes() for x in rows[0]] == [x.tobytes() for x in rows[1]]
    assert [launch[-1][: cuda_chain.COUNTERS].tolist() for launch in launches] == [[0] * cuda_chain.COUNTERS] * 2
    recorded.clear()
    a, b, c = m.parts
    blocks = norm_blocks(h, dtypes.short(dt))

    def one(kind, part, xs, norm=None):
        cuda_products.product(kind, xs, part.rows, part.n, part.shape, part.order, norm)
        ((made1, call1),) = recorded
        recorded.clear()
        ((out,),) = run(made1, call1)
        return _as_mx(out, dt)

    hv = one("add", a, [o, wo, r])
    av = one("glu", b, [hv, *(ws * 2 if concat else ws), nw], (1e-5, blocks))
    want = one("add", c, [av, wd, hv])
    out, (h_out, a_out) = launches[0][0], rows[0]
    assert out.tobytes() == _bits(want) and h_out.tobytes() == _bits(hv) and a_out.tobytes() == _bits(av)
    ref = products.reference_products(m, [x.astype(mx.float32) for x in ins])
    tol = {mx.float32: 1e-4, mx.float16: 2e-2, mx.bfloat16: 8e-2}[dt]
    np.testing.assert_allclose(np.array(_as_mx(out, dt).astype(mx.float32)), np.array(ref), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("dt", "h", "n", "nq", "eps2", "blocks"),
    [
        (mx.float32, 96, 40, 52, 1e-6, None),  # rows of the fourth stage not a multiple of 8
        (mx.bfloat16, 128, 24, 300, 1e-5, None),  # the fourth stage the largest: its grid
        (mx.float16, 64, 9, 20, 1e-5, "3"),  # fewer blocks than tickets
    ],
)
def test_the_four_stage_chain_is_the_four_product_kernels(recorded, monkeypatch, dt, h, n, nq, eps2, blocks) -> None:
    """A chain with its fourth part (``product_chain.py``: the normed product of what
    the chain writes) against the four product kernels it stands for, each run by the
    emulator: both outputs the same bytes, in two launches (the five counters back to
    zero), on the default grid (a block per ticket of the largest stage) and on fewer."""
    m3 = chain_match(h, n, True, (True, True, False, True))
    d = ProductMatch("gemv", ("out", "wq", "nw2"), (0,), nq, (), "q", (1, nq), 3, frozenset(), eps=eps2)
    m = ProductMatch(
        "chain", (*m3.ins, "wq", "nw2"), m3.rows, n, m3.order, "out", m3.shape, 3, frozenset(), m3.eps, None,
        (*m3.parts, d),
    )  # fmt: skip
    assert m.outs == ("out", "q")
    mx.random.seed(h + n + nq)
    o, r = mx.random.normal((1, 32)).astype(dt), mx.random.normal((1, h)).astype(dt)
    wo, wgu = (mx.random.normal((h, 32)) * 0.1).astype(dt), (mx.random.normal((2 * n, h)) * 0.1).astype(dt)
    nw, nw2 = (mx.random.uniform(0.5, 1.5, (h,)).astype(dt) for _ in range(2))
    wd, wq = (mx.random.normal((h, n)) * 0.1).astype(dt), (mx.random.normal((nq, h)) * 0.1).astype(dt)
    if blocks:
        monkeypatch.setenv("SEGC_CHAIN_BLOCKS", blocks)
    got = cuda_chain.chain(m, [o, wo, r, wgu, nw, wd, wq, nw2])
    assert isinstance(got, list) and len(got) == 2
    ((made, call),) = recorded
    assert call["grid"][0] == 32 * (int(blocks) if blocks else max(-(-x // 8) for x in (h, n, nq)))
    launches = run(made, call, launches=2, inputs=True)
    assert [launch[-1][: cuda_chain.COUNTERS].tolist() for launch in launches] == [[0] * cuda_chain.COUNTERS] * 2
    recorded.clear()
    a, b, c = m3.parts
    norm = norm_blocks(h, dtypes.short(dt))

    def one(kind, part, xs, eps=None):
        cuda_products.product(kind, xs, part.rows, part.n, part.shape, part.order, eps and (eps, norm))
        ((made1, call1),) = recorded
        recorded.clear()
        ((out,),) = run(made1, call1)
        return _as_mx(out, dt)

    hv = one("add", a, [o, wo, r])
    av = one("glu", b, [hv, wgu, wgu, nw], 1e-5)
    out = one("add", c, [av, wd, hv])
    q = one("gemv", d, [out, wq, nw2], eps2)
    for launch in launches:
        assert launch[0].tobytes() == _bits(out) and launch[1].tobytes() == _bits(q)


@pytest.mark.parametrize("blocks", ["1", "12"])
def test_the_chain_kernel_on_any_grid(recorded, monkeypatch, blocks) -> None:
    """Any grid (``SEGC_CHAIN_BLOCKS``): one block taking every ticket, or more blocks
    than any stage has tickets; the same bytes as the default grid."""
    m = chain_match(40, 72, False, (True, True, False, True))
    mx.random.seed(7)
    ins = [mx.random.normal(s) for s in [(1, 16), (40, 16), (1, 40), (72, 40), (72, 40), (40,), (40, 72)]]
    cuda_chain.chain(m, ins)
    monkeypatch.setenv("SEGC_CHAIN_BLOCKS", blocks)
    cuda_chain.chain(m, ins)
    (made, call), (made2, call2) = recorded
    assert call["grid"][0] == 32 * 9 and call2["grid"][0] == 32 * int(blocks)  # the default: 72 rows / 8
    want = run(made, call)[0]
    got = run(made2, call2, inputs=True)[0]
    assert got[0].tobytes() == want[0].tobytes()
    assert got[-1][: cuda_chain.COUNTERS].tolist() == [0] * cuda_chain.COUNTERS
    monkeypatch.setenv("SEGC_CHAIN_BLOCKS", "0")
    with pytest.raises(UsageError, match="SEGC_CHAIN_BLOCKS"):
        cuda_chain.chain(m, ins)


def test_the_chains_occupancy_is_nvrtc_s_alone_and_changes_no_byte(recorded, monkeypatch) -> None:
    """``SEGC_CHAIN_OCCUPANCY``: the chain's header ends with launch bounds for MLX's
    declaration (256 threads, that many blocks an SM), for NVRTC alone (the emulator's
    ``g++`` skips them), a kernel of its own name, the same bytes; 0 is the default, a
    value past 8 a UsageError naming the variable."""
    from segc.lower.cuda_kernel import expand

    m = chain_match(40, 72, False, (True, True, False, True))
    mx.random.seed(8)
    ins = [mx.random.normal(s) for s in [(1, 16), (40, 16), (1, 40), (72, 40), (72, 40), (40,), (40, 72)]]
    cuda_chain.chain(m, ins)
    monkeypatch.setenv("SEGC_CHAIN_OCCUPANCY", "3")
    cuda_chain.chain(m, ins)
    (made, call), (made2, call2) = recorded
    plain, bounded = expand(made["header"]), expand(made2["header"])
    assert "__launch_bounds__" not in plain and made2["name"] != made["name"]
    assert bounded.startswith(plain) and bounded[len(plain) :] == (
        "#ifdef __CUDACC_RTC__\n#undef __global__\n"
        "#define __global__ __location__(global) __launch_bounds__(256, 3)\n#endif\n"
    )
    assert run(made2, call2)[0][0].tobytes() == run(made, call)[0][0].tobytes()
    monkeypatch.setenv("SEGC_CHAIN_OCCUPANCY", "9")
    with pytest.raises(UsageError, match="SEGC_CHAIN_OCCUPANCY"):
        cuda_chain.chain(m, ins)


@pytest.mark.parametrize(("concat", "nxt"), [(False, False), (True, False), (True, True)])
def test_a_chain_found_in_a_layer_runs_through_segc_s_wiring(recorded, monkeypatch, concat, nxt) -> None:
    """The finder's chain (``product_chain.py``) replayed through ``products.cuda_products``
    into the kernel, run by the emulator: the inputs in the order the kernel reads them,
    against MLX's own ops within float32's rounding (a weight read in another's place, or
    the addend, would be far off); with the next normed product, both outputs."""
    from test_product_chain import _avals, _inputs, _layer, _next

    from segc.lower import replay_fn

    monkeypatch.setenv("SEGC_CHAIN_PRODUCTS", "1")
    eqns = _layer(24, 40, 36, "f32", concat, (False, True, False, True))
    ins = _inputs(24, 40, 36, mx.float32, concat, 11, 28 if nxt else 0)
    keep = ["out", "q2"] if nxt else ["out"]
    if nxt:
        eqns = _next(eqns, 40, 28, "f32")[:24]  # up to the product (its reshape and the late reader left out)
    names, vals = list(ins), list(ins.values())
    fn = replay_fn(eqns, names, keep, {}, None, None, eqns, products.cuda_products, _avals(eqns, ins))
    fn(*vals)
    ((made, call),) = recorded
    assert made["name"].startswith("segc_chain4" if nxt else "segc_chain_")
    (outs,) = run(made, call)
    want = replay_fn(eqns, names, keep, {})(*vals)
    for got, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(got, np.array(w).reshape(got.shape), rtol=1e-4, atol=1e-4)


def _writing_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``mx.fast.cuda_kernel`` replaced by the emulator, writing back into its inputs'
    memory what the kernel left there, as the GPU's kernel writes its inputs."""
    from segc.lower import cuda_kernel

    def make(**made: Any) -> Any:
        def call(**kw: Any) -> list[mx.array]:
            mx.eval(kw["inputs"])
            n = len(kw["output_shapes"])
            (got,) = run(made, kw, inputs=True)
            for x, after in zip(kw["inputs"], got[n:], strict=True):
                raw = x.view(mx.uint16) if x.dtype == mx.bfloat16 else x  # (no buffer format for bfloat16)
                mx.eval(raw)
                np.asarray(memoryview(raw))[...] = after.view(np.uint16) if x.dtype == mx.bfloat16 else after
            return [_as_mx(o, t) for o, t in zip(got[:n], kw["output_dtypes"], strict=True)]

        return call

    monkeypatch.setattr(cuda_kernel.mx.fast, "cuda_kernel", make)


def test_the_write_in_place_hands_back_the_old_buffers_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SEGC_KV_IN_PLACE``'s wiring (``kv_attention(..., in_place=True)``), the kernel
    emulated as the GPU runs it, writing into its inputs' memory: the buffers it hands
    back hold the copying kernel's bytes and are the caller's (a contiguous buffer
    written in place); a buffer that is not contiguous is written through its contiguous
    copy, and the caller's is left as it was."""
    _writing_inputs(monkeypatch)
    cuda_kvattention._kernel.cache_clear()
    try:
        cap, pos = 40, 21
        mx.random.seed(5)
        kb, vb, base = (mx.random.normal((1, 2, cap, 64)) for _ in range(3))
        k, v, q = mx.random.normal((1, 2, 1, 64)), mx.random.normal((1, 2, 1, 64)), mx.random.normal((1, 8, 1, 64))
        mask = mx.array(np.arange(cap)[None, :] <= pos)
        off = mx.array(pos, dtype=mx.int32)
        ins = [kb, k, vb, v, off, q]
        mx.eval(ins, base)

        def attend(ins: list[mx.array], in_place: bool) -> list[bytes]:
            res = cuda_kvattention.kv_attention(ins, mask, 64, False, 10000.0, 1.0, False, 0.125, in_place=in_place)
            return [_bits(x) for x in res]  # (the emulator runs at the call: mx.depends's order is the GPU's to show)

        want = attend(ins, False)
        assert _bits(kb) != want[0] and _bits(vb) != want[1]  # the copy wrote its own buffers
        assert attend(ins, True) == want
        assert (_bits(kb), _bits(vb)) == (want[0], want[1])  # the caller's buffers, written
        # keys not contiguous: the same bytes handed back, the caller's keys untouched
        swapped = mx.swapaxes(base.reshape(1, cap, 2, 64), 1, 2)
        mx.eval(swapped)
        before = _bits(base)
        ins2 = [swapped, k, mx.array(np.array(vb)), v, off, q]
        want2 = attend([mx.array(np.array(swapped)), *ins2[1:]], False)
        assert attend(ins2, True) == want2 and _bits(base) == before
    finally:
        cuda_kvattention._kernel.cache_clear()


@pytest.mark.parametrize("dt", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize(("d", "dims", "trad", "pos"), [(64, 64, False, 21), (16, 8, True, 0), (80, 80, False, 39)])
def test_the_rows_written_in_place_are_the_copying_kernel_s(monkeypatch: pytest.MonkeyPatch, dt, d, dims, trad, pos):
    """``kv_write_rows`` (the live attention's write in place, ``segc.lower.live``),
    emulated as the GPU runs it, writing into its inputs' memory: the caller's buffers
    end as the copying kernel's new buffers, byte for byte, and the rotated queries are
    the copying kernel's."""
    _writing_inputs(monkeypatch)
    cuda_kvwrite._kernel.cache_clear()
    try:
        mx.random.seed(pos + d)
        cap = 40
        kb, vb = (mx.random.normal((1, 2, cap, d)).astype(dt) for _ in range(2))
        k, v, q = (mx.random.normal((1, h, 1, d)).astype(dt) for h in (2, 2, 8))
        off = mx.array(pos, dtype=mx.int32)
        mx.eval(kb, vb, k, v, q)
        want = [_bits(x) for x in cuda_kvwrite.kv_write([kb, k, vb, v, off, q], dims, trad, 10000.0, 1.0, True, False)]
        assert _bits(kb) != want[0]  # the copy wrote buffers of its own
        got = cuda_kvwrite.kv_write_rows([kb, k, vb, v, off, q], dims, trad, 10000.0, 1.0, False)
        assert [_bits(x) for x in got] == want
        assert (_bits(kb), _bits(vb)) == (want[0], want[1])  # the caller's buffers, written
    finally:
        cuda_kvwrite._kernel.cache_clear()
