"""Analyses and cut-placement strategies on inline IR, plans as JSON. No MLX execution."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segc import ScheduleError
from segc.ir import parse, segments, to_text
from segc.passes import Plan, make_plan, run_pass
from segc.passes.analysis import (
    Machine,
    analyze,
    critical_path,
    crossing_bytes,
    eqn_stats,
    liveness,
    span_peak,
)
from segc.passes.legalize import fusion_groups, illegal_points, legal_points
from segc.passes.plan import apply_plan, diff, plan_key, plan_of
from segc.passes.strategies import parse_bytes
from segc.runtime import measure_segments

# a chain of "layers": matmul, then a fused Exp*x chain, with markers after #2 and #5
SRC = """\
graph f(%a0: f32[8,8] arg="0", %p0: f32[8,8] param="w0", %p1: f32[8,8] param="w1") {
  %v0: f32[8,8] = Matmul(%a0, %p0) #0
  %v1: f32[8,8] = Exp(%v0) #1
  %v2: f32[8,8] = Multiply(%v1, %a0) #2
  segc.cut() ["l0"] #3
  %v3: f32[8,8] = Matmul(%v2, %p1) #4
  %v4: f32[8,8] = Add(%v3, %v2) #5
  segc.cut() ["l1"] #6
  %v5: f32[8,8] = Matmul(%v4, %p0) #7
  %v6: f32[8,8] = Tanh(%v5) #8
  %v7: f32[8,8] = Reshape(%v6) [[8, 8]] #9
  return (%v7)
}
"""


@pytest.fixture
def g():
    return parse(SRC)


def test_flops_and_bytes(g):
    st = {s.id: s for s in eqn_stats(g)}
    assert st[0].flops == 2 * 8 * 8 * 8 and st[0].read == 2 * 256 and st[0].written == 256
    assert st[1].flops == 64 and (st[1].read, st[1].written) == (256, 256)
    assert st[9].flops == 0 and (st[9].read, st[9].written) == (0, 0)  # a view
    m = Machine("toy", flops_per_s=1e9, bytes_per_s=1e9)
    assert eqn_stats(g, m)[0].cost == pytest.approx(max(1024 / 1e9, 768 / 1e9))


def test_liveness_and_crossing(g):
    lv = liveness(g)
    assert lv.defined["v2"] == 2 and lv.last_use["v2"] == 4
    assert lv.root["v7"] == "v6" and lv.last_use["v6"] == 8  # the output, a view of v6, lives to the end
    cross = crossing_bytes(g)
    assert cross[3] == 256  # after #2 only %v2 is live
    assert cross[1] == 256 + 0  # after #0: %v0 (the input %a0 is not an activation)
    assert cross[4] == 2 * 256  # after #4: %v3 and %v2


def test_views_own_no_memory():
    g = parse(
        """graph f(%a0: f32[4,4] arg="0") {
  const %c0: f32[] = [2.0]
  %v0: f32[4,4] = Broadcast(%c0) [[4, 4]] #0
  %v1: f32[4,4] = Exp(%a0) #1
  %v2: f32[4,4] = Transpose(%v1) [[1, 0]] #2
  %v3: f32[16] = Reshape(%v2) [[16]] #3
  %v4: f32[4,4] = Matmul(%v2, %v0) #4
  %v5: f32[16] = Reshape(%v4) [[16]] #5
  %v6: f32[16] = Add(%v5, %v3) #6
  return (%v6)
}"""
    )
    lv = liveness(g)
    assert lv.root["v0"] == "c0" and lv.nbytes["c0"] == 0  # a broadcast constant crosses for free
    assert lv.root["v2"] == "v1" and lv.last_use["v1"] == 4  # the transpose keeps v1 alive
    assert lv.root["v3"] == "v3"  # reshaping a transposed value copies
    assert lv.root["v5"] == "v4"  # reshaping a contiguous one does not
    assert crossing_bytes(g)[1] == 0 and crossing_bytes(g)[3] == 64


def test_span_peak_counts_inputs_and_intermediates(g):
    # ops 0..2: reads a0, p0 (512 B); v0, v1 die inside, v2 leaves: at worst v0+v1 = 512
    assert span_peak(g, 0, 3) == 512 + 512


def test_analyze_segments_and_critical_path(g):
    st = analyze(g)
    assert [s.name for s in st.segments] == ["l0", "l1", "tail"]
    assert [s.n_eqns for s in st.segments] == [3, 2, 3]
    assert st.boundary_bytes == 256 + 256
    assert st.peak_live >= st.max_segment_peak
    cost, path = critical_path(g)
    assert path == (0, 1, 2, 4, 5, 7, 8) and cost == pytest.approx(st.cost)  # one chain: all of it


def test_fusion_groups(g):
    groups = fusion_groups(g)
    assert groups == [(1, 2)]  # Exp -> Multiply; Add #5 and Tanh #8 stand alone
    assert illegal_points(g) == {2}
    assert legal_points(g) == [1, 3, 4, 5, 6, 7]


def test_broadcast_of_outside_value_pins_nothing():
    g = parse(
        """graph f(%a0: f32[4] arg="0", %a1: f32[2,4] arg="1") {
  %v0: f32[4] = Exp(%a0) #0
  %v1: f32[2,4] = Broadcast(%v0) [[2, 4]] #1
  %v2: f32[2,4] = Matmul(%a1, %a1) #2
  %v3: f32[2,4] = Multiply(%v1, %v2) #3
  return (%v3)
}"""
    )
    # Exp -> Broadcast -> Multiply fuse (the broadcast's input is in the group)
    assert fusion_groups(g) == [(0, 1, 3)]
    # a Matmul feeding the broadcast: the broadcast is copied into the group, pins nothing
    g2 = parse(to_text(g).replace("%v0: f32[4] = Exp(%a0) #0", "%v0: f32[4] = Matmul(%a0, %a0) #0"))
    assert fusion_groups(g2) == []
    g3 = parse(
        """graph f(%a0: f32[4] arg="0", %a1: f32[2,4] arg="1") {
  %v1: f32[2,4] = Broadcast(%a0) [[2, 4]] #1
  %v2: f32[2,4] = Matmul(%a1, %a1) #2
  %v3: f32[2,4] = Multiply(%v1, %v2) #3
  return (%v3)
}"""
    )
    assert fusion_groups(g3) == []  # a broadcast of an input may cross a cut


# --------------------------------------------------------------------------- strategies


def cut_after(g) -> list[int]:
    return [c.after for c in plan_of(g).cuts]


def test_markers_and_none(g):
    assert cut_after(run_pass("cut", g, strategy="markers")) == [2, 5]
    assert run_pass("cut", g, strategy="markers") == g  # the traced cuts, ids kept
    assert segments(run_pass("cut", g, strategy="none"))[0].name == "tail"


def test_every(g):
    assert cut_after(run_pass("cut", g, strategy="every:2")) == [5]
    assert cut_after(run_pass("cut", g, strategy="every(1)")) == [2, 5]


def test_balanced_minimises_the_largest_segment(g):
    for n in (1, 2, 3, 4):
        out = run_pass("cut", g, strategy=f"balanced:{n}")
        st = analyze(out)
        assert len(st.segments) <= n
        # brute force over legal points
        pts = legal_points(g)
        from segc.passes.analysis import eqn_cost, ops

        costs = [eqn_cost(e, g.vars()) for e in ops(g)]
        best = min(
            max(sum(costs[a:b]) for a, b in itertools.pairwise([0, *c, len(costs)]))
            for k in range(n)
            for c in itertools.combinations(pts, k)
        )
        assert st.max_segment_cost == pytest.approx(best)


@given(
    costs=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=9),
    data=st.data(),
)
@settings(max_examples=60, deadline=None, derandomize=True)
def test_partition_is_optimal(costs, data):
    from segc.passes.strategies import _partition

    n = len(costs)
    points = data.draw(st.lists(st.integers(1, max(n - 1, 1)), unique=True)) if n > 1 else []
    k = data.draw(st.integers(1, 5))
    cuts = _partition(costs, points, k)
    assert set(cuts) <= set(points) and len(cuts) <= k - 1

    def worst(cs):
        return max(sum(costs[a:b]) for a, b in itertools.pairwise([0, *sorted(cs), n]))

    best = min(worst(c) for j in range(k) for c in itertools.combinations(sorted(set(points)), j))
    assert worst(cuts) == pytest.approx(best)


def test_balanced_with_measured_times(g):
    from segc.passes.strategies import Balanced

    # the tail measured 10x slower than the rest: the balanced cut moves into it
    measured = {"l0": 1.0, "l1": 1.0, "tail": 10.0}
    plan = make_plan(g, Balanced(2, measured=measured))
    assert plan.strategy == "balanced(2, measured)"
    assert plan.cuts[0].after in (7, 8)


def test_memory_budget(g):
    out = run_pass("cut", g, strategy="memory:1280")
    assert all(s.peak_live <= 1280 for s in analyze(out).segments)
    fewer = run_pass("cut", g, strategy="memory:100KiB")
    assert len(segments(fewer)) == 1
    with pytest.raises(ScheduleError, match="cannot be cut"):
        run_pass("cut", g, strategy="memory:100")


def test_min_boundary_bytes(g):
    plan = make_plan(g, "min_boundary_bytes")
    out = apply_plan(g, plan)
    # between the markers after #2 and #5 the cheapest cut carries 256 B
    st = analyze(out)
    assert st.boundary_bytes == 256 and len(st.segments) == 2
    with pytest.raises(ScheduleError, match="no marker named 'zz'"):
        make_plan(g, "min_boundary_bytes:l0,zz")


def test_min_boundary_bytes_may_reorder():
    g = parse(
        """graph f(%a0: f32[64] arg="0", %a1: f32[1] arg="1") {
  %v0: f32[64] = Sin(%a0) #0
  segc.cut() ["m0"] #1
  %v1: f32[1] = Cos(%a1) #2
  %v2: f32[64] = Matmul(%v0, %v0) #3
  %v3: f32[1] = Matmul(%v1, %v1) #4
  %v4: f32[1] = Sum(%v2) #5
  segc.cut() ["m1"] #6
  %v5: f32[64] = Cos(%v4) #7
  return (%v5, %v3)
}"""
    )
    plan = make_plan(g, "min_boundary_bytes")
    out = apply_plan(g, plan)
    assert analyze(out).boundary_bytes <= 8
    assert apply_plan(out, plan) == out  # the key ignores order: the plan re-applies


def test_user_callable_and_bad_ids(g):
    assert cut_after(run_pass("cut", g, strategy=lambda g: [4])) == [4]
    with pytest.raises(ScheduleError, match="#42"):
        run_pass("cut", g, strategy=lambda g: [42])


@pytest.mark.parametrize("spec", ["bogus", "every:x", "memory:lots"])
def test_bad_specs(g, spec):
    with pytest.raises(ScheduleError):
        make_plan(g, spec)


def test_parse_bytes():
    assert parse_bytes("64MiB") == 64 << 20 and parse_bytes("1.5k") == 1536 and parse_bytes("100") == 100


# --------------------------------------------------------------------------- plans


def test_plan_json_roundtrip_diff_and_reapply(g, tmp_path):
    plan = make_plan(g, "every:1")
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json")
    assert back == plan and back.fingerprint == plan_key(g)
    other = make_plan(g, "balanced:2")
    d = diff(plan, other)
    assert d.startswith(("-", "+", "~")) and diff(plan, back) == ""
    stripped = run_pass("strip_cuts", g)
    assert plan_key(stripped) == plan_key(g)
    assert run_pass("cut", stripped, plan=back) == run_pass("cut", g, plan=back)


def test_plan_records_legalisation_moves(g):
    plan = make_plan(g, lambda g: [1])
    assert [(m.requested, m.placed) for m in plan.moved] == [(1, 0)]
    assert "splits the fused chain #1..#2" in plan.moved[0].reason
    assert '"moved"' in plan.to_json()


def test_plan_for_another_graph_is_refused(g):
    plan = make_plan(g, "markers")
    other = parse(SRC.replace("Tanh", "Exp"))
    with pytest.raises(ScheduleError, match="was made for graph"):
        run_pass("cut", other, plan=plan)
    with pytest.raises(ScheduleError, match="not a segc plan"):
        Plan.from_json('{"segc_plan": 99}')


def test_measure_segments_runs_each_segment():
    import mlx.core as mx

    g = parse(SRC)
    x = mx.ones((8, 8))
    times = measure_segments(g, [x, x, x], repeats=1)
    assert set(times) == {"l0", "l1", "tail"} and all(t > 0 for t in times.values())
