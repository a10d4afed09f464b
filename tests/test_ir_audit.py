"""The IR and pass API's edges an audit found: float ranges (bf16's NumPy holder is u16),
constants whose NaNs carry a sign or payload, names and paths of any text, passes that
misbehave, elided constants, hand-built graphs the text cannot hold, plans with bad ids."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_same_bits, bits, eager_or_skip, examples, same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

import segc
from segc import IRError, ScheduleError, SegcError, dtypes, parse
from segc.ir import CUT, Const, Eqn, Graph, Input, Var, to_text, verify
from segc.passes import Step, registry, run, run_pass
from segc.passes.plan import Plan
from segc.runtime import Executor

FLOAT_DTYPES = [mx.float16, mx.bfloat16, mx.float32, mx.float64]
INT_DTYPES = [mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16, mx.uint32, mx.uint64]


# ------------------------------------------------------------------ 1. ranges


def _range_fn(start: float, stop: float, step: float, dt: mx.Dtype) -> Any:
    def f(x: mx.array) -> tuple[mx.array, mx.array]:
        r = mx.arange(start, stop, step, dtype=dt)
        return r, x + 0

    return f


def _check_range(start: float, stop: float, step: float, dt: mx.Dtype) -> None:
    f = _range_fn(start, stop, step, dt)
    x = mx.zeros((1,))
    want = eager_or_skip(f, [x])
    got = segc.jit(f)(x)
    assert_same_bits(list(got), want, f"arange({start}, {stop}, {step}, {dt})")


@pytest.mark.parametrize("dt", FLOAT_DTYPES + INT_DTYPES, ids=str)
@settings(max_examples=examples(8), deadline=None)
@given(
    start=st.integers(-300, 300),
    n=st.integers(0, 400),
    step=st.sampled_from([1, 2, 3, -1, -5, 0.5, 0.1, 1.5, -0.25]),
)
def test_ranges_in_jit_are_eagers_bits_for_every_dtype(dt: mx.Dtype, start: int, n: int, step: float) -> None:
    if mx.issubdtype(dt, mx.integer) and not float(step).is_integer():
        step = int(math.copysign(1, step))
    _check_range(start, start + n * step, step, dt)


@pytest.mark.parametrize("dt", FLOAT_DTYPES + INT_DTYPES, ids=str)
@pytest.mark.parametrize(("start", "stop", "step"), [(0, 300, 1), (-3, 7, 2), (250, 270, 1), (0.5, 9.5, 1.5)])
def test_ranges_known_cases(dt: mx.Dtype, start: float, stop: float, step: float) -> None:
    _check_range(start, stop, step, dt)


def test_bf16_range_rounds_as_bf16_does() -> None:
    # 257 is not a bf16 value (bf16 keeps 8 significant bits): MLX's kernel gives 256
    # there, where a u16 range (the old host constant) gave 257
    r = segc.jit(lambda x: mx.arange(300, dtype=mx.bfloat16) + x)(mx.zeros((1,), mx.bfloat16))
    assert r.dtype == mx.bfloat16
    assert r[255].item() == 255.0 and r[257].item() == 256.0


def test_a_parsed_bf16_range_runs() -> None:
    text = """graph f(%a0: bf16[4] arg="args[0]") {
  %v0: bf16[4] = Arange() [0.0, 4.0, 1.0] #0
  %v1: bf16[4] = Add(%a0, %v0) #1
  return (%v1)
}"""
    x = mx.ones((4,), mx.bfloat16)
    (out,) = Executor(parse(text))([x])
    want = np.array([0x3F80, 0x4000, 0x4040, 0x4080], np.uint16).tobytes()  # bf16 1.0, 2.0, 3.0, 4.0
    assert bits(out) == ((4,), "bf16", want)


# ------------------------------------------------------------------ 2. constants

_WIDTH = {"f32": 32, "f16": 16, "bf16": 16}
_SPECIAL = {
    "f32": [
        0x7FC00000,
        0xFFC00000,
        0x7FC00001,
        0x7F800001,
        0xFFFFFFFF,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x1,
        0x807FFFFF,
    ],
    "f16": [0x7E00, 0xFE00, 0x7D00, 0x7C01, 0xFFFF, 0x8000, 0x7C00, 0xFC00, 0x1, 0x83FF],
    "bf16": [0x7FC0, 0xFFC0, 0x7FC1, 0x7F81, 0xFFFF, 0x8000, 0x7F80, 0xFF80, 0x1, 0x807F],
}


def _const_of(name: str, raw: list[int]) -> mx.array:
    u = np.array(raw, dtype=np.uint32 if _WIDTH[name] == 32 else np.uint16)
    if name == "bf16":
        return mx.array(u).view(mx.bfloat16)
    return mx.array(u.view(dtypes.np_dtype(name)))


def _add_graph(value: mx.array, name: str) -> Graph:
    n = value.shape
    return Graph(
        "k",
        (Input(Var("a0", n, name), "arg", "args[0]"),),
        (Const(Var("c0", n, name), value),),
        (Eqn(0, "Add", ("a0", "c0"), (Var("v0", n, name),)),),
        ("v0", "c0"),
    )


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), name=st.sampled_from(["f32", "f16", "bf16"]), size=st.integers(1, 16))
def test_small_float_constants_print_losslessly(data: st.DataObject, name: str, size: int) -> None:
    word = st.one_of(st.sampled_from(_SPECIAL[name]), st.integers(0, 2 ** _WIDTH[name] - 1))
    raw = data.draw(st.lists(word, min_size=size, max_size=size))
    value = _const_of(name, raw)
    g = verify(_add_graph(value, name))
    g2 = parse(to_text(g))
    assert g2 == g and g2.fingerprint() == g.fingerprint()
    assert same_bits(g2.consts[0].value, value)
    x = mx.ones((size,), dtypes.to_mx(name))
    assert_same_bits(Executor(g2)([x]), [x + value, value], "parsed")


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_nan_sign_and_payload_change_the_fingerprint(name: str) -> None:
    canon, neg, payload = _SPECIAL[name][:3]
    prints = {_add_graph(_const_of(name, [w]), name).fingerprint() for w in (canon, neg, payload)}
    assert len(prints) == 3
    zero, minus_zero = _add_graph(_const_of(name, [0]), name), _add_graph(_const_of(name, [_SPECIAL[name][5]]), name)
    assert zero.fingerprint() != minus_zero.fingerprint()
    assert parse(to_text(minus_zero)) == minus_zero


def test_a_traced_nan_constant_runs_from_text_to_eagers_bits() -> None:
    c = _const_of("f32", [0xFFC00000])

    def f(x: mx.array) -> mx.array:
        return x + c

    x = mx.ones((1,))
    g = segc.jit(f).trace(x).graph
    assert_same_bits(Executor(parse(g.as_text()))([x]), [f(x)], "negative NaN")


def test_ordinary_small_constants_still_print_as_values() -> None:
    g = _add_graph(mx.array([1.5, -0.0, float("inf")]), "f32")
    assert "= [1.5, -0.0, Infinity]" in to_text(g)


# ------------------------------------------------------------------ 3. names and paths

KEYS = st.text(min_size=1, max_size=12)


@settings(max_examples=examples(25), deadline=None)
@given(key=KEYS, n=st.sampled_from([1, 5]))
def test_traced_dict_keys_print_and_parse_back(key: str, n: int) -> None:
    d = {key: mx.ones((2,)), **{f"k{i}": mx.ones((2,)) for i in range(n - 1)}}
    g = segc.jit(lambda d: sum(v * 2 for v in d.values())).trace(d).graph
    assert parse(g.as_text()) == g


@settings(max_examples=examples(100), deadline=None)
@given(
    name=st.text(max_size=10),
    paths=st.lists(st.text(max_size=10), min_size=0, max_size=6),
    cut=st.text(max_size=10),
)
def test_any_graph_name_path_and_cut_name_round_trips(name: str, paths: list[str], cut: str) -> None:
    ins = tuple(Input(Var(f"a{k}", (2,), "f32"), "arg", p) for k, p in enumerate(paths))
    eqns = (Eqn(0, "Abs", ("c0",), (Var("v0", (2,), "f32"),)), Eqn(1, CUT, (), (), (cut,)))
    g = Graph(name, ins, (Const(Var("c0", (2,), "f32"), mx.zeros((2,))),), eqns, ("v0",))
    g2 = parse(to_text(verify(g)))
    assert g2 == g and (g2.name, [i.path for i in g2.inputs]) == (name, paths)


def test_plain_graph_names_print_bare_and_others_quoted() -> None:
    def head(name: str) -> str:
        return to_text(Graph(name, (), (), (), ())).splitlines()[0]

    assert head("f") == "graph f() {" and head("<lambda>") == "graph <lambda>() {"
    assert head("f(x)") == 'graph "f(x)"() {' and head("a b") == 'graph "a b"() {'


# ------------------------------------------------------------------ 4. passes


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A private copy of the registry, so that test passes do not leak."""
    table = dict(registry.PASSES)
    monkeypatch.setattr(registry, "PASSES", table)
    return table


