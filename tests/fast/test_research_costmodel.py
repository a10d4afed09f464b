"""The cost model's predictions (issue 15) on small graphs, worked out by hand from the
shapes, the machine's figures and the pipeline recurrence of
``segc/passes/costmodel.py``'s docstring. No MLX runs here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from segc.ir import parse
from segc.passes import run_pass
from segc.passes.costmodel import MachineModel, predict_time
from segc.passes.memory import predict_memory

TOY = MachineModel("toy", flops_per_s=1e9, bytes_per_s=1e9, launch_s=1e-6, dispatch_s=1e-5, host_op_s=1e-6)

TWO = """\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Matmul(%a0, %p0) #0
  segc.cut() ["c"] #1
  %v1: f32[4,8] = Matmul(%v0, %p0) #2
  return (%v1)
}
"""


def test_predict_time_by_hand() -> None:
    # each matmul: 2*4*8*8 = 512 FLOPs and 128 + 256 read + 128 written = 512 B: 512 ns
    work = 512e-9
    host = 1e-5 + 1e-6  # dispatch and one kernel
    dev0 = work + 1e-6  # and one launch
    dev1 = work + 1e-6 + 128e-9  # and reading v0 (128 B) from the first segment
    h1, h2 = host, 2 * host
    d1 = h1 + dev0
    d2 = max(d1, h2) + dev1
    tp = predict_time(parse(TWO), TOY)
    assert [s.kernels for s in tp.segments] == [1, 1]
    assert [s.device for s in tp.segments] == pytest.approx([dev0, dev1])
    assert tp.total == pytest.approx(d2) and tp.host == pytest.approx(2 * host)
    one = predict_time(run_pass("strip_cuts", parse(TWO)), TOY)
    assert one.total == pytest.approx(1e-5 + 2e-6 + 2 * (work + 1e-6))  # one dispatch, then both on the device


def test_the_size_term_charges_kernels_squared() -> None:
    """``segment_sq_s`` adds ``segment_sq * kernels**2`` to each segment's device span:
    two segments of one kernel pay it twice, one segment of two kernels four times."""
    sized = replace(TOY, segment_sq_s=1e-6)
    cut, whole = parse(TWO), run_pass("strip_cuts", parse(TWO))
    base_cut, base_whole = predict_time(cut, TOY), predict_time(whole, TOY)
    got_cut, got_whole = predict_time(cut, sized), predict_time(whole, sized)
    assert [b.device + 1e-6 for b in base_cut.segments] == pytest.approx([s.device for s in got_cut.segments])
    assert got_whole.device == pytest.approx(base_whole.device + 4e-6)
    # on the critical path: the whole plan's 4 us; of the cut plan's, the second segment's
    # 1 us (the first runs while the host dispatches the second): 3 us in the cut's favour
    assert got_cut.total - got_whole.total == pytest.approx(base_cut.total - base_whole.total - 3e-6)


def test_a_cut_inside_a_fused_chain_costs_its_values() -> None:
    src = """\
graph f(%a0: f32[4,8] arg="0") {
  %v0: f32[4,8] = Exp(%a0) #0
  segc.cut() ["c"] #1
  %v1: f32[4,8] = Multiply(%v0, %a0) #2
  return (%v1)
}
"""
    cut, whole = predict_time(parse(src), TOY), predict_time(run_pass("strip_cuts", parse(src)), TOY)
    # fused, the chain reads a0 (128 B) and writes v1 (128 B), one launch; split, v0 is
    # written and read back (2 x 128 B) and a second kernel is launched
    assert whole.device == pytest.approx(256e-9 + 1e-6)
    assert cut.segments[1].fusion_loss == pytest.approx(256e-9 + 1e-6)


def test_predict_memory_by_hand() -> None:
    src = """\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Matmul(%a0, %p0) #0
  %v1: f32[4,8] = Exp(%v0) #1
  %v2: f32[4,8] = Multiply(%v1, %a0) #2
  %v3: f32[4,8] = Matmul(%v2, %p0) #3
  %v4: f32[4,8] = Tanh(%v3) #4
  return (%v4)
}
"""
    m = predict_memory(parse(src))
    # v0 (128 B); the fused Exp*a0 never materialises v1 and writes v2 into v0's buffer
    # (v0 dies there); v3 is new (256 B live with v2), then v2 is freed; Tanh writes into v3
    assert (m.weights, m.inputs, m.constants, m.activations) == (256, 128, 0, 256)
    assert m.peak == 640


def test_kv_cache_updates_are_in_place() -> None:
    src = """\
