"""Calibration by whole-call timings (issue 15): the commit-aware pipeline worked out by
hand, and the fitter (``segc.research.fit``) recovering a known machine model from
timings that the cost model generated with it (through ``SegmentTime.retimed`` and
``costmodel.timed``, not the fitter's own vectorised evaluation). No MLX runs here."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from segc.errors import SegcError
from segc.passes.commits import commit_count
from segc.passes.costmodel import MachineModel, SegmentTime, pipeline_time, timed
from segc.research.fit import Observation, fit_machine, predict_many

BASE = MachineModel("base", 1e12, 1e11, 1e-6, 1e-6, 1e-7, "by hand", 0.0, 0.0, "gpu")
FIGURES = ("launch_s", "dispatch_s", "host_op_s", "commit_s", "segment_sq_s")


def test_pipeline_with_commits_by_hand() -> None:
    # three segments, host 1 each (pre 0.5), device 2 each, a commit costs 0.25 and is
    # made after segments 1 and 3 (3: the call's end)
    host, dev, pre = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [0.5, 0.5, 0.5]
    # segment 1 commits: released at 0.5 + 0.25, host at 1.25, device done at 2.75;
    # segment 2 waits (host 2.25); segment 3 commits: released at 2.25 + 0.5 + 0.25 = 3,
    # host at 3.5; segments 2 and 3 run from max(2.75, 3) = 3 to 7
    assert pipeline_time(host, dev, pre, [True, False, True], 0.25) == pytest.approx(7.0)
    # nothing committed until the end: everything starts at 2 + 0.5 + 0.25
    assert pipeline_time(host, dev, pre, [False, False, False], 0.25) == pytest.approx(2.75 + 6)
    # a commit per segment at no cost: the seed's pipeline, D = max(max(D, H + pre) + d, H)
    assert pipeline_time(host, dev, pre, [True] * 3) == pytest.approx(pipeline_time(host, dev, pre))
    assert pipeline_time(host, dev, pre) == pytest.approx(0.5 + 6)
    # the flagged segments, and the call's mx.eval unless the last segment committed itself
    flags = [(), (False,), (True, False, False), (True, True, True), (False, True), (False, False)]
    assert [commit_count(f) for f in flags] == [0, 1, 2, 3, 1, 1]


def _layers(n: int, per: int, kernels: int, work: float, head: tuple[int, float] = (3, 0.0)) -> list[SegmentTime]:
    """``n`` identical layers in segments of ``per``, then a head segment of its own;
    committed after segments 1, 2, 4, 8, ... (the geometric policy) and at the end."""
    segs, i = [], 0
    while i < n:
        m = min(per, n - i)
        segs.append(SegmentTime(f"s{i}", m, 0.0, 0.0, 0.0, 0.0, kernels * m, work * m))
        i += m
    segs.append(SegmentTime("head", 1, 0.0, 0.0, 0.0, 0.0, head[0], head[1] or work))
    return [replace(s, commit=(k + 1) & k == 0) for k, s in enumerate(segs)]


def _truth(scale: float, **fig: float) -> MachineModel:
    return replace(BASE, flops_per_s=BASE.flops_per_s / scale, bytes_per_s=BASE.bytes_per_s / scale, **fig)


def _observe(truth: dict[str, MachineModel], groups: dict[str, tuple[int, float]]) -> list[Observation]:
    """Synthetic timings: each group's plans (1 to 16 layers a segment) predicted by the
    cost model with that group's true machine model."""
    obs = []
    for g, (kernels, work) in groups.items():
        for per in (16, 8, 5, 4, 3, 2, 1):
            segs = _layers(16, per, kernels, work)
            obs.append(Observation(g, tuple(segs), _seconds(truth[g], segs), f"{g}/{per}"))
    return obs


def _seconds(m: MachineModel, segs: list[SegmentTime]) -> float:
    """The cost model's time for segments costed at ``BASE``'s rates, under ``m``."""
    sc = BASE.bytes_per_s / m.bytes_per_s
    return timed([replace(s, work=s.work * sc).retimed(m) for s in segs], m).total


GROUPS = {"decode": (14, 30e-6), "prefill": (14, 1.5e-3)}
TRUE = {"launch_s": 3e-6, "dispatch_s": 2e-5, "host_op_s": 1e-6, "commit_s": 1.3e-4, "segment_sq_s": 2e-9}


