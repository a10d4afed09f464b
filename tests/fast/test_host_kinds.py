"""The host's figures measured apart from any plan (issue 15; ``segc.research.calibrate``:
``host_kinds``, ``fit_host_kinds``, ``calibrate(host=...)``). The fit is checked on
times made by hand from known figures; the grid and the segments it times against
eager MLX's bytes. No timing is asserted."""

from __future__ import annotations

import importlib
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segc.errors import ScheduleError
from segc.passes.costmodel import H200
from segc.research.calibrate import HostKinds, calibrate, fit_host_kinds, host_kinds, host_segment, with_host_kinds

GRID = [(s, p, e) for s in (5, 9, 17) for p in (2, 4) for e in (0, p)]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    seg=st.floats(1e-6, 1e-4),
    prod=st.floats(1e-6, 1e-4),
    elem=st.floats(1e-7, 1e-5),
)
def test_fit_recovers_the_figures_that_made_the_times(seg: float, prod: float, elem: float) -> None:
    rows = [(s, p, e, s * (seg + p * prod + e * elem)) for s, p, e in GRID]
    got = fit_host_kinds(rows)
    assert got == pytest.approx((seg, prod, elem), rel=1e-6)


def test_fit_by_hand() -> None:
    # 10 us a segment, 20 us a product, 5 us an elementwise kernel: 2 segments of 3
    # products and 1 elementwise kernel take 2 * (10 + 60 + 5) = 150 us
    rows = [(1, 1, 0, 30e-6), (2, 3, 1, 150e-6), (4, 2, 2, 4 * (10 + 40 + 10) * 1e-6), (3, 1, 1, 3 * 35e-6)]
    assert fit_host_kinds(rows) == pytest.approx((10e-6, 20e-6, 5e-6), rel=1e-9)


@pytest.mark.parametrize(("products", "elementwise"), [(1, 0), (2, 1), (3, 3)])
def test_a_timed_segment_is_eagers_computation(products: int, elementwise: int) -> None:
    w = (mx.random.normal((16, 16), key=mx.random.key(1)) / 4).astype(mx.bfloat16)
    x = mx.random.normal((16,), key=mx.random.key(2)).astype(mx.bfloat16)
    ref = x
    for i in range(products):  # written out here, not taken from the code under test
        ref = (ref[None] @ w)[0]
        if i < elementwise:
            ref = ref * mx.sigmoid(ref) * 1.5
    got = mx.compile(host_segment(w, products, elementwise))(x)
    mx.eval(got, ref)
    assert np.asarray(got.view(mx.uint16)).tobytes() == np.asarray(ref.view(mx.uint16)).tobytes()


def test_the_grid_is_timed_and_fitted() -> None:
    hk = host_kinds(size=32, segments=(2, 3), products=(1, 2), repeats=2)
    assert [r[:3] for r in hk.rows] == [
        (2, 1, 0),
        (2, 1, 1),
        (2, 2, 0),
        (2, 2, 2),
        (3, 1, 0),
        (3, 1, 1),
        (3, 2, 0),
        (3, 2, 2),
    ]
    assert all(r[3] > 0 for r in hk.rows)
    assert (hk.segment, hk.product, hk.elementwise) == fit_host_kinds(hk.rows)
    assert hk.same == (True,) * 8  # every grid point gave eager MLX's bytes


def test_the_grids_figures_in_a_machine_model() -> None:
    hk = HostKinds(27e-6, 30e-6, 3e-6, ())
    m = with_host_kinds(replace(H200, commit_s=2e-6), hk)
    # a segment's 27 us less the model's 2 us commit; an elementwise kernel a tenth of a product
    assert (m.dispatch_s, m.host_op_s, m.elementwise_host) == pytest.approx((25e-6, 30e-6, 0.1), rel=1e-12)
    assert (m.launch_s, m.bytes_per_s, m.commit_s) == (H200.launch_s, H200.bytes_per_s, 2e-6)
    # an elementwise kernel dearer than a product counts as one
    assert with_host_kinds(H200, HostKinds(27e-6, 30e-6, 45e-6, ())).elementwise_host == 1.0


def test_calibrate_refuses_an_unknown_host_measurement() -> None:
    with pytest.raises(ScheduleError, match="host must be 'auto', 'kinds' or 'chain', not 'grid'"):
        calibrate(host="grid")


def test_calibrate_refuses_a_grid_that_fits_no_positive_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host too noisy for the grid (a figure at or below zero) is a clear error, not a
    machine model with a negative cost in it."""
    cal = importlib.import_module("segc.research.calibrate")  # the package re-exports a function of that name

    rows = ((5, 2, 0, 1e-4), (9, 2, 0, 1e-4))
    monkeypatch.setattr(cal, "host_kinds", lambda **_: cal.HostKinds(-1e-6, 2e-5, 1e-6, rows))
    with pytest.raises(ScheduleError, match="the host's figures came out as -1e-06 s a segment"):
        calibrate(host="kinds", repeats=1)


def test_calibrate_takes_the_grids_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    cal = importlib.import_module("segc.research.calibrate")  # the package re-exports a function of that name

    monkeypatch.setattr(cal, "host_kinds", lambda **_: cal.HostKinds(20e-6, 16e-6, 4e-6, ()))
    m = calibrate(host="kinds", repeats=1)
    assert (m.dispatch_s, m.host_op_s, m.elementwise_host) == (20e-6, 16e-6, 0.25)
