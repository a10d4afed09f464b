"""Analyses and cut-placement strategies on inline IR, plans as JSON. No MLX execution.

Expected figures are worked out by hand from the roofline and the liveness rules
(segc/passes/analysis.py's docstring), or by the brute-force references of
``conftest`` (``ref_segment_peaks``, ``ref_boundary_bytes``), never by the analyses
under test."""

from __future__ import annotations

import itertools

import pytest
from conftest import examples, ref_boundary_bytes, ref_segment_peaks
from hypothesis import given, settings
from hypothesis import strategies as st

from segc import ScheduleError
from segc.ir import Graph, parse, segments, to_text
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
from segc.passes.strategies import Balanced, parse_bytes

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


# The roofline of SRC by hand, on the default machine (an H200: 790e12 FLOP/s, 4.8e12
# B/s). Every op is bound by its bytes: an f32[8,8] is 256 B, and even a matmul's 1024
# FLOPs take 1.3 ps against 160 ps for its 768 B. Bytes read + written, by equation id:
BYTES = {0: 3 * 256, 1: 2 * 256, 2: 3 * 256, 4: 3 * 256, 5: 3 * 256, 7: 3 * 256, 8: 2 * 256, 9: 0}
COST = {i: b / 4.8e12 for i, b in BYTES.items()}
OP_IDS = [0, 1, 2, 4, 5, 7, 8, 9]  # the computing equations, in order
LEGAL = [1, 3, 4, 5, 6, 7]  # cut points (op indices) that split no fused chain: Exp #1 -> Multiply #2 fuse


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
    # one segment: reads a0 (64 B; the constant is free); at worst v1 (kept alive by its
    # transpose until the matmul), the copied reshape v3 and v4 are live: 3 * 64 B
    assert ref_segment_peaks(g) == [64 + 192]
    assert analyze(g).segments[0].peak_live == 64 + 192


def test_span_peak_counts_inputs_and_intermediates(g):
    # ops 0..2: reads a0, p0 (512 B); v0, v1 die inside, v2 leaves: at worst v0+v1 = 512
    assert span_peak(g, 0, 3) == 512 + 512


def test_reference_analyses_match_hand_counts(g):
    # each segment reads 512 B from outside (l0: a0, p0; l1: v2, p1; tail: v4, p0) and
    # holds at most two of its own 256 B buffers at once; v2 crosses the first cut, v4
    # the second
    assert ref_segment_peaks(g) == [1024, 1024, 1024]
    assert ref_boundary_bytes(g) == 256 + 256


def test_analyze_segments_and_critical_path(g):
    st = analyze(g)
    assert [s.name for s in st.segments] == ["l0", "l1", "tail"]
    assert [s.n_eqns for s in st.segments] == [3, 2, 3]
    assert [s.peak_live for s in st.segments] == [1024, 1024, 1024]  # as counted above
    assert st.peak_live == 1024  # nothing but a segment's own inputs is held across it
    assert [s.cross for s in st.segments] == [256, 256, 0]
    assert st.boundary_bytes == 256 + 256
    assert [s.cost for s in st.segments] == pytest.approx(
        [COST[0] + COST[1] + COST[2], COST[4] + COST[5], COST[7] + COST[8]]
    )
    assert st.cost == pytest.approx(sum(COST.values()))
    cost, path = critical_path(g)
    assert path == (0, 1, 2, 4, 5, 7, 8)  # one chain: every op but the free reshape
    assert cost == pytest.approx(sum(BYTES[i] for i in path) / 4.8e12)


def test_fusion_groups(g):
    groups = fusion_groups(g)
    assert groups == [(1, 2)]  # Exp -> Multiply; Add #5 and Tanh #8 stand alone
    assert illegal_points(g) == {2}
    assert legal_points(g) == LEGAL


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


def worst_run(costs: list[float], cuts) -> float:
    """The largest sum of ``costs`` between consecutive cut points."""
    return max(sum(costs[a:b]) for a, b in itertools.pairwise([0, *sorted(cuts), len(costs)]))


