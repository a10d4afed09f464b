"""Property tests: any plan from any strategy, applied to random programs and to tiny
mlx-lm models, runs bit-identical to the unsegmented graph; legalised plans never split
a fused chain; applying a plan again changes nothing."""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten

import segc
from segc import ScheduleError
from segc.ir import CUT, EFFECTS, Graph
from segc.passes import make_plan, run, run_pass
from segc.passes.analysis import analyze, ops
from segc.passes.fences import CutNode, Schedule, WaitNode
from segc.passes.legalize import illegal_points
from segc.passes.plan import apply_plan
from segc.runtime.executor import Executor

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def cut_points(g: Graph) -> set[int]:
    pts, k = set(), 0
    for e in g.eqns:
        if e.prim == CUT:
            pts.add(k)
        elif not e.is_pseudo:
            k += 1
    return pts


def same_bits(a: list[mx.array], b: list[mx.array]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and mx.array_equal(x, y, equal_nan=True).item() for x, y in zip(a, b)
    )


@st.composite
def specs(draw: Any, g: Graph) -> Any:
    n = len(ops(g))
    kind = draw(st.sampled_from(["none", "markers", "every", "balanced", "memory", "min_boundary_bytes", "user"]))
    if kind == "every":
        return f"every:{draw(st.integers(1, 4))}"
    if kind == "balanced":
        return f"balanced:{draw(st.integers(1, 8))}"
    if kind == "memory":
        peak = analyze(run_pass("strip_cuts", g)).peak_live
        return f"memory:{int(peak * draw(st.floats(0.2, 1.2)))}"
    if kind == "user":
        ids = [e.id for e in ops(g)]
        picks = draw(st.lists(st.sampled_from(ids), max_size=min(6, n), unique=True))
        return lambda gg: picks
    return kind


def check_plan(g: Graph, spec: Any, inputs: list[mx.array], ref: list[mx.array]) -> Graph:
    try:
        plan = make_plan(g, spec)
    except ScheduleError:
        assume(False)  # memory budget below one unsplittable chain, or too few markers
    cut = run(g, [("cut", {"plan": plan})], checks=True)
    assert not (cut_points(cut) & illegal_points(run_pass("strip_cuts", cut))), "a legal plan split a fused chain"
    assert apply_plan(cut, plan) == cut, "applying a plan twice changed the graph"
    assert same_bits(Executor(cut)(inputs), ref), f"{plan.strategy}: segmented run differs"
    stats = analyze(cut)
    if isinstance(spec, str) and spec.startswith("memory:"):
        assert stats.max_segment_peak <= int(spec.split(":")[1])
    if isinstance(spec, str) and spec.startswith("balanced:"):
        assert len(stats.segments) <= int(spec.split(":")[1])
    return cut


# --------------------------------------------------------------------------- random programs

UNARY = [mx.exp, mx.sin, mx.tanh, mx.abs, mx.square, mx.negative, mx.sigmoid]
BINARY = [mx.add, mx.multiply, mx.subtract, mx.maximum]


