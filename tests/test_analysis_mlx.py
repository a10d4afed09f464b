"""The analyses' layout rules against MLX itself: a reshape the analysis calls a view
allocates nothing when MLX evaluates it, and one it says copies allocates its bytes."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import trace_graph

from segc.passes.analysis import liveness

pytestmark = pytest.mark.timeout(60)


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
