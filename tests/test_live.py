"""The attention over the live keys (``segc.lower.live``, ``SEGC_LIVE_ATTENTION=1``): a
rotated write paired with its attention becomes the write, then MLX's own attention over
the buffers sliced to ``offset + 1`` positions, the call eager mlx-lm makes; the length
read from the host (``segc.hostints``), the segment run as compiled stretches around it.
On the CPU the write is its reference (``kvwrite.reference_kv_write``) and the graph is
built as a GPU trace records it (``test_kvwrite._layer``, the mask made from the offset);
every result is compared with eager MLX's ops, byte for byte. The GPU's end-to-end
decode against eager mlx-lm: ``tests/test_live_cuda.py``."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_env_setting, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_kvattention import _attention_eqns
from test_kvwrite import _layer, _values

from segc import hostints
from segc.ir import Eqn, Var
from segc.lower import kvwrite, live
from segc.lower.attention import reference_attention
from segc.lower.kvwrite import reference_kv_write
from segc.lower.replay import replay_fn
from segc.trace import kvcache

pytestmark = pytest.mark.timeout(120)
C = 16


def _mask_eqns(window: bool = False, reversed_: bool = False) -> list[Eqn]:
    """The dynamic cache's mask for one query (``kvcache._dyn_mask``) as the trace
    records it: ``offset + arange(1) >= arange(C)``, through its broadcasts."""
    b = lambda n, shape, dt="i32": Var(n, shape, dt)  # noqa: E731
    eqns = [
        Eqn(200, "Broadcast", ("off",), (b("m_off", (1, 1)),), ((1, 1),)),
        Eqn(201, "Arange", (), (b("m_r", (1,)),), (0.0, 1.0, 1.0)),
        Eqn(202, "ExpandDims", ("m_r",), (b("m_r2", (1, 1)),), ((1,),)),
        Eqn(203, "Add", ("m_off", "m_r2"), (b("m_q", (1, 1)),)),
        Eqn(204, "Broadcast", ("m_q",), (b("m_qb", (1, C)),), ((1, C),)),
        Eqn(205, "Arange", (), (b("m_k", (C,)),), (0.0, float(C), 1.0)),
        Eqn(206, "ExpandDims", ("m_k",), (b("m_k2", (1, C)),), ((0,),)),
    ]
    ge = ("m_k2", "m_qb") if reversed_ else ("m_qb", "m_k2")
    eqns.append(Eqn(207, "GreaterEqual", ge, (b("m_ge", (1, C), "bool"),)))
    if window:
        eqns.append(Eqn(208, "Less", ("m_k2", "m_qb"), (b("m_lt", (1, C), "bool"),)))
        eqns.append(Eqn(209, "LogicalAnd", ("m_ge", "m_lt"), (b("mask", (1, C), "bool"),)))
    else:
        eqns.append(Eqn(208, "Broadcast", ("m_ge",), (b("mask", (1, C), "bool"),), ((1, C),)))
    return eqns


def _graph(dt: str = "bf16", d: int = 8, **mask: bool):
    eqns, avals, ins, _ = _layer(h=2, hq=4, c=C, d=d, dv=d, dims=8, dt=dt)
    eqns = [e for e in eqns if e.prim != "Multiply"]  # the queries read by the attention alone
    att, consts, out = _attention_eqns("qr", "ko", "vo", "mask", avals)
    me = _mask_eqns(**mask)
    for e in [*att, *me]:
        avals.update({o.name: (o.shape, o.dtype) for o in e.outs})
    avals["mask"] = ((1, C), "bool")
    avals.update({n: (tuple(v.shape), {mx.bfloat16: "bf16"}.get(v.dtype, "f32")) for n, v in consts.items()})
    return [*me, *eqns, *att], avals, ins, [out, "ko", "vo"], consts


class Live:
    """The reference write as the kernel, ``with_attention`` (its references) and ``live``
    (the write the live attention follows), counting the pairs and the attentions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pairs: list[Any] = []
        self.lives: list[int] = []
        real = live.offset_value
        monkeypatch.setattr(live, "offset_value", lambda off: self.lives.append(1) or real(off))

    def live(self, m, ins):
        return reference_kv_write(m, ins)

    def __call__(self, m, ins):
        return reference_kv_write(m, ins)

    def with_attention(self, m, scale, ins):
        self.pairs.append(m)
        ko, vo, qr = reference_kv_write(m, ins[:-1])
        return [ko, vo, reference_attention(qr, ko, vo, ins[-1], scale)]


