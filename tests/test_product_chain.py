"""A layer's MLP from the attention's output product on as one kernel
(``segc.lower.product_chain``): the finder and the replay on the CPU, the kernel replaced
by MLX's ops (``products.reference_products``), the equations built by hand as a GPU
trace records them (``RMSNorm`` whole; on the CPU MLX records its decomposition, where
no norm, and so no chain, is matched). The kernel itself: ``tests/test_cuda_emulated.py``
(its logic) and ``tests/test_products_cuda.py`` (its bytes, on a GPU)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_products import Counted

from segc.errors import UsageError
from segc.ir import Eqn, Var, parse, segments
from segc.lower import product_chain, replay_fn
from segc.lower.fused import CUDA_DEFAULTS, find_all
from segc.lower.products import find_products

pytestmark = pytest.mark.timeout(300)

GRAPH = Path(__file__).parent / "data" / "h200_reference_decode.segc"


@pytest.fixture(autouse=True, scope="module")
def _chains_on():
    """Chains are off by default (``CHAIN_PRODUCTS``); these tests replay with them on,
    each chain without the attention before it (that: ``tests/test_layer_chain.py``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEGC_CHAIN_PRODUCTS", "1")
        mp.setenv("SEGC_CHAIN_ATTENTION", "0")
        yield


def _layer(k: int, h: int, n: int, dt: str, concat: bool, orders: tuple[bool, ...]) -> list[Eqn]:
    """A llama layer's equations from its attention's output on, as the H200 trace records
    them (``tests/data/h200_reference_decode.segc``): the output product and the residual,
    the norm, the gate and up products, the gated activation, the down product, the
    residual. ``orders``: each ``Add`` and ``Multiply``'s operands as recorded."""
    pfa, gfirst, gsfirst, pfc = orders

    def e(i, prim, ins, name, shape, *args):
        return Eqn(i, prim, tuple(ins), (Var(name, shape, dt),), args)

    def two(a, b, first):
        return (a, b) if first else (b, a)

    eqns = [
        e(0, "Transpose", ("wo",), "wot", (k, h), [1, 0]),
        e(1, "Matmul", ("o", "wot"), "y", (1, h)),
        e(2, "Unflatten", ("y",), "yu", (1, 1, h), 0, [1, 1]),
        e(3, "Add", two("yu", "r", pfa), "hh", (1, 1, h)),
        e(4, "RMSNorm", ("hh", "nw"), "hn", (1, 1, h), 1e-5),
        e(5, "Flatten", ("hn",), "hf", (1, h), 0, 1),
    ]
    if concat:
        eqns += [
            e(6, "Transpose", ("wgu",), "wgut", (h, 2 * n), [1, 0]),
            e(7, "Matmul", ("hf", "wgut"), "yy", (1, 2 * n)),
            e(8, "Slice", ("yy",), "g2", (1, n), [0, 0], [1, n], [1, 1]),
            e(9, "Slice", ("yy",), "u2", (1, n), [0, n], [1, 2 * n], [1, 1]),
        ]
    else:
        eqns += [
            e(6, "Transpose", ("wg",), "wgt", (h, n), [1, 0]),
            e(7, "Matmul", ("hf", "wgt"), "g2", (1, n)),
            e(8, "Transpose", ("wu",), "wut", (h, n), [1, 0]),
            e(9, "Matmul", ("hf", "wut"), "u2", (1, n)),
        ]
    eqns += [
        e(10, "Unflatten", ("g2",), "g", (1, 1, n), 0, [1, 1]),
        e(11, "Sigmoid", ("g",), "s", (1, 1, n)),
        e(12, "Multiply", two("g", "s", gfirst), "gs", (1, 1, n)),
        e(13, "Unflatten", ("u2",), "u", (1, 1, n), 0, [1, 1]),
        e(14, "Multiply", two("gs", "u", gsfirst), "a", (1, 1, n)),
        e(15, "Flatten", ("a",), "af", (1, n), 0, 1),
        e(16, "Transpose", ("wd",), "wdt", (n, h), [1, 0]),
        e(17, "Matmul", ("af", "wdt"), "d2", (1, h)),
        e(18, "Unflatten", ("d2",), "d", (1, 1, h), 0, [1, 1]),
        e(19, "Add", two("d", "hh", pfc), "out", (1, 1, h)),
    ]
    return eqns


def _next(eqns: list[Eqn], h: int, nq: int, dt: str, eps: float = 1e-6) -> list[Eqn]:
    """``eqns`` (a :func:`_layer`) and what follows the layer's output as the H200 trace
    records it: the next norm and its product (the next layer's concatenated q, k and v,
    or the head: ``qq``), then a later reader of the output (the next residual: ``late``)."""

    def e(i, prim, ins, name, shape, *args):
        return Eqn(i, prim, tuple(ins), (Var(name, shape, dt),), args)

    return [
        *eqns,
        e(20, "RMSNorm", ("out", "nw2"), "on", (1, 1, h), eps),
        e(21, "Flatten", ("on",), "of", (1, h), 0, 1),
        e(22, "Transpose", ("wq",), "wqt", (h, nq), [1, 0]),
        e(23, "Matmul", ("of", "wqt"), "q2", (1, nq)),
        e(24, "Unflatten", ("q2",), "qq", (1, 1, nq), 0, [1, 1]),
        e(25, "Exp", ("out",), "late", (1, 1, h)),
    ]


def _inputs(k: int, h: int, n: int, dt: mx.Dtype, concat: bool, seed: int, nq: int = 0) -> dict[str, mx.array]:
    r = np.random.default_rng(seed)

    def a(*shape):
        return mx.array(r.standard_normal(shape).astype(np.float32)).astype(dt)

    ins = {"o": a(1, k), "wo": a(h, k), "r": a(1, 1, h), "nw": a(h), "wd": a(h, n)}
    ins.update({"wgu": a(2 * n, h)} if concat else {"wg": a(n, h), "wu": a(n, h)})
    if nq:
        ins.update({"nw2": a(h), "wq": a(nq, h)})
    return ins


def _avals(eqns: list[Eqn], ins: dict[str, mx.array]) -> dict[str, tuple]:
    from segc.dtypes import short

    avals = {name: (tuple(v.shape), short(v.dtype)) for name, v in ins.items()}
    avals.update({o.name: (o.shape, o.dtype) for e in eqns for o in e.outs})
    return avals


def _run(eqns, ins, outs, kernel) -> list[mx.array]:
    names, vals = list(ins), list(ins.values())
    return replay_fn(eqns, names, outs, {}, None, None, eqns, kernel, _avals(eqns, ins))(*vals)


@settings(max_examples=examples(15), deadline=None)
@given(
    dt=hst.sampled_from([mx.float32, mx.bfloat16, mx.float16]),
    k=hst.integers(2, 24),
    h=hst.integers(2, 40),
    n=hst.integers(1, 24),
    concat=hst.booleans(),
    orders=hst.tuples(*[hst.booleans()] * 4),
    seed=hst.integers(0, 2**31),
)
def test_a_layers_mlp_is_one_chain_with_eager_bits(dt, k, h, n, concat, orders, seed) -> None:
    """Every shape, dtype and operand order: one chain, whose parts are the three
    products, replayed with the same bytes as the equations themselves (MLX's own ops)."""
    from segc.dtypes import short

    eqns = _layer(k, h, n, short(dt), concat, orders)
    ins = _inputs(k, h, n, dt, concat, seed)
    (m,) = find_all(eqns, ["out"], {}, _avals(eqns, ins), eqns, products=True, chains=True).products
    assert m.kind == "chain" and [p.kind for p in m.parts] == ["add", "glu", "add"]
    assert m.order == orders and m.skip == frozenset(range(20))  # the weights' transposes too: only it reads them
    kernel = Counted()
    (got,) = _run(eqns, ins, ["out"], kernel)
    (want,) = replay_fn(eqns, list(ins), ["out"], {})(*ins.values())
    assert kernel.calls == Counter({"chain": 1}) and same_bits(got, want)


@settings(max_examples=examples(10), deadline=None)
@given(
    dt=hst.sampled_from([mx.float32, mx.bfloat16, mx.float16]),
    h=hst.integers(2, 40),
    n=hst.integers(1, 24),
    nq=hst.integers(1, 48),
    concat=hst.booleans(),
    orders=hst.tuples(*[hst.booleans()] * 4),
    seed=hst.integers(0, 2**31),
)
def test_the_next_normed_product_is_the_chains_fourth_part(dt, h, n, nq, concat, orders, seed) -> None:
    """What the chain writes, normalised and multiplied next in the same segment (the next
    layer's q, k and v, or the head): the chain's fourth part, one kernel defining both
    values, replayed with the bytes of the equations themselves; the later reader of the
    layer's output reads the chain's."""
    from segc.dtypes import short

    eqns = _next(_layer(12, h, n, short(dt), concat, orders), h, nq, short(dt))
    ins = _inputs(12, h, n, dt, concat, seed, nq)
    keep = ["qq", "late", "out"]
    (m,) = find_all(eqns, keep, {}, _avals(eqns, ins), eqns, products=True, chains=True).products
    assert [p.kind for p in m.parts] == ["add", "glu", "add", "gemv"] and m.outs == ("out", "q2")
    assert m.skip == frozenset(range(24)) and m.last == 23  # (the unflatten after it a view)
    kernel = Counted()
    got = _run(eqns, ins, keep, kernel)
    want = replay_fn(eqns, list(ins), keep, {})(*ins.values())
    assert kernel.calls == Counter({"chain": 1})
    assert all(same_bits(x, y) for x, y in zip(got, want, strict=True))


@pytest.mark.parametrize("where", ["early reader", "no next", "two normed", "off"])
def test_a_fourth_part_only_where_the_kernel_can_define_both(monkeypatch, where) -> None:
    """No fourth part where the layer's output is read before the next product (the
    kernel would define it too late), where several normed products share its norm (q,
    k and v not concatenated), or with ``SEGC_CHAIN_NEXT=0``: the chain of three and
    the product's own kernel, the same bytes."""
    eqns = _next(_layer(8, 16, 12, "f32", True, (True, True, False, True)), 16, 20, "f32")
    ins = _inputs(8, 16, 12, mx.float32, True, 4, 20)
    keep = ["qq", "late", "out"]
    if where == "early reader":  # the later reader moved before the product (its id larger: the order counts)
        eqns = [*eqns[:20], Eqn(30, "Exp", ("out",), (Var("late", (1, 1, 16), "f32"),)), *eqns[20:25]]
    elif where == "no next":
        eqns, keep = eqns[:20], ["out"]
    elif where == "two normed":  # a second product of the normalised row
        ins["wk"] = mx.array(np.ones((6, 16), np.float32))
        more = [
            Eqn(26, "Transpose", ("wk",), (Var("wkt", (16, 6), "f32"),), ([1, 0],)),
            Eqn(27, "Matmul", ("of", "wkt"), (Var("k2", (1, 6), "f32"),)),
        ]
        eqns, keep = [*eqns, *more], [*keep, "k2"]
    else:
        monkeypatch.setenv("SEGC_CHAIN_NEXT", "0")
    found = find_all(eqns, keep, {}, _avals(eqns, ins), eqns, products=True, chains=True).products
    (chain,) = [m for m in found if m.kind == "chain"]
    assert len(chain.parts) == 3 and chain.outs == ("out",)
    kernel = Counted()
    got = _run(eqns, ins, keep, kernel)
    want = replay_fn(eqns, list(ins), keep, {})(*ins.values())
    assert kernel.calls["chain"] == 1 and all(same_bits(x, y) for x, y in zip(got, want, strict=True))
    monkeypatch.setenv("SEGC_CHAIN_NEXT", "maybe")
    with pytest.raises(UsageError, match="SEGC_CHAIN_NEXT must be 1 or 0"):
        find_all(eqns, keep, {}, _avals(eqns, ins), eqns, products=True, chains=True)


def test_a_chain_that_computes_something_else_is_seen() -> None:
    eqns = _layer(8, 16, 12, "f32", False, (True, True, True, True))
    ins = _inputs(8, 16, 12, mx.float32, False, 3)
    (got,) = _run(eqns, ins, ["out"], Counted(broken=frozenset({"chain"})))
    (want,) = replay_fn(eqns, list(ins), ["out"], {})(*ins.values())
    assert not same_bits(got, want)


@pytest.mark.parametrize(
    ("extra", "keep"),
    [
        ((("Exp", ("hh",), "e"),), ["out", "e"]),  # h read by another op
        ((), ["out", "hh"]),  # h an output of the segment
        ((("Exp", ("af",), "e"),), ["out", "e"]),  # the activation read elsewhere
        ((), ["out", "hf"]),  # the normalised row an output: the glu without its norm
    ],
)
def test_no_chain_where_an_intermediate_value_is_read_elsewhere(extra, keep) -> None:
    """The three kernels stay (each where it can), and the bytes too."""
    eqns = _layer(8, 16, 12, "f32", True, (True, False, True, False))
    shapes = {"hh": (1, 1, 16), "af": (1, 12), "hf": (1, 16)}
    eqns += [Eqn(30 + i, p, ins, (Var(name, shapes[ins[0]], "f32"),)) for i, (p, ins, name) in enumerate(extra)]
    ins = _inputs(8, 16, 12, mx.float32, True, 5)
    found = find_all(eqns, keep, {}, _avals(eqns, ins), eqns, products=True, chains=True).products
    assert found and "chain" not in {m.kind for m in found}
    kernel = Counted()
    for got, want in zip(_run(eqns, ins, keep, kernel), replay_fn(eqns, list(ins), keep, {})(*ins.values())):
        assert same_bits(got, want)
    assert "chain" not in kernel.calls and kernel.calls


def test_a_row_too_long_for_shared_memory_is_left_as_three_kernels(monkeypatch) -> None:
    eqns = _layer(8, 16, 12, "f32", False, (True, True, True, True))
    avals = _avals(eqns, _inputs(8, 16, 12, mx.float32, False, 1))
    assert [m.kind for m in find_all(eqns, ["out"], {}, avals, eqns, products=True, chains=True).products] == ["chain"]
    monkeypatch.setattr(product_chain, "SHARED_MAX", 16 * 4 + 16 * 4 - 4)  # one float short of norm and h
    kinds = sorted(m.kind for m in find_all(eqns, ["out"], {}, avals, eqns, products=True, chains=True).products)
    assert kinds == ["add", "add", "glu"]


def test_shared_elems_keep_the_normalised_row_aligned() -> None:
    """The normalised row first, ``h`` after it on a 16-byte boundary; or the activation."""
    assert product_chain.shared_elems(2048, 8192, 2) == 8192
    assert product_chain.shared_elems(2048, 1000, 2) == 4096
    assert product_chain.shared_elems(9, 4, 2) == 16 + 9  # 9 rounded to 8 values of 2 bytes
    assert product_chain.shared_elems(9, 4, 4) == 12 + 9
    assert product_chain.shared_elems(3, 40, 4) == 40


def test_the_setting_and_the_environment_choose(monkeypatch) -> None:
    """Off by default (not yet measured faster on a GPU: docs/lowering.md); the setting
    turns it on, the environment decides over the setting either way."""
    eqns = _layer(8, 16, 12, "f32", False, (True, True, True, True))
    ins = _inputs(8, 16, 12, mx.float32, False, 2)
    three, one = Counter({"add": 2, "glu": 1}), Counter({"chain": 1})
    monkeypatch.delenv("SEGC_CHAIN_PRODUCTS", raising=False)
    for setting, env, want in (
        ("never", None, three),
        ("auto", None, one),
        ("never", "1", one),
        ("auto", "0", three),
        ("auto", " ", one),
    ):
        monkeypatch.setattr(product_chain, "CHAIN_PRODUCTS", setting)
        if env is not None:
            monkeypatch.setenv("SEGC_CHAIN_PRODUCTS", env)
        kernel = Counted()
        _run(eqns, ins, ["out"], kernel)
        assert kernel.calls == want, (setting, env)
        monkeypatch.delenv("SEGC_CHAIN_PRODUCTS", raising=False)
    monkeypatch.setenv("SEGC_CHAIN_PRODUCTS", "yes")
    with pytest.raises(UsageError, match="SEGC_CHAIN_PRODUCTS must be 1 or 0"):
        _run(eqns, ins, ["out"], Counted())
    monkeypatch.delenv("SEGC_CHAIN_PRODUCTS")
    monkeypatch.setattr(product_chain, "CHAIN_PRODUCTS", "sometimes")
    with pytest.raises(UsageError, match="CHAIN_PRODUCTS"):
        _run(eqns, ins, ["out"], Counted())


def test_the_reference_llama_on_the_h200_has_a_chain_a_layer() -> None:
    """Read off the graph the H200 traced: each layer's segment holds one chain, of its
    output product (which reads the attention), its normed gate and up, its down product
    (which writes the layer's output); the head's segment none. Two kernels fewer a layer."""
    g = parse(GRAPH.read_text())
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    consts = {c.var.name: c.value for c in g.consts}
    layers = 0
    for s in segments(g):
        eqns = s.eqns(g)
        assert not CUDA_DEFAULTS["chains"]  # the cost model counts what lowers by default
        fused = find_all(eqns, s.outputs, consts, avals, g.eqns, **{**CUDA_DEFAULTS, "chains": True})
        plain = find_all(eqns, s.outputs, consts, avals, g.eqns, **CUDA_DEFAULTS)
        chains = [m for m in fused.products if m.kind == "chain"]
        rms = [e for e in eqns if e.prim == "RMSNorm"]
        if len(rms) == 1:  # the head: the final norm and the logits
            assert chains == []
            continue
        layers += 1
        (m,) = chains
        a, b, c = m.parts
        assert b.ins[0] == a.out == c.ins[-1] and c.out in s.outputs and b.eps == float(rms[1].args[0])
        assert len(fused.kernels()) == len(plain.kernels()) - 2
        assert fused.skip() == plain.skip() | {e.id for e in eqns if e.ins == (b.out,) and e.prim == "Flatten"}
    assert layers == 16


def test_with_q_k_and_v_concatenated_each_chain_takes_the_next_product(monkeypatch) -> None:
    """The H200's graph with its projections concatenated (as ``concat_projections=True``
    makes them; the shape check taken as passed): each layer's chain takes the next
    layer's q, k and v product, the last layer's the head, so a layer's marker cut is
    inside a kernel and legalisation moves it past that product; every layer's segment
    then has one chain of four parts, a step 16 kernels fewer than with three parts, and
    the last marker, which would leave a segment of the output's reshape alone, is
    dropped."""
    from segc.passes.concat import concat_projections
    from segc.passes.legalize import legalize_plan
    from segc.passes.plan import apply_plan, plan_of

    g = concat_projections(parse(GRAPH.read_text()), check=lambda *_a, **_k: True)
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    consts = {c.var.name: c.value for c in g.consts}
    flags = {**CUDA_DEFAULTS, "chains": True}
    kernels = {}
    for nxt in ("1", "0"):
        monkeypatch.setenv("SEGC_CHAIN_NEXT", nxt)
        whole = find_all(g.eqns, g.outputs, consts, avals, g.eqns, **flags).products
        chains = [m for m in whole if m.kind == "chain"]
        assert len(chains) == 16 and {len(m.parts) for m in chains} == {4 if nxt == "1" else 3}
        if nxt == "1":  # q, k and v of a layer, 15 times; the head's vocabulary
            assert [m.parts[3].n for m in chains] == [2048 + 2 * 512] * 15 + [32000]
        plan = legalize_plan(g, plan_of(g, "markers"), kernels=flags)
        assert len(plan.moved) == (16 if nxt == "1" else 0)
        if nxt == "1":  # the last marker: past the head's product only its reshape is left
            assert [m.placed for m in plan.moved].count(None) == 1 and "launches nothing" in plan.moved[-1].reason
        cut = apply_plan(g, plan)
        found = [find_all(s.eqns(cut), s.outputs, consts, avals, cut.eqns, **flags) for s in segments(cut)]
        kernels[nxt] = [len(f.kernels()) for f in found]
        parts = [[len(m.parts) for m in f.products if m.kind == "chain"] for f in found]
        assert parts == ([[4]] * 16 if nxt == "1" else [[3]] * 16 + [[]])
    # segc's kernels a segment: (the first layer's q, k and v,) the write with its
    # attention, the chain; the head's product; with four parts the next product moved
    # in, and the head's into the last layer's segment (no tail segment left)
    assert kernels["0"] == [3] * 16 + [1] and kernels["1"] == [3] + [2] * 15


def test_find_products_alone_makes_no_chain() -> None:
    eqns = _layer(8, 16, 12, "f32", False, (True, True, True, True))
    avals = _avals(eqns, _inputs(8, 16, 12, mx.float32, False, 1))
    assert sorted(m.kind for m in find_products(eqns, ["out"], avals, eqns)) == ["add", "add", "glu"]


def test_the_cost_model_and_legality_count_a_chain_as_one_kernel(monkeypatch) -> None:
    """With chains on, the H200 cost model counts two kernels fewer a layer, and no cut
    is legal inside a layer's MLP (from its output product to its down product's
    residual) where one was without."""
    from segc.passes.analysis import ops
    from segc.passes.costmodel import H200, op_costs
    from segc.passes.legalize import legal_points

    g = parse(GRAPH.read_text())
    counted, points = {}, {}
    for env in ("1", "0"):
        monkeypatch.setenv("SEGC_CHAIN_PRODUCTS", env)
        counted[env] = sum(op_costs(g, H200).kernels)
        points[env] = set(legal_points(g, kernels=True))
    assert counted["1"] == counted["0"] - 2 * 16
    os_ = ops(g)
    # a layer's two residual additions (of the hidden row's shape): after its attention's
    # output product, and after its MLP's down product
    adds = [k for k, e in enumerate(os_) if e.prim == "Add" and e.outs[0].shape == (1, 1, 2048)]
    spans = [(adds[i] - 2, adds[i + 1]) for i in range(0, len(adds), 2)]
    assert all(os_[a].prim == "Matmul" for a, _ in spans)  # the output product, unflattened, added
    inside = {p for a, b in spans for p in range(a + 1, b + 1)}
    assert len(spans) == 16 and points["1"] <= points["0"]
    assert not points["1"] & inside and points["0"] & inside


def test_a_layer_of_the_h200_trace_replays_with_its_chain_byte_for_byte() -> None:
    """One layer's segment of the graph the H200 traced (its own RMSNorm, RoPE and
    attention primitives), replayed on this machine over random values with the chain
    computed by MLX's ops (``reference_products``) and without any match: the same bytes
    for every output, the chain reading the real trace's values."""
    from segc.dtypes import to_mx

    g = parse(GRAPH.read_text())
    s = list(segments(g))[1]
    vs = g.vars()
    r = np.random.default_rng(0)
    ins = []
    for name in s.inputs:
        v = vs[name]
        if v.dtype == "i32":
            ins.append(mx.full(v.shape, 700, dtype=mx.int32))  # the cache's offset
        elif v.dtype == "bool":
            ins.append(mx.array(r.random(v.shape) < 0.7))
        else:
            ins.append(mx.array((r.standard_normal(v.shape) * 0.05).astype(np.float32)).astype(to_mx(v.dtype)))
    consts = {c.var.name: c.value for c in g.consts}
    avals = {n: (v.shape, v.dtype) for n, v in vs.items()}
    kernel = Counted()
    fused = replay_fn(s.eqns(g), list(s.inputs), list(s.outputs), consts, None, None, g.eqns, kernel, avals)(*ins)
    plain = replay_fn(s.eqns(g), list(s.inputs), list(s.outputs), consts, None, None, g.eqns)(*ins)
    assert kernel.calls["chain"] == 1 and "glu" not in kernel.calls
    for got, want in zip(fused, plain, strict=True):
        assert same_bits(got, want)
