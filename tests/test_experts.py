"""A prefill's sorted expert products as every token's products (``segc.lower.experts``):
which products it takes, its device check, and its wiring through lowering.

The CPU's ``gather_mm`` takes float32 only, and at these sizes its sums agree with its
batched product's, so the rewrite is forced on (the setting is ``"auto"`` on CUDA only)
with the CPU's own check deciding, and segc's prefill is compared with eager mlx-lm's
bytes. Every test runs on the CPU, also on a machine with a GPU (whose float32 products
use TF32, so its check refuses float32): ``tests/test_experts_cuda.py`` does the same in
bf16 on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import assert_same_bits, expert_rewrites, trace_graph
from hypothesis import given, settings
from hypothesis import strategies as hst

import segc
from segc.errors import UsageError
from segc.lower import experts
from segc.models.zoo import build

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _on_the_cpu() -> Iterator[None]:
    was = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        yield
    finally:
        mx.set_default_device(was)


def mixtral(n_experts: int = 8, top: int = 2, layers: int = 2, dt: mx.Dtype = mx.float32) -> nn.Module:
    return build(
        "mixtral",
        seed=0,
        dtype=dt,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        num_hidden_layers=layers,
        vocab_size=100,
        num_local_experts=n_experts,
        num_experts_per_tok=top,
    )


def prompt(tokens: int) -> mx.array:
    return mx.array([[(7 * i + 3) % 97 for i in range(tokens)]], dtype=mx.int32)


def found(model: nn.Module, tokens: int) -> tuple[dict[int, experts.Rewrite], set[int], segc.Graph]:
    g = segc.jit(model).trace(prompt(tokens)).graph
    av = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    rewrites, lifts = experts.find(g.eqns, g.outputs, av)
    return rewrites, lifts, g


def test_each_layer_has_two_leaves_and_a_down_product(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experts, "same_bits", lambda key: True)
    rewrites, lifts, g = found(mixtral(), 40)
    kinds = [w.kind for _, w in sorted(rewrites.items())]
    assert kinds == ["leaf", "leaf", "down"] * 2, kinds
    by_id = {e.id: e for e in g.eqns}
    assert sorted(by_id[i].prim for i in lifts) == ["Multiply"] * 4 + ["Sigmoid"] * 2  # SwiGLU, each layer
    for i, w in rewrites.items():
        e = by_id[i]
        assert e.prim == "GatherMM" and w.outs[0] == e.outs[0].name
        assert w.ins[3] == e.ins[1] and w.ins[1] == e.ins[3]  # the weight's transpose, the sorted experts
    srcs = {w.ins[0] for w in rewrites.values() if w.kind == "leaf"}
    assert all(g.vars()[s].shape == (40, 1, 64) for s in srcs)  # every token once


def test_what_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experts, "same_bits", lambda key: True)
    assert found(mixtral(), 20)[0] == {}  # 40 slots: mlx-lm does not sort them
    assert found(mixtral(n_experts=16), 40)[0] == {}  # 16 experts, 2 a token: 8 times the work
    assert {w.kind for w in found(mixtral(n_experts=8, top=2), 40)[0].values()} == {"leaf", "down"}
    monkeypatch.setattr(experts, "MAX_BYTES", 8 * 40 * 128 * 4 - 1)  # the gate's (E, T, N) too big
    assert found(mixtral(), 40)[0] == {}
    monkeypatch.setattr(experts, "same_bits", lambda key: key[0] == "leaf")  # the down refused
    monkeypatch.setattr(experts, "MAX_BYTES", 1 << 30)
    rewrites, lifts, _ = found(mixtral(), 40)
    assert {w.kind for w in rewrites.values()} == {"leaf"} and lifts == set()


def test_an_activation_with_a_constant_keeps_the_down_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain reading anything but the leaves (here a scalar) is not lifted."""
    monkeypatch.setattr(experts, "same_bits", lambda key: True)
    model = mixtral(layers=1)
    for layer in model.model.layers:
        layer.block_sparse_moe.switch_mlp.activation = lambda x, gate: nn.gelu_approx(gate) * x
    rewrites, lifts, _ = found(model, 40)
    assert [w.kind for w in rewrites.values()] == ["leaf", "leaf"] and lifts == set()


def _halves(x: mx.array, idx: mx.array, tok: mx.array, ws, quant, shape) -> mx.array:
    """The leaf's product with its inner dimension summed in two halves: another order."""
    rows, bt = x[tok], ws[0]
    h = rows.shape[-1] // 2
    lo = mx.gather_mm(rows[..., :h], bt[:, :h], rhs_indices=idx, sorted_indices=True)
    hi = mx.gather_mm(rows[..., h:], bt[:, h:], rhs_indices=idx, sorted_indices=True)
    return (lo.astype(mx.float32) + hi.astype(mx.float32)).astype(rows.dtype)


