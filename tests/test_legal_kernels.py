"""Cut placement keeps each kernel of segc's CUDA lowering in one segment (``legalize``,
``kernels=True``; on a CUDA device the default). On the H200 every plan that cut a decode
attention gave other bits than eager (docs/experiments.md): the lowering finds its kernels
segment by segment, and a split attention ran as MLX's decomposition instead of the
kernel that keeps eager's fused bits. The same happens here on the CPU with a callable
attention kernel whose bits differ from the decomposition (``reference_attention`` in
float32, a bfloat16 model): a plan that splits an attention changes the output, a
legalised plan never does, whatever the strategy."""

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
from segc.models import tiny_llama
from segc.passes import make_plan
from segc.passes.analysis import ops
from segc.passes.legalize import legal_points, legalize_plan
from segc.passes.plan import Cut, Plan, plan_key, plan_of
from segc.research import make_workload

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

    def run(plan: Plan | None) -> bytes:
        fn = segc.jit(model, boundaries="layers.*", strategy=plan, attention=ATTENTION, validate=False)
        a, k = wl.args()
        y = fn(*a, **k)
        mx.eval(y)
        return _bits(y)

    a, k = wl.args()
    g = segc.jit(model, boundaries="layers.*").trace(*a, **k).graph
    eager = _bits(model(*wl.args()[0], **wl.args()[1]))
    return g, run, run(make_plan(g, "none")), eager


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
    g, run, whole, eager = _setup()
    assert whole != eager, "the attention kernel's bits equal the decomposition's: the test could not fail"
    spans = _attention_spans(g)
    assert len(spans) == 3, spans
    lo, _ = spans[1]
    inside = ops(g)[lo].id  # a cut right after the scores' product, inside the attention
    split = Plan(plan_key(g), "inside", (Cut(inside, "inside"),))
    assert run(split) != whole, "a cut through the attention kept the kernel's bits"
    assert legalize_plan(g, split, kernels=False).cuts == split.cuts  # legal for mx.compile's chains alone
    moved = legalize_plan(g, split, kernels=True)
    assert [m.requested for m in moved.moved] == [inside] and "CUDA kernel" in moved.moved[0].reason
    assert run(moved) == whole


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
    g, run, whole, _ = _setup()
    os_ = ops(g)
    plan = make_plan(g, spec, legalize=False)
    at = {c.after for c in plan.cuts}
    more = [Cut(os_[x % (len(os_) - 1)].id, f"extra{i}") for i, x in enumerate(extra)]
    pos = {e.id: k for k, e in enumerate(os_)}
    cuts = sorted([*plan.cuts, *(c for c in more if c.after not in at)], key=lambda c: pos[c.after])
    uniq = list({c.after: c for c in cuts}.values())
    legal = legalize_plan(g, Plan(plan.fingerprint, plan.strategy, tuple(uniq)), kernels=True)
    assert run(legal) == whole, f"{spec} + {extra}: {[c.after for c in legal.cuts]}"


def test_a_saved_plan_through_a_kernel_is_moved_off_it_where_the_kernels_lower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``strategy=`` a saved plan that cuts through an attention, where segc's CUDA
    lowering runs (as on a GPU; here ``kernels_here`` says so and the callable attention
    stands for the CUDA kernel): the cut moves off the kernel with a ``ScheduleWarning``
    naming it, and the output keeps the unsegmented run's bytes; the plan's other cut
    stays where it was. On the CPU's own answer the plan runs as saved (other bytes)."""
    import segc.passes.cut as cut_pass

    g, run, whole, _ = _setup()
    lo, _ = _attention_spans(g)[1]
    os_ = ops(g)
    inside, layer = os_[lo].id, make_plan(g, "markers").cuts[0]  # the first layer's end, before the attention
    saved = Plan(plan_key(g), "saved", tuple(sorted([layer, Cut(inside, "inside")], key=lambda c: c.after)))
    assert run(saved) != whole  # as saved: the attention split
    monkeypatch.setattr(cut_pass, "kernels_here", lambda: True)
    with pytest.warns(ScheduleWarning, match=rf"cuts through kernels of segc's CUDA lowering; #{inside} -> #\d+"):
        assert run(saved) == whole
    with pytest.warns(ScheduleWarning):
        placed = plan_of(cut_pass.cut(g, plan=saved))
    assert placed.cuts[0].after == layer.after and len(placed.cuts) == 2
    assert placed.cuts[1].after != inside and ops(g)[lo].id < placed.cuts[1].after