def _g() -> Graph:
    return segc.jit(lambda x: mx.exp(x) + 1).trace(mx.ones((4,))).graph


def test_a_pass_returning_no_graph_is_named(passes: dict[str, Any]) -> None:
    registry.register("forgot_return")(lambda g: None)
    registry.register("text_return")(lambda g: g.as_text())
    g = _g()
    with pytest.raises(IRError, match="pass 'forgot_return' returned NoneType, not a Graph"):
        run_pass("forgot_return", g)
    for checks in (True, False):
        with pytest.raises(IRError, match="pass 'text_return' returned str"):
            run(g, ["text_return", "cut"], checks=checks)


def test_pass_options_are_checked(passes: dict[str, Any]) -> None:
    g = _g()
    with pytest.raises(ScheduleError, match=r"pass 'cut' has no option 'stratgy'; its options: strategy, plan"):
        run(g, [Step("cut", {"stratgy": "none"})])
    registry.register("needs_k")(lambda g, *, k: g)
    with pytest.raises(ScheduleError, match=r"pass 'needs_k'.*'k'"):
        run_pass("needs_k", g)
    assert run_pass("needs_k", g, k=1) is g


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([42], "step 1: expected a pass name, a Step or a"),
        ([("cut",)], r"step 1: .*\('cut',\)"),
        (["cut", ("cut", [1])], "Step 'cut': options must be a dict"),
        ("cut", "steps must be a list"),
    ],
)
def test_malformed_steps_are_refused(steps: Any, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        run(_g(), steps)


def test_steps_are_checked_when_made() -> None:
    with pytest.raises(ScheduleError, match="a pass name"):
        Step(3)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="options must be a dict"):
        Step("cut", "none")  # type: ignore[arg-type]


