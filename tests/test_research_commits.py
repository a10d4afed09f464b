"""The cost model's commits (``segc.passes.commits``) against the runtime's own: per
segment, the commits the executor decides for random plans under every policy (on a
GPU's ``"auto"`` through the executor's decision function, on this device through
``Executor.commit_after``); and the commits a real call makes, counted by wrapping
``mx.async_eval``, against the cost model's flags and against counts worked out by hand
for each policy (docs/runtime.md, "Commits")."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import segc
from segc.ir import Graph, segments
from segc.passes.commits import COMMITS, commit_count, commit_flags
from segc.passes.costmodel import MachineModel, predict_time
from segc.passes.legalize import legal_points
from segc.passes.plan import apply_plan, plan_at
from segc.runtime import Executor
from segc.runtime.executor import _commits_after

HERE = "gpu" if mx.default_device() == mx.gpu else "cpu"


@pytest.fixture(scope="module")
def mixed() -> Graph:
    """Nine layers, every third a 1024^3 matrix product (2 * 1024^3 FLOPs), the others a
    softmax (a few MFLOP); traced, never run."""

    def f(a: mx.array, b: mx.array) -> mx.array:
        for i in range(9):
            a = segc.boundary(a @ b if i % 3 == 0 else mx.softmax(a, axis=-1))
        return a * 2

    x = mx.ones((1024, 1024))
    return segc.jit(f).lower(x, x).graph


@settings(max_examples=examples(25), deadline=None, derandomize=True)
@given(data=st.data())
def test_commit_flags_are_the_executors(mixed: Graph, data: Any) -> None:
    pts = legal_points(mixed)
    cut = apply_plan(mixed, plan_at(mixed, "random", data.draw(st.sets(st.sampled_from(pts)))))
    segs = segments(cut)
    for policy in (*COMMITS, "every:1", "every:2", "every:3"):
        want = Executor(cut, commit=policy).commit_after  # this device's resolution of "auto"
        assert commit_flags(cut, policy, HERE) == want, policy
        tp = predict_time(cut, MachineModel(device=HERE), policy)
        assert tuple(s.commit for s in tp.segments) == want and tp.commits == commit_count(want)
    # a GPU's "auto" (every segment, as a CPU's), wherever this runs
    assert commit_flags(cut, "auto", "gpu") == _commits_after(cut, segs, "segment") == (True,) * len(segs)
    assert commit_flags(cut, "geometric", "gpu") == _commits_after(cut, segs, "geometric")


@pytest.fixture(scope="module")
def model() -> Any:
    pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")
    from segc.models import tiny_llama

    return tiny_llama(num_hidden_layers=6)


def _by_hand(policy: str, n: int) -> int:
    """Commits of one call of n segments, counted from the policy's words."""
    if policy in ("segment", "auto"):
        return n
    if policy == "fences":
        return 1
    if policy.startswith("every:"):  # after the Kth, 2Kth, ...; the last commit the caller's
        k = int(policy[6:])
        return n // k + (n % k != 0)
    powers = [p for p in (1, 2, 4, 8, 16, 32) if p <= n]
    return len(powers) + (n not in powers)


@pytest.mark.parametrize("policy", ["segment", "fences", "geometric", "every:2", "every:4"])
@pytest.mark.parametrize("every", [1, 2, 3])
def test_a_call_commits_as_predicted(model: Any, policy: str, every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    step = segc.jit(model, boundaries="layers.*", strategy=f"every:{every}", commit=policy)
    mx.eval(step(x))  # traced and compiled before counting
    cut = apply_plan(step.trace(x).graph, segc.passes.make_plan(step.trace(x).graph, f"every:{every}"))
    n = len(segments(cut))
    flags = commit_flags(cut, policy, HERE)
    real = mx.async_eval
    calls: list[int] = []

    def counting(*args: Any) -> None:
        calls.append(len(args))
        real(*args)

    monkeypatch.setattr(mx, "async_eval", counting)
    mx.eval(step(x))
    assert len(calls) == sum(flags)  # the executor committed where the cost model says
    assert predict_time(cut, MachineModel(device=HERE), policy).commits == _by_hand(policy, n)
