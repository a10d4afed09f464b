"""The cost model's GPU command buffers and consumed state buffers (issue 15),
worked out by hand: MLX's CUDA build keeps every kernel's inputs until the command
buffer holding the kernel ends (``buffer_kernels``), and a call that owns its state
buffers frees them after their last reader (``consumed_state``). No MLX runs here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from segc.errors import ScheduleError
from segc.ir import parse
from segc.passes.costmodel import H200, MachineModel, predict_time
from segc.passes.memory import predict_memory

# four products in a row, each 4x8 f32 (128 B), one kernel each
CHAIN = """\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Matmul(%a0, %p0) #0
  %v1: f32[4,8] = Matmul(%v0, %p0) #1
  %v2: f32[4,8] = Matmul(%v1, %p0) #2
  %v3: f32[4,8] = Matmul(%v2, %p0) #3
  return (%v3)
}
"""

CUT = CHAIN.replace("  %v2: f32", '  segc.cut() ["c"] #9\n  %v2: f32')


def test_freed_after_the_last_reader_without_buffers() -> None:
    # v(k) dies when v(k+1) is made: two buffers at once at most
    assert predict_memory(parse(CHAIN)).activations == 256


def test_one_command_buffer_keeps_every_input_to_its_end() -> None:
    # v0, v1 and v2 are read inside the one buffer: all four outputs alive at the end
    assert predict_memory(parse(CHAIN), buffer_kernels=100).activations == 512


def test_a_full_buffer_is_committed_past_its_limit() -> None:
    # at most 1 kernel: MLX commits after the 2nd (ops 0-1, then 2-3). v0 dies at op 1's
    # buffer end; at op 3, v1 (read at op 2), v2 and v3: 384 B
    assert predict_memory(parse(CHAIN), buffer_kernels=1).activations == 384


def test_a_commit_per_segment_ends_a_buffer() -> None:
    g = parse(CUT)
    assert predict_memory(g, buffer_kernels=100).activations == 384
    assert predict_memory(g, buffer_kernels=100, commits=[True, True]).activations == 384
    # no commit after the first segment: one buffer, as without the cut
    assert predict_memory(g, buffer_kernels=100, commits=[False, False]).activations == 512
    with pytest.raises(ScheduleError, match="1 commit flags for 2 segments"):
        predict_memory(g, buffer_kernels=100, commits=[True])


STATE = """\
graph f(%s0: f32[4,8] state="buf", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Exp(%s0) #0
  %v1: f32[4,8] = Matmul(%v0, %p0) #1
  return (%v1)
}
"""


def test_a_consumed_state_buffer_dies_after_its_last_reader() -> None:
    g = parse(STATE)
    # held by the caller: v0 and v1 are new (256 B beyond the resident 128)
    assert predict_memory(g).activations == 256
    # owned by the call: Exp writes into s0's buffer (it dies there), v1 is new: 128 B
    # beyond the 128 the call started with
    m = predict_memory(g, consumed_state=True)
    assert (m.inputs, m.activations) == (128, 128)
    # kept to its buffer's end, s0 is still donated: its one reader is the first kernel
    assert predict_memory(g, consumed_state=True, buffer_kernels=100).activations == 128


def test_a_buffer_read_earlier_in_the_same_command_buffer_is_not_donated() -> None:
    src = """\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Matmul(%a0, %p0) #0
  %v1: f32[4,8] = Matmul(%v0, %p0) #1
  %v2: f32[4,8] = Tanh(%v0) #2
  return (%v1, %v2)
}
"""
    g = parse(src)
    # no buffers: Tanh writes into v0's buffer (v0 dies there): v0/v2 and v1, 256 B
    assert predict_memory(g).activations == 256
    # one buffer: the encoder holds v0 since Matmul #1 read it, so Tanh allocates: 384 B
    assert predict_memory(g, buffer_kernels=100).activations == 384
    # Matmul #1 in a buffer of its own (ends after 2 kernels): donated again
    assert predict_memory(g, buffer_kernels=1).activations == 256


def test_the_h200_preset_has_mlx_cuda_buffer_limit() -> None:
    assert H200.buffer_kernels == 100  # get_graph_limits: 100 ops for compute capability 9.0
    assert MachineModel.from_json(H200.to_json()) == H200
    bad = H200.to_json().replace('"buffer_kernels": 100', '"buffer_kernels": 1.5')
    with pytest.raises(ScheduleError, match="buffer_kernels must be a whole number"):
        MachineModel.from_json(bad)


# per matmul 512 ns of work (2*4*8*8 FLOPs, 512 B at 1e9/s: test_research_costmodel.py)
TOY = MachineModel("toy", flops_per_s=1e9, bytes_per_s=1e9, launch_s=1e-6, dispatch_s=1e-5, host_op_s=1e-6)


def test_a_segment_past_the_buffer_size_runs_as_committed_parts() -> None:
    g = parse(CHAIN)
    whole = predict_time(g, TOY)
    # one segment: the host's 10 us dispatch and 4 x 1 us, then the device's 4 x (512 ns + 1 us)
    assert whole.total == pytest.approx(14e-6 + 4 * 1.512e-6)
    parts = predict_time(g, replace(TOY, buffer_kernels=1))
    # MLX commits after the 2nd kernel: parts of 2 kernels; the second pays no dispatch.
    # part 0: released at 12 us, done at 12 + 3.024; part 1: the host is done at 14 us,
    # the device at 15.024 + 3.024 us
    assert [(s.part, s.kernels, s.commit) for s in parts.segments] == [(0, 2, True), (1, 2, True)]
    assert [s.pre for s in parts.segments] == pytest.approx([12e-6, 2e-6])
    assert parts.total == pytest.approx(12e-6 + 2 * 3.024e-6)
    assert parts.host == pytest.approx(whole.host)


def test_an_elementwise_kernel_costs_the_host_its_share() -> None:
    src = """\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Matmul(%a0, %p0) #0
  %v1: f32[4,8] = Exp(%v0) #1
  return (%v1)
}
"""
    g = parse(src)
    # a product and an elementwise kernel: 10 us of dispatch, then 1 us and 0.25 us
    (seg,) = predict_time(g, replace(TOY, elementwise_host=0.25)).segments
    assert (seg.kernels, seg.light) == (2, 1)
    assert seg.pre == pytest.approx(10e-6 + 1e-6 + 0.25e-6)
    (whole,) = predict_time(g, TOY).segments
    assert whole.pre == pytest.approx(12e-6)


def test_an_uncommitted_segment_fills_the_buffer_the_next_one_continues() -> None:
    """Without a commit after the first segment (the policy ``fences``) MLX's buffer
    runs on into the second: with at most 2 kernels it ends after the 3rd kernel, so
    the second segment comes in two parts, the first of them committed by MLX; the
    memory prediction reads the same buffers (v0 and v1 kept until op 2 ends)."""
    g = parse(CUT)
    m = replace(TOY, buffer_kernels=2)
    parts = predict_time(g, m, commit="fences").segments
    assert [(s.part, s.kernels, s.commit) for s in parts] == [(0, 2, False), (0, 1, True), (1, 1, False)]
    # v0, v1, v2 alive at op 2 (its buffer's end), then v3 with v2: 384 B
    assert predict_memory(g, buffer_kernels=2, commits=[False, False]).activations == 384