def test_errors_inside_a_pass_carry_its_name(passes: dict[str, Any]) -> None:
    def boom(g: Graph) -> Graph:
        raise ValueError("boom in my pass")

    def refuses(g: Graph) -> Graph:
        raise IRError("bad graph")

    registry.register("boom")(boom)
    registry.register("refuses")(refuses)
    with pytest.raises(ScheduleError, match="pass 'boom' failed: ValueError: boom in my pass") as info:
        run(_g(), ["boom"])
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(IRError) as info2:
        run(_g(), ["refuses"])
    assert type(info2.value) is IRError and str(info2.value) == "bad graph"  # type and message kept
    assert info2.value.pass_name == "refuses"  # type: ignore[attr-defined]
    assert "in pass 'refuses'" in info2.value.__notes__


def test_a_warning_raised_as_an_error_inside_a_pass_stays_a_warning(passes: dict[str, Any]) -> None:
    def warns(g: Graph) -> Graph:
        raise segc.ScheduleWarning("moved a cut")

    registry.register("warns")(warns)
    with pytest.raises(segc.ScheduleWarning, match="moved a cut"):
        run(_g(), ["warns"])


def test_registering_a_name_twice_is_a_segc_error(passes: dict[str, Any]) -> None:
    with pytest.raises(ScheduleError, match="pass 'cut' registered twice") as info:
        registry.register("cut")(lambda g: g)
    assert not isinstance(info.value, ValueError) and isinstance(info.value, SegcError)


def test_run_refuses_a_non_graph() -> None:
    with pytest.raises(IRError, match="expected a segc Graph, got str"):
        run("text", ["cut"])  # type: ignore[arg-type]
    with pytest.raises(IRError, match="pass 'cut': expected a segc Graph, got NoneType"):
        run_pass("cut", None)  # type: ignore[arg-type]


# ------------------------------------------------------------------ 5. elided constants


