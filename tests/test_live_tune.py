"""The commit schedule chosen at run time (``segc.lower.live_tune``,
``SEGC_LIVE_COMMITS=tune``): the candidates spelled out, the tuner's choice against the
periods a fake clock gives it (the expected choice computed here from those periods),
and a staged segment under tuning: every call commits where its candidate says and
gives eager MLX's bytes, and after tuning the fastest candidate's commits stay."""

from __future__ import annotations

import statistics

import mlx.core as mx
import pytest
from conftest import assert_env_setting, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst
from test_kvwrite import _values
from test_live import Live, _eager_layers, _fn, _layers, _schedule

from segc.lower import live, live_tune
from segc.trace import kvcache

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _nothing_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with no schedule kept from another (``live_tune.SETTLED``)."""
    monkeypatch.setattr(live_tune, "SETTLED", {})


@pytest.mark.parametrize(
    ("n", "end", "middle", "want"),
    [(16, 2, 4, (2, 4, 4, 4, 2)), (16, 3, 5, (3, 5, 5, 3)), (32, 3, 5, (3, 5, 5, 4, 4, 4, 4, 3)), (4, 2, 4, (2,))],
)
def test_tapered_schedules_spelled_out(n: int, end: int, middle: int, want: tuple[int, ...]) -> None:
    assert live_tune.tapered(n, end, middle) == want


@given(n=hst.integers(1, 80), end=hst.integers(1, 4), middle=hst.integers(1, 8))
def test_a_tapered_schedule_covers_the_steps_with_small_ends(n: int, end: int, middle: int) -> None:
    """Past ``2 * end`` steps: ``end`` at both ends, the middle groups each at most
    ``middle`` and within one of each other, all of them adding up to ``n`` (so the last
    commit is after the last live step)."""
    groups = live_tune.tapered(n, end, middle)
    if n < 2 * end + 1:
        assert groups == (end,)
        return
    mids = groups[1:-1]
    assert groups[0] == groups[-1] == end and sum(groups) == n
    assert mids and max(mids) <= middle and max(mids) - min(mids) <= 1 and min(mids) >= 1
    assert len(mids) == -(-(n - 2 * end) // middle)  # as few as cover the middle


@given(n=hst.integers(1, 64))
def test_the_candidates_start_with_the_default_and_commit_differently(n: int) -> None:
    got = live_tune.candidates(n, (1, 1, 2))
    points = [frozenset(_schedule(n, g)) for g in got]
    assert got[0] == (1, 1, 2) and len(set(points)) == len(points) and all(points)
    if n == 16:
        assert got == [(1, 1, 2), (2,), (2, 4, 4, 4, 2), (3, 5, 5, 3)]


class Clock:
    """A clock the test moves: it reads ``t``, which the test advances by each call's period."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@settings(max_examples=40, deadline=None)
