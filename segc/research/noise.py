"""Is a measured difference between plans more than noise?

A plan's timings are ``times[process][call]``: calls in one process, over one or more
processes (``Experiment.processes``). Its measured time is the median over processes
of each process's median call. Three statistics, per set of plans:

- **separable pairs**: the fraction of plan pairs whose interquartile ranges do not
  overlap, the ranges taken over every call of every process (so that a process's
  luck widens them);
- **self-agreement**: Spearman's rank correlation between two independent bootstrap
  replicates of the measurement, the median over draws. A draw resamples the processes
  with replacement (the same ones for every plan: plans timed in one process share its
  luck) and each chosen process's calls, then takes each plan's median of medians. It
  estimates how well a second run would rank the plans as this one did; a predictor
  that knew the true times would reach about its square root (the **ceiling**);
- **confidence interval** of Spearman's correlation of the predictions with the
  measurement over the same draws (5% and 95%).

**Paired**: every process times every plan (round-robin), so a process that runs fast
or slow (its core, its clock, the machine's other load: process medians spread by
25-55% on the H200) is fast or slow for all its plans alike. The paired measurement
(:func:`paired`) divides each process's medians by their geometric mean over the plans
before taking each plan's median over processes (the overall level put back): the
plans' order within processes, with the processes' common factor removed, as a
benchmark compares variants against a baseline run beside them. ``self_spearman_paired``
and ``ceiling_paired`` are its self-agreement and ceiling, from the same draws.

**Modes**: on the H200 a prefill's processes fell into two groups (run AD: four at about
3.7 ms a call, four at 5.1-6.2 ms, eager's own call slower in the same four), and the
slower processes ranked the plans differently each time (two halves of them agreed at
0.21, two halves of the faster at 0.92). Where every plan was timed in the same
processes, :func:`fast_mode` sorts them by their level (the geometric mean of their
medians over the plans) and ends the fastest mode at the first step up of more than
:data:`MODE_GAP`; ``modes`` reports the split and ``fast_mode`` the statistics over the
fastest mode's processes alone, beside (never in place of) those over every process.

A correlation below the target with a ceiling below it too is noise; with a ceiling
above it, the model is wrong (:func:`verdict`). The bootstrap needs timings to resample:
under :data:`ENOUGH` (processes and calls each) there is no verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

Times = Sequence[Sequence[float]]  # per process, per call
ENOUGH = (3, 5)  # the fewest processes (or, in one process, calls) and calls per process for a verdict
MODE_GAP = 1.2  # a process this much slower than the next faster one starts a slower mode


def measured(times: Times) -> float:
    """The median over processes of each process's median call."""
    return statistics.median(statistics.median(p) for p in times)


def units(times: Times) -> list[float]:
    """The samples whose spread is the noise: per-process medians, or the calls of the
    only process."""
    return [statistics.median(p) for p in times] if len(times) >= 2 else list(times[0])


def separable_pairs(plans: Sequence[Times]) -> float | None:
    """The fraction of pairs of plans whose interquartile ranges (over every call) do
    not overlap."""
    iqr = []
    for t in plans:
        u = sorted(x for p in t for x in p)
        q = statistics.quantiles(u, n=4, method="inclusive") if len(u) >= 2 else [u[0]] * 3
        iqr.append((q[0], q[2]))
    pairs = [(a, b) for i, a in enumerate(iqr) for b in iqr[i + 1 :]]
    if not pairs:
        return None
    return sum(1 for a, b in pairs if a[1] < b[0] or b[1] < a[0]) / len(pairs)


def _array(plans: Sequence[Times]) -> np.ndarray:
    """plans x processes x calls, cut to the fewest processes and calls any plan has."""
    p = min(len(t) for t in plans)
    c = min(len(x) for t in plans for x in t[:p])
    return np.array([[list(x[:c]) for x in t[:p]] for t in plans], dtype=float)


def paired(meds: np.ndarray) -> np.ndarray:
    """``[..., plans, processes]`` per-process medians to ``[..., plans]``: each
    process's divided by their geometric mean over the plans, the median over processes,
    times the geometric mean of all (module docstring, "Paired")."""
    lg = np.log(meds)
    lg = lg - lg.mean(axis=-2, keepdims=True) + lg.mean(axis=(-2, -1), keepdims=True)
    return np.exp(np.median(lg, axis=-1))


def levels(plans: Sequence[Times]) -> np.ndarray:
    """Each process's level: the geometric mean over the plans of its median calls
    (every plan timed in the same processes)."""
    meds = np.array([[statistics.median(p) for p in t] for t in plans], dtype=float)
    return np.exp(np.log(meds).mean(axis=0))


def fast_mode(plans: Sequence[Times]) -> list[int] | None:
    """The processes of the fastest mode (module docstring, "Modes"), or None: plans
    not all timed in the same processes, no step up of more than :data:`MODE_GAP`
    between two processes' levels, or fewer than ``ENOUGH[0]`` processes below it."""
    if len({len(t) for t in plans}) != 1 or len(plans[0]) < 2:
        return None
    level = levels(plans)
    order = [int(i) for i in np.argsort(level)]
    for k in range(ENOUGH[0], len(order)):
        if level[order[k]] > MODE_GAP * level[order[k - 1]]:
            return sorted(order[:k])
    return None


def measured_in(plans: Sequence[Times], procs: Sequence[int]) -> list[float]:
    """Per plan, the median over the processes ``procs`` of each one's median call."""
    return [measured([t[i] for i in procs]) for t in plans]