def test_an_elided_constant_is_refused_when_the_executor_is_built() -> None:
    big = mx.array(np.arange(20000, dtype=np.float32))
    g = segc.jit(lambda x: x + big).trace(mx.ones((20000,))).graph
    g2 = parse(g.as_text())
    assert g2.consts[0].value is None and g2.fingerprint() == g.fingerprint()
    with pytest.raises(IRError, match=r"constant %c0 was elided"):
        Executor(g2)


# ------------------------------------------------------------------ polish

A = Input(Var("a0", (4,), "f32"), "arg", "args[0]")
V0 = Var("v0", (4,), "f32")
EXP = Eqn(0, "Exp", ("a0",), (V0,))


def _hand(eqns: Any = (EXP,), inputs: Any = (A,), consts: Any = (), name: Any = "hand") -> Graph:
    return Graph(name, tuple(inputs), tuple(consts), tuple(eqns), ("v0",))


@pytest.mark.parametrize(
    ("g", "message"),
    [
        (_hand([EXP.replace(id=-1)]), "id must be an int >= 0, got -1"),
        (_hand([EXP.replace(id="0")]), "id must be an int >= 0, got '0'"),
        (_hand([EXP.replace(id=True)]), "id must be an int >= 0, got True"),
        (_hand([EXP.replace(outs=(Var("v0", (True,), "f32"),))]), r"bad shape \(True,\)"),
        (_hand([Eqn(0, "Exp", ("a0",), (Var("v0", (4.0,), "f32"),))]), r"bad shape \(4.0,\)"),
        (_hand([EXP.replace(outs=(Var("v0", [4], "f32"),))]), r"bad shape \[4\]"),
        (_hand(inputs=(Input(A.var, "weird", "x"),)), "unknown kind 'weird'; kinds: arg, param, state"),
        (_hand(inputs=(Input(A.var, "arg", 3),)), "string path"),
        (_hand([EXP, Eqn(1, CUT, ("v0",), (), ("c",))]), "pseudo-equation reads and defines nothing"),
        (_hand([EXP, Eqn(1, CUT, (), (), (7,))]), "segc.cut takes one argument"),
        (_hand([EXP, Eqn(1, CUT, (), (), ("a", "b"))]), "segc.cut takes one argument"),
        (_hand([EXP, Eqn(1, CUT, (), (), ())]), "segc.cut takes one argument"),
        (_hand([EXP.replace(outs=("v0",))]), "outputs must be a tuple of Var"),
        (_hand([EXP.replace(ins="a0")]), "inputs must be a tuple of value names"),
        (_hand([EXP.replace(prim="Exp(x)")]), "bad primitive name"),
        (_hand([EXP.replace(outs=(Var("v 0", (4,), "f32"),))]), "bad value name 'v 0'"),
        (_hand(name=None), "the graph's name must be a string"),
        (
            _hand([Eqn(0, "Add", ("a0", "c0"), (V0,))], consts=(Const(Var("c0", (4,), "f32"), [1, 2, 3, 4]),)),
            "constant c0: its value must be an evaluated mx.array, got list",
        ),
    ],
)
def test_verify_refuses_what_does_not_round_trip(g: Graph, message: str) -> None:
    with pytest.raises(IRError, match=message):
        verify(g)


EXP1 = Eqn(1, "Exp", ("v0",), (Var("v1", (4,), "f32"),))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (EXP1.replace(id=0), "duplicate equation id"),
        (dataclasses.replace(EXP1, id=True), "id must be an int >= 0, got True"),  # (True == 1: replace keeps EXP1)
        (EXP1.replace(ins=("v9",)), "uses v9 before it is defined"),
        (EXP1.replace(ins=["v0"]), "inputs must be a tuple of value names"),
        (EXP1.replace(outs=(V0,)), "value v0 assigned twice"),
        (EXP1.replace(outs=("v1",)), "outputs must be a tuple of Var"),
        (EXP1.replace(outs=(Var("v1", (True,), "f32"),)), r"bad shape \(True,\)"),
        (EXP1.replace(outs=(Var("v1", (-1,), "f32"),)), r"bad shape \(-1,\)"),
        (EXP1.replace(outs=(Var("v1", (4,), "f33"),)), "unknown dtype 'f33'"),
        (EXP1.replace(outs=(Var("v\u0301", (4,), "f32"),)), "bad value name"),  # an identifier, not a \\w name
        (EXP1.replace(outs=(Var("1 v", (4,), "f32"),)), "bad value name '1 v'"),
        (EXP1.replace(args=[1]), "arguments must be a tuple"),
    ],
)
def test_verify_refuses_a_bad_equation_after_a_good_one_of_its_kind(bad: Eqn, message: str) -> None:
    """The verifier's quick test of a primitive it has already checked once (``verify``'s
    common case) refuses what the full checks refuse, with their message."""
    verify(_hand([EXP, EXP1]))  # the two good equations pass
    with pytest.raises(IRError, match=message):
        verify(_hand([EXP, bad]))


