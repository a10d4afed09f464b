"""The cost model on a machine that runs segc's CUDA product kernels (``fused_products``,
``segc/passes/product_groups.py``): a one-row product with the residual addition or
the gated activation around it is one kernel there, and a cut inside it costs that
fusion. Kernel counts are written out by hand from each program."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import pytest
from conftest import trace_graph

from segc.errors import ScheduleError
from segc.passes.costmodel import CPU, H200, MachineModel, op_costs

pytestmark = pytest.mark.timeout(120)

PLAIN_GPU = replace(H200, fused_products=False)


def _kernels(f, m, *args) -> int:
    return sum(op_costs(trace_graph(f, *args), m).kernels)


def test_a_product_and_its_residual_are_one_kernel_on_a_fusing_machine() -> None:
    x, w, r = mx.ones((1, 8)), mx.ones((4, 8)), mx.ones((1, 4))

    def f(x, w, r):
        return r + x @ w.T

    assert _kernels(f, H200, x, w, r) == 1  # gemv + add
    assert _kernels(f, PLAIN_GPU, x, w, r) == 2  # gemv, add
    assert _kernels(f, CPU, x, w, r) == 2
    x2, r2 = mx.ones((2, 8)), mx.ones((2, 4))  # two rows: a matmul MLX does not run as gemv
    assert _kernels(f, H200, x2, w, r2) == 2


def test_a_gated_activation_with_its_two_products_is_one_kernel() -> None:
    x, wg, wu = mx.ones((1, 8)), mx.ones((6, 8)), mx.ones((6, 8))

    def f(x, wg, wu):
        g = x @ wg.T
        return (g * mx.sigmoid(g)) * (x @ wu.T)

    assert _kernels(f, H200, x, wg, wu) == 1
    assert _kernels(f, PLAIN_GPU, x, wg, wu) == 3  # two products, one fused elementwise chain


def test_the_fusion_is_predicted_cheaper_and_cutting_it_costs() -> None:
    from conftest import with_cuts

    from segc.passes.costmodel import predict_time

    x, w, r = mx.ones((1, 64)), mx.ones((64, 64)), mx.ones((1, 64))

    def f(x, w, r):
        return r + x @ w.T

    g = trace_graph(f, x, w, r)
    fused, plain = predict_time(g, H200), predict_time(g, PLAIN_GPU)
    assert fused.total < plain.total  # one launch fewer, the product's bytes kept in the kernel
    add = next(k for k, e in enumerate(g.eqns) if e.prim == "Add")
    cut = with_cuts(g, [add])  # the product in one segment, the addition in the next
    # a cut costs a fusing machine the launch and the traffic the fusion saved, more than a plain one
    lost_fused = predict_time(cut, H200).total - fused.total
    lost_plain = predict_time(cut, PLAIN_GPU).total - plain.total
    assert lost_fused > lost_plain


def test_fused_products_round_trips_and_is_checked() -> None:
    m = MachineModel.from_json(H200.to_json())
    assert m.fused_products is True and m == H200
    bad = H200.to_json().replace('"fused_products": true', '"fused_products": 1')
    with pytest.raises(ScheduleError, match="fused_products"):
        MachineModel.from_json(bad)
    old = H200.to_json().replace(',\n "fused_products": true', "")  # a model saved before the field
    assert MachineModel.from_json(old).fused_products is False


def test_a_quantized_product_and_its_residual_are_one_kernel_too() -> None:
    """Over weights quantized as mlx-lm quantizes them: MLX's ``qmv``, then the
    addition; one kernel on a fusing machine, two elsewhere."""
    x, r = mx.ones((1, 1, 64)), mx.ones((1, 1, 32))
    wq, s, b = mx.quantize(mx.ones((32, 64)), group_size=32, bits=4)

    def f(x, wq, s, b, r):
        return r + mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=32, bits=4)

    assert _kernels(f, H200, x, wq, s, b, r) == 1
    assert _kernels(f, PLAIN_GPU, x, wq, s, b, r) == 2


def test_a_rotated_kv_write_with_its_queries_is_one_kernel() -> None:
    """The two rotations and two cache writes of a decode step's attention (built by hand
    as a GPU trace records them: MLX's CPU build decomposes ``RoPE``) are one kernel on
    a fusing machine (``segc.lower.kvwrite``), four without; the queries' reader is a
    kernel of its own either way."""
    from test_kvwrite import _layer

    from segc.ir import Graph, Input, Var

    eqns, avals, ins, outs = _layer()
    g = Graph("kv", tuple(Input(Var(n, *avals[n]), "arg", n) for n in ins), (), tuple(eqns), tuple(outs))
    assert sum(op_costs(g, H200).kernels) == 2  # the kernel, the queries' square
    assert sum(op_costs(g, PLAIN_GPU).kernels) == 5  # two rotations, two writes, the square


def test_an_integer_range_is_no_kernel() -> None:
    """The lowering makes an integer range from host data (``shapes.host_range``): no
    kernel and no device time on any machine; a float range, or one of more than
    ``ARANGE_CONSTANT_MAX`` values, is MLX's kernel."""
    from segc.lower.shapes import ARANGE_CONSTANT_MAX

    def f(x):
        return x + mx.arange(8, dtype=mx.int32)

    def g(x):
        return x + mx.arange(8, dtype=mx.float32)

    n = ARANGE_CONSTANT_MAX + 1

    def long(x):
        return x + mx.arange(n, dtype=mx.int32)

    x = mx.ones((8,), dtype=mx.int32)
    xf = mx.ones((8,), dtype=mx.float32)
    for m in (H200, CPU):
        assert _kernels(f, m, x) == 1  # the addition only
        assert _kernels(g, m, xf) == 2  # the range, the addition
        assert _kernels(long, m, mx.ones((n,), dtype=mx.int32)) == 2
    costs = op_costs(trace_graph(f, x), H200)
    assert costs.device[0] == 0.0 and costs.kernels[0] == 0


