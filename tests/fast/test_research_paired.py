"""The paired measurement (``segc.research.noise.paired``, issue 15): each process's
plan medians divided by their geometric mean over the plans, so that a process's own
speed cancels; checked against values worked out by hand, and through the report."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from segc.passes.costmodel import CPU
from segc.research.noise import measured_paired, noise, paired
from segc.research.report import Results

# three processes running at speeds 1, 2 and 4; plan P is 10% faster than Q in the
# first and third, 10% slower in the second. Two calls each, the same (medians = calls).
P = [[1.0, 1.0], [2.2, 2.2], [4.0, 4.0]]
Q = [[1.1, 1.1], [2.0, 2.0], [4.4, 4.4]]


def test_paired_divides_out_each_process_by_hand() -> None:
    got = measured_paired([P, Q])
    assert got is not None
    # the medians rank Q first (2.0 < 2.2); within processes P is faster in two of three
    g = math.exp(sum(math.log(x) for x in (1, 2.2, 4, 1.1, 2, 4.4)) / 6)
    assert got == pytest.approx([g / math.sqrt(1.1), g * math.sqrt(1.1)], rel=1e-12)
    assert got[0] < got[1]


def test_paired_of_a_common_factor_is_the_plans_own_ratio() -> None:
    meds = np.array([[1.0, 3.0, 7.0], [2.0, 6.0, 14.0]])  # plan 1 twice plan 0 in every process
    out = paired(meds)
    assert out[1] / out[0] == pytest.approx(2.0)


def test_paired_needs_the_same_processes_for_every_plan() -> None:
    assert measured_paired([P, Q[:2]]) is None
    assert measured_paired([P[:1], Q[:1]]) is None  # one process: nothing to pair


@settings(max_examples=examples(30), deadline=None, derandomize=True)
@given(
    plans=st.lists(st.floats(1.0, 2.0), min_size=3, max_size=6, unique=True),
    speeds=st.lists(st.floats(0.5, 4.0), min_size=2, max_size=5),
)
def test_paired_recovers_the_order_under_any_process_speeds(plans: list[float], speeds: list[float]) -> None:
    """Plans whose times are their own factor times a process's speed: the paired
    measurement orders them by that factor whatever the speeds."""
    times = [[[f * s, f * s] for s in speeds] for f in plans]
    got = measured_paired(times)
    assert got is not None
    assert np.argsort(got).tolist() == np.argsort(plans).tolist()


def _row(i: int, pred: float, times: list[list[float]]) -> dict[str, Any]:
    med = float(np.median([np.median(p) for p in times]))
    return {"model": "m", "workload": "w", "strategy": f"p{i}", "predicted_s": pred, "measured_median_s": med} | {
        "times_s": times
    }


def test_the_report_ranks_and_rates_by_the_paired_measurement() -> None:
    # P and Q as above, and a third plan R 1.5x P in every process; predicted P < Q < R
    # five calls a process (each process's calls as in P and Q): timings enough for a verdict
    p5, q5 = ([[x[0]] * 5 for x in t] for t in (P, Q))
    r_times = [[1.5 * x for x in p] for p in p5]
    rows = [_row(0, 1.0, p5), _row(1, 1.1, q5), _row(2, 1.5, r_times)]
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert [r["measured_paired_s"] < rows[2]["measured_paired_s"] for r in rows[:2]] == [True, True]
    assert rows[0]["measured_paired_s"] < rows[1]["measured_paired_s"]
    # the medians put Q before P (2.0 < 2.2): 0.5; paired: the predicted order, 1.0
    assert s["spearman_time"] == pytest.approx(0.5)
    assert s["spearman_paired"] == pytest.approx(1.0)
    assert "ceiling_paired" in s["noise"] and s["verdict"] == "meets 0.8"
    assert noise([p5, q5, r_times])["self_spearman_paired"] is not None


def test_the_report_gives_each_plans_time_error_by_hand() -> None:
    """Predicted 1.0, 1.1, 1.5 against medians 2.0, 2.0 and 1.5 (one process, one call
    each): errors 50%, 45% and 0%; mean 31.67%, largest 50%; held out (the last two) 22.5%."""
    rows = [_row(0, 1.0, [[2.0]]), _row(1, 1.1, [[2.0]]), _row(2, 1.5, [[1.5]])]
    rows[0]["calibration"] = True
    rows[1]["held_out"] = rows[2]["held_out"] = True
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["time_error_mean"] == pytest.approx((0.5 + 0.45 + 0.0) / 3)
    assert s["time_error_max"] == pytest.approx(0.5)
    assert s["time_error_heldout_mean"] == pytest.approx(0.225)