@given(
    base=hst.lists(hst.floats(1.0, 2.0), min_size=2, max_size=4),
    lag=hst.lists(hst.floats(0.0, 3.0), min_size=4, max_size=4),
    noise=hst.lists(hst.floats(0.0, 0.5), min_size=64, max_size=64),
    warmup=hst.integers(0, 3),
    block=hst.integers(2, 4),
    rounds=hst.integers(1, 4),
)
def test_the_tuner_keeps_the_schedule_whose_calls_came_fastest(base, lag, noise, warmup, block, rounds) -> None:
    """A call's period is its schedule's base plus noise plus the lag the call before
    it left (as in a loop that waits for a step's result after starting the next), the
    first call of each schedule ten more (a graph built). The tuner runs the warmup on
    the first schedule, then ``block`` calls of each schedule in turn, ``rounds``
    times, and keeps the schedule with the least median of the periods whose two calls
    are one block's, computed here from the periods given; then it stays."""
    n = 16
    schedules = [(k + 1,) for k in range(len(base))]
    clock = Clock()
    tuner = live_tune.ScheduleTuner(n, schedules, warmup=warmup, block=block, rounds=rounds, clock=clock)
    c = len(schedules)
    kept: list[list[float]] = [[] for _ in schedules]
    before = 0  # the schedule of the call before
    for i in range(warmup + c * block * rounds):
        got = tuner.next()
        k = i - warmup
        which = 0 if k < 0 else (k // block) % c
        assert got == frozenset(_schedule(n, schedules[which]))
        period = (
            base[which] + lag[before] + noise[i % len(noise)] + (10.0 if 0 <= k < c * block and k % block == 0 else 0.0)
        )
        if k >= 0 and k % block:  # both calls this schedule's: the period as the clock will read it
            # (a difference of two readings, rounded as floats round: bases an ulp apart can tie there)
            kept[which].append((clock.t + period) - clock.t)
            assert before == which
        clock.t += period
        before = which
        assert tuner.chosen is None
    medians = [statistics.median(p) for p in kept]
    best = min(range(c), key=lambda j: (medians[j], j))
    for _ in range(3):
        assert tuner.next() == frozenset(_schedule(n, schedules[best]))
        clock.t += 100.0  # a slow call after the choice changes nothing
    assert tuner.chosen == best and tuner.report()["chosen"] == ",".join(map(str, schedules[best]))
    assert tuner.report()["medians"] == pytest.approx(medians)

    def unread() -> float:
        raise AssertionError("a settled tuner read its clock: a call's dispatch pays for nothing it uses")

    tuner.clock = unread
    assert tuner.next() == frozenset(_schedule(n, schedules[best]))


def test_a_tuner_refuses_what_it_cannot_rank() -> None:
    for kw in ({"rounds": 0}, {"warmup": -1}, {"block": 1}):
        with pytest.raises(ValueError, match="a tuner needs"):
            live_tune.ScheduleTuner(4, [(1,), (2,)], **kw)
    with pytest.raises(ValueError, match="a tuner needs"):
        live_tune.ScheduleTuner(4, [])


@pytest.mark.parametrize(
    ("value", "want"), [("tune", (1, 1, 2)), (" tune ", (1, 1, 2)), ("tune,2", None), ("Tune", None)]
)
def test_tune_reads_as_the_default_schedule_for_the_cost_model(monkeypatch, value, want) -> None:
    assert_env_setting(monkeypatch, "SEGC_LIVE_COMMITS", value, live.live_commits, want)


def test_a_staged_segment_tunes_its_commits_and_keeps_eager_s_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four layers in one segment, ``SEGC_LIVE_COMMITS=tune``, a clock the test moves:
    a call committing after the second and fourth layers alone (every second) takes 1,
    any other 3. Every call commits where the tuner's turn says (spelled out here) and
    gives eager's bytes; once tuned, every second stays."""
    layers, offset = 4, 5
    monkeypatch.setenv("SEGC_LIVE_COMMITS", "tune")
    clock = Clock()
    monkeypatch.setattr(live_tune, "CLOCK", clock)
    committed: list[int] = []
    real = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: committed.append(1) or real(*a))
    eqns, avals, ins, outs, consts = _layers(layers)
    fn = live.compile_segment(_fn(eqns, avals, ins, outs, consts, Live(monkeypatch)), live.live_commits())
    tuner = fn.tuner
    tried = live_tune.candidates(layers, (1, 1, 2))
    assert tuner is not None and tuner.schedules == tried == [(1, 1, 2), (2,), (3,)]
    vals = _values(avals, ins, offset, seed=layers)
    vals[ins.index("off")] = kvcache.position(offset)
    _, want = _eager_layers(dict(zip(ins, vals, strict=True)), layers, offset + 1)
    c, w, b, r = len(tried), live_tune.WARMUP, live_tune.BLOCK, live_tune.ROUNDS
    for i in range(w + c * b * r + 3):
        k = i - w
        expect = tried[0] if k < 0 else tried[(k // b) % c] if k < c * b * r else (2,)
        committed.clear()
        got = fn(*vals)
        assert len(committed) == len(_schedule(layers, expect)), (i, expect)
        for x, y in zip(got, want, strict=True):
            assert same_bits(x, y)
        clock.t += 1.0 if expect == (2,) else 3.0
    assert tuner.report()["chosen"] == "2"
    # the same segment built again (a retrace for a grown cache) keeps the choice, untuned;
    # another shape (two layers) tunes afresh
    again = live.compile_segment(_fn(eqns, avals, ins, outs, consts, Live(monkeypatch)), live.live_commits())
    assert again.tuner.chosen == tried.index((2,)) and again.tuner.report()["chosen"] == "2"
    committed.clear()
    for x, y in zip(again(*vals), want, strict=True):
        assert same_bits(x, y)
    assert len(committed) == 2  # after the second and fourth layers
    eqns2, avals2, ins2, outs2, consts2 = _layers(2)
    other = live.compile_segment(_fn(eqns2, avals2, ins2, outs2, consts2, Live(monkeypatch)), live.live_commits())
    assert other.tuner is not None and other.tuner.chosen is None


def test_no_tuner_where_nothing_commits_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a policy that makes no commit inside a segment (the executor passes no
    schedule) tuning stays off: the plain staged function, and a segment of one layer,
    whose candidates all commit after its one live step."""
    monkeypatch.setenv("SEGC_LIVE_COMMITS", "tune")
    for layers, groups in ((4, ()), (1, (1, 1, 2))):
        eqns, avals, ins, outs, consts = _layers(layers)
        fn = live.compile_segment(_fn(eqns, avals, ins, outs, consts, Live(monkeypatch)), groups)
        assert fn.tuner is None
