"""IR tests that need no model: printing, parsing, verifying, deriving segments."""

from __future__ import annotations

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segc import IRError, parse
from segc.ir import CUT, Const, DTypeArg, Eqn, Graph, Input, Var, segments, to_networkx, to_text, verify

TEXT = """\
graph f(%a0: f32[2,3] arg="args[0]", %p0: f32[3] param="w") {
  const %c0: f32[] = [2.0]
  %v0: f32[2,3] = Broadcast(%p0) [[2, 3]] #0
  %v1: f32[2,3] = Multiply(%a0, %v0) #1
  segc.cut() ["mid"] #2
  %v2: f32[2,3] = Broadcast(%c0) [[2, 3]] #3
  %v3: f32[2,3] = Add(%v1, %v2) #4
  %v4: i32[2,3] = AsType(%v3) [{"dtype": "i32"}] #5
  return (%v3, %v4)
}
"""


def test_parse_print_round_trip_on_inline_text() -> None:
    g = parse(TEXT)
    assert to_text(g, headers=False) == TEXT
    assert parse(to_text(g)) == g  # headers are comments to the parser
    assert g.eqns[5].args == (DTypeArg("i32"),)
    assert g.eqns[0].args == ((2, 3),)


def test_segments_are_derived_from_cuts() -> None:
    g = parse(TEXT)
    segs = segments(g)
    assert [s.name for s in segs] == ["mid", "tail"]
    assert segs[0].inputs == ("p0", "a0") and segs[0].outputs == ("v1",)
    assert segs[1].inputs == ("v1",) and segs[1].outputs == ("v3", "v4")
    text = to_text(g)
    assert "-- segment 0 'mid': 2 eqns, in 2 (36 B), out 1 (24 B)" in text
    assert "-- segment 1 'tail': 3 eqns, in 1 (24 B), out 2 (48 B)" in text


def test_consecutive_and_edge_cuts_make_no_empty_segment() -> None:
    g = parse(TEXT)
    cut = Eqn(99, CUT, (), (), ("x",))
    g2 = g.replace(eqns=(cut, *g.eqns[:2], cut.replace(id=98), *g.eqns[2:], cut.replace(id=97)))
    segs = segments(g2)
    assert [(s.name, s.start, s.stop) for s in segs] == [("x", 1, 3), ("x", 5, 8)]
    assert [len(s.eqns(g2)) for s in segs] == [2, 3]


def test_replace_returns_self_when_nothing_changes() -> None:
    g = parse(TEXT)
    assert g.replace(name="f") is g
    assert g.eqns[1].replace(prim="Multiply") is g.eqns[1]
    assert g.replace(name="h") is not g


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("Multiply(%a0, %v0)", "Multiply(%a0, %v9)"), "uses v9 before it is defined"),
        (lambda t: t.replace("%v3: f32[2,3] = Add", "%v1: f32[2,3] = Add"), "assigned twice"),
        (lambda t: t.replace("#4", "#3"), "duplicate equation id"),
        (lambda t: t.replace("return (%v3, %v4)", "return (%v7)"), "graph output v7 is never defined"),
        (lambda t: t.replace("f32[2,3] = Broadcast(%p0)", "q8[2,3] = Broadcast(%p0)"), "unknown dtype"),
        (lambda t: t.replace("#1", "# one"), "line 4"),
    ],
)
def test_verifier_and_parser_name_the_problem(edit, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(IRError, match=message):
        parse(edit(TEXT))


def test_not_a_graph() -> None:
    with pytest.raises(IRError, match="missing 'graph' header"):
        parse("")
    with pytest.raises(IRError, match="line 1: cannot parse 'hello'"):
        parse("hello\n")


def test_networkx_view_edges_carry_bytes() -> None:
    g = parse(TEXT)
    dg = to_networkx(g)
    assert dg.edges["in:a0", 1]["nbytes"] == 24
    assert dg.edges[1, 4]["var"] == "v1"
    assert dg.nodes[2]["prim"] == CUT


_DTYPES = ["f32", "f16", "bf16", "i32", "u8", "bool", "i64", "c64"]


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(_DTYPES),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_constants_round_trip_bit_exactly(dtype: str, shape: list[int], seed: int) -> None:
    from segc import dtypes

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
    assert mx.array_equal(g2.consts[0].value, value).item()


def test_large_constants_are_elided_and_say_so() -> None:
    value = mx.zeros((128, 256))
    g = Graph("k", (), (Const(Var("c0", (128, 256), "f32"), value),), (), ("c0",))
    text = to_text(g)
    assert "= elided" in text
    g2 = parse(text)
    assert g2.consts[0].value is None
    assert g2.fingerprint() == g.fingerprint()
