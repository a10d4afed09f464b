"""Persistent boundary schedules and windows on a jitted mlx-lm model (docs/runtime.md):
the seed's test plan. Expected values come from eager MLX and from the stock path."""

from __future__ import annotations

import threading
import time
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits, cut_ids

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

import segc
from segc.passes import Schedule
from segc.passes.fences import CutNode, WaitNode
from segc.runtime.events import Event, WaitTimeout
from segc.runtime.perfetto import wait_complete


class Recording(Event):
    """An Event that notes when each value arrived."""

    def __init__(self, log: list, name: str):
        super().__init__(name=name)
        self.log = log

    def signal(self, value: int) -> None:
        self.log.append((time.perf_counter(), self.name, value))
        super().signal(value)


@pytest.fixture(scope="module")
def model() -> Any:
    from segc.models import tiny_llama

    return tiny_llama(num_hidden_layers=4)


X = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
HELPER_EVAL = "a helper thread's mx.eval of another thread's arrays segfaults on MLX 0.32.4's CUDA build"


def layer_ends(step: Any) -> list[int]:
    """The id of the last computing equation of each layer's segment (the markers)."""
    return cut_ids(step.trace(X).graph)[0]


def first_ids(step: Any) -> list[int]:
    """The id of the first computing equation after each layer's cut."""
    return cut_ids(step.trace(X).graph)[1]


@pytest.mark.parametrize(
    "completion",
    [
        pytest.param(
            "eval",
            marks=pytest.mark.skipif(mx.default_device() != mx.cpu, reason=HELPER_EVAL),
        ),
        "inline",
    ],
)
def test_a_schedule_changes_no_bits_and_signals_in_order(model: Any, completion: str) -> None:
    want = bits(model(X))
    step = segc.jit(model, boundaries="layers.*")
    stock = bits(step(X))
    ends = layer_ends(step)
    log: list = []
    done = Recording(log, "done")
    sched = Schedule(tuple(CutNode(i, ("done", k + 1)) for k, i in enumerate(ends)))
    # a signal value only grows: with stride, call k signals k * len(ends) + 1, + 2, ...
    step.set_boundary_schedule(sched, {"done": done}, stride=len(ends), completion=completion)
    for call in range(3):
        assert bits(step(X)) == stock == want
        done.wait((call + 1) * len(ends), timeout=10)
    values = [v for _, name, v in log]
    assert values == list(range(1, 3 * len(ends) + 1)), values
    step.clear_boundary_schedule()
    assert bits(step(X)) == want


@pytest.mark.parametrize("commit", ["segment", "fences"])
def test_an_admit_wait_fences_real_work(model: Any, commit: str) -> None:
    """Segment 2 (layer 2) waits for the host's "admit"; a pager thread signals it only
    once layer 0's completion signal arrived. Layer 2 completes only after the admit,
    while the segments before it were free to run (with the ``"fences"`` commit policy
    too: layer 0 must be committed before the dispatch loop blocks)."""
    step = segc.jit(model, boundaries="layers.*", commit=commit)
    want = bits(step(X))
    ends, starts = layer_ends(step), first_ids(step)
    log: list = []
    done, admit = Recording(log, "done"), Recording(log, "admit")
    sched = Schedule(
        tuple(CutNode(i, ("done", k + 1)) for k, i in enumerate(ends)),
        (WaitNode(starts[1], "admit", 1),),
        ("admit",),
    )
    step.set_boundary_schedule(sched, {"done": done, "admit": admit})

    def pager() -> None:
        done.wait(1, timeout=20)  # layer 0 has completed
        admit.signal(1)

    t = threading.Thread(target=pager)
    t.start()
    out = bits(step(X))
    t.join(timeout=30)
    assert not t.is_alive()
    assert out == want
    order = [(name, v) for _, name, v in sorted(log)]
    assert order.index(("done", 1)) < order.index(("admit", 1)) < order.index(("done", 3)), order