BASE = """graph f(%a0: f32[4] arg="args[0]") {
  %v0: f32[4] = Exp(%a0) #0
  return (%v0)
}"""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("return (%v0)", "return %v0", r"line 3: expected 'return \(%value, ...\)', got 'return %v0'"),
        ("return (%v0)", "return (%v9)", "graph output v9 is never defined"),
        ("Exp(%a0)", "Exp(a0)", "line 2: expected a %value, got 'a0'"),
        ("%v0: f32[4] = Exp", "%v0 = Exp", "line 2: expected '%value: type'"),
        ("f32[4] = Exp", "f32[4.5] = Exp", r"bad shape \[4.5\]"),
        (" #0", " #-1", "no equation id"),
        ('arg="args[0]"', "arg=args[0]", "its path is not a JSON string"),
        ("Exp(%a0) #0", 'AsType(%a0) [{"x": 1}] #0', r'must be \{"dtype": name\}'),
        ("  return", '  segc.cut() ["a = b", 1] #1\n  return', "segc.cut takes one argument"),
    ],
)
def test_parse_names_the_problem(old: str, new: str, message: str) -> None:
    with pytest.raises(IRError, match=message):
        parse(BASE.replace(old, new))


def test_parse_refuses_two_graphs() -> None:
    with pytest.raises(IRError, match="line 5: a second 'graph' header"):
        parse(BASE + "\n" + BASE)


def test_a_cut_name_holding_the_texts_separators_round_trips() -> None:
    g = parse(BASE.replace("  return", '  segc.cut() ["a = b #3  -- c"] #1\n  return'))
    assert g.eqns[1].args == ("a = b #3  -- c",) and parse(to_text(g)) == g


def test_an_equation_given_too_many_inputs_is_refused() -> None:
    g = parse(BASE.replace("Exp(%a0)", "Exp(%a0, %a0)"))
    with pytest.raises(IRError, match=r"equation #0 \(Exp\): the primitive takes 1 inputs, got 2"):
        Executor(g)


def _plan_json(**cut: Any) -> str:
    return json.dumps({"segc_plan": 1, "fingerprint": "x", "strategy": "s", "cuts": [{"after": 0, "name": "a", **cut}]})


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        ({"id": "x"}, "cut 0 'id' must be an equation id"),
        ({"id": -5}, r"cut 0 'id' must be an equation id \(an int >= 0\), got -5"),
        ({"id": 1.0}, "cut 0 'id' must be an equation id"),
        ({"id": True}, "cut 0 'id' must be an equation id"),
        ({"after": -1}, "cut 0 'after' must be an equation id"),
        ({"after": "0"}, "cut 0 'after' must be an equation id"),
    ],
)
def test_plan_json_with_bad_ids_is_refused(cut: dict[str, Any], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        Plan.from_json(_plan_json(**cut))
    assert Plan.from_json(_plan_json(id=7)).cuts[0].id == 7


def test_optimal_markers_says_when_legalisation_dropped_every_marker() -> None:
    def f(x: mx.array, y: mx.array) -> mx.array:  # one fused chain: the marker cannot stay
        h = segc.boundary(mx.exp(x) * y - 1.5, "m1")
        return mx.tanh(h) + mx.sqrt(mx.abs(h))

    x = mx.ones((8, 16))
    g = segc.jit(f).trace(x, x).graph
    with pytest.raises(ScheduleError, match=r"has 1 marker\(s\), but legalisation dropped every one.*fused chain"):
        segc.passes.make_plan(g, "optimal:markers")