def test_the_check_tells_another_summation_order() -> None:
    key = ("leaf", 8, 64, 256, 32, 2, "f32", 0, 0)
    assert experts.agree(key, lambda x, idx, tok, ws, q, shape: mx.gather_mm(x[tok], ws[0], rhs_indices=idx))
    assert not experts.agree(key, _halves)
    wrong = experts.agree(key, lambda x, idx, tok, ws, q, shape: experts.leaf(x, idx, 0 * tok, ws, q, shape)[0])
    assert not wrong  # rows picked from the wrong token


def test_the_setting_is_checked_by_name() -> None:
    with pytest.raises(UsageError, match="DENSE_EXPERTS"):
        experts.wanted("sometimes")
    assert experts.wanted("never") is False
    if not mx.cuda.is_available():
        assert experts.wanted("auto") is False


@settings(max_examples=6, deadline=None)
@given(
    tokens=hst.sampled_from([32, 40, 77]),
    n_experts=hst.sampled_from([4, 8]),
    top=hst.sampled_from([1, 2]),
    boundaries=hst.sampled_from([None, "layers.*"]),
)
def test_forced_a_prefill_keeps_eagers_bytes(tokens: int, n_experts: int, top: int, boundaries: str | None) -> None:
    """Forced on, segc's prefill gives eager mlx-lm's bytes wherever the CPU's check lets
    the rewrite through; it is let through at least at the first size."""
    model = mixtral(n_experts, top)
    with expert_rewrites(force=True) as taken:
        got = segc.jit(model, boundaries=boundaries)(prompt(tokens))
    want = model(prompt(tokens))
    assert_same_bits([got], [want], f"{tokens} tokens, {n_experts} experts, {top} a token, {boundaries}")
    sorted_ = tokens * top >= 64 and n_experts <= experts.MAX_WORK * top
    key = ("leaf", n_experts, tokens, 64, 128, top, "f32", 0, 0)
    assert ("leaf" in taken) == (sorted_ and experts.same_bits(key)), (taken, sorted_)


def test_the_cpus_check_lets_the_first_size_through() -> None:
    """Without this the forced test above would compare eager with itself only."""
    assert experts.same_bits(("leaf", 8, 40, 64, 128, 2, "f32", 0, 0))
    assert experts.same_bits(("down", 8, 40, 128, 64, 2, "f32", 0, 0))


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_moe", "mixtral:4", "mixtral:8"])
def test_other_moe_architectures_keep_eagers_bytes(arch: str) -> None:
    """mlx-lm's other ``SwitchGLU`` users (deepseek_v3 with its shared experts and first
    dense layer, qwen3_moe) and a quantized mixtral (``gather_qmm``, 4 and 8 bits), forced
    on: eager's bytes with their products rewritten."""
    name, _, bits = arch.partition(":")
    quant = {"bits": int(bits), "group_size": 64} if bits else {}
    model = build(name, seed=0, dtype=mx.float32, num_hidden_layers=2, **quant)
    with expert_rewrites(force=True) as taken:
        got = segc.jit(model, boundaries="layers.*")(prompt(48))
    assert_same_bits([got], [model(prompt(48))], arch)
    assert "leaf" in taken and "down" in taken, taken


def test_rows_made_as_a_view_keep_mlxs_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLX 0.32's CUDA grouped GEMM steps between rows by the middle axis's stride, so
    rows made as a view (``x[tok][:, None, :]``) get other sums there than mlx-lm's rows
    (a gather's own array): only mlx-lm's form is rewritten, so segc keeps eager's bytes
    either way."""
    monkeypatch.setattr(experts, "same_bits", lambda key: True)
    r = 64
    tok = mx.array([i // 2 for i in range(r)], dtype=mx.uint32)
    idx = mx.sort(mx.array([(5 * i) % 8 for i in range(r)], dtype=mx.uint32))
    w = mx.random.normal((8, 32, 16), key=mx.random.key(0))

    def product(x: mx.array, view: bool) -> mx.array:
        rows = x[tok][:, None, :] if view else x[:, None, :][tok]
        return mx.gather_mm(rows, w.swapaxes(-1, -2), rhs_indices=idx, sorted_indices=True)

    for view, taken in ((False, 1), (True, 0)):
        g = trace_graph(lambda x, view=view: product(x, view), mx.random.normal((32, 16), key=mx.random.key(1)))
        av = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
        rewrites, _ = experts.find(g.eqns, g.outputs, av)
        assert len(rewrites) == taken, (view, rewrites)
