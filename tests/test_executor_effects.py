"""The executor receives each segment's effects from the IR: the signals its segment
fires on completion, the waits that gate its dispatch and the windows that select it.
Expected values are written out by hand from the IR text below."""

from __future__ import annotations

import mlx.core as mx
from conftest import assert_same_bits

from segc.ir import SegmentEffects, parse, segment_effects
from segc.runtime import Executor

# three segments; the window covers #1..#3 (segments 1 and 2 by their cuts)
SRC = """\
graph f(%a0: f32[4] arg="0") {
  segc.host_event() ["pager"] #10
  %v0: f32[4] = Exp(%a0) #0
  segc.signal() ["kv", 1] #11
  segc.cut() ["a"] #12
  segc.wait() ["pager", 3] #13
  segc.window() ["w", 1, 3, "range", ["v0"], ["v2", "v3"]] #14
  %v1: f32[4] = Sin(%v0) #1
  segc.cut() ["b"] #15
  segc.wait() ["kv", 1] #16
  %v2: f32[4] = Cos(%v1) #2
  %v3: f32[4] = Tanh(%v2) #3
  segc.signal() ["kv", 2] #17
  segc.cut() ["c"] #18
  %v4: f32[4] = Negative(%v2) #4
  return (%v3, %v4)
}
"""


def test_each_step_carries_its_segments_effects() -> None:
    g = parse(SRC)
    ex = Executor(g)
    assert [st.segment.name for st in ex.steps] == ["a", "b", "c", "tail"]
    assert [st.effects for st in ex.steps] == [
        SegmentEffects(signals=(("kv", 1),)),
        SegmentEffects(waits=(("pager", 3),), windows=("w",)),
        SegmentEffects(signals=(("kv", 2),), waits=(("kv", 1),), windows=("w",)),
        SegmentEffects(),
    ]
    assert [bool(st.effects) for st in ex.steps] == [True, True, True, False]
    assert segment_effects(g) == [st.effects for st in ex.steps]


def test_effects_change_no_bits() -> None:
    g = parse(SRC)
    plain = g.replace(eqns=tuple(e for e in g.eqns if not e.is_pseudo))
    x = mx.array([0.5, -1.0, 2.0, -0.0])
    want = [mx.tanh(mx.cos(mx.sin(mx.exp(x)))), mx.negative(mx.cos(mx.sin(mx.exp(x))))]
    assert_same_bits(Executor(g)([x]), want, "with effects")
    assert_same_bits(Executor(plain)([x]), want, "without effects")