def _fn(eqns, avals, ins, outs, consts, kernel):
    shapes = {n: a[0] for n, a in avals.items()}
    return replay_fn(eqns, ins, outs, consts, reference_attention, shapes, eqns, None, avals, kernel)


def _eager(env: dict[str, mx.array], n: int) -> list[mx.array]:
    """Eager mlx-lm's one-token step over this layer: the rotations, the writes, and
    MLX's attention over the first ``n`` positions, no mask."""
    rope = lambda x: mx.fast.rope(x, 8, traditional=False, base=10000.0, scale=1.0, offset=env["off"])  # noqa: E731
    ko = mx.slice_update(env["kb"], rope(env["k"]), env["off"], [2])
    vo = mx.slice_update(env["vb"], env["v"], env["off"], [2])
    out = mx.fast.scaled_dot_product_attention(rope(env["q"]), ko[:, :, :n], vo[:, :, :n], scale=8**-0.5)
    return [out, ko, vo]


def _offset(n: int, known: bool) -> mx.array:
    if known:
        return kvcache.position(n)  # what a traced cache's offset is: made from a host integer
    a = mx.array(n, dtype=mx.int32)
    mx.eval(a)
    return a


@settings(max_examples=25, deadline=None)
@given(
    offsets=hst.lists(hst.integers(0, C - 1), min_size=1, max_size=4),
    dt=hst.sampled_from(["bf16", "f32"]),
    compiled=hst.booleans(),
    known=hst.booleans(),
)
def test_the_live_attention_is_eager_mlx_lm_s_step_at_every_offset(offsets, dt, compiled, known) -> None:
    """One function (compiled stretches or not) called at several offsets: each call eager
    MLX's bytes for the attention and both buffers, so no length is baked into it."""
    eqns, avals, ins, outs, consts = _graph(dt)
    with pytest.MonkeyPatch.context() as mp:
        k = Live(mp)
        _at_every_offset(_fn(eqns, avals, ins, outs, consts, k), k, offsets, avals, ins, outs, compiled, known)


def _at_every_offset(fn, k, offsets, avals, ins, outs, compiled, known) -> None:
    fn = fn.compiled() if compiled else fn  # type: ignore[attr-defined]
    for i, off in enumerate(offsets):
        vals = _values(avals, ins, off, seed=i)
        vals[ins.index("off")] = _offset(off, known)
        got = fn(*vals)
        want = _eager(dict(zip(ins, vals, strict=True)), off + 1)
        for name, a, b in zip(outs, got, want, strict=True):
            assert same_bits(a, b), f"offset {off}: {name}"
    assert len(k.lives) == len(offsets) and not k.pairs


@pytest.mark.parametrize("mask", [{"window": True}, {"reversed_": True}])
def test_a_mask_that_is_not_the_causal_row_keeps_the_paired_kernel(mask, monkeypatch: pytest.MonkeyPatch) -> None:
    eqns, avals, ins, outs, consts = _graph("f32", **mask)
    assert not live.causal_row("mask", eqns)
    k = Live(monkeypatch)
    vals = _values(avals, ins, 5)
    _fn(eqns, avals, ins, outs, consts, k)(*vals)
    assert len(k.pairs) == 1 and not k.lives


def test_the_causal_row_is_recognised_and_a_mask_given_as_input_is_not() -> None:
    eqns, *_ = _graph()
    assert live.causal_row("mask", eqns)
    assert not live.causal_row("mask", [e for e in eqns if e.id < 200])  # an input: unknown


