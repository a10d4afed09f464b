"""Exact cut placement (issue 15): ``memory:B`` and ``optimal[:B]`` against brute force
over every subset of the legal cut points, on random programs written as IR text. The
brute force cuts the graph and measures each plan with the reference working sets of
``conftest`` (``ref_segment_peaks``) and the cost model's ``predict_time`` applied to
the cut graph, never with the DP under test. No MLX runs here."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from conftest import examples, ref_segment_peaks
from hypothesis import given, settings
from hypothesis import strategies as st

from segc import ScheduleError
from segc.ir import Graph, parse, segments
from segc.passes import make_plan
from segc.passes.costmodel import CPU, H200, MachineModel, predict_time
from segc.passes.legalize import legal_points
from segc.passes.optimal import Optimal
from segc.passes.plan import apply_plan, plan_at
from segc.passes.strategies import Memory

WIDTHS = (4, 8, 16)


@st.composite
def programs(draw: Any) -> Graph:
    """A random straight-line program over f32[4,w] values: elementwise chains (which
    fuse), matrix products by parameters (which change the width), reductions."""
    n = draw(st.integers(3, 11))
    vals: list[tuple[str, int]] = [("a0", 8)]
    params: list[str] = []
    lines = []
    for k in range(n):
        kind = draw(st.sampled_from(["unary", "binary", "matmul", "matmul", "sum"]))
        x, w = vals[draw(st.integers(0, len(vals) - 1))]
        out = f"v{k}"
        if kind == "unary":
            lines.append(f"  %{out}: f32[4,{w}] = {draw(st.sampled_from(['Exp', 'Sin', 'Tanh']))}(%{x}) #{k}")
        elif kind == "binary":
            same = [v for v, ww in vals if ww == w]
            y = same[draw(st.integers(0, len(same) - 1))]
            lines.append(f"  %{out}: f32[4,{w}] = {draw(st.sampled_from(['Add', 'Multiply']))}(%{x}, %{y}) #{k}")
        elif kind == "matmul":
            w2 = draw(st.sampled_from(WIDTHS))
            p = f"p{len(params)}"
            params.append(f'%{p}: f32[{w},{w2}] param="w{len(params)}"')
            lines.append(f"  %{out}: f32[4,{w2}] = Matmul(%{x}, %{p}) #{k}")
            w = w2
        else:
            lines.append(f"  %{out}: f32[4,{w}] = Sum(%{x}) [[0]] #{k}")
            lines[-1] = f"  %{out}: f32[4,{w}] = Negative(%{x}) #{k}"
        vals.append((out, w))
    outs = ", ".join(f"%{v}" for v, _ in vals[-2:] if v != "a0")
    head = ", ".join(['%a0: f32[4,8] arg="0"', *params])
    return parse(f"graph f({head}) {{\n" + "\n".join(lines) + f"\n  return ({outs})\n}}\n")


def all_plans(g: Graph) -> list[tuple[tuple[int, ...], Graph]]:
    pts = legal_points(g)
    out = []
    for r in range(len(pts) + 1):
        for sub in itertools.combinations(pts, r):
            out.append((sub, apply_plan(g, plan_at(g, "brute", sub))))
    return out


@settings(max_examples=examples(60), deadline=None, derandomize=True)
@given(g=programs(), frac=st.floats(0.1, 1.2))
def test_memory_dp_matches_brute_force(g: Graph, frac: float) -> None:
    plans = all_plans(g)
    (whole,) = ref_segment_peaks(plans[0][1])
    budget = int(whole * frac)
    feasible = [len(segments(cut)) for _, cut in plans if max(ref_segment_peaks(cut)) <= budget]
    if not feasible:
        with pytest.raises(ScheduleError, match="no plan keeps every segment"):
            make_plan(g, Memory(budget))
        return
    cut = apply_plan(g, make_plan(g, Memory(budget)))
    assert max(ref_segment_peaks(cut)) <= budget
    assert len(segments(cut)) == min(feasible)  # the fewest segments any legal plan needs


SLOW_HOST = MachineModel("slow-host", 1e9, 1e9, 1e-7, 1e-3, 1e-5)
ENCODING = MachineModel("encoding", 1e9, 1e9, 1e-7, 1e-4, 1e-6, "by hand", 5e-6)
# a queue of 2 kernels, comparable in device time to a segment's preparation
QUEUED = MachineModel("queued", 1e9, 1e8, 1e-6, 2e-6, 1e-6, "by hand", queue_kernels=2)
# a size term large enough to prefer more segments than the dispatch cost alone would
SIZED = MachineModel("sized", 1e9, 1e9, 1e-7, 2e-6, 1e-7, "by hand", segment_sq_s=5e-7)
# elementwise kernels a tenth of a product's host time, with the host dear
CHEAP_ELEMENTWISE = MachineModel("cheap-elementwise", 1e9, 1e9, 1e-7, 1e-5, 1e-5, "by hand", elementwise_host=0.1)
# the device dear per segment (a command buffer's start and drain), the host cheap
SEGMENT_DEVICE = MachineModel("segment-device", 1e9, 1e9, 1e-7, 1e-7, 1e-7, "by hand", segment_device_s=2e-5)


@pytest.mark.parametrize("model", [CPU, H200, SLOW_HOST, ENCODING, QUEUED, SIZED, CHEAP_ELEMENTWISE, SEGMENT_DEVICE])
@settings(max_examples=examples(25), deadline=None, derandomize=True)
@given(g=programs(), frac=st.one_of(st.none(), st.floats(0.2, 1.2)))
def test_optimal_matches_brute_force(model: MachineModel, g: Graph, frac: float | None) -> None:
    plans = all_plans(g)
    (whole,) = ref_segment_peaks(plans[0][1])
    budget = None if frac is None else int(whole * frac)
    times = [
        predict_time(cut, model).total for _, cut in plans if budget is None or max(ref_segment_peaks(cut)) <= budget
    ]
    if not times:
        with pytest.raises(ScheduleError):
            make_plan(g, Optimal(budget, model))
        return
    cut = apply_plan(g, make_plan(g, Optimal(budget, model)))
    assert budget is None or max(ref_segment_peaks(cut)) <= budget
    assert predict_time(cut, model).total == pytest.approx(min(times), rel=1e-9, abs=1e-15)


def test_relative_budgets_and_specs() -> None:
    src = """\