@pytest.mark.parametrize(("reader", "want"), [(False, 1), (True, 3)])
def test_a_rotated_write_with_its_decode_attention_is_one_kernel(reader: bool, want: int) -> None:
    """A decode layer's rotated write and the masked attention reading what it wrote, as a
    GPU trace records them (heads of 64, one query: where eager's CUDA attention is one
    kernel, so segc's is used): one kernel on a fusing machine (``segc.lower.fused``'s
    pair, ``cuda_kvattention.py``); where the rotated queries have another reader (a
    square here) three: the write's kernel, the square, the attention's kernel. Without
    segc's kernels: two rotations, two writes, the square if any, and MLX's attention (the
    scaled queries, two products, the select, the softmax; the mask's broadcast split
    into KV groups is a view, as MLX makes it: ``tests/test_analysis_mlx.py``)."""
    from test_kvattention import _graph

    from segc.ir import Const, Graph, Input, Var

    def graph(d: int):
        eqns, avals, ins, outs, consts = _graph(reader, d=d)
        inputs = tuple(Input(Var(n, *avals[n]), "arg", n) for n in ins)
        cs = tuple(Const(Var(n, *avals[n]), v) for n, v in consts.items())
        return Graph("kv", inputs, cs, tuple(eqns), tuple(outs))

    assert sum(op_costs(graph(64), H200).kernels) == want
    assert sum(op_costs(graph(64), PLAIN_GPU).kernels) == 4 + reader + 5
    # heads of 8: eager runs MLX's decomposition, so segc keeps it (and its bits); only the
    # rotations and writes become one kernel
    assert sum(op_costs(graph(8), H200).kernels) == 1 + reader + 5


def test_a_cut_inside_a_pattern_leaves_each_side_to_mlx() -> None:
    """The lowering finds segc's kernels segment by segment, so a cut between a gated
    activation's two products leaves three kernels: the gate's product in the first
    segment; the up product and MLX's fused elementwise chain (the activation and the
    gating) in the second. Uncut, all of it is one kernel."""
    from conftest import with_cuts

    from segc.passes.costmodel import predict_time

    x, wg, wu = mx.ones((1, 8)), mx.ones((6, 8)), mx.ones((6, 8))

    def f(x, wg, wu):
        g = x @ wg.T
        return (g * mx.sigmoid(g)) * (x @ wu.T)

    g = trace_graph(f, x, wg, wu)
    first = next(k for k, e in enumerate(g.eqns) if e.prim == "Matmul")
    cut = with_cuts(g, [first + 1])
    assert [s.kernels for s in predict_time(g, H200).segments] == [1]
    assert [s.kernels for s in predict_time(cut, H200).segments] == [1, 2]


SHARED_NORM = """\
graph f(%a0: f32[1,1,16] arg="0", %p0: f32[16] param="nw", %p1: f32[16,16] param="wq", %p2: f32[8,16] param="wk", %p3: f32[8,16] param="wv") {
  %v0: f32[1,1,16] = RMSNorm(%a0, %p0) [1e-05] #0
  %v1: f32[1,16] = Flatten(%v0) [0, 1] #1
  %v2: f32[16,16] = Transpose(%p1) [[1, 0]] #2
  %v3: f32[1,16] = Matmul(%v1, %v2) #3
  %v4: f32[1,16] = Exp(%v3) #4
  %v5: f32[16,8] = Transpose(%p2) [[1, 0]] #5
  %v6: f32[1,8] = Matmul(%v1, %v5) #6
  %v7: f32[16,8] = Transpose(%p3) [[1, 0]] #7
  %v8: f32[1,8] = Matmul(%v1, %v7) #8
  %v9: f32[1,8] = Multiply(%v6, %v8) #9
  return (%v4, %v9)
}
"""


def test_products_that_share_a_norm_are_cut_as_one() -> None:
    """q, k and v not concatenated (``test_products``' three products reading one norm):
    each of segc's kernels normalises the row itself, so uncut they are three kernels and
    the norm none. The kernels are found segment by segment, so a cut among them leaves
    the row to be written for a later segment, and the lowering then runs the norm as
    MLX's kernel: six kernels in all, not five. So no cut among them is legal; the only
    legal point is after the last product (before the multiply: 9), and it keeps the
    uncut graph's kernels. On the H200's decode graph the experiment's ``optimal`` cut
    among them: its dynamic program, which costs the uncut graph's kernels, predicted
    2.608 ms for a plan the cost model puts at 2.640 ms."""
    from segc.ir import parse
    from segc.passes.costmodel import predict_time
    from segc.passes.legalize import legal_points
    from segc.passes.plan import apply_plan, plan_at

    g = parse(SHARED_NORM)
    uncut = op_costs(g, H200)
    assert sum(uncut.kernels) == 5  # three products (the norm in each), the exponential, the multiply
    assert legal_points(g, kernels=True) == [9]
    # what a cut among them would cost: after q's product, the row crosses and the norm is MLX's
    after_q = apply_plan(g, plan_at(g, "after q", [4]))
    assert [s.kernels for s in predict_time(after_q, H200).segments] == [2, 4]  # norm, q | exp, k, v, multiply
    for p in legal_points(g, kernels=True):
        assert sum(op_costs(apply_plan(g, plan_at(g, "legal", [p])), H200).kernels) == sum(uncut.kernels)