graph f(%a0: f32[1,8] arg="0", %s0: f32[4,8] state="cache.k") {
  %v0: f32[4,8] = SliceUpdate(%s0, %a0) [4, [0, 0], [1, 8], [1, 1]] #0
  %v1: f32[4,8] = Exp(%v0) #1
  return (%v0, %v1)
}
"""
    m = predict_memory(parse(src))
    assert (m.inputs, m.activations) == (32 + 128, 128)  # only Exp's output is new


def test_rotated_kv_writes_of_the_cuda_kernel_allocate() -> None:
    """A decode step's rotations and writes (built by hand as a GPU trace records them)
    with the caches as state: in place, only the rotated queries (64 B, its square
    taking over its buffer) and keys (32 B) are new; computed by segc's CUDA kernel
    (``copied_writes``), the new key and value buffers (512 B each) are too."""
    from test_kvwrite import _layer

    from segc.ir import Graph, Input, Var

    eqns, avals, ins, outs = _layer()
    kinds = {"kb": "state", "vb": "state", "off": "state"}
    inputs = tuple(Input(Var(n, *avals[n]), kinds.get(n, "arg"), n) for n in ins)
    g = Graph("kv", inputs, (), tuple(eqns), tuple(outs))
    assert predict_memory(g).activations == 64 + 32
    # the queries' 64 (squared in place), the keys' 32 until their write, then both buffers
    assert predict_memory(g, copied_writes=True).activations == 64 + 512 + 512


QUEUED = """\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Matmul(%a0, %p0) #0
  %v1: f32[4,8] = Exp(%v0) #1
  segc.cut() ["c"] #2
  %v2: f32[4,8] = Matmul(%v1, %p0) #3
  return (%v2)
}
"""


def test_a_queue_of_kernels_exposes_a_segments_preparation() -> None:
    # 1 MB/s: the matmul moves 512 B (512 us), the exp 256 B (256 us), each kernel a 1 us
    # launch; the host prepares a segment in 600 us (dispatch) + 1 us a kernel. Segment 1:
    # host 602 us, device 512 + 256 + 2 = 770 us; segment 2 (reads v1, 128 B): 641 us.
    # Unbounded, the host prepares segment 2 (601 us) by 1203 us, before the device is
    # done with segment 1 (D1 = 602 + 770 = 1372 us): no stall. With a queue of Q kernels
    # the host is done with segment 1 only once the device has its last Q kernels left,
    # so it starts segment 2 at D1 - (their device time) and the device waits the rest:
    # Q = 1: the exp is left (257 us): 601 - 257 = 344 us; Q = 2 (or more than there are):
    # the matmul too (770 us), more than the 601 us: no stall.
    m = MachineModel("slow", 1e9, 1e6, launch_s=1e-6, dispatch_s=600e-6, host_op_s=1e-6)
    g = parse(QUEUED)
    free = predict_time(g, m)
    assert [s.device for s in free.segments] == pytest.approx([770e-6, 641e-6])
    assert free.total == pytest.approx(602e-6 + 770e-6 + 641e-6)
    one = predict_time(g, replace(m, queue_kernels=1))
    assert [s.queue for s in one.segments] == pytest.approx([0.0, 257e-6])
    assert one.total - free.total == pytest.approx(601e-6 - 257e-6)
    for q in (2, 50):
        assert predict_time(g, replace(m, queue_kernels=q)).total == pytest.approx(free.total)
    whole = predict_time(run_pass("strip_cuts", g), replace(m, queue_kernels=1))
    assert whole.total == pytest.approx(603e-6 + 512e-6 + 256e-6 + 512e-6 + 3e-6)  # the first segment waits anyway


def test_a_repeated_segment_costs_the_host_repeat_s_less() -> None:
    """``TWO``'s second segment has the first's equation (a Matmul to f32[4,8]): its
    host share is ``repeat_s`` less; a segment of other shapes repeats nothing; the
    saving never makes a host share negative."""
    m = replace(TOY, repeat_s=4e-6)
    work, host = 512e-9, 1e-5 + 1e-6
    dev0, dev1 = work + 1e-6, work + 1e-6 + 128e-9
    h1, h2 = host, 2 * host - 4e-6
    tp = predict_time(parse(TWO), m)
    assert [s.repeat for s in tp.segments] == [False, True]
    assert [s.host for s in tp.segments] == pytest.approx([host, host - 4e-6])
    assert tp.total == pytest.approx(max(h1 + dev0, h2) + dev1) and tp.host == pytest.approx(h2)
    other = TWO.replace("%v1: f32[4,8] = Matmul(%v0, %p0)", "%v1: f32[4,8] = Add(%v0, %v0)")
    assert [s.repeat for s in predict_time(parse(other), m).segments] == [False, False]
    assert predict_time(parse(TWO), replace(m, repeat_s=1.0)).segments[1].host == 0.0


def test_a_repeated_segment_costs_the_host_repeat_op_s_less_per_equation() -> None:
    """The per-equation saving: ``TWO``'s repeated second segment (one equation) costs
    the host ``repeat_op_s`` less, on top of ``repeat_s``; a segment that repeats nothing
    pays it all; the saving never makes a host share negative."""
    host = 1e-5 + 1e-6  # TOY's dispatch and one kernel
    tp = predict_time(parse(TWO), replace(TOY, repeat_op_s=3e-6))
    ops = [s.ops for s in tp.segments]
    assert ops == [1, 1] and [s.repeat for s in tp.segments] == [False, True]
    assert [s.host for s in tp.segments] == pytest.approx([host, host - 3e-6 * ops[1]])
    both = predict_time(parse(TWO), replace(TOY, repeat_s=4e-6, repeat_op_s=3e-6))
    assert both.segments[1].host == pytest.approx(host - 4e-6 - 3e-6)
    assert predict_time(parse(TWO), replace(TOY, repeat_op_s=1.0)).segments[1].host == 0.0
