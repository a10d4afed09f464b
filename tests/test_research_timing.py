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
from segc.research.timing import ORDERS, Job, blocks, round_robin, timed_calls


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
    assert all(len(r["times_s"]) == 1 and len(r["times_s"][0]) == 2 for r in res.rows)
    assert said == ["llama:layers=1,hidden=32: 1 of 3 timing processes within the time limit"]
    assert Experiment().order == "rounds" and Job("m", "", "auto", 1, 0, []).order == "rounds"
