"""A layer's rotated KV write and its attention as one kernel
(``segc.lower.cuda_kvattention``, on CUDA unless ``SEGC_FUSED_KV_ATTENTION=0``): where the replay
pairs them. On the CPU the kernel is stood in for by the references of its two parts
(``kvwrite.reference_kv_write``, ``attention.reference_attention``); the pair must be
found where the attention reads the write's buffers and rotated queries and nothing else
reads those queries, must give what the two steps give apart, byte for byte, and
eager MLX's bytes for the buffers. The CUDA kernel itself: ``tests/test_cuda_emulated.py``
(on the CPU, against the write's kernel followed by the attention's)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_env_setting, same_bits
from test_kvwrite import _eager, _layer, _values

import segc
from segc.ir import Eqn, Var
from segc.lower.attention import reference_attention
from segc.lower.kvwrite import reference_kv_write
from segc.lower.replay import replay_fn

pytestmark = pytest.mark.timeout(120)


def _attention_eqns(q: str, k: str, v: str, mask: str, avals: dict[str, Any]):
    """MLX's masked attention as the trace records it (its fallback), reading ``q``,
    ``k``, ``v`` and ``mask``: its equations (ids from 100), constants and output."""
    d = avals[q][0][3]
    c = avals[k][0][2]
    f = lambda a, b, e, m: mx.fast.scaled_dot_product_attention(a, b, e, scale=d**-0.5, mask=m)  # noqa: E731
    args = [mx.zeros(avals[x][0], dtype={"bf16": mx.bfloat16, "f32": mx.float32}[avals[x][1]]) for x in (q, k, v)]
    g = segc.jit(f).trace(*args, mx.zeros((1, c), dtype=mx.bool_)).graph
    names = dict(zip([i.var.name for i in g.inputs], (q, k, v, mask), strict=True))
    rename = lambda n: names.get(n, f"att_{n}")  # noqa: E731
    eqns = [
        Eqn(
            100 + e.id,
            e.prim,
            tuple(rename(x) for x in e.ins),
            tuple(Var(rename(o.name), o.shape, o.dtype) for o in e.outs),
            e.args,
        )
        for e in g.eqns
    ]
    consts = {rename(cv.var.name): cv.value for cv in g.consts}
    return eqns, consts, rename(g.outputs[0])


class Reference:
    """A rotated write's kernel (the reference) with ``with_attention`` (the references
    of both parts), counting the calls of each."""

    def __init__(self) -> None:
        self.writes: list[Any] = []
        self.pairs: list[Any] = []

    def __call__(self, m, ins):
        self.writes.append(m)
        return reference_kv_write(m, ins)

    def with_attention(self, m, scale, ins):
        self.pairs.append(m)
        ko, vo, qr = reference_kv_write(m, ins[:-1])
        return [ko, vo, reference_attention(qr, ko, vo, ins[-1], scale)]


def _graph(reader: bool, dt: str = "bf16", d: int = 8):
    eqns, avals, ins, _ = _layer(h=2, hq=4, c=16, d=d, dv=d, dims=d, dt=dt)
    if not reader:
        eqns = [e for e in eqns if e.prim != "Multiply"]  # the rotated queries' other reader
    att, consts, out = _attention_eqns("qr", "ko", "vo", "mask", avals)
    avals = {**avals, "mask": ((1, 16), "bool")}
    avals.update({o.name: (o.shape, o.dtype) for e in att for o in e.outs})
    avals.update(
        {n: (tuple(v.shape), {mx.bfloat16: "bf16", mx.float32: "f32"}.get(v.dtype, "?")) for n, v in consts.items()}
    )
    return [*eqns, *att], avals, [*ins, "mask"], [out, "ko", "vo", *(["qq"] if reader else [])], consts


def _run(eqns, avals, ins, outs, consts, vals, kernel):
    shapes = {n: a[0] for n, a in avals.items()}
    fn = replay_fn(eqns, ins, outs, consts, reference_attention, shapes, eqns, None, avals, kernel)
    return fn(*vals)


@pytest.mark.parametrize("dt", ["bf16", "f32"])
@pytest.mark.parametrize("offset", [0, 5, 15])
def test_the_write_and_its_attention_are_one_step_with_the_same_bytes(offset: int, dt: str) -> None:
    eqns, avals, ins, outs, consts = _graph(reader=False, dt=dt)
    vals = [*_values(avals, ins[:-1], offset), mx.array(np.arange(16)[None, :] <= offset)]
    paired = Reference()
    got = _run(eqns, avals, ins, outs, consts, vals, paired)
    assert len(paired.pairs) == 1 and not paired.writes  # one kernel for both

    class Apart(Reference):
        with_attention = None  # type: ignore[assignment]

    apart = Apart()
    want = _run(eqns, avals, ins, outs, consts, vals, apart)
    assert len(apart.writes) == 1
    assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    # and the buffers are eager MLX's bytes (the rotation and the writes as MLX runs them)
    env = dict(zip(ins, vals))
    _, ko, vo = _eager(env, 8, False, False)
    assert same_bits(got[1], ko) and same_bits(got[2], vo)
    qr = mx.fast.rope(env["q"], 8, traditional=False, base=10000.0, scale=1.0, offset=env["off"])
    att = mx.fast.scaled_dot_product_attention(qr, ko, vo, scale=8**-0.5, mask=env["mask"])
    if dt == "f32":  # (in bfloat16 MLX's attention rounds its scores, the reference does not)
        np.testing.assert_allclose(np.array(got[0]), np.array(att), atol=1e-4, rtol=1e-4)


def test_no_pair_where_the_rotated_queries_have_another_reader() -> None:
    eqns, avals, ins, outs, consts = _graph(reader=True)
    vals = [*_values(avals, ins[:-1], 3), mx.array(np.arange(16)[None, :] <= 3)]
    k = Reference()
    got = _run(eqns, avals, ins, outs, consts, vals, k)
    assert not k.pairs and len(k.writes) == 1
    env = dict(zip(ins, vals))
    qq, ko, vo = _eager(env, 8, False, False)
    assert same_bits(got[1], ko) and same_bits(got[2], vo) and same_bits(got[3], qq)


@pytest.mark.parametrize(
    ("value", "want"), [(None, True), ("1", True), ("0", False), ("", True), ("2", None), ("on", None)]
)
def test_the_write_with_attention_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch, value, want) -> None:
    """On by default (measured on the H200: docs/performance.md); ``0`` keeps two kernels;
    anything else is refused by name."""
    from segc.lower.kvwrite import kv_attention_wanted

    assert_env_setting(monkeypatch, "SEGC_FUSED_KV_ATTENTION", value, kv_attention_wanted, want)


@pytest.mark.parametrize("attention", ["caller's", "auto", "off"])
def test_a_callers_attention_kernel_is_not_taken_into_segcs_write(monkeypatch: pytest.MonkeyPatch, attention) -> None:
    """``segc.jit(..., attention=callable)``: the caller's kernel computes every layer's
    attention, so segc's rotated write must not take the attention into its own kernel
    (on CUDA by default). The CPU trace has no ``RoPE`` to match (``mx.fast.rope``
    decomposes there), so this checks what the executor hands each segment's lowering,
    with the write's kernels chosen as on a GPU; ``tests/test_fused_attention.py`` runs
    a caller's kernel on a GPU."""
    from segc.lower import kvwrite, products
    from segc.runtime import executor

    wanted = products.cuda_wanted  # the write's CUDA kernel as on a GPU, the products' as here
    monkeypatch.setattr(products, "cuda_wanted", lambda s, name: name == "FUSED_KV_WRITE" or wanted(s, name))
    handed: list[Any] = []
    segment_fn = executor.segment_fn

    def recording(*args: Any, **kw: Any) -> Any:
        handed.append(args[-1])  # the kv_write kernel
        return segment_fn(*args[:-1], None, **kw)

    monkeypatch.setattr(executor, "segment_fn", recording)
    setting = reference_attention if attention == "caller's" else attention
    f = segc.jit(lambda x: (x * 2).sum(), attention=setting)
    mx.eval(f(mx.ones((4,))))
    assert handed
    if attention == "caller's":
        assert set(handed) == {kvwrite.cuda_kv_write}
    else:  # segc's write with its attention (wrapped with the live attention's write, the default)
        own = kvwrite.cuda_kv_write_with_attention.with_attention  # type: ignore[attr-defined]
        assert all(getattr(k, "with_attention", None) is own for k in handed), handed


