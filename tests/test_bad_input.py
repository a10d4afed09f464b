"""Mistakes get a segc error naming what was wrong, never a raw exception from deep
inside (issue: TypeError, OverflowError, RecursionError, AttributeError, IndexError)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

import segc
from segc.cli import main
from segc.ir import parse
from segc.passes import make_plan
from segc.runtime import Executor

SRC = """\
graph f(%a0: f32[4] arg="0") {
  %v0: f32[4] = Exp(%a0) #0
  %v1: f32[4] = Sin(%v0) #1
  return (%v1)
}
"""


def test_a_module_passed_as_an_argument() -> None:
    step = segc.jit(lambda m, x: m(x))
    with pytest.raises(segc.TraceError, match=r"args\[0\] is an nn.Module"):
        step(nn.Linear(2, 2), mx.ones((1, 2)))


@pytest.mark.parametrize("spec", ["memory:1e999", "memory:nan", "memory:-5"])
def test_byte_counts_out_of_range(spec: str) -> None:
    with pytest.raises(segc.ScheduleError, match="byte count"):
        make_plan(parse(SRC), spec)


@pytest.mark.parametrize("bad", [{"x": 1}, 3, "0", [(0, 1)], [0.5]])
def test_a_callable_strategy_returning_the_wrong_type(bad: object) -> None:
    with pytest.raises(segc.ScheduleError, match="user strategy"):
        make_plan(parse(SRC), lambda g: bad)


def test_integer_constant_too_big_for_its_dtype() -> None:
    text = SRC.replace("{\n  %v0", "{\n  const %c0: i8[] = [1000]\n  %v0")
    with pytest.raises(segc.IRError, match="line 2"):
        parse(text)


def test_deeply_nested_arguments() -> None:
    text = SRC.replace("Sin(%v0) #1", "Sin(%v0) " + "[" * 5000 + "]" * 5000 + " #1")
    with pytest.raises(segc.IRError, match="line 3"):
        parse(text)


def test_boundaries_that_are_not_strings() -> None:
    with pytest.raises(segc.TraceError, match="globs"):
        segc.jit(nn.Sequential(nn.Linear(2, 2)), boundaries=[1, 2])


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("%v1: f32[4] = Add(%v0) #1", "do not fit"),
        ("%v1: f32[4,4] = Sin(%v0) #1", "declares %v1: f32\\[4,4\\]"),
        ("%v1: i32[4] = Sin(%v0) #1", "declares %v1: i32\\[4\\]"),
    ],
)
def test_a_parsed_graph_that_lies_about_arity_or_types(line: str, why: str) -> None:
    g = parse(SRC.replace("%v1: f32[4] = Sin(%v0) #1", line))
    with pytest.raises(segc.IRError, match=f"equation #1.*{why}"):
        Executor(g)


def test_segc_ir_check_on_a_bad_file(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.segc"
    bad.write_text(SRC[:40])
    assert main(["ir", "--check", str(bad)]) == 2
    assert "segc ir:" in capsys.readouterr().err
    assert main(["ir", "--check", str(tmp_path / "missing.segc")]) == 2