def test_the_offset_comes_from_the_host_not_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A position made by the trace's cache is read from the registry (no ``item()``, so
    no wait for the device); an array nobody registered is read from the array."""
    reads: list[int] = []
    real = mx.array.item
    monkeypatch.setattr(mx.array, "item", lambda a: reads.append(1) or real(a))
    assert live.offset_value(kvcache.position(1234)) == 1234 and not reads
    assert live.offset_value(mx.array(77, dtype=mx.int32)) == 77 and reads == [1]


def test_the_registry_is_by_identity_and_forgets_what_positions_drop() -> None:
    a, b = mx.array(5, dtype=mx.int32), mx.array(5, dtype=mx.int32)
    hostints.remember(a, 5)
    assert hostints.known(a) == 5 and hostints.known(b) is None
    hostints.forget(a)
    assert hostints.known(a) is None
    first = kvcache.position(900_001)
    for n in range(900_002, 900_012):  # more than the positions kept: the first is dropped
        kvcache.position(n)
    assert hostints.known(first) is None and hostints.known(kvcache.position(900_011)) == 900_011


def test_the_staged_function_runs_its_stretches_around_the_live_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compiled()`` compiles each stretch, never the live step (whose length a compiled
    graph would freeze): the stretches handed to ``mx.compile`` leave the attention out."""
    eqns, avals, ins, outs, consts = _graph("f32")
    compiled: list[Any] = []
    real = mx.compile
    monkeypatch.setattr(mx, "compile", lambda f: compiled.append(f) or real(f))
    fn = live.compile_segment(_fn(eqns, avals, ins, outs, consts, Live(monkeypatch)))
    assert compiled and all(f.__name__ == "run" for f in compiled)
    vals = _values(avals, ins, 9)
    vals[ins.index("off")] = kvcache.position(9)
    for a, b in zip(fn(*vals), _eager(dict(zip(ins, vals, strict=True)), 10), strict=True):
        assert same_bits(a, b)
    plain = live.compile_segment(lambda x: [x + 1])  # a segment without live steps: mx.compile
    # one stretch (the mask, the rotations' inputs) before the live step, none after it
    assert len(compiled) == 1 + 1 and np.array(plain(mx.array([1.0]))[0]).tolist() == [2.0]


def _layers(n: int, d: int = 8):
    """``n`` layers of ``_graph``'s one, each attending with its own caches and the last
    one's output as its queries (the offset shared), as one segment's equations."""
    eqns, avals, ins, outs, consts = _graph("bf16", d=d)
    all_eqns, all_avals, all_ins, all_outs, all_consts = list(eqns), dict(avals), list(ins), list(outs), dict(consts)
    prev = outs[0]
    for j in range(1, n):
        name = lambda v, j=j, prev=prev: {"off": "off", "q": prev}.get(v, f"{v}_{j}")  # noqa: E731
        for e in eqns:
            outs_j = tuple(Var(name(o.name), o.shape, o.dtype) for o in e.outs)
            all_eqns.append(Eqn(e.id + 1000 * j, e.prim, tuple(name(v) for v in e.ins), outs_j, e.args))
        all_avals.update({name(v): a for v, a in avals.items() if v not in ("off", "q")})
        all_ins += [name(v) for v in ins if v not in ("off", "q")]
        all_consts.update({name(v): c for v, c in consts.items()})
        all_outs = [name(outs[0]), *all_outs[1:], *(name(v) for v in outs[1:])]
        prev = name(outs[0])
    return all_eqns, all_avals, all_ins, all_outs, all_consts


def _eager_layers(env: dict[str, mx.array], n_layers: int, n: int) -> tuple[list[mx.array], list[mx.array]]:
    """``_eager`` layer after layer, as ``_layers`` chains them: every layer's attention
    output, and the graph's outputs (the last output, then every layer's written buffers)."""
    q, outs, written = env["q"], [], []
    for j in range(n_layers):
        at = lambda v, j=j: env[v if j == 0 else f"{v}_{j}"]  # noqa: E731
        q, ko, vo = _eager({"q": q, "k": at("k"), "v": at("v"), "kb": at("kb"), "vb": at("vb"), "off": env["off"]}, n)
        outs, written = [*outs, q], [*written, ko, vo]
    return outs, [q, *written]


def _schedule(n: int, groups: tuple[int, ...]) -> list[int]:
    """The live steps (from 1) a schedule commits after, spelled out: a group at a time,
    the last group's size repeated, none past ``n``."""
    out, at = [], 0
    sizes = [*groups, *[groups[-1]] * n] if groups else []
    for g in sizes:
        at += g
        if at > n:
            break
        out.append(at)
    return out


