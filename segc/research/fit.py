"""Fit a machine model to whole-call timings of plans (calibration plans).

Each :class:`Observation` is one plan of one workload: its segments as the cost model
costed them with a base machine model (``costmodel.predict_time(..., commit=...)``:
each segment's work at the base rates, its kernels, whether it is committed) and the
measured seconds of a call. :func:`fit_machine` finds the machine figures that predict
those seconds best: the per-kernel, per-segment and per-commit overheads and the
size term (``segment_sq_s``), shared by
every observation, and a throughput ``scale`` (the factor by which real kernels are
slower than the base rates: the bandwidth and FLOP rate are divided by it), one per
group (``scales="group"``: a decode step's small matrix-vector products and a
prefill's large products fall short of the base rates by different factors) or one for
all (``"shared"``), each within :data:`BOUNDS`.

The loss, per group of observations (a workload: its plans are what a rank correlation
compares), is the squared log error of the plans' differences from the group's mean
(what ranks plans) plus ``level_weight`` times that of the mean (the level), plus a
weak prior: ``prior_weight`` times each overhead's squared log10 distance from the base
model's figure (0.01: a tenfold change costs what four plans each 5% off do), so that a
figure the calibration plans hardly constrain stays near the base model's instead of
fitting their noise (four plans and four overheads can always be fitted exactly). It is
minimised in log space: a few thousand machine models drawn over the bounds, then
Levenberg-Marquardt from the best few, all evaluated at once
(``overlap.pipeline_time`` over numpy arrays). Deterministic for a seed.

With ``overheads="group"`` the overheads are fitted per group too (each group's
observations alone): the figures are effective ones, of the group's kernels (a
decode's matrix-vector products and small commits against a prefill's large products
and commits after every segment), and a rank correlation compares plans of one group
only, so a shared fit lets one workload's plans pull another's figures away from what
ranks its plans (docs/experiments-log.md, "The third run": the H200's prefill under
``auto``). The experiment's calibration fits this way; ``segc calibrate --fit``, whose
figures go to another model, shares them.

An observation may carry the host's measured time until the call returns
(``Observation.host``); with ``host_weight > 0`` each one's squared log error, times
that weight, joins the loss (:func:`predict_host_many`: every segment's dispatch and
kernels and every commit), which pins the host's figures where whole calls show them
only through the first commit's delay (a device-bound workload). Off in
:func:`fit_machine` by default; the experiment's calibration weighs them 1
(``Experiment.host_weight``) since its plans are no longer timed interleaved: measured
interleaved on the H200 it ranked decode plans worse (docs/experiments-log.md, "The sixth
and seventh runs"), measured as in use it ranks them better ("The seventeenth run").

A figure the observations cannot tell apart is left at the base model's value:
``commit_s`` when every segment of every observation is committed (it then only adds
to ``dispatch_s``), ``repeat_s`` (the host's saving on a segment that repeats an earlier
one's equations: ``costmodel``, "Repeats") when every observation repeats as many
segments, ``repeat_op_s`` (that saving per equation of the repeated segment, what the
experiment fits) when every observation repeats as many equations, ``segment_device_s``
(the device's time per command buffer beyond its kernels: on request) when every
observation has as many. The host's queue (``queue_kernels``) is the base model's, not
fitted: MLX's source fixes it; its device time follows the fitted launches and scale.
``launch_s`` and a scale are told apart only by segments whose
work per kernel differs (a shared scale over decode and prefill; with a scale per
workload only the head and the layers differ): weakly, so only their sum is
meaningful there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import SegcError
from ..passes.commits import commit_count
from ..passes.costmodel import MachineModel, SegmentTime, host_kernels
from ..passes.overlap import pipeline_time

BOUNDS: dict[str, tuple[float, float]] = {
    "scale": (1e-2, 1e2),
    "launch_s": (1e-8, 1e-3),
    "dispatch_s": (1e-7, 1e-2),
    "host_op_s": (1e-9, 1e-4),
    "commit_s": (1e-7, 1e-2),
    "encode_s": (1e-9, 1e-4),
    "segment_sq_s": (1e-13, 1e-5),
    "repeat_s": (1e-9, 1e-4),
    "repeat_op_s": (1e-12, 1e-5),
    "segment_device_s": (1e-9, 1e-3),
}
# figures at 0 in the built-in models, left to calibration: no prior pulls them to 0
ONLY_FITTED = ("repeat_s", "repeat_op_s", "segment_device_s")
FREE = ("scale", "launch_s", "dispatch_s", "host_op_s", "commit_s", "segment_sq_s")  # repeat_op_s: on request


@dataclass(frozen=True)
class Observation:
    group: str  # the workload: plans compared with each other
    segments: tuple[SegmentTime, ...]  # costed with the base machine model
    seconds: float  # measured, one call
    name: str = ""  # the plan, for reports
    host: float | None = None  # measured: the host's time until the call returns (None: not measured)


@dataclass(frozen=True)
class Fit:
    machines: dict[str, MachineModel]  # per group: the fitted overheads, the base rates / its scale
    scales: dict[str, float]  # per group: the work multiplier found
    loss: float
    free: tuple[str, ...]  # the figures fitted (the others kept from the base model)
    observations: int

    @property
    def machine(self) -> MachineModel:
        """The first group's model (every group's, with a shared scale)."""
        return next(iter(self.machines.values()))


def _figures(base: MachineModel, values: dict[str, np.ndarray]) -> Callable[[str], np.ndarray]:
    """A figure by name, one per machine model: ``values``' array, else the base model's
    (``scale``: 1) repeated."""
    p = len(next(iter(values.values()))) if values else 1

    def fig(name: str) -> np.ndarray:
        return values[name] if name in values else np.full(p, 1.0 if name == "scale" else getattr(base, name))

    return fig


def predict_many(obs: Sequence[Observation], base: MachineModel, values: dict[str, np.ndarray]) -> np.ndarray:
    """Seconds predicted for every observation (columns) under every machine model
    (rows) that ``values`` gives (figure -> array, one per model; figures not given are
    the base model's; ``scale`` multiplies the work, ``scale:GROUP`` that group's)."""
    fig = _figures(base, values)
    p = len(fig("scale"))
    names = (
        "launch_s",
        "dispatch_s",
        "host_op_s",
        "commit_s",
        "encode_s",
        "segment_sq_s",
        "repeat_s",
        "repeat_op_s",
        "segment_device_s",
    )
    ln, dp, ho, cm, en, sq, rp, ro, sd = (fig(n) for n in names)
    ew = base.elementwise_host
    out = np.empty((p, len(obs)))
    for j, o in enumerate(obs):
        sc = values.get(f"scale:{o.group}", fig("scale"))
        ks = [float(s.kernels) for s in o.segments]
        pre = [_pre(s, dp, ho, rp, ro, ew) for s in o.segments]
        host = [x + en * k for x, k in zip(pre, ks)]
        dev = [sc * s.work + ln * k + sq * k * k + sd for s, k in zip(o.segments, ks)]
        flags = [s.commit for s in o.segments]
        queue = [sc * s.queue_work + ln * s.queue_n for s in o.segments] if base.queue_kernels > 0 else None
        out[:, j] = pipeline_time(host, dev, pre, flags, cm, np.maximum, queue)
    return out


def _pre(
    s: SegmentTime, dp: np.ndarray, ho: np.ndarray, rp: np.ndarray, ro: np.ndarray, elementwise: float
) -> np.ndarray:
    """The host's seconds before the device may start ``s``, one per machine model
    (``SegmentTime.retimed``'s ``pre``): a segment's later command buffers (``part``) pay
    no dispatch of their own, a repeated one ``rp`` and ``ro`` per equation less, never
    below 0."""
    first = s.part == 0
    return np.maximum(dp * first + ho * host_kernels(s, elementwise) - (rp + ro * s.ops) * (s.repeat and first), 0.0)


def predict_host_many(obs: Sequence[Observation], base: MachineModel, values: dict[str, np.ndarray]) -> np.ndarray:
    """The host's seconds until the call returns (``costmodel.timed``'s ``host``: every
    segment's dispatch and kernels and every commit the loop makes), as
    :func:`predict_many` gives the whole call's."""
    fig = _figures(base, values)
    dp, ho, cm, en, rp, ro = (
        fig(n) for n in ("dispatch_s", "host_op_s", "commit_s", "encode_s", "repeat_s", "repeat_op_s")
    )
    out = np.empty((len(dp), len(obs)))
    for j, o in enumerate(obs):
        k = float(sum(s.kernels for s in o.segments))
        commits = commit_count(tuple(s.commit for s in o.segments))
        pre = sum(_pre(s, dp, ho, rp, ro, base.elementwise_host) for s in o.segments)
        out[:, j] = pre + en * k + commits * cm
    return out


def host_residuals(pred: np.ndarray, obs: Sequence[Observation], weight: float) -> np.ndarray:
    """Per row of ``pred`` (host seconds, models by observations): each measured host
    time's log error times ``sqrt(weight)``; none for observations without one."""
    have = [j for j, o in enumerate(obs) if o.host is not None and o.host > 0]
    if not have or weight <= 0:
        return np.zeros((pred.shape[0], 0))
    meas = np.log([obs[j].host for j in have])  # type: ignore[arg-type]
    return math.sqrt(weight) * (np.log(np.maximum(pred[:, have], 1e-300)) - meas[None, :])


def residuals(pred: np.ndarray, obs: Sequence[Observation], level_weight: float = 0.1) -> np.ndarray:
    """Per row of ``pred`` (models by observations), the loss's terms: per group, each
    plan's log error less the group's mean, then the mean times ``sqrt(level_weight *
    plans)``; the loss is their sum of squares."""
    err = np.log(np.maximum(pred, 1e-300)) - np.log([o.seconds for o in obs])[None, :]
    groups = [o.group for o in obs]
    parts = []
    for g in dict.fromkeys(groups):
        e = err[:, [j for j, x in enumerate(groups) if x == g]]
        mean = e.mean(axis=1, keepdims=True)
        parts += [e - mean, math.sqrt(level_weight * e.shape[1]) * mean]
    return np.concatenate(parts, axis=1)


def loss(pred: np.ndarray, obs: Sequence[Observation], level_weight: float = 0.1) -> np.ndarray:
    """Per row of ``pred`` (models by observations): the loss of the module docstring."""
    return (residuals(pred, obs, level_weight) ** 2).sum(axis=1)


def identifiable(obs: Sequence[Observation], free: Sequence[str], base: MachineModel) -> tuple[str, ...]:
    """``free`` less the figures the observations cannot determine (module docstring)."""
    every = all(s.commit for o in obs for s in o.segments)
    repeats = {sum(s.repeat for s in o.segments) for o in obs}
    repeated_ops = {sum(s.ops for s in o.segments if s.repeat and s.part == 0) for o in obs}
    buffers = {len(o.segments) for o in obs}
    return tuple(
        f
        for f in free
        if not (f == "commit_s" and every)
        and not (f == "repeat_s" and len(repeats) < 2)
        and not (f == "repeat_op_s" and len(repeated_ops) < 2)
        and not (f == "segment_device_s" and len(buffers) < 2)
    )


def fit_machine(
    base: MachineModel,
    obs: Sequence[Observation],
    *,
    free: Sequence[str] = FREE,
    scales: str = "group",
    level_weight: float = 0.1,
    prior_weight: float = 0.01,
    host_weight: float = 0.0,
    seed: int = 0,
    samples: int = 4096,
    starts: int = 16,
    rounds: int = 100,
    overheads: str = "shared",
) -> Fit:
    """The machine models (``base`` with the ``free`` figures fitted, per group) whose
    predictions fit the observations best (module docstring). ``overheads="group"``
    fits each group alone (its own overheads as well as its scale): the fits of the
    groups one by one, merged."""
    if not obs:
        raise SegcError("calibration needs at least one measured plan")
    if any(not (o.seconds > 0 and math.isfinite(o.seconds)) for o in obs):
        raise SegcError("calibration: every measured time must be a positive number")
    unknown = sorted(set(free) - set(BOUNDS))
    if unknown:
        raise SegcError(f"calibration: cannot fit {unknown}; figures: {sorted(BOUNDS)}")
    if scales not in ("group", "shared"):
        raise SegcError(f"calibration: scales must be 'group' or 'shared', not {scales!r}")
    if overheads not in ("group", "shared"):
        raise SegcError(f"calibration: overheads must be 'group' or 'shared', not {overheads!r}")
    groups = list(dict.fromkeys(o.group for o in obs))
    if overheads == "group" and len(groups) > 1:
        fits = [
            fit_machine(
                base,
                [o for o in obs if o.group == g],
                free=free,
                scales=scales,
                level_weight=level_weight,
                prior_weight=prior_weight,
                host_weight=host_weight,
                seed=seed,
                samples=samples,
                starts=starts,
                rounds=rounds,
            )
            for g in groups
        ]
        return Fit(
            {g: f.machines[g] for g, f in zip(groups, fits)},
            {g: f.scales[g] for g, f in zip(groups, fits)},
            sum(f.loss for f in fits),
            tuple(dict.fromkeys(x for f in fits for x in f.free)),
            len(obs),
        )
    free_ = identifiable(obs, free, base)
    names = [n for n in free_ if n != "scale"]
    if "scale" in free_:
        names += [f"scale:{g}" for g in groups] if scales == "group" else ["scale"]
    if not names:
        r0 = host_residuals(predict_host_many(obs, base, {}), obs, host_weight)
        f0 = float(loss(predict_many(obs, base, {}), obs, level_weight)[0] + (r0**2).sum())
        return Fit({g: base for g in groups}, dict.fromkeys(groups, 1.0), f0, (), len(obs))
    lo = np.log10([BOUNDS[n.partition(":")[0]][0] for n in names])
    hi = np.log10([BOUNDS[n.partition(":")[0]][1] for n in names])

    # the prior: each overhead's log10 distance from the base model's figure, weighted
    # (none for a figure the base model has at 0, which has no log10: ONLY_FITTED)
    prior = [
        i for i, n in enumerate(names) if not n.startswith("scale") and not (n in ONLY_FITTED and not getattr(base, n))
    ]
    x0 = np.clip(np.log10([max(getattr(base, names[i]), 1e-300) for i in prior]), lo[prior], hi[prior])

    def res(x: np.ndarray) -> np.ndarray:
        vals = {n: 10.0 ** x[:, i] for i, n in enumerate(names)}
        r = residuals(predict_many(obs, base, vals), obs, level_weight)
        rh = host_residuals(predict_host_many(obs, base, vals), obs, host_weight)
        r = np.concatenate([r, rh, math.sqrt(prior_weight) * (x[:, prior] - x0)], axis=1)
        return np.where(np.isfinite(r), r, 1e6)

    x = lo + (hi - lo) * np.random.default_rng(seed).random((samples, len(names)))
    best = _levenberg_marquardt(res, x[np.argsort((res(x) ** 2).sum(axis=1))[:starts]], lo, hi, rounds)
    f = float((res(best[None, :]) ** 2).sum())
    got: dict[str, Any] = {n: float(10.0 ** best[i]) for i, n in enumerate(names)}
    shared = got.pop("scale", 1.0)
    per = {g: got.pop(f"scale:{g}", shared) for g in groups}
    fitted = replace(base, **got)
    machines = {
        g: replace(fitted, flops_per_s=base.flops_per_s / sc, bytes_per_s=base.bytes_per_s / sc)
        for g, sc in per.items()
    }
    return Fit(machines, per, f, free_, len(obs))


def _levenberg_marquardt(
    res: Callable[[np.ndarray], np.ndarray], x: np.ndarray, lo: np.ndarray, hi: np.ndarray, rounds: int
) -> np.ndarray:
    """Least squares from every row of ``x`` at once (log10 figures, kept within
    ``[lo, hi]``; forward-difference Jacobians); the best point reached."""
    k, d = x.shape
    lam = np.full(k, 1e-2)
    r = res(x)
    f = (r**2).sum(axis=1)
    h = 1e-6
    for _ in range(rounds):
        steps = x[:, None, :] + h * np.eye(d)[None, :, :]  # k x d x d
        rj = res(steps.reshape(k * d, d)).reshape(k, d, -1)
        jac = (rj - r[:, None, :]) / h  # k x d x m: d residuals by figure
        jtj = jac @ jac.transpose(0, 2, 1)
        g = jac @ r[:, :, None]
        damp = jtj + lam[:, None, None] * (
            np.eye(d) * np.maximum(np.diagonal(jtj, axis1=1, axis2=2), 1e-12)[:, None, :]
        )
        try:
            delta = -np.linalg.solve(damp + 1e-18 * np.eye(d), g)[:, :, 0]
        except np.linalg.LinAlgError:
            delta = -g[:, :, 0] * 1e-3
        xn = np.clip(x + delta, lo, hi)
        rn = res(xn)
        fn = (rn**2).sum(axis=1)
        better = fn < f
        x = np.where(better[:, None], xn, x)
        r = np.where(better[:, None], rn, r)
        lam = np.where(better, lam / 3, np.minimum(lam * 4, 1e8))
        f = np.where(better, fn, f)
        if not better.any() and (lam > 1e4).all():  # every start stuck: a minimum each
            break
    return x[int(np.argmin(f))]