def test_fit_recovers_a_shared_scale_and_every_overhead() -> None:
    truth = _truth(1.7, **TRUE)
    obs = _observe(dict.fromkeys(GROUPS, truth), GROUPS)
    fit = fit_machine(BASE, obs, scales="shared", prior_weight=0)
    assert set(fit.free) == {"scale", *FIGURES}
    for f in FIGURES:
        assert getattr(fit.machine, f) == pytest.approx(TRUE[f], rel=0.02), f
    assert fit.scales == {"decode": pytest.approx(1.7, rel=0.02), "prefill": pytest.approx(1.7, rel=0.02)}
    assert fit.machine.bytes_per_s == pytest.approx(truth.bytes_per_s, rel=0.02)


def test_fit_recovers_a_scale_per_group() -> None:
    """With a scale per workload, ``launch_s`` is only weakly told from the scales (the
    layers' work per kernel is the same): it is held at the truth, the rest fitted. The
    host's figures show in a host-bound decode (a GPU's: a few us of work per layer);
    were every workload device-bound, only the first commit's delay would show them,
    which does not tell a segment's dispatch from a commit."""
    truth = {"decode": _truth(2.5, **TRUE), "prefill": _truth(0.6, **TRUE)}
    base = replace(BASE, launch_s=TRUE["launch_s"], segment_sq_s=TRUE["segment_sq_s"])
    groups = {"decode": (14, 3e-6), "prefill": GROUPS["prefill"]}
    free = ("scale", "dispatch_s", "host_op_s", "commit_s")
    fit = fit_machine(base, _observe(truth, groups), free=free, prior_weight=0)
    assert fit.scales == {"decode": pytest.approx(2.5, rel=0.02), "prefill": pytest.approx(0.6, rel=0.02)}
    for f in ("dispatch_s", "host_op_s", "commit_s"):
        assert getattr(fit.machine, f) == pytest.approx(TRUE[f], rel=0.03), f
    for g, m in fit.machines.items():
        assert m.flops_per_s == pytest.approx(truth[g].flops_per_s, rel=0.02)


def test_overheads_per_group() -> None:
    """Two workloads whose kernels cost the host differently (a commit 50 us in one, 150
    us in the other): with ``overheads="group"`` each group's timings, generated by the
    cost model with its own true machine model, are reproduced, and the host-bound
    group with enough segments gives back its true figures; one shared set of
    overheads cannot reproduce both (a plan 26% off)."""
    a = {"dispatch_s": 1e-5, "host_op_s": 5e-7, "commit_s": 5e-5}
    b = {"dispatch_s": 3e-5, "host_op_s": 1.5e-6, "commit_s": 1.5e-4}
    fixed = {"launch_s": 3e-6, "segment_sq_s": 2e-9}
    truth = {"decode": _truth(2.5, **a, **fixed), "prefill": _truth(0.8, **b, **fixed)}
    obs = _observe(truth, {"decode": (14, 3e-6), "prefill": (20, 1e-5)})
    base = replace(BASE, launch_s=fixed["launch_s"], segment_sq_s=fixed["segment_sq_s"])
    free = ("scale", "dispatch_s", "host_op_s", "commit_s")

    def worst(fit: Any) -> float:
        return max(abs(_seconds(fit.machines[o.group], list(o.segments)) / o.seconds - 1) for o in obs)

    fit = fit_machine(base, obs, free=free, prior_weight=0, overheads="group")
    assert worst(fit) < 1e-3 and fit.observations == len(obs) and fit.free == free
    assert fit.scales["prefill"] == pytest.approx(0.8, rel=0.02)
    for f, v in b.items():
        assert getattr(fit.machines["prefill"], f) == pytest.approx(v, rel=0.02), f
    shared = fit_machine(base, obs, free=free, prior_weight=0)
    assert worst(shared) > 0.1 and shared.machines["decode"].commit_s == shared.machines["prefill"].commit_s
    with pytest.raises(SegcError, match="overheads must be"):
        fit_machine(base, obs, overheads="workload")


@settings(max_examples=examples(8), deadline=None, derandomize=True)
@given(
    scale=st.floats(0.3, 5.0),
    launch=st.floats(-6.5, -5.0),
    dispatch=st.floats(-5.5, -4.0),
    host_op=st.floats(-7.0, -5.5),
    commit=st.floats(-5.0, -3.5),
)
def test_fitted_predictions_reproduce_the_timings(
    scale: float, launch: float, dispatch: float, host_op: float, commit: float
) -> None:
    """Whatever the true figures (within the bounds), the fitted model predicts the
    synthetic timings again (a loss near zero), whether or not every figure could be
    told apart."""
    fig = dict(zip(FIGURES, (10**launch, 10**dispatch, 10**host_op, 10**commit)))
    obs = _observe(dict.fromkeys(GROUPS, _truth(scale, **fig)), GROUPS)
    fit = fit_machine(BASE, obs, scales="shared", prior_weight=0)
    for o in obs:
        assert _seconds(fit.machines[o.group], list(o.segments)) == pytest.approx(o.seconds, rel=0.02), o.name