graph f(%a0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {
  %v0: f32[4,8] = Matmul(%a0, %p0) #0
  segc.cut() ["l0"] #1
  %v1: f32[4,8] = Matmul(%v0, %p0) #2
  segc.cut() ["l1"] #3
  %v2: f32[4,8] = Matmul(%v1, %p0) #4
  return (%v2)
}
"""
    g = parse(src)
    # each layer reads its input (128 B) and the weight (256 B) and makes 128 B: 512 B
    plan = make_plan(g, "memory:1x")
    assert plan.info["budget"] == 512 and len(plan.cuts) == 2
    assert make_plan(g, "memory:2x").info["budget"] == 1024
    # the whole graph: a0 and the weight (384 B), and at most two 128 B values at once
    assert len(make_plan(g, "memory:1.25x").cuts) == 0 and len(make_plan(g, "memory:1.2x").cuts) == 2
    assert make_plan(g, "optimal").strategy == "optimal"
    assert make_plan(g, "optimal:1x").strategy == "optimal(1x=512)"  # as memory:1x's label
    with pytest.raises(ScheduleError, match="bad argument"):
        make_plan(g, "memory:lotsx")


def _layers(n: int) -> Graph:
    """``n`` layers, each a norm read by three one-row products (q, k and v, as segc's
    CUDA lowering fuses them: each kernel normalises the row itself), then a residual
    addition, with a marker after each layer."""
    lines, params = [], ['%a0: f32[1,1,16] arg="0"']
    x, k = "a0", 0

    def eq(text: str) -> None:
        nonlocal k
        lines.append(f"  {text} #{k}")
        k += 1

    for i in range(n):
        params += [f'%nw{i}: f32[16] param="nw{i}"', f'%wq{i}: f32[16,16] param="wq{i}"']
        params += [f'%wk{i}: f32[8,16] param="wk{i}"', f'%wv{i}: f32[8,16] param="wv{i}"']
        eq(f"%n{i}: f32[1,1,16] = RMSNorm(%{x}, %nw{i}) [1e-05]")
        eq(f"%r{i}: f32[1,16] = Flatten(%n{i}) [0, 1]")
        for w, o in (("q", 16), ("k", 8), ("v", 8)):
            eq(f"%t{w}{i}: f32[16,{o}] = Transpose(%w{w}{i}) [[1, 0]]")
            eq(f"%{w}{i}: f32[1,{o}] = Matmul(%r{i}, %t{w}{i})")
        eq(f"%kv{i}: f32[1,8] = Multiply(%k{i}, %v{i})")
        eq(f"%e{i}: f32[1,16] = Exp(%q{i})")
        eq(f"%xf{i}: f32[1,16] = Flatten(%{x}) [0, 1]")
        eq(f"%s{i}: f32[1,16] = Add(%xf{i}, %e{i})")
        eq(f"%h{i}: f32[1,1,16] = Unflatten(%s{i}) [0, [1, 1]]")
        if i < n - 1:
            eq(f'segc.cut() ["layers.{i}"]')
        x = f"h{i}"
    outs = ", ".join([f"%{x}", *(f"%kv{i}" for i in range(n))])
    return parse(f"graph f({', '.join(params)}) {{\n" + "\n".join(lines) + f"\n  return ({outs})\n}}\n")


@pytest.mark.parametrize("spec", ["optimal", "optimal:markers"])
@pytest.mark.parametrize("model", [H200, replace(SLOW_HOST, fused_products=True)])
def test_optimal_is_exact_where_segcs_kernels_share_a_norm(spec: str, model: MachineModel) -> None:
    """On machines that run segc's CUDA kernels (``make_plan(..., model=...)`` pins
    them), two layers of products sharing a norm: the plan's predicted time is the
    least over every subset of the legal points (the marker's for ``optimal:markers``),
    each costed by ``predict_time`` on the cut graph, and the dynamic program's own
    figure is that time (on the H200's decode graph it was not: its ``optimal`` cut
    among such products)."""
    from segc.passes.plan import marker_points

    g = _layers(2)
    pts = legal_points(g, kernels=True)
    assert len(pts) == 7  # after each layer's last product, its multiply, its addition; the marker
    if spec == "optimal:markers":
        pts = [p for p, _, _ in marker_points(g)]
        assert len(pts) == 1 and set(pts) <= set(legal_points(g, kernels=True))
    subsets = [s for r in range(len(pts) + 1) for s in itertools.combinations(pts, r)]
    best = min(predict_time(apply_plan(g, plan_at(g, "brute", s)), model).total for s in subsets)
    plan = make_plan(g, spec, model=model)
    got = predict_time(apply_plan(g, plan), model).total
    assert got == pytest.approx(best, rel=1e-9) and plan.info["predicted_s"] == pytest.approx(got, rel=1e-9)
    assert plan.strategy == ("optimal(markers)" if spec == "optimal:markers" else "optimal")


def test_optimal_at_markers_needs_markers() -> None:
    with pytest.raises(ScheduleError, match="has no markers"):
        make_plan(_layers(1), "optimal:markers")


# the host's saving on a repeated segment (costmodel "Repeats"), which the DP cannot see
# (a model, whether the DP's own plan is already the least: the host so slow that one
# segment is best whatever the saving)
REPEATING = (
    (replace(H200, repeat_op_s=1e-6, repeat_s=3e-6), False),
    (replace(H200, repeat_op_s=1e-5), False),
    (replace(SLOW_HOST, fused_products=True, repeat_op_s=1e-5, repeat_s=3e-5), True),
)


def _subsets(points: list[int]) -> list[tuple[int, ...]]:
    return [s for r in range(len(points) + 1) for s in itertools.combinations(points, r)]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(("model", "dp_suffices"), REPEATING)
def test_optimal_with_repeats_finds_the_least_time_here(n: int, model: MachineModel, dp_suffices: bool) -> None:
    """On two and three repeated layers, with the saving large enough to change the
    answer, the search's plan has the least predicted time over every subset of the
    legal points, and its own figure is that time (repeat_search.py: not exact in
    general; benchmarks/optimal_gap.py measures how far it is on random machines)."""
    g = _layers(n)
    pts = legal_points(g, kernels=True)
    best = min(predict_time(apply_plan(g, plan_at(g, "brute", s)), model).total for s in _subsets(pts))
    plan = make_plan(g, "optimal", model=model)
    got = predict_time(apply_plan(g, plan), model).total
    assert got == pytest.approx(best, rel=1e-9) and plan.info["predicted_s"] == pytest.approx(got, rel=1e-9)
    assert (plan.info["found_by"] == "dp") == dp_suffices
    assert plan.info["dp_s"] >= got and (plan.info["dp_s"] == got) == dp_suffices


@settings(max_examples=examples(15), deadline=None, derandomize=True)
@given(
    n=st.integers(2, 5),
    per_op=st.floats(1e-8, 1e-4),
    per_segment=st.floats(0, 1e-4),
    frac=st.one_of(st.none(), st.floats(0.3, 1.5)),
    spec=st.sampled_from(["optimal", "optimal:markers"]),
)
def test_optimal_with_repeats_never_above_its_starts(
    n: int, per_op: float, per_segment: float, frac: float | None, spec: str
) -> None:
    """Whatever the saving: the plan keeps the budget, is predicted no slower than the
    DP's plan (made without the saving), every marker or every second marker (where
    they keep the budget), costed by ``predict_time`` on the cut graph, and ``optimal``
    no slower than ``optimal:markers`` under the same budget; with ``optimal:markers``
    it cuts at markers only."""
    from segc.passes.plan import marker_points

    model = replace(H200, repeat_op_s=per_op, repeat_s=per_segment)
    g = _layers(n)
    budget = None if frac is None else int(max(ref_segment_peaks(g)) * frac)  # the layers' largest, scaled
    markers = spec == "optimal:markers"

    def time_of(plan_spec: Any, m: MachineModel = model) -> float | None:
        try:
            cut = apply_plan(g, make_plan(g, plan_spec, model=m))
        except ScheduleError:
            return None
        return predict_time(cut, model).total if budget is None or max(ref_segment_peaks(cut)) <= budget else None

    no_saving = replace(model, repeat_op_s=0.0, repeat_s=0.0)
    starts = [time_of(Optimal(budget, no_saving, markers=markers), no_saving), time_of("markers"), time_of("every:2")]
    if not markers:  # every point includes the markers: never above the search over them alone
        starts.append(time_of(Optimal(budget, model, markers=True)))
    if all(t is None for t in starts):
        return
    plan = make_plan(g, Optimal(budget, model, markers=markers), model=model)
    cut = apply_plan(g, plan)
    got = predict_time(cut, model).total
    assert budget is None or max(ref_segment_peaks(cut)) <= budget
    assert all(got <= t * (1 + 1e-12) for t in starts if t is not None)
    assert plan.info["predicted_s"] == pytest.approx(got, rel=1e-9)
    if markers:
        os_ = [e for e in g.eqns if not e.is_pseudo]
        at = {p for p, _, _ in marker_points(g)}
        assert {next(k + 1 for k, e in enumerate(os_) if e.id == c.after) for c in plan.cuts} <= at


@pytest.mark.parametrize("machine", ["cm", "cn"])
def test_optimal_never_above_optimal_at_markers_on_the_reference_prefill(machine: str) -> None:
    """On the reference llama's prefill as the H100s traced it (the same graph on both:
    ``tests/data/h100_reference_prefill.segc``), under the model each run fitted first
    (``tests/data/h100_<machine>_reference_prefill_fitted.json``: the twenty-ninth and
    thirtieth runs of docs/experiments-log.md), ``optimal`` came out above
    ``optimal:markers``, a plan it may choose: on CM (5.072 against 5.013 ms predicted)
    its search spent its plans before a step; on CN (by 0.03%) its search over the
    markers started elsewhere than ``optimal:markers``'s. It now starts from that plan."""
    from pathlib import Path

    data = Path(__file__).parent.parent / "data"
    g = parse((data / "h100_reference_prefill.segc").read_text())
    model = replace(MachineModel.load(data / f"h100_{machine}_reference_prefill_fitted.json"), device="gpu")
    times = {}
    for spec in ("optimal", "optimal:markers", "markers"):
        plan = make_plan(g, spec, model=model)
        times[spec] = predict_time(apply_plan(g, plan), model).total
        assert plan.info.get("predicted_s", times[spec]) == times[spec]  # the search's figure is predict_time's
    assert times["optimal"] <= times["optimal:markers"] < times["markers"]


