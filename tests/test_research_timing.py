"""The experiment's timing orders (``segc.research.timing``): ``"rounds"`` calls each
plan in turn, one untimed call then two timed ones a round; ``"blocks"`` calls each
plan back to back after warm-up calls of its own; ``"interleaved"`` one call of each
plan per round; an unknown order is refused. The calls are counted by stand-in
functions that record which one ran, so the order itself is what is checked."""

from __future__ import annotations

import mlx.core as mx
import pytest

from segc.errors import SegcError
from segc.research import Experiment, load_model, make_workload, run_experiment
from segc.research.timing import ORDERS, Job, Timed, adjust, blocks, round_robin, timed_calls


def _recorders(n: int, log: list[int]) -> list:
    def make(i: int):
        def fn(*args, **kwargs):
            log.append(i)
            return mx.array([i])

        return fn

    return [make(i) for i in range(n)]


@pytest.fixture(scope="module")
def workload():
    return make_workload("prefill:4", load_model("llama:layers=1,hidden=32"))


def test_blocks_run_each_plan_back_to_back_after_its_own_warmup(workload) -> None:
    log: list[int] = []
    got = blocks(_recorders(3, log), workload, 4, warmup=2, rotate=1)
    # plan 1 first (rotate), each plan 2 warm-up calls then 4 timed ones, nothing between
    assert log == [1] * 6 + [2] * 6 + [0] * 6
    assert [len(t.times) for t in got] == [4, 4, 4]
    assert all(len(t.host) == 4 and all(h <= w for h, w in zip(t.host, t.times)) for t in got)
    assert all(len(t.probe) == 4 and min(t.probe) > 0 for t in got)  # the host's speed before each call


def test_interleaved_calls_every_plan_once_a_round(workload) -> None:
    log: list[int] = []
    got = timed_calls(_recorders(3, log), workload, 2, "interleaved", rotate=2)
    assert log == [2, 0, 1, 2, 0, 1]
    assert [len(t.times) for t in got] == [2, 2, 2]
    log.clear()
    round_robin(_recorders(2, log), workload, 3)
    assert log == [0, 1] * 3


def test_rounds_of_short_blocks_each_after_a_call_of_its_own(workload) -> None:
    log: list[int] = []
    got = timed_calls(_recorders(2, log), workload, 5, "rounds", rotate=1)
    # three rounds (2 + 2 + 1 timed calls), each block one untimed call then the timed ones
    assert log == [1, 1, 1, 0, 0, 0] * 2 + [1, 1, 0, 0]
    assert [len(t.times) for t in got] == [5, 5]
    log.clear()
    blocks(_recorders(2, log), workload, 3, warmup=0, size=2)
    assert log == [0, 0, 1, 1, 0, 1]


def test_an_unknown_order_is_refused(workload) -> None:
    assert ORDERS == ("rounds", "blocks", "interleaved")
    with pytest.raises(SegcError, match="timing order must be one of"):
        timed_calls(_recorders(1, []), workload, 1, "shuffled")
    with pytest.raises(SegcError, match="order must be one of"):
        Experiment(order="shuffled").check()
    with pytest.raises(SegcError, match="host_weight must be >= 0"):
        Experiment(host_weight=-1.0).check()
    with pytest.raises(SegcError, match="time_limit must be > 0"):
        Experiment(time_limit=0).check()


def test_adjust_puts_every_call_at_the_hosts_median_speed() -> None:
    """By hand: within plan a's first process the time rises 2 s per second of probe,
    within b's too, the host share 1 s per second in both: slopes 2 and 1. a's second
    process is slower and probed slower throughout, but varies not within itself, so it
    sets no slope. Median probe 3: each call less slope x (probe - 3)."""
    a0 = Timed([10.0, 12.0, 14.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    a1 = Timed([100.0, 100.0], [9.0, 9.0], [5.0, 5.0])
    b0 = Timed([20.0, 24.0], [1.0, 3.0], [1.0, 3.0])
    ((ka0, ka1), (kb0,)), slopes = adjust([[a0, a1], [b0]])
    assert slopes == (2.0, 1.0)
    assert (ka0.times, ka1.times, kb0.times) == ([14.0, 14.0, 14.0], [96.0, 96.0], [24.0, 24.0])
    assert (ka0.host, ka1.host, kb0.host) == ([3.0, 3.0, 3.0], [7.0, 7.0], [3.0, 3.0])
    assert ka0.probe == a0.probe  # the probes as measured
    # a slope of 1 with t = 2.5 on 3 degrees of freedom (r^2 = 100/148): below SLOPE_T, none
    weak = Timed([2.0, 1.0, 4.0, 3.0, 6.0], [0.0] * 5, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert adjust([[weak]]) == ([[weak]], (0.0, 0.0))
    # the times' slope (3.47, t over SLOPE_T) would make the fourth call last
    # 0.04 - 3.47 x (1.3 - 1.2) < 0: none; the host shares' (0.65) leaves each positive
    short = Timed([0.01, 0.02, 0.03, 0.04, 10.0], [1.0, 1.1, 1.2, 1.3, 3.0], [1.0, 1.1, 1.2, 1.3, 4.0])
    ((kept,),), (bt, bh) = adjust([[short]])
    assert bt == 0.0 and kept.times == short.times
    assert bh == pytest.approx(0.6518, abs=1e-4) and all(h > 0 for h in kept.host)
    # calls timed without probes (runs before them): unchanged, no slope
    bare = Timed([1.0, 2.0], [0.1, 0.2])
    assert adjust([[bare]]) == ([[bare]], (0.0, 0.0))


def test_a_time_limit_leaves_fewer_timing_processes_not_none() -> None:
    """A limit already past when timing starts: the first process runs, no other does;
    every row says so and the log tells why."""
    said: list[str] = []
    exp = Experiment(
        models=["llama:layers=1,hidden=32"], workloads=["prefill:4"], strategies=["none", "balanced:2"],
        processes=3, repeats=2, warmup=0, plots=(), progress=False, time_limit=1e-3, log=said.append,
    )  # fmt: skip
    res = run_experiment(exp)
    assert [r["processes"] for r in res.rows] == [1, 1, 1]  # two plans and eager
    assert all(len(r["calls"]) == 1 and len(r["calls"][0]["times"]) == 2 for r in res.rows)
    assert said == ["llama:layers=1,hidden=32: 1 of 3 timing processes within the time limit"]
    assert Experiment().order == "rounds" and Job("m", "", "auto", 1, 0, []).order == "rounds"
