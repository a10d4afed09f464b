"""Boundary schedules, windows and the stash under misuse and across a function's graphs
(docs/runtime.md): a schedule by boundary name or per graph puts each signal at the
boundary it names in every graph (prefill and decode, with and without caches); a call
that failed does not move a strided schedule on; bad input is refused up front with a
``segc.ScheduleError`` that names it, and changes nothing. Expected values come from
eager MLX, from the stock path and from the markers the model was traced with."""

from __future__ import annotations

import math
import re
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits, cut_ids

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.errors import ScheduleError
from segc.ir import Graph, segment_effects
from segc.passes import Schedule
from segc.passes.fences import CutNode, WaitNode
from segc.runtime.events import Event, WaitTimeout

LAYERS = 3
NAMES = [f"model.layers.{k}" for k in range(LAYERS)]  # the markers of boundaries="layers.*"
X = mx.array([[3, 1, 4, 1, 5]])
TOKEN = mx.array([[9]])


@pytest.fixture(scope="module")
def model() -> Any:
    from segc.models import tiny_llama

    return tiny_llama(num_hidden_layers=LAYERS)


def eager_run(model: Any) -> list[Any]:
    """Eager mlx-lm: a prefill with a cache, then one decode step."""
    cache = make_prompt_cache(model)
    return [bits(model(X, cache=cache)), bits(model(TOKEN, cache=cache))]


def signals_by_segment(step: Any) -> list[list[tuple[str, tuple]]]:
    """Per compiled entry (one per graph): each segment's name and the signals it fires."""
    return [[(s.name, fx.signals) for s, fx in zip(c.segments, segment_effects(c.graph))] for c in step.entries()]


def prefill_and_decode(step: Any) -> list[Any]:
    cache = make_prompt_cache(step.module)
    return [bits(step(X, cache=cache)), bits(step(TOKEN, cache=cache))]


def layer_done() -> Schedule:
    return Schedule(tuple(CutNode(name, ("done", k + 1)) for k, name in enumerate(NAMES)))


def test_a_schedule_by_boundary_name_signals_at_that_boundary_in_every_graph(model: Any) -> None:
    """Cut nodes named by boundary: in the prefill graph and in the decode graph (other
    ids) each layer's segment signals its value and no segment is cut anew."""
    want = eager_run(model)
    stock = segc.jit(model, boundaries="layers.*")
    assert prefill_and_decode(stock) == want
    segs = [[s.name for s in c.segments] for c in stock.entries()]
    assert len(segs) == 2 and all(s == [*NAMES, "tail"] for s in segs), segs
    step = segc.jit(model, boundaries="layers.*")
    done = Event(name="done")
    step.set_boundary_schedule(layer_done(), {"done": done}, stride=LAYERS)
    assert prefill_and_decode(step) == want
    expected = [(name, (("done", k + 1),)) for k, name in enumerate(NAMES)] + [("tail", ())]
    assert signals_by_segment(step) == [expected, expected]
    done.wait(2 * LAYERS, timeout=10)  # every layer of both calls signalled once it completed