def test_the_prior_holds_what_the_timings_cannot_see() -> None:
    """Segments of no kernels: ``launch_s`` and ``host_op_s`` change no prediction, so
    the prior (on by default) keeps them at the base model's figures; the scale, which
    shows, is still fitted."""
    truth = _truth(1.5, **TRUE)
    obs = []
    for per in (8, 4, 2, 1):
        segs = [replace(s, kernels=0) for s in _layers(8, per, 1, 1e-4)]
        obs.append(Observation("g", tuple(segs), _seconds(truth, segs)))
    base = replace(BASE, dispatch_s=TRUE["dispatch_s"], commit_s=TRUE["commit_s"])
    fit = fit_machine(base, obs, free=("scale", "launch_s", "host_op_s"))
    assert (fit.machine.launch_s, fit.machine.host_op_s) == (pytest.approx(1e-6), pytest.approx(1e-7))
    assert fit.scales["g"] == pytest.approx(1.5, rel=0.01)


def test_the_fitters_evaluation_is_the_cost_models() -> None:
    m = _truth(2.0, **TRUE)
    obs = _observe({"decode": m}, {"decode": GROUPS["decode"]})
    vals: dict[str, Any] = {f: [getattr(m, f)] for f in FIGURES} | {"scale": [2.0]}
    import numpy as np

    got = predict_many(obs, BASE, {k: np.array(v) for k, v in vals.items()})[0]
    assert got == pytest.approx([o.seconds for o in obs], rel=1e-12)


def test_a_commit_per_segment_leaves_commit_s_alone() -> None:
    """Under the policy "segment" a commit only adds to the per-segment dispatch: the fit
    does not pretend to tell them apart."""
    segs = [replace(s, commit=True) for s in _layers(8, 2, 10, 1e-4)]
    obs = [Observation("g", tuple(segs[:k]), 1e-3 * k) for k in range(2, 6)]
    fit = fit_machine(replace(BASE, commit_s=7e-6), obs)
    assert "commit_s" not in fit.free and fit.machine.commit_s == 7e-6


@pytest.mark.parametrize(
    ("obs", "msg"),
    [
        ([], "at least one measured plan"),
        ([Observation("g", (), 0.0)], "positive number"),
        ([Observation("g", (), math.nan)], "positive number"),
    ],
)
def test_bad_observations(obs: list[Observation], msg: str) -> None:
    with pytest.raises(SegcError, match=msg):
        fit_machine(BASE, obs)


def test_host_times_give_back_the_host_figures_of_a_device_bound_workload() -> None:
    """A device-bound workload's whole-call times show its host figures only through the
    first commit's delay; the host's own time until the call returns (``timed().host``,
    generated by the cost model, not the fitter's vectorised evaluation) pins them."""
    from segc.research.fit import predict_host_many

    truth = _truth(1.3, **TRUE)
    obs = []
    for per in (16, 8, 5, 4, 3, 2, 1):
        segs = _layers(16, per, 14, 1.5e-3)
        sc = BASE.bytes_per_s / truth.bytes_per_s
        tp = timed([replace(s, work=s.work * sc).retimed(truth) for s in segs], truth)
        obs.append(Observation("prefill", tuple(segs), tp.total, str(per), tp.host))
    vals = {f: np.array([TRUE[f]]) for f in ("dispatch_s", "host_op_s", "commit_s")}
    assert predict_host_many(obs, BASE, vals)[0] == pytest.approx([o.host for o in obs], rel=1e-9)
    base = replace(BASE, launch_s=TRUE["launch_s"], segment_sq_s=TRUE["segment_sq_s"])
    free = ("scale", "dispatch_s", "host_op_s", "commit_s")
    fit = fit_machine(base, obs, free=free, prior_weight=0, host_weight=1.0)
    for f in ("dispatch_s", "host_op_s", "commit_s"):
        assert getattr(fit.machine, f) == pytest.approx(TRUE[f], rel=0.03), f
    assert fit.scales["prefill"] == pytest.approx(1.3, rel=0.02)