def best_partition(costs: list[float], legal: list[int], n: int) -> float:
    """Brute force: the smallest largest run over every choice of at most ``n - 1`` points."""
    return min(worst_run(costs, c) for k in range(n) for c in itertools.combinations(legal, k))


def test_balanced_minimises_the_largest_segment(g):
    costs = [COST[i] for i in OP_IDS]
    for n in (1, 2, 3, 4):
        out = run_pass("cut", g, strategy=f"balanced:{n}")
        segs = segments(out)
        assert len(segs) <= n
        largest = max(sum(COST[e.id] for e in s.eqns(out)) for s in segs)
        assert largest == pytest.approx(best_partition(costs, LEGAL, n))


def measured_chain(kinds: list[str]) -> Graph:
    """A chain of ops over f32[4,4], op ``k`` with id ``k`` (``"M"``: a matmul, ``"E"``:
    an exp), each in its own segment ``s{k}`` (the last: ``tail``). Two exps in a row
    fuse, so the point between them is illegal; every other point is legal."""
    lines = ['graph chain(%a0: f32[4,4] arg="0") {']
    prev = "%a0"
    for k, kind in enumerate(kinds):
        rhs = f"Matmul({prev}, %a0)" if kind == "M" else f"Exp({prev})"
        lines.append(f"  %v{k}: f32[4,4] = {rhs} #{k}")
        if k < len(kinds) - 1:
            lines.append(f'  segc.cut() ["s{k}"] #{100 + k}')
        prev = f"%v{k}"
    lines += [f"  return ({prev})", "}"]
    return parse("\n".join(lines) + "\n")


@given(
    costs=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=9),
    data=st.data(),
)
@settings(max_examples=examples(60), deadline=None, derandomize=True)
def test_balanced_with_measured_times_is_optimal(costs, data):
    """Any measured per-op times, any fusion pattern: the balanced plan's largest
    segment is the brute-force best over the legal points."""
    n = len(costs)
    kinds = data.draw(st.lists(st.sampled_from("ME"), min_size=n, max_size=n))
    k = data.draw(st.integers(1, 5))
    g = measured_chain(kinds)
    measured = {(f"s{i}" if i < n - 1 else "tail"): c for i, c in enumerate(costs)}
    plan = make_plan(g, Balanced(k, measured=measured))
    legal = [p for p in range(1, n) if not (kinds[p - 1] == "E" and kinds[p] == "E")]
    cuts = [c.after + 1 for c in plan.cuts]  # op k has id k: a cut after #k is the point k + 1
    assert set(cuts) <= set(legal) and len(cuts) <= k - 1
    assert not plan.moved
    assert worst_run(costs, cuts) == pytest.approx(best_partition(costs, legal, k))


def test_balanced_with_measured_times(g):
    from segc.passes.strategies import Balanced

    # the tail measured 10x slower than the rest: the balanced cut moves into it
    measured = {"l0": 1.0, "l1": 1.0, "tail": 10.0}
    plan = make_plan(g, Balanced(2, measured=measured))
    assert plan.strategy == "balanced(2, measured)"
    assert plan.cuts[0].after in (7, 8)


def test_memory_budget(g):
    out = run_pass("cut", g, strategy="memory:1280")
    assert all(p <= 1280 for p in ref_segment_peaks(out))
    assert max(ref_segment_peaks(run_pass("strip_cuts", g))) > 1280  # so it had to cut
    fewer = run_pass("cut", g, strategy="memory:100KiB")
    assert len(segments(fewer)) == 1
    with pytest.raises(ScheduleError, match="cannot be cut"):
        run_pass("cut", g, strategy="memory:100")


def test_min_boundary_bytes(g):
    plan = make_plan(g, "min_boundary_bytes")
    out = apply_plan(g, plan)
    # between the markers after #2 and #5 the cheapest cut carries 256 B
    assert ref_boundary_bytes(out) == 256 and len(segments(out)) == 2
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
    assert ref_boundary_bytes(out) <= 8
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
