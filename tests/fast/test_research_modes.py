"""Process modes (``segc.research.noise.fast_mode``, issue 15): processes whose level
steps up by more than ``MODE_GAP`` over the next faster one start a slower mode, and the
fastest mode's figures are reported beside those over every process; checked on
timings built by hand and through the report."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from segc.passes.costmodel import CPU
from segc.research.noise import MODE_GAP, fast_mode, measured_in, noise
from segc.research.report import Results


def _times(factors: list[float], speeds: list[float], noise_of: dict[int, list[float]] | None = None) -> list:
    """plans x processes x 5 calls: a plan's factor times a process's speed, times the
    process's own per-plan disturbance where ``noise_of`` gives one."""
    out = []
    for j, f in enumerate(factors):
        row = []
        for i, s in enumerate(speeds):
            d = (noise_of or {}).get(i, [1.0] * len(factors))[j]
            row.append([f * s * d] * 5)
        out.append(row)
    return out


def test_two_groups_of_processes_split_at_the_step() -> None:
    # processes 0, 2, 3 run at 1.0-1.1, processes 1 and 4 at 1.5 and 1.6: a step of 1.36
    times = _times([1.0, 1.2, 1.4], [1.0, 1.5, 1.05, 1.1, 1.6])
    assert fast_mode(times) == [0, 2, 3]
    assert measured_in(times, [0, 2, 3]) == pytest.approx([1.05, 1.2 * 1.05, 1.4 * 1.05])
    stats = noise(times, [1.0, 2.0, 3.0])
    assert stats["modes"]["fast"] == [0, 2, 3] and stats["modes"]["slow"] == [1, 4]
    assert stats["modes"]["step"] == pytest.approx(1.5 / 1.1)
    assert stats["fast_mode"]["ceiling"] == pytest.approx(1.0)  # no noise within the mode


def test_no_step_no_modes() -> None:
    # levels 1.0, 1.15, 1.3, 1.45: each step under 1.2
    times = _times([1.0, 1.2, 1.4], [1.0, 1.15, 1.3, 1.45])
    assert fast_mode(times) is None
    assert "modes" not in noise(times)


def test_a_fast_mode_needs_enough_processes() -> None:
    times = _times([1.0, 1.2, 1.4], [1.0, 1.02, 2.0, 2.1, 2.2])  # two fast: too few to resample
    assert fast_mode(times) is None
    uneven = [*[t[:2] for t in times][:2], [[1.0] * 5]]  # plans timed in other processes
    assert fast_mode(uneven) is None


@settings(max_examples=examples(25), deadline=None, derandomize=True)
@given(
    fast=st.lists(st.floats(1.0, 1.1), min_size=3, max_size=5),
    slow=st.lists(st.floats(1.5, 2.0), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
)
def test_the_fast_mode_is_the_processes_below_the_step(fast: list[float], slow: list[float], seed: int) -> None:
    speeds = fast + slow
    order = np.random.default_rng(seed).permutation(len(speeds)).tolist()
    times = _times([1.0, 1.3, 1.7], [speeds[k] for k in order])
    want = sorted(i for i, k in enumerate(order) if k < len(fast))
    assert max(fast) * MODE_GAP < min(slow)  # the step the rule looks for
    assert fast_mode(times) == want


def _row(i: int, pred: float, times: list) -> dict[str, Any]:
    med = float(np.median([np.median(p) for p in times]))
    return {"model": "m", "workload": "w", "strategy": f"p{i}", "predicted_s": pred, "measured_median_s": med} | {
        "times_s": times
    }


def test_the_report_gives_the_fast_modes_correlation_beside_every_processes() -> None:
    """Four plans predicted in the order 0 < 1 < 2 < 3. Three fast processes agree with
    it; two slow ones (1.6x) reverse it and, being slow, only the medians over every
    process feel them. Over the fast mode: 1.0, whatever the slow ones do."""
    factors = [1.0, 1.1, 1.2, 1.3]
    reverse = [1.3 / f for f in factors]  # the slow processes time plan j as if it were plan 3 - j
    times = _times(factors, [1.0, 1.0, 1.6, 1.0, 1.6], {2: reverse, 4: reverse})
    rows = [_row(j, 0.1 * (j + 1), [t for t in times[j]]) for j in range(4)]
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["noise"]["modes"]["fast"] == [0, 1, 3]
    assert [r["measured_fast_s"] for r in rows] == pytest.approx(factors)
    assert s["spearman_fast"] == pytest.approx(1.0)
    assert s["spearman_time"] == pytest.approx(1.0)  # medians over five: the fast three still decide
    rows2 = [_row(j, 0.1 * (4 - j), [t for t in times[j]]) for j in range(4)]  # the reverse prediction
    (s2,) = Results(machine=CPU, rows=rows2, env={}).summary()
    assert s2["spearman_fast"] == pytest.approx(-1.0)