@settings(max_examples=16, deadline=None)
@given(
    layers=hst.integers(1, 4),
    groups=hst.one_of(hst.just(()), hst.lists(hst.integers(1, 3), min_size=1, max_size=3).map(tuple)),
    offset=hst.integers(0, C - 2),
)
def test_commits_inside_a_segment_come_where_the_schedule_says_over_layers(layers, groups, offset) -> None:
    """Any number of layers in one segment and any schedule (group sizes, the last
    repeated; ``()`` none): the compiled form commits after the live steps the schedule
    names, each commit holding the attention output it follows and the stretch's before
    it; the plain form never commits. Both give eager MLX's bytes, layer after layer,
    the written caches too."""
    eqns, avals, ins, outs, consts = _layers(layers)
    committed: list[list[mx.array]] = []
    real = mx.async_eval
    with pytest.MonkeyPatch.context() as mp:  # (hypothesis: no function-scoped fixture)
        mp.setattr(mx, "async_eval", lambda *a: committed.append(list(a[0])) or real(*a))
        k = Live(mp)
        plain = _fn(eqns, avals, ins, outs, consts, k)
        vals = _values(avals, ins, offset, seed=layers)
        vals[ins.index("off")] = kvcache.position(offset)
        results = [plain(*vals)]
        assert not committed
        results.append(live.compile_segment(plain, groups)(*vals))
    attended, want = _eager_layers(dict(zip(ins, vals, strict=True)), layers, offset + 1)
    assert len(k.lives) == 2 * layers and not k.pairs  # every layer's attention a live step, in both calls
    after = _schedule(layers, groups)
    assert len(committed) == len(after)
    for at, arrays in zip(after, committed, strict=True):
        assert len(arrays) > 1 and any(same_bits(a, attended[at - 1]) for a in arrays)
    for got in results:
        assert len(got) == len(want) == 1 + 2 * layers
        for a, b in zip(got, want, strict=True):
            assert same_bits(a, b)


@pytest.mark.parametrize(
    ("n", "groups", "want"),
    [(16, (2,), {2, 4, 6, 8, 10, 12, 14, 16}), (7, (1, 2), {1, 3, 5, 7}), (8, (4, 2, 1), {4, 6, 7, 8}), (3, (), set())],
)
def test_commit_points_spell_out_the_schedule(n: int, groups: tuple[int, ...], want: set[int]) -> None:
    assert live.commit_points(n, groups) == want


@pytest.mark.parametrize(
    ("commit", "drain", "want"), [("auto", False, (3,)), ("segment", False, ()), ("auto", True, ())]
)
def test_the_executor_commits_inside_a_segment_under_auto_alone(monkeypatch, commit, drain, want) -> None:
    """The period reaches the executor's segments under ``"auto"`` only: ``"segment"``
    names every commit, and a draining run waits after each segment anyway."""
    from segc.ir import Graph, Input
    from segc.runtime import executor as ex

    monkeypatch.setenv("SEGC_LIVE_COMMITS", "3")
    periods: list[tuple[int, ...]] = []
    real = ex.compile_segment
    monkeypatch.setattr(ex, "compile_segment", lambda f, k=(): periods.append(k) or real(f, k))
    x = Var("x", (2,), "f32")
    g = Graph("one", (Input(x, "arg", "x"),), (), (Eqn(1, "Exp", ("x",), (Var("y", (2,), "f32"),)),), ("y",))
    e = ex.Executor(g, commit=commit, drain=drain)
    assert e.live_groups == want and periods == [want]
    a = mx.array([0.5, -1.0])
    assert same_bits(e([a])[0], mx.exp(a))


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, (1, 1, 2)),
        ("0", ()),
        ("3", (3,)),
        (" ", (1, 1, 2)),
        ("1,2", (1, 2)),
        (" 4, 2 ,1", (4, 2, 1)),
        ("-1", None),
        ("x", None),
        ("0,2", None),
        ("1,,2", None),
        ("2,", None),
    ],
)
def test_the_commit_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch, value, want) -> None:
    assert_env_setting(monkeypatch, "SEGC_LIVE_COMMITS", value, live.live_commits, want)


@pytest.mark.parametrize(("value", "want"), [(None, True), ("0", False), ("1", True), ("", True), ("2", None)])
def test_the_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch, value, want) -> None:
    assert_env_setting(monkeypatch, "SEGC_LIVE_ATTENTION", value, live.live_wanted, want)


def test_the_kernel_carries_the_live_rule_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvwrite, "FUSED_KV_WRITE", "auto")
    from segc.lower import products

    monkeypatch.setattr(products, "cuda_wanted", lambda *a: True)
    monkeypatch.delenv("SEGC_LIVE_ATTENTION", raising=False)  # the default
    k = kvwrite.kv_write_kernel()
    assert k is not None and callable(getattr(k, "live", None)) and callable(getattr(k, "with_attention", None))
    monkeypatch.setenv("SEGC_LIVE_ATTENTION", "1")
    assert callable(getattr(kvwrite.kv_write_kernel(), "live", None))
    monkeypatch.setenv("SEGC_LIVE_ATTENTION", "0")
    assert getattr(kvwrite.kv_write_kernel(), "live", None) is None


