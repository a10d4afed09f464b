"""Property tests: any plan from any strategy, applied to random programs and to tiny
mlx-lm models, runs with eager MLX's bits (or mx.compile's, where those differ from
eager's: ``conftest.assert_matches``); legalised plans never split a fused chain;
memory plans keep every segment within budget; applying a plan again changes nothing;
fences and windows land on the executor steps they name."""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import pytest
from conftest import (
    PROMPT8,
    assert_matches,
    assert_same_bits,
    eager_and_compiled,
    examples,
    ref_segment_peaks,
    same_bits,
    traced_with_inputs,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import segc
from segc import ScheduleError
from segc.ir import CUT, Graph, segments
from segc.passes import make_plan, run, run_pass
from segc.passes.analysis import ops
from segc.passes.fences import CutNode, Schedule, WaitNode
from segc.passes.legalize import illegal_points
from segc.passes.plan import apply_plan
from segc.runtime import Executor

SETTINGS = settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
Reference = tuple[list[mx.array], list[mx.array] | None]  # eager's outputs, mx.compile's where they differ


def cut_points(g: Graph) -> set[int]:
    pts, k = set(), 0
    for e in g.eqns:
        if e.prim == CUT:
            pts.add(k)
        elif not e.is_pseudo:
            k += 1
    return pts


@st.composite
def specs(draw: Any, g: Graph) -> Any:
    n = len(ops(g))
    kind = draw(st.sampled_from(["none", "markers", "every", "balanced", "memory", "min_boundary_bytes", "user"]))
    if kind == "every":
        return f"every:{draw(st.integers(1, 4))}"
    if kind == "balanced":
        return f"balanced:{draw(st.integers(1, 8))}"
    if kind == "memory":
        (peak,) = ref_segment_peaks(run_pass("strip_cuts", g))
        return f"memory:{int(peak * draw(st.floats(0.2, 1.2)))}"
    if kind == "user":
        ids = [e.id for e in ops(g)]
        picks = draw(st.lists(st.sampled_from(ids), max_size=min(6, n), unique=True))
        return lambda gg: picks
    return kind


def check_plan(g: Graph, spec: Any, inputs: list[mx.array], ref: Reference) -> Graph:
    try:
        plan = make_plan(g, spec)
    except ScheduleError:
        assume(False)  # memory budget below one unsplittable chain, or too few markers
    cut = run(g, [("cut", {"plan": plan})], checks=True)
    assert not (cut_points(cut) & illegal_points(run_pass("strip_cuts", cut))), "a legal plan split a fused chain"
    assert apply_plan(cut, plan) == cut, "applying a plan twice changed the graph"
    got = Executor(cut)(inputs)
    eager, compiled = ref
    if len(segments(cut)) == 1 and compiled is not None:  # one mx.compile'd segment: mx.compile's bits
        assert_same_bits(got, compiled, f"{plan.strategy}: uncut (mx.compile's bits)")
    assert_matches(got, eager, compiled, f"{plan.strategy}: segmented run")
    if isinstance(spec, str) and spec.startswith("memory:"):
        budget = int(spec.split(":")[1])
        assert all(p <= budget for p in ref_segment_peaks(cut)), f"{plan.strategy}: a segment over budget"
    if isinstance(spec, str) and spec.startswith("balanced:"):
        assert len(segments(cut)) <= int(spec.split(":")[1])
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


def check_effects(fenced: Graph, signal_after: int, wait_at: int, first: int, last: int, window: str) -> None:
    """Each executor step carries the signal, the wait and the window exactly where the
    equation positions say: the signal on the step holding ``#signal_after``, the wait
    on the one holding ``#wait_at``, the window on every step holding an equation
    between ``#first`` and ``#last`` (the window selects whole segments)."""
    pos = {e.id: p for p, e in enumerate(fenced.eqns) if not e.is_pseudo}
    steps = Executor(fenced).steps

    def holds(step: Any, eid: int) -> bool:
        return step.segment.start <= pos[eid] < step.segment.stop

    assert sum(holds(s, signal_after) for s in steps) == 1 and sum(holds(s, wait_at) for s in steps) == 1
    for k, step in enumerate(steps):
        computing = [p for p in range(step.segment.start, step.segment.stop) if not fenced.eqns[p].is_pseudo]
        in_window = any(pos[first] <= p <= pos[last] for p in computing)
        assert step.effects.signals == ((("ev", 1),) if holds(step, signal_after) else ()), f"step {k}: signals"
        assert step.effects.waits == ((("ev", 1),) if holds(step, wait_at) else ()), f"step {k}: waits"
        assert step.effects.windows == ((window,) if in_window else ()), f"step {k}: windows"


@pytest.mark.slow
@given(steps=programs, data=st.data())
# off the CPU every example compiles new kernels (NVRTC on CUDA): fewer of them there
@settings(SETTINGS, max_examples=examples(80 if mx.default_device() == mx.cpu else 20))
def test_random_programs_any_plan_bit_identical(steps: list, data: Any) -> None:
    x = mx.random.normal((4, 4), key=mx.random.key(1))
    y = mx.random.normal((4, 4), key=mx.random.key(2))
    fn = build_program(steps)
    ref = eager_and_compiled(fn, [x, y])
    g = segc.jit(fn).lower(x, y).graph
    cut = check_plan(g, data.draw(specs(g)), [x, y], ref)
    # a signal after one equation, its wait before a later one, and a window: the steps
    # carry them where the positions say, and the bits stay
    ids = [e.id for e in ops(cut)]
    assume(len(ids) >= 2)
    # the fence's cut where a cut splits no fused chain (elsewhere the fences pass moves
    # it to the chain's end, or refuses it: tests/fast/test_research_fences.py)
    bad = illegal_points(run_pass("strip_cuts", cut)) - cut_points(cut)
    legal = [k for k in range(len(ids) - 1) if k + 1 not in bad]
    assume(legal)
    i = data.draw(st.sampled_from(legal), label="signal after")
    j = data.draw(st.integers(i + 1, len(ids) - 1), label="wait before")
    lo = data.draw(st.integers(0, len(ids) - 1), label="window first")
    hi = data.draw(st.integers(lo, len(ids) - 1), label="window last")
    sched = Schedule((CutNode(ids[i], ("ev", 1)),), (WaitNode(ids[j], "ev", 1),))
    passes = [("fences", {"schedule": sched}), ("window", {"first": ids[lo], "last": ids[hi], "name": "w"})]
    fenced = run(cut, passes, checks=True)
    check_effects(fenced, ids[i], ids[j], ids[lo], ids[hi], "w")
    out = Executor(fenced)([x, y])
    # the fence cuts after ids[i], a legal point: the bits stay on every device (a cut
    # splitting a fused chain would keep them on the CPU only: on CUDA the chain's fused
    # kernel rounds differently from its two halves, FMA contraction, docs/lowering.md)
    assert_matches(out, *ref, "fenced run")


# --------------------------------------------------------------------------- mlx-lm models


@functools.cache
def lm_model(arch: str) -> Any:
    from segc.models import tiny_llama
    from segc.models.zoo import build

    if arch == "llama":
        return tiny_llama(num_hidden_layers=3)
    if arch == "llama-q4":
        return build("llama", bits=4)
    return build(arch)


@functools.cache
def lm(arch: str) -> tuple[Graph, list[mx.array], Reference]:
    """The traced graph (a cut after each layer), its inputs, and the eager reference."""
    model = lm_model(arch)
    g, inputs = traced_with_inputs(model, PROMPT8, boundaries="layers.*")
    return g, inputs, eager_and_compiled(model, [PROMPT8])


@pytest.mark.slow
@given(data=st.data())
@SETTINGS
def test_tiny_llama_any_plan_bit_identical(data: Any) -> None:
    g, inputs, ref = lm("llama")
    check_plan(g, data.draw(specs(g)), inputs, ref)


@pytest.mark.parametrize("spec", ["none", "markers", "every:1", "balanced:2", "balanced:5", "memory:150KiB"])
def test_cut_by_strategy_is_idempotent(spec: str) -> None:
    g = segc.jit(lm_model("llama"), boundaries="layers.*").trace(PROMPT8).graph  # nothing run
    once = run_pass("cut", g, strategy=spec)
    assert run_pass("cut", once, strategy=spec) == once
    assert run_pass("legalize", once) == once


def zoo() -> list[str]:
    from segc.models.zoo import ZOO

    return [a for a in ZOO if a != "llama"] + ["llama-q4"]


@pytest.mark.slow  # the model zoo: 9 architectures traced and run, 4 s together on a fresh machine
@pytest.mark.parametrize("arch", zoo())
@pytest.mark.parametrize("spec", ["every:2", "balanced:3", "memory", "min_boundary_bytes"])
def test_zoo_models_every_strategy_bit_identical(arch: str, spec: str) -> None:
    try:
        g, inputs, ref = lm(arch)
    except ImportError:
        pytest.skip(reason=f"{arch} is not available in this mlx-lm")
    if spec == "memory":  # the budget of the largest per-layer segment
        spec = f"memory:{max(ref_segment_peaks(g))}"
    check_plan(g, spec, inputs, ref)


def test_jit_strategy_hook_bit_identical_to_eager() -> None:
    from segc.models import tiny_llama

    model = tiny_llama(num_hidden_layers=2)
    want = model(PROMPT8)
    step = segc.jit(model, boundaries="layers.*", strategy="balanced:3")
    assert same_bits(step(PROMPT8), want)
    low = step.lower(PROMPT8, strategy="every:2")
    assert len(low.segments) == 2
    plan = make_plan(step.trace(PROMPT8).graph, "memory:300KiB")
    assert same_bits(step.lower(PROMPT8, strategy=plan).compile()(PROMPT8), want)
