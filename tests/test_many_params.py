"""Any parameter count traces (issue: parameters went to ``mx.export_function`` as
keyword arguments, and nanobind refuses more than 1024)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import bits
from mlx.utils import tree_flatten

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

import segc
from segc.models import tiny_llama


@pytest.mark.slow
def test_a_model_with_more_than_1024_parameter_arrays() -> None:
    model = tiny_llama(hidden_size=16, intermediate_size=16, num_hidden_layers=120, vocab_size=32)
    assert len(tree_flatten(model.parameters())) > 1024
    x = mx.array([[1, 2, 3]])
    step = segc.jit(model, boundaries="layers.*")
    assert bits(step(x)) == bits(model(x))
    g = step.trace(x).graph
    names = [i.path for i in g.inputs if i.kind == "param"]
    assert names == sorted(k for k, _ in tree_flatten(model.parameters()))