def build_program(steps: list[tuple[str, int, int, int]]) -> Any:
    def fn(x: mx.array, y: mx.array) -> mx.array:
        vals = [x, y]
        for k, (op, i, j, f) in enumerate(steps):
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if op == "unary":
                v = UNARY[f % len(UNARY)](a)
            elif op == "binary":
                v = BINARY[f % len(BINARY)](a, b)
            elif op == "matmul":
                v = (a @ b) * 0.125
            elif op == "reduce":
                v = a - mx.max(a, axis=-1, keepdims=True)
            elif op == "softmax":
                v = mx.softmax(a, axis=-1)
            elif op == "where":
                v = mx.where(a > b, a, b * 0.5)
            else:
                v = segc.boundary(a, f"m{k}")
            vals.append(v)
        return vals[-1] + vals[len(vals) // 2]

    return fn


programs = st.lists(
    st.tuples(
        st.sampled_from(["unary", "binary", "matmul", "reduce", "softmax", "where", "marker", "marker"]),
        st.integers(0, 50),
        st.integers(0, 50),
        st.integers(0, 10),
    ),
    min_size=2,
    max_size=24,
)


@given(steps=programs, data=st.data())
@settings(SETTINGS, max_examples=80)
def test_random_programs_any_plan_bit_identical(steps: list, data: Any) -> None:
    x = mx.random.normal((4, 4), key=mx.random.key(1))
    y = mx.random.normal((4, 4), key=mx.random.key(2))
    g = segc.jit(build_program(steps)).lower(x, y).graph
    ref = Executor(run_pass("strip_cuts", g))([x, y])
    cut = check_plan(g, data.draw(specs(g)), [x, y], ref)
    # fences and a window after the cuts leave the bits alone too
    ids = [e.id for e in ops(cut)]
    assume(len(ids) >= 2)
    sched = Schedule((CutNode(ids[0], ("ev", 1)),), (WaitNode(ids[-1], "ev", 1),))
    fenced = run(cut, [("fences", {"schedule": sched}), ("window", {"first": ids[0], "last": ids[-1]})], checks=True)
    out = Executor(fenced)([x, y])
    plain = fenced.replace(eqns=tuple(e for e in fenced.eqns if e.prim not in EFFECTS))
    assert same_bits(out, Executor(plain)([x, y])), "the fence and window ops changed the bits"
    # the fence cuts after ids[0] wherever that is: a legal point keeps the uncut bits on
    # every device; one that splits a fused chain keeps them on the CPU, while on CUDA the
    # chain's fused kernel rounds differently from its two halves (FMA contraction,
    # docs/lowering.md), the reason plans are legalised
    if mx.default_device() == mx.cpu or not cut_points(fenced) & illegal_points(run_pass("strip_cuts", fenced)):
        assert same_bits(out, ref)


# --------------------------------------------------------------------------- mlx-lm models


@functools.cache
def lm(arch: str) -> tuple[Graph, list[mx.array], list[mx.array]]:
    from segc.models import tiny_llama
    from segc.models.zoo import build

    if arch == "llama":
        model = tiny_llama(num_hidden_layers=3)
    elif arch == "llama-q4":
        model = build("llama", bits=4)
    else:
        model = build(arch)
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=mx.int32)
    g = segc.jit(model, boundaries="layers.*").lower(x).graph
    params = dict(tree_flatten(model.parameters()))
    inputs = [x] + [params[i.path] for i in g.inputs if i.kind == "param"]
    ref = Executor(run_pass("strip_cuts", g))(inputs)
    assert same_bits(ref, [model(x)]), "the unsegmented graph differs from eager"
    return g, inputs, ref


@given(data=st.data())
@SETTINGS
def test_tiny_llama_any_plan_bit_identical(data: Any) -> None:
    g, inputs, ref = lm("llama")
    check_plan(g, data.draw(specs(g)), inputs, ref)


@pytest.mark.parametrize("spec", ["none", "markers", "every:1", "balanced:2", "balanced:5", "memory:150KiB"])
def test_cut_by_strategy_is_idempotent(spec: str) -> None:
    g, _, _ = lm("llama")
    once = run_pass("cut", g, strategy=spec)
    assert run_pass("cut", once, strategy=spec) == once
    assert run_pass("legalize", once) == once


def zoo() -> list[str]:
    from segc.models.zoo import ZOO

    return [a for a in ZOO if a != "llama"] + ["llama-q4"]


@pytest.mark.parametrize("arch", zoo())
@pytest.mark.parametrize("spec", ["every:2", "balanced:3", "memory", "min_boundary_bytes"])
def test_zoo_models_every_strategy_bit_identical(arch: str, spec: str) -> None:
    try:
        g, inputs, ref = lm(arch)
    except ImportError:
        pytest.skip(reason=f"{arch} is not available in this mlx-lm")
    if spec == "memory":  # the budget of the largest per-layer segment
        spec = f"memory:{analyze(g).max_segment_peak}"
    check_plan(g, spec, inputs, ref)


def test_jit_strategy_hook_bit_identical_to_eager() -> None:
    from segc.models import tiny_llama

    model = tiny_llama(num_hidden_layers=2)
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=mx.int32)
    want = model(x)
    step = segc.jit(model, boundaries="layers.*", strategy="balanced:3")
    assert same_bits([step(x)], [want])
    low = step.lower(x, strategy="every:2")
    assert len(low.segments) == 2
    plan = make_plan(step.trace(x).graph, "memory:300KiB")
    assert same_bits([step.lower(x, strategy=plan).compile()(x)], [want])
