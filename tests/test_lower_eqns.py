"""Rules tested on hand-built equations: primitives the CPU trace never produces (the
``mx.fast`` primitives the GPU keeps whole, forms no Python op builds), and the
arguments a rule refuses before anything runs.

The expected values are computed independently: by the eager ``mx.fast`` call, or by
NumPy for pure data movement.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from conftest import FLOATS, assert_same_bits, examples, run_graph
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from segc import UnsupportedPrimitive, dtypes
from segc.ir import Eqn, Graph, Input, Var

# primitives whose rules this file exercises (test_lower_props checks coverage with it)
HANDMADE = {
    "RMSNorm",
    "LayerNorm",
    "RoPE",
    "ScaledDotProductAttention",
    "StopGradient",
    "Copy",
    "NumberOfElements",
    "Gather",
    "Scatter",
    "ScatterAxis",
}


def one_eqn(prim: str, args: tuple, ins: list[mx.array], outs: list[tuple[tuple[int, ...], mx.Dtype]]) -> Graph:
    inputs = tuple(Input(Var(f"a{k}", tuple(x.shape), dtypes.short(x.dtype)), "arg", str(k)) for k, x in enumerate(ins))
    out_vars = tuple(Var(f"v{k}", tuple(s), dtypes.short(d)) for k, (s, d) in enumerate(outs))
    e = Eqn(0, prim, tuple(i.var.name for i in inputs), out_vars, args)
    return Graph(prim, inputs, (), (e,), tuple(v.name for v in out_vars))


def run_one(prim: str, args: tuple, ins: list[mx.array], like: list[mx.array]) -> list[mx.array]:
    mx.eval(ins)
    g = one_eqn(prim, args, ins, [(tuple(o.shape), o.dtype) for o in like])
    return run_graph(g, ins)


def _rand(seed: int, shape: tuple[int, ...], dt: mx.Dtype = mx.float32, ints: bool = False) -> mx.array:
    rng = np.random.default_rng(seed)
    v = rng.integers(-4, 5, shape).astype(np.float32) if ints else rng.standard_normal(shape).astype(np.float32)
    return mx.array(v).astype(dt)


SET = settings(max_examples=examples(8), deadline=None)
FAST = settings(max_examples=examples(5), deadline=None)  # each new fused CPU kernel costs a C++ compile
seeds = st.integers(0, 2**31)


# --------------------------------------------------------------------------- mx.fast


@pytest.mark.slow
@FAST
@given(seed=seeds, rows=st.integers(1, 4), d=st.integers(1, 40), dt=st.sampled_from(FLOATS), weight=st.booleans())
def test_rms_norm(seed: int, rows: int, d: int, dt: mx.Dtype, weight: bool) -> None:
    x, w = _rand(seed, (rows, d), dt), _rand(seed + 1, (d,), dt)
    want = mx.fast.rms_norm(x, w if weight else None, 1e-5)
    wi = w if weight else mx.array(1, dtype=dt)
    assert_same_bits(run_one("RMSNorm", (1e-5,), [x, wi], [want]), [want], "RMSNorm")


@pytest.mark.slow
@FAST
@given(seed=seeds, d=st.integers(1, 40), dt=st.sampled_from(FLOATS), weight=st.booleans(), bias=st.booleans())
def test_layer_norm(seed: int, d: int, dt: mx.Dtype, weight: bool, bias: bool) -> None:
    x, w, b = _rand(seed, (3, d), dt), _rand(seed + 1, (d,), dt), _rand(seed + 2, (d,), dt)
    want = mx.fast.layer_norm(x, w if weight else None, b if bias else None, 1e-6)
    wi = w if weight else mx.array(1, dtype=dt)
    bi = b if bias else mx.array(0, dtype=dt)
    assert_same_bits(run_one("LayerNorm", (1e-6,), [x, wi, bi], [want]), [want], "LayerNorm")


@pytest.mark.slow
@FAST
@given(
    seed=seeds,
    t=st.integers(1, 5),
    half=st.integers(1, 8),
    trad=st.booleans(),
    off=st.integers(0, 30),
    freqs=st.booleans(),
    dt=st.sampled_from(FLOATS),
)
def test_rope(seed: int, t: int, half: int, trad: bool, off: int, freqs: bool, dt: mx.Dtype) -> None:
    d = 2 * half
    x = _rand(seed, (1, 2, t, d), dt)
    o = mx.array(off, dtype=mx.int32)
    if freqs:
        f = mx.array(np.linspace(0.5, 2.0, half).astype(np.float32))
        want = mx.fast.rope(x, d, traditional=trad, base=None, scale=1.0, offset=o, freqs=f)
        got = run_one("RoPE", (d, trad, 1.0, 1.0, True), [x, o, f], [want])
    else:
        want = mx.fast.rope(x, d, traditional=trad, base=10000.0, scale=0.5, offset=o)
        got = run_one("RoPE", (d, trad, 10000.0, 0.5, True), [x, o], [want])
    assert_same_bits(got, [want], "RoPE")


@FAST
@given(
    seed=seeds,
    lq=st.integers(1, 4),
    lk=st.integers(4, 6),
    rep=st.sampled_from([1, 2]),
    kind=st.sampled_from(["none", "causal", "additive", "sinks"]),
    dt=st.sampled_from(FLOATS),
)
def test_sdpa(seed: int, lq: int, lk: int, rep: int, kind: str, dt: mx.Dtype) -> None:
    q, k, v = (
        _rand(seed, (1, 2 * rep, lq, 8), dt),
        _rand(seed + 1, (1, 2, lk, 8), dt),
        _rand(seed + 2, (1, 2, lk, 8), dt),
    )
    m = _rand(seed + 3, (1, 2 * rep, lq, lk), dt)
    sinks = _rand(seed + 4, (2 * rep,), dt)
    sdpa = mx.fast.scaled_dot_product_attention
    ins = [q, k, v]
    if kind == "none":
        want = sdpa(q, k, v, scale=0.3)
    elif kind == "causal":
        want = sdpa(q, k, v, scale=0.3, mask="causal")
    elif kind == "additive":
        want, ins = sdpa(q, k, v, scale=0.3, mask=m), [q, k, v, m]
    else:
        want, ins = sdpa(q, k, v, scale=0.3, sinks=sinks), [q, k, v, sinks]
    got = run_one("ScaledDotProductAttention", (0.3, kind == "causal", kind == "sinks", False, False), ins, [want])
    assert_same_bits(got, [want], "ScaledDotProductAttention")


# --------------------------------------------------------------------------- no Python op builds these


def test_identities_and_constants() -> None:
    x = _rand(0, (3, 4))
    assert_same_bits(run_one("StopGradient", (), [x], [x]), [mx.stop_gradient(x)], "StopGradient")
    assert_same_bits(run_one("Copy", (), [x], [x]), [x], "Copy")
    for inverted, dt in [(False, mx.int32), (True, mx.float32), (True, mx.float16), (False, mx.float32)]:
        want_np = np.array(1.0 / 12.0 if inverted else 12.0).astype(np.float32 if dt != mx.int32 else np.int32)
        want = mx.array(want_np).astype(dt)
        got = run_one("NumberOfElements", ((0, 1), inverted, dtypes_arg(dt)), [x], [want])
        assert_same_bits(got, [want], "NumberOfElements")


def dtypes_arg(dt: mx.Dtype) -> Any:
    from segc.ir import DTypeArg

    return DTypeArg(dtypes.short(dt))


def _np(a: mx.array) -> np.ndarray:
    return np.array(a)


@SET
@given(seed=seeds, data=st.data())
def test_gather_general(seed: int, data: st.DataObject) -> None:
    """Any axes and slice sizes, against a NumPy gather with the XLA/MLX semantics:
    ``out[b, s] = x[idx_0[b] + s_0, ..., s_d, ...]``."""
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    n = len(shape)
    axes = sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))))
    sizes = [data.draw(st.integers(1, shape[d])) for d in range(n)]
    b = tuple(data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    rng = np.random.default_rng(seed)
    x = mx.array(rng.standard_normal(shape).astype(np.float32))
    idx = [mx.array(rng.integers(0, shape[a] - sizes[a], b, endpoint=True).astype(np.int32)) for a in axes]
    xn, idn = _np(x), [_np(i) for i in idx]
    want = np.zeros(b + tuple(sizes), np.float32)
    for bi in np.ndindex(*b) if b else [()]:
        for si in np.ndindex(*sizes):
            src = list(si)
            for a, i in zip(axes, idn):
                src[a] += int(i[bi])
            want[bi + si] = xn[tuple(src)]
    got = run_one("Gather", (tuple(axes), tuple(sizes)), [x, *idx], [mx.array(want)])
    assert_same_bits(got, [mx.array(want)], f"Gather axes={axes} sizes={sizes}")


@SET
@given(seed=seeds, data=st.data())
def test_scatter_general(seed: int, data: st.DataObject) -> None:
    """Scatter over any axes (updates of slice shape 1 on the indexed axes), against NumPy."""
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    n = len(shape)
    axes = sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))))
    sizes = [1 if d in axes else shape[d] for d in range(n)]
    b = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    reduce = data.draw(st.sampled_from([2, 4]))  # Sum, None
    rng = np.random.default_rng(seed)
    x = mx.array(rng.integers(-5, 5, shape).astype(np.float32))
    idx = [mx.array(rng.integers(0, shape[a] - 1, b, endpoint=True).astype(np.int32)) for a in axes]
    u = mx.array(rng.integers(-5, 5, b + tuple(sizes)).astype(np.float32))
    want = _np(x).copy()
    un, idn = _np(u), [_np(i) for i in idx]
    for bi in np.ndindex(*b):
        for si in np.ndindex(*sizes):
            dst = list(si)
            for a, i in zip(axes, idn):
                dst[a] += int(i[bi])
            if reduce == 2:
                want[tuple(dst)] += un[bi + si]
            else:
                want[tuple(dst)] = un[bi + si]
    targets = {tuple(int(i[bi]) for i in idn) for bi in np.ndindex(*b)}
    # duplicate targets of an assignment: which write wins is unspecified
    assume(reduce == 2 or len(targets) == int(np.prod(b)))
    got = run_one("Scatter", (reduce, tuple(axes)), [x, *idx, u], [x])
    assert_same_bits(got, [mx.array(want)], f"Scatter reduce={reduce} axes={axes}")


@SET
@given(seed=seeds, data=st.data())
def test_scatter_axis_sum(seed: int, data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    axis = data.draw(st.integers(0, len(shape) - 1))
    ishape = list(shape)
    ishape[axis] = data.draw(st.integers(1, 4))
    rng = np.random.default_rng(seed)
    x = mx.array(rng.integers(-5, 5, shape).astype(np.float32))
    i = mx.array(rng.integers(0, shape[axis] - 1, ishape, endpoint=True).astype(np.int32))
    u = mx.array(rng.integers(-5, 5, ishape).astype(np.float32))
    want = _np(x).copy()
    un, inp = _np(u), _np(i)
    for pos in np.ndindex(*ishape):
        dst = list(pos)
        dst[axis] = int(inp[pos])
        want[tuple(dst)] += un[pos]
    got = run_one("ScatterAxis", (0, axis), [x, i, u], [x])
    assert_same_bits(got, [mx.array(want)], "ScatterAxis(Sum)")


# --------------------------------------------------------------------------- refused up front


@pytest.mark.parametrize(
    ("prim", "args", "ins", "out", "match"),
    [
        ("RoPE", (4, False, 1e4, 1.0, False), [mx.zeros((1, 1, 2, 4)), mx.array(0)], ((1, 1, 2, 4), mx.float32), "VJP"),
        (
            "ScaledDotProductAttention",
            (1.0, False, False, True, False),
            [mx.zeros((1, 1, 2, 4))] * 3,
            ((1, 1, 2, 4), mx.float32),
            "gradient",
        ),
        (
            "QuantizedMatmul",
            (32, 4, 0, True),
            [mx.zeros((1, 64)), mx.zeros((2, 8), mx.uint32), mx.zeros((2, 2))],
            ((1, 2), mx.float32),
            "expected 4",
        ),
        ("NoSuchPrimitive", (), [mx.zeros((2,))], ((2,), mx.float32), "no lowering rule"),
        ("BlockMaskedMM", (32,), [mx.zeros((2, 2))] * 2, ((2, 2), mx.float32), "mask inputs"),
    ],
)
def test_refused_before_running(prim: str, args: tuple, ins: list[mx.array], out: tuple, match: str) -> None:
    g = one_eqn(prim, args, ins, [out])
    with pytest.raises(UnsupportedPrimitive, match=match) as info:
        run_graph(g, ins)
    assert info.value.primitive == prim


def test_unexportable_primitive_is_named() -> None:
    import segc

    with pytest.raises(UnsupportedPrimitive, match="Contiguous") as info:
        segc.jit(lambda x: mx.contiguous(x.T) + 1).trace(mx.zeros((2, 3)))
    assert info.value.primitive == "Contiguous"


def test_refusal_names_the_boundary() -> None:
    from conftest import with_cuts

    x = mx.zeros((2,))
    g = with_cuts(one_eqn("NoSuchPrimitive", (), [x], [((2,), mx.float32)]), [0])
    with pytest.raises(UnsupportedPrimitive, match="after boundary 'cut0'"):
        run_graph(g, [x])


@settings(max_examples=examples(30), deadline=None)
@given(
    start=st.integers(-300, 300),
    step=st.integers(-7, 7).filter(bool),
    count=st.integers(0, 70000),
    dt=st.sampled_from([mx.int32, mx.int64, mx.int16, mx.uint32]),
)
def test_an_integer_range_is_host_data_with_mlxs_values(start, step, count, dt) -> None:
    """An integer ``Arange`` is made from host data (no kernel: ``mx.arange`` is not
    called) up to ``ARANGE_CONSTANT_MAX`` values that fit its dtype; past that, or for
    a fractional start, MLX's op. Values byte for byte ``mx.arange``'s."""
    from segc.lower import shapes

    stop = start + step * count
    info = np.iinfo(dtypes.np_dtype(dtypes.short(dt)))
    assume(count == 0 or (info.min <= min(start, stop - step) and max(start, stop - step) <= info.max))
    want = mx.arange(start, stop, step, dtype=dt)
    calls: list[tuple] = []
    real = mx.arange

    def counted(*a, **k):
        calls.append(a)
        return real(*a, **k)

    e = Eqn(0, "Arange", (), (Var("r", tuple(want.shape), dtypes.short(dt)),), (float(start), float(stop), float(step)))
    half = e.replace(args=(start + 0.5, float(stop), float(step)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mx, "arange", counted)
        got = shapes._arange([], e.args, e)
        assert len(calls) == (want.size > shapes.ARANGE_CONSTANT_MAX)
        shapes._arange([], half.args, half)
        assert len(calls) == 1 + (want.size > shapes.ARANGE_CONSTANT_MAX)  # MLX's op
    assert_same_bits([got], [want])


def test_a_range_that_wraps_is_mlxs_op() -> None:
    from segc.lower import shapes

    want = mx.arange(30000, 40000, 3, dtype=mx.int16)  # past int16's largest value
    e = Eqn(0, "Arange", (), (Var("r", tuple(want.shape), "i16"),), (30000.0, 40000.0, 3.0))
    assert shapes.host_range(e) is None
    assert_same_bits([shapes._arange([], e.args, e)], [want])