def measured_paired(plans: Sequence[Times]) -> list[float] | None:
    """Per plan, the paired measurement; None unless every plan was timed in the same
    two or more processes."""
    if len({len(t) for t in plans}) != 1 or len(plans[0]) < 2:
        return None
    meds = np.array([[statistics.median(p) for p in t] for t in plans], dtype=float)
    return [float(x) for x in paired(meds)]


def bootstrap(plans: Sequence[Times], draws: int, rng: np.random.Generator, pair: bool = False) -> np.ndarray:
    """``draws`` x plans: each plan's median of per-process medians in a resample
    (module docstring), or with ``pair`` the paired measurement of it."""
    a = _array(plans)
    n, p, c = a.shape
    procs = rng.integers(0, p, size=(draws, 1, p, 1))
    calls = rng.integers(0, c, size=(draws, n, p, c))
    sel = a[np.arange(n)[None, :, None, None], procs, calls]
    meds = np.median(sel, axis=3)
    return paired(meds) if pair else np.median(meds, axis=2)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 0 along the last axis, ties sharing their average rank (as
    ``sweep.ranks``: plans that are the same plan are predicted alike)."""
    less = (x[..., None, :] < x[..., :, None]).sum(axis=-1)
    same = (x[..., None, :] == x[..., :, None]).sum(axis=-1)
    return less + (same - 1) / 2


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's correlation of each row of ``x`` with the same row of ``y`` (either may
    be one row, broadcast)."""
    rx, ry = _ranks(x), _ranks(y)
    rx = rx - rx.mean(axis=-1, keepdims=True)
    ry = ry - ry.mean(axis=-1, keepdims=True)
    den = np.sqrt((rx**2).sum(axis=-1) * (ry**2).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(axis=-1) / np.where(den > 0, den, 1), np.nan)


def noise(
    plans: Sequence[Times],
    predicted: Sequence[float] | None = None,
    draws: int = 1000,
    seed: int = 0,
    modes: bool = True,
) -> dict[str, Any]:
    """The statistics of the module docstring for a set of plans (at least three); with
    ``modes``, where the processes fall into modes, the same over the fastest one's
    processes (``fast_mode``)."""
    procs, calls = min(len(t) for t in plans), min(len(x) for t in plans for x in t)
    out: dict[str, Any] = {"unit": "process medians" if procs >= 2 else "calls"}
    out["enough"] = (procs >= ENOUGH[0] or (procs == 1 and calls >= ENOUGH[0])) and calls >= ENOUGH[1]
    out["separable_pairs"] = separable_pairs(plans)
    meds = [measured(t) for t in plans]
    out["plan_spread"] = float((max(meds) - min(meds)) / min(meds))
    spreads = [(max(u) - min(u)) / measured(t) for t in plans if len(t) >= 2 for u in [units(t)]]
    out["process_spread"] = float(statistics.median(spreads)) if spreads else None
    if len(plans) < 3:
        return out
    rng = np.random.default_rng(seed)
    a, b = bootstrap(plans, draws, rng), bootstrap(plans, draws, rng)
    rs = spearman_rows(a, b)
    rs = rs[np.isfinite(rs)]  # a draw of equal medians ranks nothing
    self_rho = float(np.median(rs)) if rs.size else None
    out["self_spearman"] = self_rho
    out["ceiling"] = math.sqrt(max(self_rho, 0.0)) if self_rho is not None else None
    if measured_paired(plans) is not None:
        pa, pb = bootstrap(plans, draws, rng, pair=True), bootstrap(plans, draws, rng, pair=True)
        ps = spearman_rows(pa, pb)
        ps = ps[np.isfinite(ps)]
        self_p = float(np.median(ps)) if ps.size else None
        out["self_spearman_paired"] = self_p
        out["ceiling_paired"] = math.sqrt(max(self_p, 0.0)) if self_p is not None else None
    if predicted is not None:
        rho = spearman_rows(np.asarray(predicted, dtype=float)[None, :], a)
        rho = rho[np.isfinite(rho)]
        out["spearman_ci"] = [float(q) for q in np.quantile(rho, [0.05, 0.95])] if rho.size else None
    fast = fast_mode(plans) if modes else None
    if fast is not None:
        level = levels(plans)
        slow = [i for i in range(len(plans[0])) if i not in fast]
        step = min(level[i] for i in slow) / max(level[i] for i in fast)
        out["modes"] = {"fast": fast, "slow": slow, "step": float(step)}
        out["fast_mode"] = noise([[t[i] for i in fast] for t in plans], predicted, draws, seed, modes=False)
    return out


def verdict(rho: float | None, ceiling: float | None, target: float = 0.8, enough: bool = True) -> str:
    """Reads a rank correlation against the measurement's own noise (``enough``: were
    there timings enough to estimate it; without them there is no verdict, whatever the
    correlation: a few calls can rank plans right by chance)."""
    if rho is None or ceiling is None:
        return "n/a"
    if not enough:
        return f"not enough timings to judge (at least {ENOUGH[0]} processes of {ENOUGH[1]} calls)"
    if rho >= target:
        return f"meets {target}"
    if ceiling < target:
        return f"noise: the measurement's own ceiling is {ceiling:.2f} < {target}"
    return f"model: the measured order is reproducible (ceiling {ceiling:.2f}) and the prediction misses it"
