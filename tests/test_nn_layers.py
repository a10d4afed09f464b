"""mlx.nn layers through segc: bit-identical to eager uncut, with a boundary after every
layer (``segc.jit(model, boundaries="layers.*")``), and cut at every point of the graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import (
    assert_matches,
    assert_rules_exact,
    cut_variants,
    examples,
    record_differs,
    run_graph,
    same_bits,
    traced_with_inputs,
    with_cuts,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import segc


class Stack(nn.Module):
    """``layers`` applied in turn: ``boundaries="layers.*"`` cuts after each."""

    def __init__(self, layers: list[nn.Module], call: Callable[[nn.Module, mx.array], mx.array] | None = None):
        super().__init__()
        self.layers = layers
        self._call = call

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = self._call(layer, x) if self._call else layer(x)
        return x


def _attn(layer: nn.Module, x: mx.array) -> mx.array:
    mask = nn.MultiHeadAttention.create_additive_causal_mask(x.shape[1]).astype(x.dtype)
    return layer(x, x, x, mask=mask)


def _encoder(layer: nn.Module, x: mx.array) -> mx.array:
    return layer(x, mask=nn.MultiHeadAttention.create_additive_causal_mask(x.shape[1]).astype(x.dtype))


def _quantized() -> list[nn.Module]:
    m = Stack([nn.Linear(64, 64), nn.Linear(64, 32)])
    nn.quantize(m, group_size=32, bits=4)
    return list(m.layers)


# name -> (layers, input shape, input dtype, call)
LAYERS: dict[str, tuple[Callable[[], list[nn.Module]], tuple[int, ...], mx.Dtype, Any]] = {
    "Linear": (lambda: [nn.Linear(8, 16), nn.Linear(16, 8, bias=False)], (2, 3, 8), mx.float32, None),
    "Conv1d": (lambda: [nn.Conv1d(4, 6, 3, padding=1), nn.Conv1d(6, 4, 3, stride=2)], (2, 9, 4), mx.float32, None),
    "Conv2d": (lambda: [nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 2, stride=2)], (1, 6, 6, 3), mx.float32, None),
    "Embedding": (lambda: [nn.Embedding(50, 16)], (2, 7), mx.int32, None),
    "RMSNorm": (lambda: [nn.RMSNorm(16), nn.RMSNorm(16, eps=1e-3)], (2, 5, 16), mx.float32, None),
    "LayerNorm": (lambda: [nn.LayerNorm(16), nn.LayerNorm(16, affine=False)], (2, 5, 16), mx.float32, None),
    "RoPE": (lambda: [nn.RoPE(8), nn.RoPE(16, traditional=True, base=500.0)], (1, 2, 5, 16), mx.float32, None),
    "MultiHeadAttention": (
        lambda: [nn.MultiHeadAttention(16, 4), nn.MultiHeadAttention(16, 2)],
        (2, 5, 16),
        mx.float32,
        _attn,
    ),
    "TransformerEncoder": (
        lambda: [nn.TransformerEncoder(2, 16, 4, mlp_dims=32), nn.TransformerEncoder(1, 16, 2, norm_first=False)],
        (1, 6, 16),
        mx.float32,
        _encoder,
    ),
    "QuantizedLinear": (_quantized, (3, 64), mx.float32, None),
    "Linear bf16": (lambda: [nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)], (2, 3, 8), mx.bfloat16, None),
    "RMSNorm f16": (lambda: [nn.RMSNorm(16), nn.SiLU(), nn.RMSNorm(16)], (2, 5, 16), mx.float16, None),
}


def build(name: str, seed: int) -> tuple[Stack, mx.array]:
    make, shape, dt, call = LAYERS[name]
    mx.random.seed(seed)
    model = Stack(make(), call)
    if dt in (mx.bfloat16, mx.float16):
        model.set_dtype(dt)
    mx.eval(model.parameters())
    rng = np.random.default_rng(seed)
    x = (
        mx.array(rng.integers(0, 50, shape)).astype(dt)
        if dt == mx.int32
        else mx.array(rng.standard_normal(shape)).astype(dt)
    )
    return model, x


def sampled_cuts(n: int, k: int = 8) -> list[int]:
    """At most ``k`` single cut points, spread over the graph (all of them if fewer)."""
    return list(range(1, n)) if n - 1 <= k else sorted({int(p) for p in np.linspace(1, n - 1, k)})


def references(name: str, model: nn.Module, x: mx.array) -> tuple[mx.array, mx.array | None]:
    """Eager's output, and mx.compile's where it differs (then recorded; on the CPU it
    must not differ for these layers)."""
    want = model(x)
    compiled = mx.compile(lambda x: model(x))(x)
    mx.eval(want, compiled)
    if same_bits(want, compiled):
        return want, None
    record_differs(f"nn.{name}", segc.jit(model).trace(x).graph)
    assert mx.default_device() != mx.cpu, f"{name}: mx.compile differs from eager on the CPU"
    return want, compiled


# layers of more than about 2 s on a fresh machine (their fused CPU kernels are C++
# compiles), marked slow: `make test-fast` leaves them out
SLOW_LAYERS = {"RMSNorm", "RMSNorm f16", "LayerNorm", "RoPE", "TransformerEncoder", "Linear bf16"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_LAYERS else []) for n in LAYERS]
)
def test_layer_bit_identical(name: str) -> None:
    model, x = build(name, 0)
    want, compiled = references(name, model, x)
    uncut_want = want if compiled is None else compiled
    g, ins = traced_with_inputs(model, x)

    # uncut, and with a boundary after every layer, through the public API
    assert_matches([segc.jit(model)(x)], [uncut_want], None, f"{name} uncut")
    step = segc.jit(model, boundaries="layers.*")
    assert len(step.lower(x).segments) >= len(model.layers)  # nested "layers.N" match too
    other = None if compiled is None else [compiled]
    assert_matches([step(x)], [want], other, f"{name} per layer")

    # every single cut point (sampled in large graphs) and every point at once
    assert_rules_exact(g)
    for label, gv in cut_variants(g, sampled_cuts(len(g.eqns))):
        assert_matches(run_graph(gv, ins), [want], other, f"{name} {label}")


@pytest.mark.slow  # draws any layer, the slow ones too
@settings(max_examples=examples(5), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), name=st.sampled_from(list(LAYERS)), data=st.data())
def test_layer_random_cuts(seed: int, name: str, data: st.DataObject) -> None:
    """Random weights and inputs, random cut plans (any set of cut points)."""
    model, x = build(name, seed)
    want, compiled = references(name, model, x)
    g, ins = traced_with_inputs(model, x)
    n = len(g.eqns)
    cuts = data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=6, unique=True)) if n > 1 else []
    got = run_graph(with_cuts(g, cuts), ins)
    other = None if compiled is None else [compiled]
    assert_matches(got, [want], other, f"{name} cuts {cuts}")