def _repeating_plans(truth: MachineModel) -> list[Observation]:
    """Plans of 16 decode layers, 16 to 1 layers a segment, whose segments of equal size
    repeat the first of that size (``SegmentTime.repeat``), timed by the cost model
    under ``truth``."""
    obs = []
    for per in (16, 8, 5, 4, 3, 2, 1):
        segs, seen = [], set()
        for s in _layers(16, per, 14, 3e-6):
            segs.append(replace(s, repeat=s.ops in seen and s.name != "head"))
            seen.add(s.ops)
        sc = BASE.bytes_per_s / truth.bytes_per_s
        tp = timed([replace(s, work=s.work * sc).retimed(truth) for s in segs], truth)
        obs.append(Observation("decode", tuple(segs), tp.total, str(per), tp.host))
    return obs


@pytest.mark.parametrize("figure, value", [("repeat_s", 1.5e-5), ("repeat_op_s", 8e-7)])
def test_fit_recovers_the_hosts_saving_on_a_repeated_segment(figure: str, value: float) -> None:
    """From timings the cost model generated with a saving on each repeated segment
    (``repeat_s`` = 15 us) or on each equation of one (``repeat_op_s`` = 0.8 us, what
    the experiment fits), host-bound decode layers, the fit finds it; the fitter's host
    times are the cost model's; with no segment repeated it cannot be told from the
    dispatch and is left alone."""
    from segc.research.fit import predict_host_many

    true = dict(TRUE, **{figure: value})
    obs = _repeating_plans(_truth(1.3, **true))
    assert sum(s.repeat for s in obs[-1].segments) == 15  # a layer a segment: all but the first repeat
    vals = {f: np.array([true[f]]) for f in ("dispatch_s", "host_op_s", "commit_s", figure)}
    assert predict_host_many(obs, BASE, vals)[0] == pytest.approx([o.host for o in obs], rel=1e-9)
    base = replace(BASE, launch_s=TRUE["launch_s"], segment_sq_s=TRUE["segment_sq_s"], commit_s=TRUE["commit_s"])
    free = ("scale", "dispatch_s", "host_op_s", figure)
    fit = fit_machine(base, obs, free=free, host_weight=1.0, prior_weight=0)
    for f in ("dispatch_s", "host_op_s", figure):
        assert getattr(fit.machine, f) == pytest.approx(true[f], rel=0.03), f
    same = [replace(o, segments=tuple(replace(s, repeat=False) for s in o.segments)) for o in obs]
    assert figure not in fit_machine(base, same, free=free).free


def test_a_device_time_per_segment_by_hand() -> None:
    """``segment_device_s`` is device time per command buffer: three device-bound
    segments of 10 us of work each, released at once (no host time), end at 3 x (10 +
    5) us with 5 us a segment, and a segment in two parts pays it twice."""
    m = replace(BASE, launch_s=0.0, dispatch_s=0.0, host_op_s=0.0, segment_device_s=5e-6)
    segs = [SegmentTime(f"s{k}", 1, 0.0, 0.0, 0.0, 0.0, 0, 1e-5) for k in range(3)]
    assert timed([s.retimed(m) for s in segs], m).total == pytest.approx(45e-6, rel=1e-12)
    parts = [replace(segs[0], work=5e-6), replace(segs[0], work=5e-6, part=1), *segs[1:]]
    assert timed([s.retimed(m) for s in parts], m).total == pytest.approx(50e-6, rel=1e-12)
    m0 = replace(m, segment_device_s=0.0)
    assert timed([s.retimed(m0) for s in segs], m0).total == pytest.approx(30e-6, rel=1e-12)


def test_fit_recovers_a_device_time_per_segment() -> None:
    """Timings the cost model generated with 40 us of device time per segment (decode
    layers on a fast host: device-bound plans, where each segment's extra shows): the
    fit finds it when asked; with every plan of as many segments it is left alone."""
    true = dict(TRUE, segment_device_s=4e-5)
    truth = _truth(1.3, **true)
    obs = _observe({"decode": truth}, {"decode": (14, 30e-6)})
    base = replace(BASE, launch_s=TRUE["launch_s"], segment_sq_s=TRUE["segment_sq_s"], commit_s=TRUE["commit_s"])
    free = ("scale", "dispatch_s", "host_op_s", "segment_device_s")
    fit = fit_machine(base, obs, free=free, prior_weight=0)
    assert fit.machine.segment_device_s == pytest.approx(4e-5, rel=0.03)
    assert fit.scales["decode"] == pytest.approx(1.3, rel=0.03)
    one = [o for o in obs if o.name == "decode/4"]
    assert "segment_device_s" not in fit_machine(base, one, free=free).free
    plain = fit_machine(base, obs, free=("scale", "dispatch_s", "host_op_s"), prior_weight=0)
    assert plain.loss > 10 * fit.loss  # without the term the timings cannot be fitted as well