def test_a_wait_nothing_signals_times_out_and_the_function_stays_usable(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    starts = first_ids(step)
    never = Event(name="never")
    step.set_boundary_schedule(
        Schedule((), (WaitNode(starts[2], "never", 1),), ("never",)), {"never": never}, timeout=0.2
    )
    with pytest.raises(WaitTimeout, match=r"never.*1.*segment 3"):
        step(X)
    step.clear_boundary_schedule()
    assert bits(step(X)) == want


def test_a_schedule_needs_its_events(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    with pytest.raises(segc.ScheduleError, match="kv"):
        step.set_boundary_schedule(Schedule((CutNode(layer_ends(step)[0], ("kv", 1)),)), {})


def test_windows_chain_through_the_stash_to_the_full_result(model: Any) -> None:
    """Three windows run one after the other (layer 0; layers 1-2; layer 3 and the head),
    each from the stash the previous one filled, give the full run's logits bit for bit;
    each runs only its own segments."""
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    g = step.trace(X).graph
    ids = [e.id for e in g.eqns if not e.is_pseudo]
    ends, starts = layer_ends(step), first_ids(step)
    timeline: list = []
    step.record_timeline(timeline)
    stash: dict = {}
    ran = []
    for first, last in [(ids[0], ends[0]), (starts[0], ends[2]), (starts[2], ids[-1])]:
        step.set_window(first, last, stash, name="band")
        timeline.clear()
        out = step(X)
        ran.append(sorted({k for _, what, k, _ in timeline if what == "dispatch"}))
    assert ran == [[0], [1, 2], [3, 4]], ran
    assert bits(out) == want
    assert any(what == "stash_in" for _, what, _, _ in timeline)
    step.clear_window()
    step.record_timeline(None)
    assert bits(step(X)) == want


def test_windows_over_other_graphs_and_half_windows(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    step.set_window(10**6, 10**6 + 1)  # neither endpoint in this graph: it runs in full
    assert bits(step(X)) == want
    step.clear_window()
    ends = layer_ends(step)
    with pytest.raises(segc.ScheduleError, match="endpoint"):
        step.set_window(ends[0], 10**6)
    assert bits(step(X)) == want  # a refused window changed nothing


def test_a_refused_signal_does_not_stop_later_ones(model: Any) -> None:
    """An event already past a schedule's value refuses the signal; the completer keeps
    the error and goes on signalling the others (no waiter is left hanging)."""
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    ends = layer_ends(step)
    ahead, fresh = Event(100, name="ahead"), Event(name="fresh")
    sched = Schedule((CutNode(ends[0], ("ahead", 1)), CutNode(ends[1], ("fresh", 1))))
    step.set_boundary_schedule(sched, {"ahead": ahead, "fresh": fresh})
    assert bits(step(X)) == want
    fresh.wait(1, timeout=10)
    assert ahead.value == 100


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            "eval",
            marks=pytest.mark.skipif(mx.default_device() != mx.cpu, reason=HELPER_EVAL),
        ),
        "inline",
    ],
)
def test_the_completer_signals_in_order_and_keeps_refusals(mode: str) -> None:
    """Both ways of signalling on completion (a worker evaluating the outputs, on the CPU;
    the dispatching thread itself, where MLX cannot evaluate another thread's arrays): in
    order, after the outputs, a refused value kept and the rest signalled."""
    from segc.runtime.completion import Completer

    c = Completer(mode=mode)
    log: list = []
    ahead, ev = Recording(log, "ahead"), Recording(log, "ev")
    ahead.signal(5)
    for v in range(1, 4):
        out = mx.ones((64, 64)) * v
        mx.async_eval(out)  # dispatched first, as the executor does
        c.signal_when_done([out], [(ahead, 1), (ev, v)])
    ev.wait(3, timeout=10)
    c.close()
    assert [(n, v) for _, n, v in log] == [("ahead", 5)] + [x for v in range(1, 4) for x in (("ahead", 1), ("ev", v))]
    assert len(c.errors) == 3 and all(isinstance(e, segc.ScheduleError) for e in c.errors)
    assert ahead.value == 5 and ev.value == 3


def test_the_timeline_records_waits_dispatches_and_completions(model: Any) -> None:
    step = segc.jit(model, boundaries="layers.*")
    want = bits(step(X))
    ends, starts = layer_ends(step), first_ids(step)
    done, admit = Event(name="done"), Event(1, name="admit")
    sched = Schedule((CutNode(ends[0], ("done", 1)),), (WaitNode(starts[1], "admit", 1),), ("admit",))
    step.set_boundary_schedule(sched, {"done": done, "admit": admit})
    timeline: list = []
    step.record_timeline(timeline)
    assert bits(step(X)) == want
    done.wait(1, timeout=10)
    wait_complete(timeline, timeout=10)  # every segment's completion, noted from the completer
    step.record_timeline(None)
    kinds = [(what, k) for _, what, k, _ in timeline]
    assert kinds[0] == ("call", -1)
    assert ("wait", 2) in kinds and kinds.index(("wait", 2)) < kinds.index(("waited", 2)) < kinds.index(("dispatch", 2))
    complete = {k: (t, detail) for t, what, k, detail in timeline if what == "complete"}
    assert sorted(complete) == list(range(len(step.entries()[0].segments)))
    signalling = [k for k, (_, d) in complete.items() if d == "done = 1"]
    assert len(signalling) == 1  # the segment that signals names its values
    t_dispatch = {k: t for t, what, k, _ in timeline if what == "dispatch"}
    assert all(t >= t_dispatch[k] for k, (t, _) in complete.items())  # completion is noted after its dispatch
    assert sum(1 for what, _ in kinds if what == "dispatch") == len(step.entries()[0].segments)


def test_a_scheduled_call_leaves_no_reference_cycles(model: Any) -> None:
    """The fenced path, as ``test_leaks.py`` checks the stock one: calls under a boundary
    schedule free what they made when they return (eager's bits each time), leaving
    nothing for Python's cyclic collector."""
    import gc

    want = bits(model(X))
    step = segc.jit(model, boundaries="layers.*")
    ends = layer_ends(step)
    done = Event(name="done")
    sched = Schedule(tuple(CutNode(i, ("done", k + 1)) for k, i in enumerate(ends)))
    step.set_boundary_schedule(sched, {"done": done}, stride=len(ends), completion="inline")
    assert bits(step(X)) == want
    done.wait(len(ends), timeout=10)
    gc.collect()
    gc.disable()
    try:
        for call in range(1, 4):
            assert bits(step(X)) == want
            done.wait((call + 1) * len(ends), timeout=10)
        assert gc.collect() == 0
    finally:
        gc.enable()
