"""Commits on a thread of their own (``segc.committer``, ``SEGC_COMMIT_THREAD=1``): a
segment run as stretches around its live steps (``segc.lower.live``) commits its first
part, with the call's inputs, on the calling thread and hands the later ones to the
committing thread, building on a stream any thread may evaluate. Every result is compared with eager MLX's ops byte
for byte (``test_live``'s layers, the CPU's reference write); a commit's failure and a
commit that never ends reach the caller as errors."""

from __future__ import annotations

import sys
import threading

import mlx.core as mx
import pytest
from conftest import same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_kvwrite import _values
from test_live import C, Live, _eager_layers, _fn, _layers, _schedule

from segc import committer as cm
from segc.errors import UsageError, WaitTimeout
from segc.lower import live
from segc.trace import kvcache

pytestmark = pytest.mark.timeout(120)


def _run(mp: pytest.MonkeyPatch, layers: int, groups: tuple[int, ...], offset: int, lazy: bool = False):
    """The staged segment of ``layers`` layers compiled with the schedule ``groups``, its
    inputs (the last layer's key buffer left lazy, on the caller's stream, if ``lazy``),
    and eager's results for them."""
    eqns, avals, ins, outs, consts = _layers(layers)
    vals = _values(avals, ins, offset, seed=layers)
    vals[ins.index("off")] = kvcache.position(offset)
    want = _eager_layers(dict(zip(ins, vals, strict=True)), layers, offset + 1)[1]
    if lazy:  # read only by the last layer: by a part the committing thread commits
        last = ins.index("kb" if layers == 1 else f"kb_{layers - 1}")
        vals[last] = vals[last] + 0  # the same bytes, not yet computed
    return live.compile_segment(_fn(eqns, avals, ins, outs, consts, Live(mp)), groups), vals, want


@settings(max_examples=12, deadline=None)
@given(
    layers=hst.integers(1, 4),
    groups=hst.lists(hst.integers(1, 2), min_size=1, max_size=3).map(tuple),
    offset=hst.integers(0, C - 2),
    lazy=hst.booleans(),
)
def test_the_later_commits_come_from_the_committing_thread_with_eagers_bytes(layers, groups, offset, lazy) -> None:
    """The first commit the schedule names is the caller's, with the call's inputs (an
    input left lazy is on the caller's own stream, which only its thread may evaluate),
    the rest the committing thread's, one each, in order; the outputs are eager's bytes,
    the written caches too."""
    who: list[str] = []
    real = mx.async_eval
    with pytest.MonkeyPatch.context() as mp:  # (hypothesis: no function-scoped fixture)
        mp.setenv("SEGC_COMMIT_THREAD", "1")
        mp.setattr(mx, "async_eval", lambda *a: who.append(threading.current_thread().name) or real(*a))
        fn, vals, want = _run(mp, layers, groups, offset, lazy)
        got = fn(*vals)
    n = len(_schedule(layers, groups))
    assert who == (["MainThread", *["segc-committer"] * (n - 1)] if n else [])  # no commit: none
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert same_bits(a, b)


def test_a_commits_failure_reaches_the_caller_and_the_next_call_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that raises on the committing thread is raised by the call (after the
    call's other commits are waited for); the thread lives on, and the next call gives
    eager's bytes."""
    monkeypatch.setenv("SEGC_COMMIT_THREAD", "1")
    fn, vals, want = _run(monkeypatch, 3, (1,), 5)
    real = mx.async_eval

    def failing(*a):
        if threading.current_thread().name == "segc-committer":
            raise RuntimeError("a commit failed")
        return real(*a)

    monkeypatch.setattr(mx, "async_eval", failing)
    with pytest.raises(RuntimeError, match="a commit failed"):
        fn(*vals)
    monkeypatch.setattr(mx, "async_eval", real)
    for a, b in zip(fn(*vals), want, strict=True):
        assert same_bits(a, b)


def test_a_commit_that_never_ends_is_a_wait_timeout_naming_the_committer(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cm.Committer(mx.default_device())
    release = threading.Event()
    real = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: release.wait(10) and real(*a))
    with c.building():
        c.submit([mx.array([1.0]) + 1])
    with pytest.raises(WaitTimeout, match="segc-committer") as info:
        c.finish(timeout=0.2, where="here")
    assert info.value.where == "here" and info.value.reached == 0
    release.set()
    c.finish(timeout=10)  # what was left is waited for by the next finish
    assert c._pending == 0


def test_building_sets_the_stream_and_switch_interval_and_puts_them_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGC_COMMIT_SWITCH", "50")
    c = cm.committer()
    before, stream = sys.getswitchinterval(), mx.default_stream(mx.default_device())
    with c.building():
        assert sys.getswitchinterval() == pytest.approx(50e-6, abs=2e-6)
        assert mx.default_stream(mx.default_device()) == c.stream != stream
    assert sys.getswitchinterval() == before and mx.default_stream(mx.default_device()) == stream
    assert cm.committer() is c


@pytest.mark.parametrize(("name", "value"), [("SEGC_COMMIT_THREAD", "2"), ("SEGC_COMMIT_SWITCH", "0")])
def test_a_setting_outside_its_values_is_refused_by_name(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=name):
        cm.thread_wanted() if name == "SEGC_COMMIT_THREAD" else cm.switch_interval()


def test_the_caller_goes_on_while_the_thread_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the thread: ``submit`` returns while the commit it handed over is
    still in MLX (the commit, on the committing thread, sees the caller past ``submit``
    before it goes on), and ``finish`` waits for it. A ``submit`` that committed itself
    would find the caller still inside it."""
    c = cm.Committer(mx.default_device())
    returned = threading.Event()
    seen: list[tuple[str, bool]] = []
    real = mx.async_eval

    def held(*a):
        seen.append((threading.current_thread().name, returned.wait(5)))
        return real(*a)

    monkeypatch.setattr(mx, "async_eval", held)
    with c.building():
        x = mx.ones((8, 8)) * 3
        c.submit([x])
        returned.set()
        c.finish(timeout=10)
    assert seen == [("segc-committer", True)]
    assert same_bits(x, mx.full((8, 8), 3.0))


def test_stop_commits_what_was_handed_over_then_ends_the_thread() -> None:
    """What the process's exit runs (before MLX's own teardown): the thread commits what
    it holds, then ends."""
    c = cm.Committer(mx.default_device())
    with c.building():
        x = mx.arange(4.0) * 2
        c.submit([x])
    c.stop(timeout=10)
    assert not c._thread.is_alive()
    assert same_bits(x, mx.array([0.0, 2.0, 4.0, 6.0]))