@pytest.mark.parametrize("reader", [False, True])
def test_memory_predicted_in_place_allocates_no_new_buffers(monkeypatch: pytest.MonkeyPatch, reader: bool) -> None:
    """``predict_memory(copied_writes=True)`` for a write paired with its attention
    (bfloat16 buffers of 2 heads x 16 positions x 64: 4 KiB each): with
    ``SEGC_KV_IN_PLACE=1`` the new buffers are the old ones, 8 KiB fewer activations;
    where the old key buffer has another reader the kernel copies, so nothing changes."""
    from segc.ir import Graph, Input, Var
    from segc.ir.nodes import Const
    from segc.passes.memory import predict_memory

    eqns, avals, ins, outs, consts = _graph(reader=False, d=64)
    if reader:  # the old keys read again: not alone
        eqns.append(Eqn(999, "Multiply", ("kb", "kb"), (Var("kk", avals["kb"][0], "bf16"),)))
        outs.append("kk")
    kinds = {"kb": "state", "vb": "state", "off": "state"}
    inputs = tuple(Input(Var(n, *avals[n]), kinds.get(n, "arg"), n) for n in ins)
    g = Graph("kv", inputs, tuple(Const(Var(n, *avals[n]), v) for n, v in consts.items()), tuple(eqns), tuple(outs))
    got = {}
    for value in ("0", "1"):
        monkeypatch.setenv("SEGC_KV_IN_PLACE", value)
        got[value] = predict_memory(g, copied_writes=True).activations
    assert got["0"] - got["1"] == (0 if reader else 2 * 2 * 16 * 64 * 2), got
