"""Graph constants through the IR's text form: printed and parsed back bit for bit, or
elided (large ones) with the fingerprint kept. These build and compare MLX arrays."""

from __future__ import annotations

import mlx.core as mx
from conftest import examples, same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

from segc import dtypes, parse
from segc.ir import Const, Eqn, Graph, Input, Var, to_text, verify

_DTYPES = ["f32", "f16", "bf16", "i32", "u8", "bool", "i64", "c64"]


@settings(max_examples=examples(60), deadline=None)
@given(
    dtype=st.sampled_from(_DTYPES),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_constants_round_trip_bit_exactly(dtype: str, shape: list[int], seed: int) -> None:
    mx.random.seed(seed)
    base = mx.random.normal(tuple(shape)) * 100
    if dtype == "c64":
        value = base.astype(mx.complex64)
    elif dtype == "bool":
        value = base > 0
    else:
        value = base.astype(dtypes.to_mx(dtype))
    var = Var("c0", tuple(shape), dtype)
    g = Graph(
        "k",
        (Input(Var("a0", (), "f32"), "arg", "args[0]"),),
        (Const(var, value),),
        (Eqn(0, "Abs", ("a0",), (Var("v0", (), "f32"),)),),
        ("v0", "c0"),
    )
    verify(g)
    g2 = parse(to_text(g))
    assert g2 == g
    assert same_bits(g2.consts[0].value, value)


def test_large_constants_are_elided_and_say_so() -> None:
    value = mx.zeros((128, 256))
    g = Graph("k", (), (Const(Var("c0", (128, 256), "f32"), value),), (), ("c0",))
    text = to_text(g)
    assert "= elided" in text
    g2 = parse(text)
    assert g2.consts[0].value is None
    assert g2.fingerprint() == g.fingerprint()


def test_an_empty_array_has_no_bytes_and_round_trips() -> None:
    """``to_bytes`` of an empty array is empty without asking MLX for its data (MLX
    0.32.4's CUDA build segfaults turning an empty ``mx.arange`` into numpy, docs/gpu.md),
    and ``from_bytes`` gives the shape and type back."""
    for name in ("f32", "bf16", "i32", "u32", "i64", "bool"):
        for a in (mx.zeros((0, 3), dtype=dtypes.to_mx(name)), mx.arange(0, 0, 1).astype(dtypes.to_mx(name))):
            assert dtypes.to_bytes(a) == b""
            back = dtypes.from_bytes(b"", tuple(a.shape), name)
            assert back.shape == a.shape and back.dtype == a.dtype
