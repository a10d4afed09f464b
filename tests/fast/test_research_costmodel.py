"""The cost model's predictions (issue 15) on small graphs, worked out by hand from the
shapes, the machine's figures and the pipeline recurrence of
``segc/passes/costmodel.py``'s docstring. No MLX runs here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from segc.ir import parse
from segc.passes import run_pass
from segc.passes.costmodel import MachineModel, predict_memory, predict_time

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


def test_a_bounded_queue_exposes_a_segments_preparation() -> None:
    # device-bound: each matmul moves 512 B at 1 MB/s (512 us), far more than the host's
    # 11 us per segment (dispatch and one kernel). Unbounded, the host prepares segment 2
    # while the device runs segment 1; with 5 us of queue the host may start it only 5 us
    # before the device is done, so the device waits the rest of it: 11 - 5 = 6 us
    slow = MachineModel("slow", 1e9, 1e6, launch_s=1e-6, dispatch_s=1e-5, host_op_s=1e-6)
    pre = 1e-5 + 1e-6
    dev0, dev1 = 512e-6 + 1e-6, 512e-6 + 1e-6 + 128e-6  # segment 2 also reads v0 (128 B)
    free = predict_time(parse(TWO), slow)
    assert free.total == pytest.approx(pre + dev0 + dev1)
    bounded = predict_time(parse(TWO), replace(slow, queue_s=5e-6))
    assert bounded.total - free.total == pytest.approx(pre - 5e-6)
    roomy = predict_time(parse(TWO), replace(slow, queue_s=20e-6))  # more queue than preparation: no stall
    assert roomy.total == pytest.approx(free.total)
    one = predict_time(run_pass("strip_cuts", parse(TWO)), replace(slow, queue_s=5e-6))
    assert one.total == pytest.approx(1e-5 + 2e-6 + 2 * (512e-6 + 1e-6))  # the first segment waits anyway
