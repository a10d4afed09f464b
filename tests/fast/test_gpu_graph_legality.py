"""Cut placement on the reference llama's decode step as the H200 traced it
(``tests/data/h200_reference_decode.segc``: MLX 0.32.4's CUDA build, which keeps
``RMSNorm``, ``RoPE`` and attention whole where the CPU trace decomposes them, so segc's
CUDA kernels are found on it here too). Every legal point (segc's CUDA kernels pinned)
keeps the kernels of the uncut graph, and ``optimal``'s dynamic program gives the cost
model's figure for its plan: neither held before products that share a norm (q, k and
v) were pinned together, when ``optimal`` cut among them on every H200 run
(docs/experiments.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from segc.ir import parse
from segc.passes import make_plan
from segc.passes.analysis import ops
from segc.passes.costmodel import H200, op_costs, predict_time
from segc.passes.legalize import legal_points
from segc.passes.plan import apply_plan, plan_at

pytestmark = pytest.mark.timeout(120)

GRAPH = Path(__file__).parent.parent / "data" / "h200_reference_decode.segc"


@pytest.fixture(scope="module")
def graph():
    return parse(GRAPH.read_text())


def test_no_legal_cut_changes_segcs_kernels(graph) -> None:
    kernels = sum(op_costs(graph, H200).kernels)
    points = legal_points(graph, kernels=True)
    changed = [
        p for p in points if sum(op_costs(apply_plan(graph, plan_at(graph, "one", [p])), H200).kernels) != kernels
    ]
    assert points and changed == []


def test_no_legal_cut_among_products_that_share_a_norm(graph) -> None:
    """Read off the graph: each layer's norm, flattened, is read by its q, k and v
    products; no legal point lies between the first of them and the last."""
    os_ = ops(graph)
    readers: dict[str, list[int]] = {}
    for k, e in enumerate(os_):
        for v in e.ins:
            readers.setdefault(v, []).append(k)
    spans = []
    for e in os_:
        if e.prim == "RMSNorm":
            (flat,) = [r for r in readers[e.outs[0].name] if os_[r].prim == "Flatten"] or [None]
            prods = [r for r in readers.get(os_[flat].outs[0].name, []) if os_[r].prim == "Matmul"] if flat else []
            if len(prods) == 3:
                spans.append((prods[0], prods[-1]))
    assert len(spans) == 16  # a layer's q, k and v
    points = set(legal_points(graph, kernels=True))
    assert not [p for a, b in spans for p in range(a + 1, b + 1) if p in points]


@pytest.mark.parametrize("spec", ["optimal", "optimal:markers", "optimal:1x"])
def test_optimal_figures_are_the_cost_models(graph, spec: str) -> None:
    plan = make_plan(graph, spec, model=H200)
    want = predict_time(apply_plan(graph, plan), H200).total
    assert plan.info["predicted_s"] == pytest.approx(want, rel=1e-9)
