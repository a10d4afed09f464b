"""A decode layer as one kernel (``segc.lower.layer_chain``): the rotated KV write with
its attention, then the chain, where chains are on (``SEGC_CHAIN_PRODUCTS=1``). On the
CPU, on segments of the graph the H200 traced (its own RoPE, attention and RMSNorm
primitives), with the kernels stood in for by their references (``Counted``: the
products' and a layer's, ``layer_chain.reference_layer``; ``Reference``: the write's and the
pair's): the layer found once a layer's segment, replayed with the bytes of the pair and
the chain apart and of MLX's own ops for the products; what it must refuse. The kernel
itself: ``tests/test_layer_emulated.py`` (its logic) and ``tests/test_products_cuda.py``
(its bytes, on a GPU)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import same_bits
from test_kvattention import Reference
from test_products import Counted

from segc.errors import UsageError
from segc.ir import Eqn, Graph, Var, parse, segments
from segc.lower import replay_fn
from segc.lower.attention import reference_attention
from segc.lower.fused import CUDA_DEFAULTS, find_all

pytestmark = pytest.mark.timeout(300)

GRAPH = Path(__file__).parent / "data" / "h200_reference_decode.segc"
FLAGS = {**CUDA_DEFAULTS, "chains": True}


@pytest.fixture(autouse=True)
def _chains_on(monkeypatch):
    monkeypatch.setenv("SEGC_CHAIN_PRODUCTS", "1")


def _concatenated() -> Graph:
    """The H200's graph with q, k and v concatenated (as ``concat_projections=True``
    makes it; the shape check taken as passed) and its markers legalised with chains on:
    each layer's chain takes the next product, each segment starts at its attention."""
    from segc.passes.concat import concat_projections
    from segc.passes.legalize import legalize_plan
    from segc.passes.plan import apply_plan, plan_of

    g = concat_projections(parse(GRAPH.read_text()), check=lambda *_a, **_k: True)
    return apply_plan(g, legalize_plan(g, plan_of(g, "markers"), kernels=FLAGS))


def _values(g: Graph, names, seed: int = 0) -> list[mx.array]:
    vs, r = g.vars(), np.random.default_rng(seed)
    out = []
    for name in names:
        v = vs[name]
        if v.dtype == "i32":
            out.append(mx.full(v.shape, 700, dtype=mx.int32))  # the cache's offset
        elif v.dtype == "bool":
            out.append(mx.broadcast_to(mx.array(np.arange(v.shape[-1]) <= 700), v.shape))  # the positions written
        else:
            x = (r.standard_normal(v.shape) * 0.05).astype(np.float32)
            out.append(mx.array(x).astype({"bf16": mx.bfloat16, "f32": mx.float32}[v.dtype]))
    return out


def _replay(g: Graph, k: int, products, eqns=None, keep=None):
    """Segment ``k`` of ``g`` replayed over random values with the attention's and the
    write's references and ``products`` (None: MLX's own ops)."""
    s = list(segments(g))[k]
    eqns, keep = eqns or s.eqns(g), keep or list(s.outputs)
    vs = g.vars()
    consts = {c.var.name: c.value for c in g.consts}
    avals = {n: (v.shape, v.dtype) for n, v in vs.items()}
    shapes = {n: a[0] for n, a in avals.items()}
    writes = Reference()
    fn = replay_fn(eqns, list(s.inputs), keep, consts, reference_attention, shapes, g.eqns, products, avals, writes)
    return fn(*_values(g, s.inputs)), writes


@pytest.mark.parametrize(("concat", "k"), [(False, 1), (False, 15), (True, 1), (True, 15)])
def test_a_layers_segment_is_one_kernel_with_the_bytes_of_its_parts(monkeypatch, concat, k) -> None:
    """One layer kernel a segment (the chain of three parts where q, k and v are apart,
    of four where they are concatenated: the next layer's product, or the head's), whose
    outputs have the bytes of the pair and the chain run apart, and of the pair and MLX's
    own ops for the products."""
    g = _concatenated() if concat else parse(GRAPH.read_text())
    layer = Counted()
    got, w1 = _replay(g, k, layer)
    # (q, k and v apart: the segment's own three products, normed, stay)
    assert layer.calls == ({"layer": 1} if concat else {"layer": 1, "gemv": 3}) and not w1.pairs and not w1.writes
    monkeypatch.setenv("SEGC_CHAIN_ATTENTION", "0")
    apart = Counted()
    want, w2 = _replay(g, k, apart)
    assert apart.calls["chain"] == 1 and "layer" not in apart.calls and len(w2.pairs) == 1
    plain, _ = _replay(g, k, None)
    for a, b, c in zip(got, want, plain, strict=True):
        assert same_bits(a, b) and same_bits(a, c)
    monkeypatch.setenv("SEGC_CHAIN_ATTENTION", "yes")
    with pytest.raises(UsageError, match="SEGC_CHAIN_ATTENTION must be 1 or 0"):
        _replay(g, k, Counted())


