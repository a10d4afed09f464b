"""The executor's commit policy (docs/runtime.md, "Commits"): where segments are committed
to the device changes no bits, and ``"fences"`` commits only where a schedule observes a
boundary. Expected values come from eager mlx-lm; the commits are counted by wrapping
``mx.async_eval``."""

from __future__ import annotations

import threading
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits, cut_ids, same_bits, same_caches

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

import segc
from segc.passes import Schedule
from segc.passes.fences import CutNode, WaitNode
from segc.runtime import Executor, resolve_commit
from segc.runtime.events import Event

X = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])


@pytest.fixture(scope="module")
def model() -> Any:
    from segc.models import tiny_llama

    return tiny_llama(num_hidden_layers=4)


class Commits:
    """Wraps ``mx.async_eval``: notes each commit (as ``("commit", n arrays)``) in ``log``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, log: list) -> None:
        real = mx.async_eval
        self.log = log

        def counting(*args: Any) -> None:
            log.append(("commit", threading.current_thread().name))
            real(*args)

        monkeypatch.setattr(mx, "async_eval", counting)

    @property
    def count(self) -> int:
        return sum(1 for what, _ in self.log if what == "commit")


@pytest.mark.parametrize("commit", ["segment", "fences"])
def test_every_policy_gives_eager_bits_in_a_cached_decode(model: Any, commit: str) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    # the reference: eager mlx-lm on the CPU; on the GPU, where segc's dynamic KV cache
    # promises only segmented == unsegmented (docs/models.md), segc with no boundaries
    ref = model if mx.default_device() == mx.cpu else segc.jit(model, commit="segment")
    ref_cache, cache = make_prompt_cache(model), make_prompt_cache(model)
    step = segc.jit(model, boundaries="layers.*", commit=commit)
    assert same_bits(step(X, cache=cache), ref(X, cache=ref_cache))
    for t in range(4):
        x = mx.array([[t + 7]])
        y = step(x, cache=cache)
        assert same_bits(y, ref(x, cache=ref_cache))
        assert same_caches(cache, ref_cache)


def test_the_stock_loop_commits_per_segment_or_not_at_all(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    want = bits(model(X))
    per_segment = segc.jit(model, boundaries="layers.*", commit="segment")
    at_end = segc.jit(model, boundaries="layers.*", commit="fences")
    n = len(per_segment.lower(X).compile().executor.steps)
    assert n == 5  # four layers and the head
    for step in (per_segment, at_end):
        step(X)  # traced and compiled before counting
    log: list = []
    commits = Commits(monkeypatch, log)
    assert bits(per_segment(X)) == want
    assert commits.count == n
    log.clear()
    assert bits(at_end(X)) == want  # bits() evaluates: the caller's eval commits
    assert commits.count == 0


def test_fences_commit_after_signals_and_before_waits(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Layer 1 signals, layer 3 waits: the ``"fences"`` policy commits once after layer 1
    (what its signal reports must be running) and once before layer 3's wait (layer 2,
    dispatched since, runs while the host blocks), and nowhere else."""
    want = bits(model(X))
    step = segc.jit(model, boundaries="layers.*", commit="fences")
    ends, starts = cut_ids(step.trace(X).graph)
    log: list = []

    class Noting(Event):
        def wait(self, value: int, timeout: float = 10.0, *, where: str | None = None) -> None:
            log.append(("wait", self.name))
            super().wait(value, timeout, where=where)

    done, admit = Noting(name="done"), Noting(name="admit")
    admit.signal(1)
    sched = Schedule((CutNode(ends[1], ("done", 1)),), (WaitNode(starts[2], "admit", 1),), ("admit",))
    step.set_boundary_schedule(sched, {"done": done, "admit": admit})
    step(X)  # compiled before counting; the values are reached already, so nothing blocks
    log.clear()
    Commits(monkeypatch, log)
    assert bits(step(X)) == want
    # after layer 1: its outputs, then (a completer thread, on the CPU) the views of them
    # that the completer waits on; before layer 3's wait: layer 2
    probes = ["commit"] if mx.default_device() == mx.cpu else []
    assert [what for what, _ in log] == ["commit", *probes, "commit", "wait"], log
    done.wait(1, timeout=10)


def test_a_bad_policy_is_refused_where_it_is_given() -> None:
    with pytest.raises(segc.ScheduleError, match=r"commit must be one of .*'segment'.*not 'every'"):
        segc.jit(lambda x: x + 1, commit="every")
    assert resolve_commit("auto") == "segment"


def test_auto_commits_after_every_segment_on_every_device() -> None:
    """``"auto"`` is ``"segment"`` on the CPU and on a GPU (docs/runtime.md, "Commits");
    the other policies' flags for six segments, counted from their words."""
    from segc.runtime.executor import _commits_after

    def f(a: mx.array, b: mx.array) -> mx.array:
        for _ in range(4):
            a = segc.boundary(a + 1)
        c = segc.boundary(a @ b)
        return c + 1 + b

    a = mx.ones((64, 64))
    step = segc.jit(f)
    g = step.lower(a, a).graph
    segs = segc.segments(g)
    assert len(segs) == 6
    assert resolve_commit("auto") == "segment"
    assert Executor(g).commit_after == (True,) * 6
    assert _commits_after(g, segs, "geometric") == (True, True, False, True, False, False)
    assert _commits_after(g, segs, "segment") == (True,) * 6
    assert _commits_after(g, segs, "fences") == (False,) * 6


def test_geometric_commits_after_segments_1_2_4_8() -> None:
    from segc.runtime.executor import _commits_after

    def f(x: mx.array) -> mx.array:
        for _ in range(10):
            x = segc.boundary(x + 1)
        return x * 2

    g = segc.jit(f).lower(mx.ones((4,))).graph
    segs = segc.segments(g)
    assert len(segs) == 11
    want = tuple(k + 1 in (1, 2, 4, 8) for k in range(11))
    assert _commits_after(g, segs, "geometric") == want
    assert _commits_after(g, segs, "auto") == want  # small segments: no FLOP commits
    step = segc.jit(f, commit="geometric")
    assert bits(step(mx.ones((4,)))) == bits(f(mx.ones((4,))))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 11, 12])
def test_every_k_commits_after_every_kth_segment(k: int) -> None:
    """``"every:K"``: a commit after segments K, 2K, ... (counted from 1), the same bits
    as eager; ``"every:1"`` is ``"segment"``."""
    from segc.runtime.executor import _commits_after

    def f(x: mx.array) -> mx.array:
        for _ in range(10):
            x = segc.boundary(x * 1.5 - 0.25)
        return x * 2

    g = segc.jit(f).lower(mx.ones((4,))).graph
    segs = segc.segments(g)
    assert len(segs) == 11
    want = tuple(n in range(k, 12, k) for n in range(1, 12))
    assert _commits_after(g, segs, f"every:{k}") == want
    x = mx.arange(4, dtype=mx.float32) - 1.0
    assert bits(segc.jit(f, commit=f"every:{k}")(x)) == bits(f(x))


@pytest.mark.parametrize(
    "bad", ["every", "every:", "every:0", "every:-1", "every:2.5", "every:x", "every: 2", "every:\u00b2"]
)
def test_a_bad_every_policy_is_refused_when_jitted(bad: str) -> None:
    with pytest.raises(segc.ScheduleError, match="every:K"):
        segc.jit(lambda x: x + 1, commit=bad)
