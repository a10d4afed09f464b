"""A one-row product and the elementwise work after it as one kernel (``segc.lower.products``).

On CUDA segc computes ``r + x @ W.T`` and ``silu(x @ Wg.T) * (x @ Wu.T)`` of a decode
step each with one kernel that keeps MLX's bits (``tests/test_products_cuda.py``).
Here, on the CPU, the finder and the replay are checked with the kernel replaced by
:func:`reference_products` (MLX's own ops): segc's decode must stay byte for byte
eager's, which it cannot if a match reads the wrong weight, row or addend, or drops an
operation; and a kernel that computes something else must be seen to break it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import examples, same_bits, trace_graph
from hypothesis import given, settings
from hypothesis import strategies as hst
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.errors import UsageError
from segc.lower import products
from segc.lower.layer_chain import reference_layer
from segc.lower.products import ProductMatch, find_products, reference_products
from segc.models.zoo import build

GPU = mx.default_device() == mx.gpu  # where the trace records mx.fast.rms_norm as RMSNorm


def _found(g) -> list[ProductMatch]:
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    return find_products(g.eqns, g.outputs, avals, g.eqns)


class Counted:
    """The reference kernel, counting its calls by kind."""

    def __init__(self, broken: bool | frozenset[str] = False):
        self.calls: Counter[str] = Counter()
        self.quant: set = set()
        self.broken = broken

    def __call__(self, m: ProductMatch, ins: Sequence[mx.array]) -> mx.array:
        self.calls[m.kind] += 1
        self.quant.add(m.quant)
        out = reference_layer(m, ins) if m.kind == "layer" else reference_products(m, ins)
        if self.broken is True or (self.broken and m.kind in self.broken):
            return [x * 2 for x in out] if isinstance(out, list) else out * 2
        return out


def _decode(
    arch: str, dtype: mx.Dtype, concat: bool, kernel: Counted, monkeypatch: pytest.MonkeyPatch, layers=2, bits=None
):
    """Logits of a prompt and three decode steps: eager, and segc with ``kernel``."""
    monkeypatch.setattr(products, "FUSED_PRODUCTS", kernel)
    model = build(arch, num_hidden_layers=layers, dtype=dtype, bits=bits)
    step = segc.jit(model, validate=False, concat_projections=concat)
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[(7 * i + 3) % 100 for i in range(9)]])
    pairs = [(model(prompt, cache=ce), step(prompt, cache=cs))]
    for _ in range(3):
        t = mx.argmax(pairs[-1][0][:, -1:], -1)
        pairs.append((model(t, cache=ce), step(t, cache=cs)))
    return pairs, ce, cs


@pytest.mark.parametrize("concat", [False, True])
@pytest.mark.parametrize("arch,bits", [("llama", None), ("qwen3", None), ("llama", 4), ("qwen3", 8)])
def test_a_decode_with_the_fused_products_is_eager_byte_for_byte(arch, bits, concat, monkeypatch) -> None:
    """Also over quantized weights (``QuantizedLinear``: MLX's ``qmv`` for one row)."""
    kernel = Counted()
    pairs, ce, cs = _decode(arch, mx.bfloat16, concat, kernel, monkeypatch, bits=bits)
    for k, (want, got) in enumerate(pairs):
        assert same_bits(got, want), f"call {k}: logits"
    for a, b in zip(ce, cs):
        n = a.offset
        assert same_bits(a.keys[..., :n, :], b.keys[..., :n, :])
        assert same_bits(a.values[..., :n, :], b.values[..., :n, :])
    # each decode step of 2 layers: 2 residual additions and one gated activation a layer
    # (the prompt's products have 9 rows: none); on a GPU the trace keeps RMSNorm whole, and
    # the norms before q/k/v (one product concatenated, three otherwise, each normalising
    # the row itself) and before the logits go with them
    gemv = 0 if not GPU else 3 if concat else 7
    assert kernel.calls == {"add": 4, "glu": 2, **({"gemv": gemv} if gemv else {})}, kernel.calls
    assert kernel.quant == ({(32, bits)} if bits else {None})


def test_a_kernel_that_computes_something_else_is_seen(monkeypatch) -> None:
    pairs, _, _ = _decode("llama", mx.float32, False, Counted(broken=True), monkeypatch)
    assert same_bits(pairs[0][1], pairs[0][0]), "the prompt has no one-row product"
    assert not any(same_bits(got, want) for want, got in pairs[1:])


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("layers", [1, 2])
def test_the_experts_products_are_fused_gathered(arch, layers, monkeypatch) -> None:
    """A mixture-of-experts decode step (float32: MLX's CPU gathers no other dtype): each
    layer's experts' gate and up with SwiGLU (``gglu``) and their weighted down products
    with the sum and the residual (``gmoe``), the prompt's (nine rows) left to MLX;
    eager's bits."""
    kernel = Counted()
    pairs, _, _ = _decode(arch, mx.float32, False, kernel, monkeypatch, layers=layers)
    for want, got in pairs:
        assert same_bits(got, want)
    # a layer: o_proj + residual and the experts' two kernels (on a GPU also the plain
    # products with their norms, q/k/v and the logits: not counted here)
    calls = {k: n for k, n in kernel.calls.items() if not (GPU and k == "gemv")}
    assert calls == {"add": layers, "gglu": layers, "gmoe": layers}, kernel.calls
    broken = Counted(broken=frozenset({"gglu", "gmoe"}))  # the experts' kernels' outputs are used
    pairs, _, _ = _decode(arch, mx.float32, False, broken, monkeypatch, layers=layers)
    assert not any(same_bits(got, want) for want, got in pairs[1:])


@settings(max_examples=examples(25), deadline=None)
@given(
    dt=hst.sampled_from([mx.float32, mx.float16, mx.bfloat16]),
    k=hst.integers(1, 70),
    n=hst.integers(1, 40),
    gate_first=hst.booleans(),
    gs_first=hst.booleans(),
    p_first=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_every_operand_order_and_shape_keeps_the_bits(dt, k, n, gate_first, gs_first, p_first, seed) -> None:
    """Functions of one row, all operand orders, any sizes: the matches' reference
    against the function run eagerly, byte for byte; the matches found are the ones
    written."""
    key = mx.random.key(seed)
    ks = mx.random.split(key, 6)
    x = mx.random.normal((1, 1, k), key=ks[0]).astype(dt)
    wg, wu, wd = (mx.random.normal((n, k), key=ks[i]).astype(dt) for i in (1, 2, 3))
    wo = mx.random.normal((k, n), key=ks[4]).astype(dt)

    def f(x, wg, wu, wd, wo):
        g, u = x @ wg.T, x @ wu.T
        s = mx.sigmoid(g)
        gs = g * s if gate_first else s * g
        h = gs * u if gs_first else u * gs
        y = h @ wo.T
        return y + x if p_first else x + y

    args = (x, wg, wu, wd, wo)
    g = trace_graph(f, *args)
    found = _found(g)
    assert sorted(m.kind for m in found) == ["add", "glu"]
    glu = next(m for m in found if m.kind == "glu")
    add = next(m for m in found if m.kind == "add")
    assert glu.order == (gate_first, gs_first) and add.order == (p_first,)
    assert same_bits(_replayed(g, args, Counted()), f(*args))


def _replayed(g, args, kernel) -> mx.array:
    from segc.lower import replay_fn

    names = [i.var.name for i in g.inputs]
    consts = {c.var.name: c.value for c in g.consts}
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    fn = replay_fn(g.eqns, names, g.outputs, consts, None, None, g.eqns, kernel, avals)
    (out,) = fn(*args)
    return out


def _fused_against_plain(eqns, ins: dict, outs: list[str], avals: dict) -> Counter[str]:
    """Replays hand-built ``eqns`` over ``ins`` with every match computed by MLX's ops
    and without matches: the same bits for every output. Returns the matches' kinds."""
    from segc.lower import replay_fn

    names, vals = list(ins), list(ins.values())
    kernel = Counted()
    fused = replay_fn(eqns, names, outs, {}, None, None, eqns, kernel, avals)(*vals)
    for got, want in zip(fused, replay_fn(eqns, names, outs, {})(*vals), strict=True):
        assert same_bits(got, want)
    return kernel.calls


def test_nothing_is_fused_where_an_intermediate_value_is_read_elsewhere() -> None:
    x = mx.ones((1, 8))
    w = mx.ones((4, 8))
    r = mx.ones((1, 4))

    def product_kept(x, w, r):  # the product is an output too
        y = x @ w.T
        return r + y, y

    def gate_kept(x, w, r):  # the gate's value is read by another op
        gv, u = x @ w.T, x @ w.T
        return (gv * mx.sigmoid(gv)) * u, gv + 1

    def two_rows(x, w, r):  # a product of two rows: not MLX's gemv
        return mx.concatenate([x, x]) @ w.T + mx.concatenate([r, r])

    def broadcast_addend(x, w, r):  # the addend broadcast: the Add reads a Broadcast, kept
        return x @ w.T + r[0, :1]

    for f in (product_kept, gate_kept, two_rows):
        assert _found(trace_graph(f, x, w, r)) == [], f.__name__
    g = trace_graph(broadcast_addend, x, w, r)
    assert [m.kind for m in _found(g)] == ["add"]
    assert same_bits(_replayed(g, (x, w, r), Counted()), broadcast_addend(x, w, r))


def test_the_setting_is_read_when_a_graph_lowers(monkeypatch) -> None:
    assert products.product_kernel("never") is None
    with pytest.raises(UsageError, match="FUSED_PRODUCTS"):
        products.product_kernel("sometimes")
    if not (mx.default_device() == mx.gpu and mx.cuda.is_available()):
        assert products.product_kernel("auto") is None  # the CPU keeps MLX's kernels
    monkeypatch.setenv("SEGC_FUSED_PRODUCTS", "0")
    assert products.product_kernel("auto") is None


def test_a_module_with_a_gated_mlp_of_its_own_is_fused(monkeypatch) -> None:
    class GLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(16, 24, bias=False)
            self.up = nn.Linear(16, 24, bias=False)
            self.down = nn.Linear(24, 16, bias=False)

        def __call__(self, x):
            return x + self.down(nn.silu(self.gate(x)) * self.up(x))

    kernel = Counted()
    monkeypatch.setattr(products, "FUSED_PRODUCTS", kernel)
    m = GLU()
    x = mx.random.normal((1, 1, 16))
    assert same_bits(segc.jit(m)(x), m(x))
    assert kernel.calls == {"add": 1, "glu": 1}


def test_a_row_sliced_out_of_another_buffer_is_left_to_mlx() -> None:
    """Such a row may start off the alignment MLX's gemv checks, where MLX's matmul
    copies it first: the kernel, reading it in place, would sum in another order."""
    x, w, r = mx.ones((1, 9)), mx.ones((4, 8)), mx.ones((1, 4))
    assert _found(trace_graph(lambda x, w, r: x[:, 1:] @ w.T + r, x, w, r)) == []
    assert len(_found(trace_graph(lambda x, w, r: mx.exp(x[:, 1:]) @ w.T + r, x, w, r))) == 1


def _mlp_block(k: int, n: int, dt: str, eps: float, concat: bool) -> list:
    """A llama MLP block's equations as a GPU trace records them (``RMSNorm`` whole): the
    norm, the gate and up products, the gated activation, the down product, the residual
    addition. Built by hand: on the CPU MLX records the norm's decomposition."""
    from segc.ir import Eqn, Var

    def e(i, prim, ins, name, shape, *args):
        return Eqn(i, prim, tuple(ins), (Var(name, shape, dt),), args)

    eqns = [
        e(0, "RMSNorm", ("h", "nw"), "hn", (1, 1, k), eps),
        e(1, "Flatten", ("hn",), "hf", (1, k), 0, 1),
    ]
    if concat:
        eqns += [
            e(2, "Transpose", ("wgu",), "wgut", (k, 2 * n), [1, 0]),
            e(3, "Matmul", ("hf", "wgut"), "y", (1, 2 * n)),
            e(4, "Slice", ("y",), "g2", (1, n), [0, 0], [1, n], [1, 1]),
            e(5, "Slice", ("y",), "u2", (1, n), [0, n], [1, 2 * n], [1, 1]),
        ]
    else:
        eqns += [
            e(2, "Transpose", ("wg",), "wgt", (k, n), [1, 0]),
            e(3, "Matmul", ("hf", "wgt"), "g2", (1, n)),
            e(4, "Transpose", ("wu",), "wut", (k, n), [1, 0]),
            e(5, "Matmul", ("hf", "wut"), "u2", (1, n)),
        ]
    eqns += [
        e(6, "Unflatten", ("g2",), "g", (1, 1, n), 0, [1, 1]),
        e(7, "Sigmoid", ("g",), "s", (1, 1, n)),
        e(8, "Multiply", ("g", "s"), "gs", (1, 1, n)),
        e(9, "Unflatten", ("u2",), "u", (1, 1, n), 0, [1, 1]),
        e(10, "Multiply", ("gs", "u"), "a", (1, 1, n)),
        e(11, "Flatten", ("a",), "af", (1, n), 0, 1),
        e(12, "Transpose", ("wd",), "wdt", (n, k), [1, 0]),
        e(13, "Matmul", ("af", "wdt"), "d2", (1, k)),
        e(14, "Unflatten", ("d2",), "d", (1, 1, k), 0, [1, 1]),
        e(15, "Add", ("h", "d"), "out", (1, 1, k)),
        e(16, "RMSNorm", ("out", "fw"), "on", (1, 1, k), eps),  # the final norm and the logits
        e(17, "Flatten", ("on",), "of", (1, k), 0, 1),
        e(18, "Transpose", ("wl",), "wlt", (k, 3), [1, 0]),
        e(19, "Matmul", ("of", "wlt"), "logits", (1, 3)),
    ]
    return eqns


@settings(max_examples=examples(15), deadline=None)
@given(
    dt=hst.sampled_from([mx.float32, mx.bfloat16]),
    k=hst.integers(2, 40),
    n=hst.integers(1, 20),
    concat=hst.booleans(),
    eps=hst.sampled_from([1e-5, 1e-6, 0.1]),
    seed=hst.integers(0, 2**31),
)
def test_a_norm_before_the_products_is_taken_with_them(dt, k, n, concat, eps, seed) -> None:
    from segc.dtypes import short

    d = short(dt)
    eqns = _mlp_block(k, n, d, eps, concat)
    r = np.random.default_rng(seed)

    def a(*shape):
        return mx.array(r.standard_normal(shape).astype(np.float32)).astype(dt)

    ins = {"h": a(1, 1, k), "nw": a(k), "fw": a(k), "wd": a(k, n), "wl": a(3, k)}
    ins.update({"wgu": a(2 * n, k)} if concat else {"wg": a(n, k), "wu": a(n, k)})
    avals = {name: (tuple(v.shape), d) for name, v in ins.items()}
    avals.update({o.name: (o.shape, o.dtype) for e in eqns for o in e.outs})
    found = find_products(eqns, ["out", "logits"], avals, eqns)
    assert sorted((m.kind, m.eps is not None) for m in found) == [("add", False), ("gemv", True), ("glu", True)]
    assert all(m.eps == eps for m in found if m.eps is not None)
    assert _fused_against_plain(eqns, ins, ["out", "logits"], avals) == {"glu": 1, "add": 1, "gemv": 1}


def test_a_norm_read_elsewhere_stays_and_the_product_is_fused_without_it() -> None:
    from segc.ir import Eqn, Var

    eqns = _mlp_block(8, 4, "f32", 1e-5, True)
    eqns.append(Eqn(20, "Exp", ("hn",), (Var("hn_exp", (1, 1, 8), "f32"),)))  # the norm's output, read again
    avals = {"h": ((1, 1, 8), "f32"), "nw": ((8,), "f32"), "wgu": ((8, 8), "f32"), "wd": ((8, 4), "f32")}
    avals.update({"fw": ((8,), "f32"), "wl": ((3, 8), "f32")})
    avals.update({o.name: (o.shape, o.dtype) for e in eqns for o in e.outs})
    found = {m.kind: m for m in find_products(eqns, ["out", "logits", "hn_exp"], avals, eqns)}
    assert found["glu"].eps is None and "hn" not in found["glu"].ins and found["glu"].ins[0] == "hf"
    assert found["gemv"].eps is not None  # the final norm is read by the logits alone
    assert 0 not in found["glu"].skip


def test_norm_blocks_follow_mlx_launch() -> None:
    """``dispatch_num_chunks`` of MLX 0.32's CUDA RMSNorm, written out by hand."""
    nb = products.norm_blocks
    assert nb(512, "bf16") == (64, 1, 8)  # k <= 8 * 64
    assert nb(2048, "bf16") == (128, 2, 8)  # 256 vectors: 2 chunks of 128
    assert nb(8192, "bf16") == (128, 8, 8)
    assert nb(8193, "bf16") is None  # MLX's other kernel
    assert nb(1536, "bf16") == (64, 3, 8)  # 192 vectors: a multiple of 64, not of 128
    assert nb(1600, "bf16") == (128, 2, 8)  # 200 vectors: of neither, rounded up to chunks of 128
    assert nb(4096, "f32") == (128, 8, 4)
    assert nb(3000, "f32") == (128, 6, 4)  # 750 vectors, rounded up to 6 chunks of 128


@pytest.mark.parametrize("spoil", [False, True])
def test_a_norm_read_by_three_products_goes_into_each(spoil) -> None:
    """q, k and v not concatenated: three products read one norm; each kernel normalises
    the row itself and the norm's own kernel goes. Where something else reads the row
    too (``spoil``), the norm stays and the products are MLX's."""
    from segc.ir import Eqn, Var

    k, dt = 16, "f32"

    def e(i, prim, ins, name, shape, *args):
        return Eqn(i, prim, tuple(ins), (Var(name, shape, dt),), args)

    eqns = [e(0, "RMSNorm", ("h", "nw"), "hn", (1, 1, k), 1e-5), e(1, "Flatten", ("hn",), "hf", (1, k), 0, 1)]
    outs = []
    for j, (w, n) in enumerate((("wq", 16), ("wk", 8), ("wv", 8))):
        eqns += [
            e(2 + 2 * j, "Transpose", (w,), f"{w}t", (k, n), [1, 0]),
            e(3 + 2 * j, "Matmul", ("hf", f"{w}t"), f"y{j}", (1, n)),
        ]
        outs.append(f"y{j}")
    if spoil:
        eqns.append(e(8, "Exp", ("hf",), "spoiled", (1, k)))
        outs.append("spoiled")
    r = np.random.default_rng(3)
    ins = {
        n: mx.array(r.standard_normal(s).astype(np.float32))
        for n, s in (("h", (1, 1, k)), ("nw", (k,)), ("wq", (16, k)), ("wk", (8, k)), ("wv", (8, k)))
    }
    avals = {n: (tuple(v.shape), dt) for n, v in ins.items()}
    avals.update({o.name: (o.shape, o.dtype) for q in eqns for o in q.outs})
    found = find_products(eqns, outs, avals, eqns)
    if spoil:
        assert found == []
        return
    assert [(m.kind, m.ins, m.eps) for m in found] == [("gemv", ("h", w, "nw"), 1e-5) for w in ("wq", "wk", "wv")]
    assert {0, 1} <= found[0].skip and not {0, 1} & (found[1].skip | found[2].skip)
    assert _fused_against_plain(eqns, ins, outs, avals) == {"gemv": 3}


@settings(max_examples=examples(40), deadline=None)
@given(
    ops=hst.lists(
        hst.tuples(
            hst.sampled_from(["prod", "add", "padd", "glu", "exp", "mul"]), hst.integers(0, 99), hst.integers(0, 99)
        ),
        min_size=1,
        max_size=9,
    ),
    keep=hst.lists(hst.integers(0, 99), max_size=3),
    bits=hst.sampled_from([None, 4, 8]),
    seed=hst.integers(0, 2**31),
)
def test_random_programs_keep_their_bits_whatever_is_fused(ops, keep, bits, seed) -> None:
    """Random programs of one-row products (of plain or quantized weights), additions,
    gated activations and other elementwise steps over rows of one width, some
    intermediate values returned too: the replay with every match the finder makes (the
    kernel replaced by MLX's ops) gives the program's bits, eager's and the plain
    replay's."""
    k = 8 if bits is None else 32
    r = np.random.default_rng(seed)
    args = [mx.array(r.standard_normal((1, k)).astype(np.float32)) for _ in range(2)]
    ws_ = [mx.array(r.standard_normal((k, k)).astype(np.float32)) for _ in range(3)]
    args += ws_ if bits is None else [q for w in ws_ for q in mx.quantize(w, group_size=32, bits=bits)]

    def f(x, y, *flat):
        vals = [x, y]
        if bits is None:
            ws = [lambda a, w=w: a @ w.T for w in flat]
        else:
            ws = [
                lambda a, q=flat[3 * i : 3 * i + 3]: mx.quantized_matmul(
                    a, *q, transpose=True, group_size=32, bits=bits
                )
                for i in range(3)
            ]
        for op, i, j in ops:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if op == "prod":
                vals.append(ws[j % 3](a))
            elif op == "add":
                vals.append(a + b)
            elif op == "padd":  # a product and an addition, the product kept where later ops find it
                p = ws[i % 3](a)
                vals += [p, p + b if j % 2 else b + p]
            elif op == "glu":
                g = ws[i % 3](a)
                vals.append((g * mx.sigmoid(g)) * ws[(i + 1) % 3](a))
            elif op == "exp":
                vals.append(mx.exp(a) * 0.5)
            else:
                vals.append(a * b)
        return [vals[-1], *(vals[q % len(vals)] for q in keep)]

    g = trace_graph(f, *args)
    names = [i.var.name for i in g.inputs]
    consts = {c.var.name: c.value for c in g.consts}
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    from segc.lower import replay_fn

    kernel = Counted()
    fused = replay_fn(g.eqns, names, g.outputs, consts, None, None, g.eqns, kernel, avals)(*args)
    plain = replay_fn(g.eqns, names, g.outputs, consts)(*args)
    want = f(*args)
    assert sum(kernel.calls.values()) == len(_found(g))
    for a, b, c in zip(fused, plain, want):
        assert same_bits(a, b) and same_bits(a, c)


def _qmlp_block(k: int, n: int, dt: str, group: int, bits: int, concat: bool) -> list:
    """A quantized llama MLP block as a GPU trace records it: the norm whole, each
    projection one ``QuantizedMatmul`` of the (1, 1, K) row (no flattening), the
    concatenated gate and up sliced along the last axis."""
    from segc.ir import Eqn, Var

    def e(i, prim, ins, name, shape, *args, dtype=dt):
        return Eqn(i, prim, tuple(ins), (Var(name, shape, dtype),), args)

    q = (group, bits, 0, True)

    def qm(i, x, w, name, rows):
        return e(i, "QuantizedMatmul", (x, w, f"{w}_s", f"{w}_b"), name, (1, 1, rows), *q)

    eqns = [e(0, "RMSNorm", ("h", "nw"), "hn", (1, 1, k), 1e-5)]
    if concat:
        eqns += [
            qm(1, "hn", "wgu", "y", 2 * n),
            e(2, "Slice", ("y",), "g", (1, 1, n), [0, 0, 0], [1, 1, n], [1, 1, 1]),
            e(3, "Slice", ("y",), "u", (1, 1, n), [0, 0, n], [1, 1, 2 * n], [1, 1, 1]),
        ]
    else:
        eqns += [qm(1, "hn", "wg", "g", n), qm(3, "hn", "wu", "u", n)]
    return [
        *eqns,
        e(4, "Sigmoid", ("g",), "s", (1, 1, n)),
        e(5, "Multiply", ("g", "s"), "gs", (1, 1, n)),
        e(6, "Multiply", ("gs", "u"), "a", (1, 1, n)),
        qm(7, "a", "wd", "d", k),
        e(8, "Add", ("h", "d"), "out", (1, 1, k)),
        e(9, "RMSNorm", ("out", "fw"), "on", (1, 1, k), 1e-5),
        qm(10, "on", "wl", "logits", 32),
    ]


@settings(max_examples=examples(12), deadline=None)
@given(
    dt=hst.sampled_from([mx.float32, mx.bfloat16, mx.float16]),
    k=hst.sampled_from([128, 256]),
    n=hst.sampled_from([128, 384]),
    group=hst.sampled_from([32, 64, 128]),
    bits=hst.sampled_from([2, 3, 4, 5, 6, 8]),
    concat=hst.booleans(),
    seed=hst.integers(0, 2**31),
)
def test_a_quantized_block_with_its_norms_is_taken_whole(dt, k, n, group, bits, concat, seed) -> None:
    """The quantized products with their norms and epilogues (gate and up with their
    activation and norm, down with its residual, the logits with the final norm): found
    with their quantization, and the replay with the matches computed by MLX's ops is
    the plain replay's bits."""
    from segc.dtypes import short

    d = short(dt)
    eqns = _qmlp_block(k, n, d, group, bits, concat)
    r = np.random.default_rng(seed)

    def a(*shape):
        return mx.array(r.standard_normal(shape).astype(np.float32)).astype(dt)

    ins = {"h": a(1, 1, k), "nw": a(k), "fw": a(k)}
    weights = {"wd": a(k, n), "wl": a(32, k), **({"wgu": a(2 * n, k)} if concat else {"wg": a(n, k), "wu": a(n, k)})}
    for name, w in weights.items():
        ins.update(zip((name, f"{name}_s", f"{name}_b"), mx.quantize(w, group_size=group, bits=bits)))
    avals = {name: (tuple(v.shape), short(v.dtype)) for name, v in ins.items()}
    avals.update({o.name: (o.shape, o.dtype) for e in eqns for o in e.outs})
    found = find_products(eqns, ["out", "logits"], avals, eqns)
    kinds = sorted((m.kind, m.eps is not None, m.quant) for m in found)
    assert kinds == [("add", False, (group, bits)), ("gemv", True, (group, bits)), ("glu", True, (group, bits))]
    assert _fused_against_plain(eqns, ins, ["out", "logits"], avals) == {"glu": 1, "add": 1, "gemv": 1}


@pytest.mark.parametrize(
    "spoil",
    ["none", "mode", "untransposed", "rows", "row_length", "two_rows"],
)
def test_quantized_products_mlx_runs_otherwise_are_left_alone(spoil) -> None:
    """Only what MLX computes with its ``qmv`` is taken: affine quantization, the weight
    transposed, at most 16384 rows and row length, one row."""
    from segc.ir import Eqn, Var

    k, n = 256, 20000 if spoil == "rows" else 64
    if spoil == "row_length":
        k = 16384 + 128
    m = 2 if spoil == "two_rows" else 1
    q = (64, 4, 1 if spoil == "mode" else 0, spoil != "untransposed")
    eqns = [
        Eqn(0, "QuantizedMatmul", ("x", "w", "s", "b"), (Var("y", (1, m, n), "bf16"),), q),
        Eqn(1, "Add", ("r", "y"), (Var("out", (1, m, n), "bf16"),), ()),
    ]
    avals = {"x": ((1, m, k), "bf16"), "w": ((n, k // 8), "u32"), "s": ((n, k // 64), "bf16")}
    avals.update({"b": avals["s"], "r": ((1, m, n), "bf16"), "y": ((1, m, n), "bf16"), "out": ((1, m, n), "bf16")})
    found = find_products(eqns, ["out"], avals, eqns)
    assert [(f.kind, f.quant) for f in found] == ([("add", (64, 4))] if spoil == "none" else [])


def test_the_gathered_kernels_can_be_turned_off(monkeypatch) -> None:
    """``SEGC_FUSED_GATHER=0`` leaves the experts to MLX's kernels (a benchmark's A/B
    switch); another value is refused, naming the variable."""
    monkeypatch.setenv("SEGC_FUSED_GATHER", "0")
    kernel = Counted()
    pairs, _, _ = _decode("mixtral", mx.float32, False, kernel, monkeypatch, layers=1)
    assert all(same_bits(got, want) for want, got in pairs)
    assert "gglu" not in kernel.calls and "gmoe" not in kernel.calls and kernel.calls["add"] == 1, kernel.calls
    monkeypatch.setenv("SEGC_FUSED_GATHER", "yes")
    with pytest.raises(UsageError, match="SEGC_FUSED_GATHER"):
        _decode("mixtral", mx.float32, False, Counted(), monkeypatch, layers=1)
