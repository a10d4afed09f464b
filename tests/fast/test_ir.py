"""IR tests that run no MLX: printing, parsing, verifying, deriving segments, on inline
text. (Constants round-tripping bit for bit: tests/test_ir_constants.py.)"""

from __future__ import annotations

import pytest

from segc import IRError, parse
from segc.ir import CUT, DTypeArg, Eqn, segments, to_networkx, to_text

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