@settings(max_examples=examples(30), deadline=None, derandomize=True)
@given(data=st.data(), n=st.integers(1, 4), per_op=st.floats(0, 1e-5), buffer=st.sampled_from([0, 3, 100]))
def test_plan_timer_is_predict_time_on_the_cut_graph(data: st.DataObject, n: int, per_op: float, buffer: int) -> None:
    """``repeat_search.PlanTimer`` (the per-op costs once, on the uncut graph) gives
    ``predict_time``'s figure on the graph cut at the same legal points, exactly (the same
    arithmetic in the same order), whatever the repeat saving and command-buffer size."""
    from segc.passes.repeat_search import PlanTimer

    g = _layers(n)
    model = replace(H200, repeat_op_s=per_op, buffer_kernels=buffer)
    pts = legal_points(g, kernels=True)
    chosen = data.draw(st.lists(st.sampled_from(pts), unique=True) if pts else st.just([]))
    want = predict_time(apply_plan(g, plan_at(g, "x", chosen)), model).total
    assert PlanTimer(g, model)(chosen) == want


@pytest.mark.parametrize("graph", ["h100_reference_prefill.segc", "h200_reference_decode.segc"])
def test_plan_timer_on_the_reference_graphs(graph: str) -> None:
    """The same on the reference llama's traced graphs, twenty random plans each."""
    import random
    from pathlib import Path

    from segc.passes.repeat_search import PlanTimer

    g = parse((Path(__file__).parent.parent / "data" / graph).read_text())
    model = replace(H200, repeat_op_s=8e-7, segment_device_s=3e-5)
    pts = legal_points(g, kernels=True)
    timer, rng = PlanTimer(g, model), random.Random(0)
    for _ in range(20):
        chosen = rng.sample(pts, rng.randint(0, min(40, len(pts))))
        want = predict_time(apply_plan(g, plan_at(g, "x", chosen)), model).total
        assert timer(chosen) == want, sorted(chosen)
