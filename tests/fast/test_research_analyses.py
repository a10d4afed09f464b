"""The analyses' fixed figures (issue 15), each against a number worked out by hand in
the test from the shapes alone: a reshape of a transposed value copies; a broadcast
input costs its source's bytes; an elementwise output that keeps a broadcast layout
holds only its data; AddMM's FLOPs include the add; the run's boundary bytes count a
buffer crossing several cuts once. No MLX runs here."""

from __future__ import annotations

import pytest

from segc.ir import parse
from segc.passes.analysis import analyze, crossing_bytes, eqn_stats, liveness

F32 = 4  # bytes of a float32


def stats_by_id(src: str) -> dict[int, tuple[int, int, int]]:
    return {s.id: (s.flops, s.read, s.written) for s in eqn_stats(parse(src))}


def test_reshape_of_a_transposed_value_copies() -> None:
    src = """\
graph f(%a0: f32[4,8] arg="0") {
  %v0: f32[8,4] = Transpose(%a0) [[1, 0]] #0
  %v1: f32[32] = Reshape(%v0) [[32]] #1
  %v2: f32[32] = Reshape(%v1) [[32]] #2
  %v3: f32[32] = Exp(%v2) #3
  return (%v3)
}
"""
    st = stats_by_id(src)
    n = 4 * 8 * F32  # 128 B
    assert st[0][1:] == (0, 0)  # the transpose is a view
    assert st[1][1:] == (n, n)  # the reshape of it copies: reads and writes every byte
    assert st[2][1:] == (0, 0)  # a reshape of the (contiguous) copy is a view again
    lv = liveness(parse(src))
    assert lv.root["v1"] == "v1" and lv.nbytes["v1"] == n and lv.root["v2"] == "v1"


def test_reshape_of_a_transpose_of_unit_axes_is_a_view() -> None:
    """Moving only axes of size 1 keeps the elements' order, and MLX keeps such a value
    contiguous (a decode step's attention output, heads by one position, to one row):
    the reshape after it is a view. Checked against MLX's memory in
    ``tests/test_analysis_mlx.py``."""
    src = """\
graph f(%a0: f32[1,4,1,8] arg="0") {
  %v0: f32[1,1,4,8] = Transpose(%a0) [[0, 2, 1, 3]] #0
  %v1: f32[1,32] = Reshape(%v0) [[1, 32]] #1
  %v2: f32[1,8,1,4] = Transpose(%a0) [[0, 3, 2, 1]] #2
  %v3: f32[1,32] = Reshape(%v2) [[1, 32]] #3
  return (%v1, %v3)
}
"""
    st = stats_by_id(src)
    assert st[1][1:] == (0, 0)  # only the unit axis moved: a view
    n = 4 * 8 * F32
    assert st[3][1:] == (n, n)  # axes of 4 and 8 swapped: the reshape copies
    lv = liveness(parse(src))
    assert lv.root["v1"] == "a0" and lv.root["v3"] == "v3"


def test_broadcast_inputs_are_charged_at_their_source_size() -> None:
    src = """\
graph f(%a0: f32[16,64] arg="0", %p0: f32[64] param="w") {
  %v0: f32[16,64] = Broadcast(%p0) [[16, 64]] #0
  %v1: f32[16,64] = Multiply(%a0, %v0) #1
  %v2: f32[4,64] = Slice(%a0) [[0, 0], [4, 64], [1, 1]] #2
  %v3: f32[4,64] = Exp(%v2) #3
  return (%v1, %v3)
}
"""
    st = stats_by_id(src)
    dense, w = 16 * 64 * F32, 64 * F32
    assert st[1] == (16 * 64, dense + w, dense)  # reads x (4 KiB) and w (256 B), not 2 x 4 KiB
    assert st[3][1:] == (4 * 64 * F32, 4 * 64 * F32)  # a slice reads its elements only


def test_outputs_that_keep_a_broadcast_layout_hold_only_their_data() -> None:
    src = """\
graph f(%a0: f32[16,64] arg="0", %p0: f32[64] param="w") {
  const %c0: f32[] = [2.0]
  %v0: f32[16,64] = Broadcast(%p0) [[16, 64]] #0
  %v1: f32[16,64] = Exp(%v0) #1
  %v2: f32[16,64] = Broadcast(%c0) [[16, 64]] #2
  %v3: f32[16,64] = Multiply(%v1, %v2) #3
  %v4: f32[16,64] = Add(%a0, %v3) #4
  %v5: f16[16,64] = AsType(%v3) [{"dtype": "f16"}] #5
  return (%v4, %v5)
}
"""
    st = stats_by_id(src)
    row, dense = 64 * F32, 16 * 64 * F32
    assert st[1][1:] == (row, row)  # exp of a broadcast row: one row read, one row written
    assert st[3][1:] == (row + F32, row)  # times a broadcast scalar: still one row
    assert st[4][1:] == (dense + row, dense)  # added to a dense value: dense
    assert st[5][1:] == (row, 64 * 2)  # a cast keeps the layout: 64 halves
    lv = liveness(parse(src))
    assert (lv.nbytes["v1"], lv.nbytes["v3"], lv.nbytes["v4"], lv.nbytes["v5"]) == (row, row, dense, 128)


@pytest.mark.parametrize(("alpha", "beta", "extra"), [(1.0, 1.0, 1), (2.0, 1.0, 2), (2.0, 0.5, 3)])
def test_addmm_flops_include_the_add(alpha: float, beta: float, extra: int) -> None:
    src = f"""\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,6] param="w", %p1: f32[4,6] param="b") {{
  %v0: f32[4,6] = AddMM(%a0, %p0, %p1) [{alpha}, {beta}] #0
  return (%v0)
}}
"""
    m, n, k = 4, 6, 8
    # the product: m*n*k multiply-adds (two FLOPs each); the add, and a scaling per factor
    assert stats_by_id(src)[0][0] == 2 * m * n * k + extra * m * n


def test_boundary_bytes_count_a_buffer_once() -> None:
    src = """\
graph f(%a0: f32[8,8] arg="0") {
  %v0: f32[8,8] = Exp(%a0) #0
  segc.cut() ["c0"] #1
  %v1: f32[8,8] = Sin(%a0) #2
  segc.cut() ["c1"] #3
  %v2: f32[8,8] = Add(%v0, %v1) #4
  return (%v2)
}
"""
    g = parse(src)
    b = 8 * 8 * F32  # 256 B
    st = analyze(g)
    assert [s.cross for s in st.segments] == [b, 2 * b, 0]  # per cut: v0; then v0 and v1
    assert st.boundary_bytes == 2 * b  # v0 crosses both cuts but is written once
    assert crossing_bytes(g)[1:3] == [b, 2 * b]
