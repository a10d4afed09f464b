"""Cuts inside fused chains (issue 15): the ``fences`` pass moves a schedule's cut to
the end of the chain with its signal (warning), or refuses it; the ``legalize`` pass
moves a cut's signals with the cut. The expected IR is written out by hand."""

from __future__ import annotations

import pytest

from segc import ScheduleError
from segc.errors import ScheduleWarning
from segc.ir import parse, verify
from segc.passes import Schedule, run, run_pass
from segc.passes.fences import CutNode, WaitNode

# Exp #1 -> Multiply #2 fuse (mx.compile): a cut after #1 would split them
SRC = """\
graph f(%a0: f32[8,8] arg="0", %p0: f32[8,8] param="w0") {
  %v0: f32[8,8] = Matmul(%a0, %p0) #0
  %v1: f32[8,8] = Exp(%v0) #1
  %v2: f32[8,8] = Multiply(%v1, %a0) #2
  %v3: f32[8,8] = Matmul(%v2, %p0) #3
  return (%v3)
}
"""


def effects(g) -> list[str]:
    return [f"{e.prim}{list(e.args)}" if e.is_pseudo else f"#{e.id}" for e in g.eqns]


def test_fences_moves_a_cut_inside_a_chain_with_its_signal() -> None:
    g = parse(SRC)
    sched = Schedule(cuts=(CutNode(1, ("ev", 1)),), waits=(WaitNode(3, "ev", 1),))
    with pytest.warns(ScheduleWarning, match=r"after #1 splits a chain.*moved after #2"):
        out = run(g, [("fences", {"schedule": sched})], checks=True)
    assert effects(out) == ["#0", "#1", "#2", "segc.signal['ev', 1]", "segc.cut['fence1']", "segc.wait['ev', 1]", "#3"]
    verify(out)
    with pytest.warns(ScheduleWarning):
        assert run_pass("fences", out, schedule=sched) == out  # still idempotent


def test_fences_refuses_a_cut_inside_a_chain_when_told() -> None:
    with pytest.raises(ScheduleError, match=r"cut node after #1 splits a chain.*legalize=False.*after #2"):
        run_pass("fences", parse(SRC), schedule=Schedule(cuts=(CutNode(1, ("ev", 1)),)), legalize=False)


def test_legalize_moves_signals_with_their_cut() -> None:
    src = SRC.replace(
        "  %v2: f32[8,8] = Multiply",
        '  segc.signal() ["ev", 1] #4\n  segc.cut() ["c"] #5\n  segc.wait() ["ev", 1] #6\n  %v2: f32[8,8] = Multiply',
    )
    g = parse(src)
    out = run_pass("legalize", g)
    # the cut moves later (a signal must not fire before #1 ran), the signal with it
    assert effects(out) == ["#0", "#1", "#2", "segc.signal['ev', 1]", "segc.cut['c']", "segc.wait['ev', 1]", "#3"]
    verify(out)


def test_fences_refuses_a_move_past_its_own_wait() -> None:
    # moving the cut after #1 to after #2 would put the wait at #2 in the signalling segment
    sched = Schedule(cuts=(CutNode(1, ("ev", 1)),), waits=(WaitNode(2, "ev", 1),))
    with pytest.raises(ScheduleError, match=r"wait at #2 on 'ev' >= 1 in the segment that signals it"):
        run_pass("fences", parse(SRC), schedule=sched)