@pytest.mark.parametrize("window", [False, True])
def test_the_cost_model_counts_a_live_pair_as_two_kernels_and_cuts_keep_it_whole(monkeypatch, window) -> None:
    """Heads of 64 (eager fuses the attention, so segc pairs it with the write): with the
    live attention a decode step's pair launches the write's kernel and MLX's attention,
    one kernel more than the paired kernel; a window's mask keeps the paired kernel either
    way. For a cut the pair stays one unit: its attention cut from its write would run
    as segc's attention kernel, other bytes (``passes.product_groups.lowering_kernels``)."""
    from segc.ir import Const, Graph, Input
    from segc.passes.costmodel import H200, op_costs
    from segc.passes.product_groups import lowering_kernels

    eqns, avals, ins, outs, consts = _graph(d=64, window=window)
    inputs = tuple(Input(Var(n, *avals[n]), "arg", n) for n in ins)
    g = Graph("kv", inputs, tuple(Const(Var(n, *avals[n]), v) for n, v in consts.items()), tuple(eqns), tuple(outs))
    counts = {}
    for value in ("0", "1"):
        monkeypatch.setenv("SEGC_LIVE_ATTENTION", value)
        counts[value] = sum(op_costs(g, H200).kernels)
        units = lowering_kernels(g, list(g.eqns))
        write = {k for k, e in enumerate(g.eqns) if e.prim == "DynamicSliceUpdate"}
        softmax = {k for k, e in enumerate(g.eqns) if e.prim == "Softmax"}
        assert len(write) == 2 and len(softmax) == 1
        assert any(write | softmax <= set(u) for u in units), units  # one unit either way
    assert counts["1"] == counts["0"] + (0 if window else 1), counts


@pytest.mark.parametrize(
    ("layers", "commit", "period", "device", "want"),
    [
        (1, "auto", "1", "gpu", 2),
        (1, "auto", "0", "gpu", 1),
        (1, "segment", "1", "gpu", 1),
        (1, "auto", "1", "cpu", 1),
        (3, "auto", "1", "gpu", 4),
        (3, "auto", "2", "gpu", 2),
        (3, "auto", "3", "gpu", 2),
        (3, "auto", "4", "gpu", 1),
        (2, "auto", "2", "gpu", 2),
        (3, "auto", "1,2", "gpu", 3),
        (4, "auto", "2,1", "gpu", 4),
    ],
)
def test_the_cost_model_commits_after_live_attentions_where_the_runtime_does(
    monkeypatch, layers, commit, period, device, want
) -> None:
    """Layers of one segment (heads of 64: eager fuses the attention, so segc pairs it),
    an op after the last: ``"auto"`` on a GPU predicts the call's commit and one after
    every attention the schedule ``period`` names, as many as the staged run makes
    (``layers // period`` for one size; ``1,2`` over three layers: after the first and
    the third), each ending a command buffer; the policy ``"segment"``, a period of 0 or a CPU (no
    live steps there to commit after) leave the call's one."""
    from dataclasses import replace

    from segc.ir import Const, Graph, Input
    from segc.passes.costmodel import H200, predict_time

    monkeypatch.setenv("SEGC_LIVE_COMMITS", period)
    eqns, avals, ins, outs, consts = _layers(layers, d=64)
    shape, dt = avals[outs[0]]
    eqns.append(Eqn(9000, "Multiply", (outs[0], outs[0]), (Var("after", shape, dt),)))
    avals["after"], outs = (shape, dt), ["after", *outs[1:]]
    inputs = tuple(Input(Var(n, *avals[n]), "arg", n) for n in ins)
    g = Graph("kv", inputs, tuple(Const(Var(n, *avals[n]), v) for n, v in consts.items()), tuple(eqns), tuple(outs))
    tp = predict_time(g, replace(H200, device=device), commit)
    assert tp.commits == want and len(tp.segments) == want
    assert predict_time(g, replace(H200, device=device), "segment").commits == 1


def test_live_closes_take_the_scheduled_attentions_of_each_segment() -> None:
    from segc.passes.buffers import live_closes

    spans = [("a", 0, 10), ("b", 10, 25)]
    assert live_closes([3, 7, 12, 20, 22], spans, (2,)) == {7, 20}  # counted afresh in each segment
    assert live_closes([3, 7, 12, 20, 22], spans, (1,)) == {3, 7, 12, 20, 22}
    assert live_closes([3, 7, 12, 20, 22], spans, (1, 2)) == {3, 12, 22}
    assert live_closes([3, 7], spans, ()) == frozenset() and live_closes([], spans, (2,)) == frozenset()