def test_a_wait_by_boundary_name_holds_that_segment(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    cache = make_prompt_cache(model)
    want = eager_run(model)
    sched = Schedule(waits=(WaitNode("model.layers.1", "admit", 1),), host_events=("admit",))
    admit = Event(name="admit")
    step.set_boundary_schedule(sched, {"admit": admit}, timeout=0.2)
    with pytest.raises(WaitTimeout, match=r"model\.layers\.1") as exc:
        step(X, cache=cache)
    assert (exc.value.event, exc.value.value) == ("admit", 1)
    assert [c.offset for c in cache] == [0] * LAYERS  # the failed call left the caches as they were
    admit.signal(1)
    assert [bits(step(X, cache=cache)), bits(step(TOKEN, cache=cache))] == want
    for c in step.entries():
        waits = {s.name: fx.waits for s, fx in zip(c.segments, segment_effects(c.graph))}
        assert waits == {**{n: () for n in NAMES}, "model.layers.1": (("admit", 1),), "tail": ()}


def test_a_schedule_function_is_applied_to_each_graph(model: Any) -> None:
    """``set_boundary_schedule(fn)``: ``fn(graph)`` gives the schedule of each graph, so
    its ids are that graph's."""
    want = eager_run(model)
    step = segc.jit(model, boundaries="layers.*")
    seen: list[str] = []

    def per_graph(g: Graph) -> Schedule:
        seen.append(g.name)
        return Schedule(tuple(CutNode(i, ("done", k + 1)) for k, i in enumerate(cut_ids(g)[0])))

    step.set_boundary_schedule(per_graph, {"done": Event(name="done")}, stride=LAYERS)
    assert prefill_and_decode(step) == want
    expected = [(name, (("done", k + 1),)) for k, name in enumerate(NAMES)] + [("tail", ())]
    assert signals_by_segment(step) == [expected, expected]
    assert len(seen) == 2


def test_a_boundary_name_no_marker_has_is_refused(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    typo = Schedule((CutNode("model.layer.0", ("done", 1)),))
    with pytest.raises(ScheduleError, match=r"'model\.layer\.0'.*model\.layers\.0"):
        step.set_boundary_schedule(typo, {"done": Event(name="done")})  # a cached graph: refused here
    assert bits(step(X)) == want
    fresh = segc.jit(model, boundaries="layers.*")
    fresh.set_boundary_schedule(typo, {"done": Event(name="done")})  # no graph yet: refused at the call
    cache = make_prompt_cache(model)
    with pytest.raises(ScheduleError, match=r"model\.layer\.0"):
        fresh(X, cache=cache)
    assert [c.offset for c in cache] == [0] * LAYERS


def test_a_schedule_json_keeps_boundary_names() -> None:
    s = Schedule(
        (CutNode("model.layers.0", ("done", 1)), CutNode(17, ("done", 2), "mine")),
        (WaitNode("model.layers.2", "admit", 3), WaitNode(40, "admit", 4)),
        ("admit",),
    )
    back = Schedule.from_json(s.to_json())
    assert back == s
    assert back.cuts[0].after == "model.layers.0" and back.cuts[1].after == 17
    with pytest.raises(ScheduleError, match="cannot read"):
        Schedule.from_json('{"cuts": [{"after": true}]}')
    for text in ("[]", '{"cuts": 5}', '{"waits": [{"at": "x"}]}'):
        with pytest.raises(ScheduleError, match="cannot read"):
            Schedule.from_json(text)


def test_a_failed_call_does_not_move_a_strided_schedule_on(model: Any) -> None:
    """The host signals ``h = k + 1`` before call k; a call that timed out is retried
    with the same value, and the calls after it line up."""
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    h = Event(name="h")
    sched = Schedule(waits=(WaitNode(cut_ids(step.trace(X).graph)[1][0], "h", 1),), host_events=("h",))
    step.set_boundary_schedule(sched, {"h": h}, timeout=0.2, stride=1)
    with pytest.raises(WaitTimeout) as first:
        step(X)  # the host is late
    assert first.value.value == 1
    h.signal(1)
    assert bits(step(X)) == want  # the retry waits for h >= 1 again
    h.signal(2)
    assert bits(step(X)) == want  # call 1
    with pytest.raises(WaitTimeout) as third:
        step(X)
    assert third.value.value == 3  # call 2 waits for 1 + 2 * 1


@pytest.mark.parametrize("timeout", [None, -1, math.inf, math.nan, "1", True])
def test_a_bad_timeout_is_refused_when_the_schedule_is_set(model: Any, timeout: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    done = Event(name="done")
    step.set_boundary_schedule(layer_done(), {"done": done})
    with pytest.raises(ScheduleError, match="timeout"):
        step.set_boundary_schedule(layer_done(), {"done": Event(name="other")}, timeout=timeout)
    assert bits(step(X)) == want
    done.wait(LAYERS, timeout=10)  # the schedule set before is still the one in force


@pytest.mark.parametrize(
    ("schedule", "events", "match"),
    [
        (layer_done(), {"done": "not an event"}, r"events\['done'\].*Event.*str"),
        (layer_done(), {"done": 3}, r"events\['done'\].*int"),
        (layer_done(), [("done", Event(name="done"))], "events must map"),
        (layer_done(), {}, r"\['done'\]"),
        (42, {}, "takes a Schedule.*int"),
        (Schedule((CutNode(1.5, ("done", 1)),)), {"done": Event(name="done")}, "after.*1.5"),
        (Schedule((CutNode(True, ("done", 1)),)), {"done": Event(name="done")}, "after.*True"),
        (Schedule(waits=(WaitNode("", "done", 1),)), {"done": Event(name="done")}, "at.*''"),
        (Schedule((CutNode("model.layers.0", ("done", 0)),)), {"done": Event(name="done")}, "value.*>= 1"),
    ],
)
def test_bad_schedules_and_events_are_refused_up_front(model: Any, schedule: Any, events: Any, match: str) -> None:
    step = segc.jit(model, boundaries="layers.*")
    fresh = segc.jit(model, boundaries="layers.*")  # no graph yet: the check needs none
    want = bits(step(X))
    for s in (step, fresh):
        with pytest.raises(ScheduleError, match=match):
            s.set_boundary_schedule(schedule, events)
    assert bits(step(X)) == want and bits(fresh(X)) == want


def test_a_schedule_function_returning_a_bad_value_is_refused(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    done = Event(name="done")
    step.set_boundary_schedule(layer_done(), {"done": done})

    def broken(g: Graph) -> Any:
        return 5

    with pytest.raises(ScheduleError, match=r"broken.*int"):
        step.set_boundary_schedule(broken, {"done": Event(name="done")})

    def other_event(g: Graph) -> Schedule:
        return Schedule((CutNode("model.layers.0", ("kv", 1)),))

    with pytest.raises(ScheduleError, match=r"other_event.*\['kv'\]"):
        step.set_boundary_schedule(other_event, {"done": Event(name="done")})
    assert bits(step(X)) == want
    done.wait(LAYERS, timeout=10)  # the earlier schedule is still in force


def test_use_window_with_a_name_never_placed_is_refused(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    with pytest.raises(ScheduleError, match="no windows are placed"):
        step.use_window("band0")
    want = bits(step(X))
    ends = cut_ids(step.trace(X).graph)[0]
    first = next(e.id for e in step.trace(X).graph.eqns if not e.is_pseudo)
    step.set_windows(lambda g: {"band0": (first, ends[0])})
    with pytest.raises(ScheduleError, match=r"'bnad0'.*band0"):
        step.use_window("bnad0")  # the cached graph places band0 only
    fresh = segc.jit(model, boundaries="layers.*")
    fresh.set_windows(lambda g: {"band0": (first, ends[0])})
    stash = fresh.use_window("bnad0")  # no graph yet: refused at the call, before it runs
    with pytest.raises(ScheduleError, match=r"'bnad0'.*band0"):
        fresh(X)
    assert stash == {}
    fresh.use_window(None)
    assert bits(fresh(X)) == want


@pytest.mark.parametrize(
    "windows",
    [lambda g: 5, lambda g: {"w": (0.5, 3)}, lambda g: {"w": (1,)}, lambda g: {"w": (True, 3)}],
)
def test_set_windows_refuses_a_bad_result(model: Any, windows: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    with pytest.raises(ScheduleError, match="window function"):
        step.set_windows(windows)
    assert bits(step(X)) == want


@pytest.mark.parametrize(("first", "last"), [(0.5, 3), (0, "x"), (True, 3)])
def test_set_window_refuses_ids_that_are_not_ints(model: Any, first: Any, last: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    with pytest.raises(ScheduleError, match="equation id"):
        step.set_window(first, last)


def test_record_timeline_takes_a_list() -> None:
    step = segc.jit(lambda x: x + 1)
    for bad in ("abc", (), {}):
        with pytest.raises(ScheduleError, match="list"):
            step.record_timeline(bad)  # type: ignore[arg-type]
    step.record_timeline([])
    step.record_timeline(None)


def test_a_stash_value_of_the_wrong_shape_is_refused_naming_it(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    g = step.trace(X).graph
    ids = [e.id for e in g.eqns if not e.is_pseudo]
    ends, starts = cut_ids(g)
    stash = step.set_window(ids[0], ends[0], name="head")
    step(X)
    assert stash  # the first window's exit values
    step.set_window(starts[0], ids[-1], stash, name="rest")
    key = next(iter(stash))
    right = stash[key]
    stash[key] = mx.zeros((2, 3), dtype=right.dtype)
    with pytest.raises(ScheduleError, match=rf"%{re.escape(key)}.*\[2,3\].*\[{','.join(map(str, right.shape))}\]"):
        step(X)
    stash[key] = right
    assert bits(step(X)) == want