def test_the_step_is_a_kernel_a_layer() -> None:
    """With q, k and v concatenated and chains on: every layer's segment is one kernel
    of segc's (the first also its q, k and v product; the last also the head's), and no
    segment is left for the head."""
    g = _concatenated()
    consts = {c.var.name: c.value for c in g.consts}
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    found = [find_all(s.eqns(g), s.outputs, consts, avals, g.eqns, **FLAGS) for s in segments(g)]
    assert [len(f.kernels()) for f in found] == [2] + [1] * 15
    kinds = [[(p.kind, len(p.parts)) for p in f.products] for f in found]
    assert kinds == [[("gemv", 0), ("layer", 4)]] + [[("layer", 4)]] * 15
    assert all(not f.pairs and not f.writes and not f.attention for f in found)


def test_the_cost_model_counts_a_layer_as_one_kernel(monkeypatch) -> None:
    """The H200 cost model over the same graph: 16 kernels fewer a step than with each
    chain after its pair (two kernels a layer), and no legal cut inside a layer's
    kernel where there was one between the pair and the chain."""
    from segc.passes.costmodel import H200, op_costs
    from segc.passes.legalize import legal_points

    g = _concatenated()
    counted, points = {}, {}
    monkeypatch.setenv("SEGC_LIVE_ATTENTION", "0")  # each pair one kernel (live: two, the write's and MLX's)
    for env in ("1", "0"):
        monkeypatch.setenv("SEGC_CHAIN_ATTENTION", env)
        counted[env] = sum(op_costs(g, H200).kernels)
        points[env] = set(legal_points(g, kernels=True))
    assert counted["1"] == counted["0"] - 16
    assert points["1"] < points["0"] and len(points["0"] - points["1"]) >= 16


@pytest.mark.parametrize("refusal", ["output kept", "buffer read early"])
def test_no_layer_where_the_kernel_cannot_define_what_is_read(refusal) -> None:
    """The attention's output a segment output, or a new buffer read before the chain's
    last equation (where the kernel would define it): the pair and the chain stay two
    kernels, and the bytes are the same."""
    g = parse(GRAPH.read_text())
    s = list(segments(g))[1]
    eqns, keep = list(s.eqns(g)), list(s.outputs)
    at = next(k for k, e in enumerate(eqns) if e.prim == "Softmax") + 1
    if refusal == "output kept":
        attention_out = next(e for e in eqns[at:] if e.prim == "Flatten").outs[0].name
        keep.append(attention_out)
    else:
        buf = next(e for e in eqns if e.prim == "DynamicSliceUpdate").outs[0]
        eqns.insert(at, Eqn(9999, "Exp", (buf.name,), (Var("early", buf.shape, buf.dtype),)))
        keep.append("early")
    counted = Counted()
    got, writes = _replay(g, 1, counted, eqns, keep)
    assert "layer" not in counted.calls and counted.calls["chain"] == 1 and len(writes.pairs) == 1
    plain, _ = _replay(g, 1, None, eqns, keep)
    assert all(same_bits(a, b) for a, b in zip(got, plain, strict=True))


def test_the_memory_model_sees_a_layers_writes(monkeypatch) -> None:
    """The memory prediction's copied writes (``memory._copied``: each KV write segc's
    CUDA kernels make into a new buffer) are the same whether a layer's kernel or the
    pair's makes them: two a layer."""
    from segc.passes.memory import _copied

    g = _concatenated()
    copied = {}
    for env in ("1", "0"):
        monkeypatch.setenv("SEGC_CHAIN_ATTENTION", env)
        copied[env] = _copied(g)
    assert copied["1"] == copied["0"] and len(copied["1"]) == 2 * 16


def test_no_layer_past_a_blocks_shared_memory(monkeypatch) -> None:
    """A layer's block keeps the chain's rows, the attention's row and its queries and
    scores in shared memory, and the chunk's mask: the reference llama's 8,192 bfloat16
    values, 4 query heads a KV head of 64 values and 32 scores in floats, and 32 booleans,
    17,952 bytes. One byte less allowed: the pair and the chain stay two kernels."""
    from segc.lower import layer_chain

    g = parse(GRAPH.read_text())
    for most, want in ((17952, "layer"), (17951, "chain")):
        monkeypatch.setattr(layer_chain, "SHARED_MAX", most)
        counted = Counted()
        _replay(g, 1, counted)
        assert counted.calls[want] == 1, most
