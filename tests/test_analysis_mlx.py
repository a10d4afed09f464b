"""The analyses' layout rules against MLX itself: a reshape the analysis calls a view
allocates nothing when MLX evaluates it, and one it says copies allocates its bytes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples, trace_graph
from hypothesis import given, settings
from hypothesis import strategies as hst

from segc.passes.analysis import liveness

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 3, 2, 1), (2, 0, 1, 3)])
def test_a_reshape_after_a_transpose_copies_as_mlx_does(perm: tuple[int, ...]) -> None:
    x = mx.random.normal((1, 16, 1, 4096))
    mx.eval(x)
    y = mx.transpose(x, perm)
    mx.eval(y)
    before = mx.get_active_memory()
    z = mx.reshape(y, (1, -1))
    mx.eval(z)
    copied = mx.get_active_memory() - before >= x.nbytes

    g = trace_graph(lambda a: mx.reshape(mx.transpose(a, perm), (1, -1)), x)
    lv = liveness(g)
    out = g.outputs[0]
    assert copied == (lv.root[out] == out)  # the analysis' own buffer exactly when MLX copies
    assert copied == (perm == (0, 3, 2, 1))  # worked out by hand: only that one reorders elements


def _copies(shape: tuple[int, ...], run, trace=None) -> tuple[bool, bool]:
    """Whether MLX's evaluation of ``run`` over a buffer of ``shape`` gives its output a
    buffer of its own (its data outside the input's: a copy), and whether the analysis
    of ``trace``'s graph (``run``'s unless given) says so."""
    x = mx.zeros(shape) + 1  # (a buffer of its own: ``zeros`` alone is a broadcast scalar)
    mx.eval(x)
    start = np.asarray(x).__array_interface__["data"][0]
    y = run(x)
    mx.eval(y)
    at = np.asarray(y).__array_interface__["data"][0]
    g = trace_graph(trace or run, x)
    lv = liveness(g)
    return not start <= at < start + x.nbytes, lv.root[g.outputs[0]] != lv.root[g.inputs[0].var.name]


@pytest.mark.parametrize(
    ("shape", "views"),
    [
        # axes of size 1 between two that make one run: (2, 1, 1, 2) with strides (32, 1, 1, 16)
        ((2, 2, 16), lambda a: mx.transpose(mx.expand_dims(a, 0), (1, 0, 3, 2))[0:2, 0:1, 0:1, 0:2]),
        # a first axis of size 1 before a strided one: (1, 2) with strides (16, 2)
        ((1, 16), lambda a: a[0:1, 0:3:2]),
    ],
)
def test_a_reshape_skips_axes_of_size_one_as_mlx_does(shape, views) -> None:
    """Two views hypothesis found (2026-12-07) whose flattening MLX 0.32.4 makes a view,
    where an analysis that kept axes of size 1 in a run (MLX's several-array collapse, or
    0.32.2's first axis) said it copies: MLX's own result decides, and both stay views
    (worked out by hand: the elements are evenly spaced)."""
    copied, analysed = _copies(shape, lambda a: mx.reshape(views(a), (-1,)))
    assert not copied
    assert copied == analysed


def _view(draw, x: mx.array) -> mx.array:
    """One random view of ``x``: a slice (steps and ends included), a transpose, a
    reshape (flattened, split or merged axes), an added or dropped axis of size 1."""
    kind = draw(hst.sampled_from(["slice", "transpose", "reshape", "expand", "squeeze"]))
    if kind == "slice":
        index = []
        for n in x.shape:
            a = draw(hst.integers(0, n - 1))
            b = draw(hst.integers(a + 1, n))
            index.append(slice(a, b, draw(hst.sampled_from([1, 1, 2]))))
        return x[tuple(index)]
    if kind == "transpose":
        return mx.transpose(x, draw(hst.permutations(range(x.ndim))))
    if kind == "expand":
        return mx.expand_dims(x, draw(hst.integers(0, x.ndim)))
    if kind == "squeeze":
        ones = [i for i, n in enumerate(x.shape) if n == 1]
        return mx.squeeze(x, draw(hst.sampled_from(ones))) if ones else x
    how = draw(hst.sampled_from(["flat", "merge", "split"]))
    if how == "flat" or x.ndim < 2:
        return mx.reshape(x, (-1,))
    i = draw(hst.integers(0, x.ndim - 2))
    if how == "merge":
        return mx.reshape(x, (*x.shape[:i], x.shape[i] * x.shape[i + 1], *x.shape[i + 2 :]))
    n = x.shape[i]
    d = draw(hst.sampled_from([k for k in range(1, n + 1) if n % k == 0]))
    return mx.reshape(x, (*x.shape[:i], d, n // d, *x.shape[i + 1 :]))


@settings(max_examples=examples(80), deadline=None)
@given(
    shape=hst.lists(hst.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=4),
    data=hst.data(),
)
def test_the_analysis_copies_where_mlx_copies_over_random_views(shape, data) -> None:
    """Random chains of views ending in a reshape (``segc.passes.layout``): the output
    owns a buffer in the analysis exactly where MLX's evaluation gives it one (its data
    outside the input's buffer: a copy)."""
    steps = data.draw(hst.integers(1, 4), label="views")
    draws: list = []

    def f(a: mx.array, replay: bool = False) -> mx.array:
        k = 0

        def draw(strategy, label=None):  # the same draws for MLX's run and for the trace
            nonlocal k
            if not replay:
                draws.append(data.draw(strategy, label))
            k += 1
            return draws[k - 1]

        for _ in range(steps):
            a = _view(draw, a)
        return mx.reshape(a, (-1,))

    copied, analysed = _copies((*shape, 16), f, lambda a: f(a, replay=True))
    assert copied == analysed, (shape, draws)


def test_a_broadcast_mask_split_into_groups_is_a_view_as_in_mlx() -> None:
    """The decomposed attention's mask: a broadcast of one ``(1, C)`` row over the query
    heads, then split into KV-head groups. MLX makes the split a view (its strides
    merge the broadcast axes), and so does the analysis."""
    m = mx.array(np.arange(16)[None] < 9)
    mx.eval(m)

    def f(a: mx.array) -> mx.array:
        return mx.unflatten(mx.broadcast_to(a, (1, 4, 1, 16)), 1, (2, 2))

    u = f(m)
    mx.eval(u)
    start, at = (np.asarray(x).__array_interface__["data"][0] for x in (m, u))
    assert start <= at < start + m.nbytes  # MLX: a view
    g = trace_graph(f, m)
    lv = liveness(g)
    assert lv.root[g.outputs[0]] == g.inputs[0].var.name
