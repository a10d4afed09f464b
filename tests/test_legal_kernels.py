"""Cut placement keeps each kernel of segc's lowering in one segment (``legalize``: with
``kernels=True`` the CUDA lowering's; by default those of the jit's own lowering: on a
CUDA device, or with a callable ``attention``). On the H200 every plan that cut a decode
attention gave other bits than eager (docs/experiments.md): the lowering finds its kernels
segment by segment, and a split attention ran as MLX's decomposition instead of the
kernel that keeps eager's fused bits. The same happens here on the CPU with a callable
attention kernel whose bits differ from the decomposition (``reference_attention`` in
float32, a bfloat16 model): a plan that splits an attention changes the output, a
legalised plan never does, whatever the strategy, and neither does a jit given that
attention and a strategy or a saved plan."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as hst

import segc
from segc.errors import ScheduleWarning
from segc.lower.attention import only_where_eager_fuses, reference_attention
from segc.lower.fused import lowering_for
from segc.models import tiny_llama
from segc.passes import make_plan
from segc.passes.analysis import ops
from segc.passes.cut import cut
from segc.passes.legalize import illegal_points, legal_points, legalize_plan
from segc.passes.plan import Cut, Plan, apply_plan, plan_key, plan_of
from segc.research import make_workload
from segc.staging.stages import Lowered

pytestmark = pytest.mark.timeout(300)

ATTENTION = only_where_eager_fuses(reference_attention)  # float32 inside: not the decomposition's bits
STRATEGIES = ["balanced:2", "balanced:3", "balanced:5", "balanced:7", "memory:1x", "memory:2x", "optimal", "optimal:1x"]


def _bits(x: mx.array) -> bytes:
    return np.array(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x).tobytes()


@functools.cache
def _setup():
    """The graph, a runner of plans (the output's bytes), the unsegmented run's bytes and
    eager's (once per module: not a fixture, whose repr hypothesis would print)."""
    model = tiny_llama(
        hidden_size=128,
        num_hidden_layers=3,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        dtype=mx.bfloat16,
        seed=3,
    )
    wl = make_workload("decode:12", model)

    def run(plan: Plan | str) -> bytes:
        """The jit's bytes with ``strategy=plan``: its cut placement judges legality by
        its own attention kernel, so a saved plan's cut through a kernel moves."""
        fn = segc.jit(model, boundaries="layers.*", strategy=plan, attention=ATTENTION, validate=False)
        a, k = wl.args()
        y = fn(*a, **k)
        mx.eval(y)
        return _bits(y)

    def as_is(plan: Plan) -> bytes:
        """The bytes of ``plan`` applied as it is (no cut moved), lowered with the
        attention kernel: what a placement that ignored the kernel would run."""
        a, k = wl.args()
        t = segc.jit(model, boundaries="layers.*", attention=ATTENTION, validate=False).trace(*a, **k)
        y = Lowered(t, apply_plan(t.graph, plan), attention=ATTENTION).compile()(*a, **k)
        mx.eval(y)
        return _bits(y)

    a, k = wl.args()
    g = segc.jit(model, boundaries="layers.*").trace(*a, **k).graph
    eager = _bits(model(*wl.args()[0], **wl.args()[1]))
    return g, run, as_is, run(make_plan(g, "none")), eager


def _attention_spans(g) -> list[tuple[int, int]]:
    """The op positions of each decode attention, found from the primitives alone (not
    with the lowering's finder): from the scores' product to the product with the
    values, the softmax between them."""
    os_ = ops(g)
    spans = []
    for k, e in enumerate(os_):
        if e.prim == "Softmax":
            lo = max(j for j in range(k) if os_[j].prim == "Matmul")
            hi = min(j for j in range(k, len(os_)) if os_[j].prim == "Matmul")
            spans.append((lo, hi))
    return spans


def test_the_kernel_s_bits_differ_from_the_decomposition() -> None:
    """What the other tests rest on: the callable kernel runs here (the unsegmented run
    is not eager's bits), and a cut through an attention loses it (other bits again)."""
    g, _, as_is, whole, eager = _setup()
    assert whole != eager, "the attention kernel's bits equal the decomposition's: the test could not fail"
    spans = _attention_spans(g)
    assert len(spans) == 3, spans
    lo, _ = spans[1]
    inside = ops(g)[lo].id  # a cut right after the scores' product, inside the attention
    split = Plan(plan_key(g), "inside", (Cut(inside, "inside"),))
    assert as_is(split) != whole, "a cut through the attention kept the kernel's bits"
    assert legalize_plan(g, split, kernels=False).cuts == split.cuts  # legal for mx.compile's chains alone
    moved = legalize_plan(g, split, kernels=True)
    assert [m.requested for m in moved.moved] == [inside] and "kernel of segc" in moved.moved[0].reason
    assert as_is(moved) == whole


def test_no_legal_point_lies_inside_an_attention() -> None:
    g = _setup()[0]
    pts = set(legal_points(g, kernels=True))
    for lo, hi in _attention_spans(g):
        assert not pts & set(range(lo + 1, hi + 1)), (lo, hi)
    # no layer boundary splits a kernel; on the CPU the last one splits the final norm's
    # fused chain (docs/passes.md), whose nearer legal point, before the residual addition,
    # would split the last product's kernel: it moves past the chain instead
    markers = make_plan(g, "markers", legalize=False)
    legal = legalize_plan(g, markers, kernels=True)
    assert legal.cuts[:2] == markers.cuts[:2]
    assert [m.reason for m in legal.moved] == ["splits the fused chain #397..#399"]
    assert legal.cuts[2].after == 399 and legalize_plan(g, markers, kernels=False).cuts[2].after == 396


@settings(max_examples=examples(8), deadline=None)
@given(spec=hst.sampled_from(STRATEGIES), extra=hst.lists(hst.integers(0, 10_000), max_size=3))
def test_every_legalised_plan_keeps_the_unsegmented_bits(spec, extra) -> None:
    """A strategy's plan, with a few arbitrary cuts added, legalised with the lowering's
    kernels pinned: the output's bytes are the unsegmented run's."""
    g, _, as_is, whole, _ = _setup()
    os_ = ops(g)
    plan = make_plan(g, spec, legalize=False)
    at = {c.after for c in plan.cuts}
    more = [Cut(os_[x % (len(os_) - 1)].id, f"extra{i}") for i, x in enumerate(extra)]
    pos = {e.id: k for k, e in enumerate(os_)}
    cuts = sorted([*plan.cuts, *(c for c in more if c.after not in at)], key=lambda c: pos[c.after])
    uniq = list({c.after: c for c in cuts}.values())
    legal = legalize_plan(g, Plan(plan.fingerprint, plan.strategy, tuple(uniq)), kernels=True)
    assert as_is(legal) == whole, f"{spec} + {extra}: {[c.after for c in legal.cuts]}"


@pytest.mark.parametrize("spec", STRATEGIES)
def test_a_jit_s_strategy_keeps_its_own_attention_kernel_whole(spec: str) -> None:
    """``segc.jit(attention=callable, strategy=...)`` on the CPU: the strategy's cuts
    avoid the callable's attentions (legality follows the jit's own lowering, not the
    device's), so the output is the unsegmented run's bytes; without the pins at least
    one strategy cuts an attention (checked, so this test can fail)."""
    _, run, _, whole, _ = _setup()
    assert run(spec) == whole, spec


def test_a_strategy_cuts_an_attention_without_the_pins() -> None:
    """What the test above rests on: placed as for a lowering without the kernel
    (``attention="off"``), ``balanced:5`` cuts through an attention, and its plan run
    with the kernel gives other bytes than the unsegmented run."""
    g, _, as_is, whole, _ = _setup()
    with lowering_for("off"):
        plan = make_plan(g, "balanced:5")
    assert as_is(plan) != whole


def test_a_saved_plan_through_a_kernel_is_moved_off_it_where_the_kernels_lower() -> None:
    """``strategy=`` a saved plan that cuts through an attention, with the jit's
    attention a kernel (the callable here, the CUDA kernel on a GPU): the cut moves off
    the kernel with a ``ScheduleWarning`` naming it, and the output keeps the
    unsegmented run's bytes; the plan's other cut stays where it was. Where segments
    take no kernel of segc's (the CPU's default) the plan applies as saved."""
    g, run, as_is, whole, _ = _setup()
    lo, _ = _attention_spans(g)[1]
    os_ = ops(g)
    inside, layer = os_[lo].id, make_plan(g, "markers").cuts[0]  # the first layer's end, before the attention
    saved = Plan(plan_key(g), "saved", tuple(sorted([layer, Cut(inside, "inside")], key=lambda c: c.after)))
    assert as_is(saved) != whole  # as saved: the attention split
    with pytest.warns(ScheduleWarning, match=rf"cuts through kernels of segc's lowering; #{inside} -> #\d+"):
        assert run(saved) == whole
    with pytest.warns(ScheduleWarning), lowering_for(ATTENTION):
        placed = plan_of(cut(g, plan=saved))
    assert placed.cuts[0].after == layer.after and len(placed.cuts) == 2
    assert placed.cuts[1].after != inside and ops(g)[lo].id < placed.cuts[1].after
    assert [c.after for c in plan_of(cut(g, plan=saved)).cuts] == [c.after for c in saved.cuts]  # no kernel here


@pytest.mark.parametrize("spec", ["balanced:5", "balanced:7", "memory:1x", "optimal"])
def test_a_plan_made_for_a_gpu_keeps_its_kernels_whole_on_the_cpu(spec: str) -> None:
    """``make_plan(g, spec, model=H200)`` on the CPU: the plan is for a machine running
    segc's CUDA kernels (``fused_products``), so none of its cuts lies inside one (their
    spans found by the CUDA lowering's defaults, ``kernels=True``); for the same machine
    without them, and for the CPU's model, the same strategy cuts inside one."""
    from dataclasses import replace

    from segc.passes.machine import CPU, H200

    g = _setup()[0]
    pos = {e.id: k for k, e in enumerate(ops(g))}
    inside = set(illegal_points(g, kernels=True)) - set(illegal_points(g, kernels=False))

    def points(plan: Plan) -> set[int]:
        return {pos[c.after] + 1 for c in plan.cuts}

    assert not points(make_plan(g, spec, model=H200)) & inside
    assert points(make_plan(g, spec, model=replace(H200, fused_products=False))) & inside
    assert points(make_plan(g, spec, model=CPU)) & inside


@pytest.mark.parametrize("spec", ["llama", "llama:bits=4", "mixtral", "qwen3_moe"])
@pytest.mark.parametrize("workload", ["decode:16", "prefill:8"])
def test_no_legal_cut_changes_the_kernels_a_fusing_machine_counts(spec: str, workload: str) -> None:
    """Every legal point (segc's CUDA kernels pinned) of two layers of each model, cut
    alone, leaves the kernels the H200's cost model counts as they are uncut: the
    dynamic programs cost the uncut graph's kernels (``optimal``), so a legal cut that
    changed them would make their figures wrong (``test_gpu_graph_legality`` checks the
    H200's own trace)."""
    from segc.passes.costmodel import H200, op_costs
    from segc.passes.plan import plan_at
    from segc.research.models import load_model

    model = load_model(f"{spec}{',' if ':' in spec else ':'}num_hidden_layers=2")
    wl = make_workload(workload, model)
    a, k = wl.args()
    g = segc.jit(model, boundaries="layers.*").trace(*a, **k).graph
    kernels = sum(op_costs(g, H200).kernels)
    points = legal_points(g, kernels=True)
    changed = [p for p in points if sum(op_costs(apply_plan(g, plan_at(g, "one", [p])), H200).kernels) != kernels]
    assert points and changed == []
