"""Noise statistics and held-out evaluation of the experiment harness (issue 15), on
timings and rows written by hand. No MLX runs here."""

from __future__ import annotations

import random
from typing import Any

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from segc.passes.costmodel import CPU
from segc.research.noise import measured, noise, separable_pairs, verdict
from segc.research.report import Results
from segc.research.sweep import spearman


def test_measured_and_separable_pairs_by_hand() -> None:
    # per-process medians 2, 4, 3: their median is 3
    assert measured([[1.0, 2.0, 9.0], [4.0, 4.0, 5.0], [3.0, 3.0, 3.0]]) == 3.0
    # one process: the calls' quartiles. a: 1..2, b: 3..4 (apart), c: 1.5..3.5 (overlaps both)
    a, b, c = [[1.0, 1.0, 2.0, 2.0]], [[3.0, 3.0, 4.0, 4.0]], [[1.5, 1.5, 3.5, 3.5]]
    assert separable_pairs([a, b, c]) == pytest.approx(1 / 3)
    # two processes: the quartiles of every call (1, 1, 2, 2 against 5, 5, 6, 6): apart;
    # (1, 1, 5, 5 against 4, 4, 6, 6): the second process's luck makes them overlap
    assert separable_pairs([[[1.0, 1.0], [2.0, 2.0]], [[5.0, 5.0], [6.0, 6.0]]]) == 1.0
    assert separable_pairs([[[1.0, 1.0], [5.0, 5.0]], [[4.0, 4.0], [6.0, 6.0]]]) == 0.0


def _plans(gaps: list[float], jitter: float, processes: int = 3, calls: int = 6, seed: int = 0) -> list:
    rnd = random.Random(seed)
    return [[[g + rnd.uniform(-jitter, jitter) for _ in range(calls)] for _ in range(processes)] for g in gaps]


def test_noise_tells_clear_differences_from_noise() -> None:
    clear = noise(_plans([1.0, 2.0, 3.0, 4.0, 5.0], 0.01), predicted=[1, 2, 3, 4, 5])
    assert clear["unit"] == "process medians" and clear["separable_pairs"] == 1.0
    assert clear["self_spearman"] == pytest.approx(1.0) and clear["ceiling"] == pytest.approx(1.0)
    assert clear["spearman_ci"] == [pytest.approx(1.0), pytest.approx(1.0)]
    blur = noise(_plans([1.0, 1.0001, 1.0002, 1.0003, 1.0004], 0.5))
    assert blur["self_spearman"] < 0.8 and blur["ceiling"] < 0.9 and blur["separable_pairs"] < 0.5
    one = noise(_plans([1.0, 2.0, 3.0], 0.01, processes=1))
    assert one["unit"] == "calls" and one["process_spread"] is None and one["enough"]
    assert clear["enough"] and not noise(_plans([1.0, 2.0, 3.0], 0.01, processes=2))["enough"]
    assert not noise(_plans([1.0, 2.0, 3.0], 0.01, calls=4))["enough"]


def test_verdict() -> None:
    assert verdict(0.9, 0.5) == "meets 0.8"
    assert verdict(0.3, 0.6).startswith("noise")
    assert verdict(0.3, 0.95).startswith("model")
    assert verdict(None, 0.9) == verdict(0.9, None) == "n/a"
    assert verdict(0.3, 0.95, enough=False).startswith("not enough timings")
    # too few timings: no verdict, however well the prediction ranks them (audit, bug 3)
    assert verdict(0.9, 0.95, enough=False).startswith("not enough timings")


def _row(workload: str, strategy: str, pred: float, meas: float, calib: bool | None, held: bool) -> dict[str, Any]:
    r: dict[str, Any] = {"model": "m", "workload": workload, "strategy": strategy, "predicted_s": pred}
    r |= {"measured_median_s": meas, "times_s": [[meas, meas * 1.01]]}
    if calib is not None:
        r |= {"calibration": calib, "held_out": held}
    return r


@settings(max_examples=examples(30), deadline=None, derandomize=True)
@given(
    held=st.lists(st.tuples(st.floats(1, 2), st.floats(1, 2)), min_size=3, max_size=6),
    calib=st.lists(st.tuples(st.floats(1, 2), st.floats(1, 2)), min_size=1, max_size=4),
    twin=st.booleans(),
)
def test_held_out_correlation_uses_no_calibration_plan(
    held: list[tuple[float, float]], calib: list[tuple[float, float]], twin: bool
) -> None:
    """The held-out correlation is over the held-out rows alone: whatever the calibration
    rows (and a twin of one, a plan cutting as a calibration plan does) hold, it is the
    Spearman of the held-out rows' own figures."""
    rows = [_row("w", f"h{i}", p, m, False, True) for i, (p, m) in enumerate(held)]
    rows += [_row("w", f"c{i}", p, m, True, False) for i, (p, m) in enumerate(calib)]
    if twin:
        rows.append(_row("w", "twin", 0.5, 9.0, False, False))
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["heldout_plans"] == len(held)
    assert s["spearman_heldout"] == spearman([p for p, _ in held], [m for _, m in held])
    everything = [(r["predicted_s"], r["measured_median_s"]) for r in rows]
    assert s["spearman_time"] == spearman([p for p, _ in everything], [m for _, m in everything])


def test_summary_without_calibration_has_no_held_out_figure() -> None:
    rows = [_row("w", f"p{i}", i, i + 0.5, None, False) for i in range(4)]
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["heldout_plans"] is None and s["spearman_heldout"] is None
    assert s["spearman_time"] == pytest.approx(1.0)
    assert s["verdict"].startswith("not enough timings")  # two calls a plan: no verdict
    assert s["noise"]["unit"] == "calls" and s["noise"]["separable_pairs"] == 1.0


def test_the_fastest_calls_correlation_reads_each_plans_minimum() -> None:
    """``spearman_min`` ranks the plans by their fastest call: here the reverse of their
    medians' order (each plan's minimum written in the row, as the experiment records
    it), so it is -1 where the medians' correlation is +1; a row without a minimum
    leaves it undefined rather than ranking the others."""
    rows = [_row("w", f"p{i}", i, 1 + i, False, True) for i in range(4)]
    for i, r in enumerate(rows):
        r["measured_min_s"] = 1.0 - 0.1 * i
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["spearman_time"] == pytest.approx(1.0) and s["spearman_heldout"] == pytest.approx(1.0)
    assert s["spearman_min"] == pytest.approx(-1.0) and s["spearman_min_heldout"] == pytest.approx(-1.0)
    del rows[0]["measured_min_s"]
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["spearman_min"] is None
