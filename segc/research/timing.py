"""Timing plans: whole calls ``y = f(); mx.eval(y, caches)``, in this process or in fresh
ones, in one of three orders (``ORDERS``):

- ``"rounds"`` (the default): rounds of short blocks; in each round every plan in
  turn makes one untimed call, then ``ROUND_BLOCK`` timed ones (:func:`blocks` with
  ``size``). Each timed call follows a call of its own plan, as in use, and drift
  within a process still hits every plan alike.
- ``"blocks"``: each plan's calls back to back after its own warm-up, the plans one
  after another: a plan runs as in use, but drift within a process (on the H200 a
  prefill switching between two speeds, 4 and 6 ms, midway) lands on whole plans.
- ``"interleaved"``: round-robin, each round calling every plan once
  (:func:`round_robin`; the order before 2026-12-04). Plans timed in one process share
  MLX's process-wide state: on CUDA, for one, an instantiated graph per command buffer
  *topology* (its kinds of node and their edges, not its kernels), updated by every
  buffer of that topology. Interleaved on an H200, every plan's decode step measured
  0.15-0.7 ms slower a call than alone, by different amounts, so that interleaving
  ranked the plans as they do not rank alone (docs/experiments-log.md, "The seventeenth
  run").

On a GPU the same compiled variant can run tens of percent faster or slower from one
process to the next (docs/performance.md), more than plans differ; so
:func:`time_in_processes` runs the timing in ``processes`` fresh Python processes
one after another (``python -m segc.research.timing JOB OUT``), each loading the model,
re-applying the saved plans to its own trace, compiling and warming them up, starting
at a different plan; the experiment reports the median over processes of
each process's median (``noise.py``).

Before each timed call :func:`host_probe` times a fixed loop of pure Python, the host
CPU's speed just then; :func:`adjust` puts every call at the host's median speed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import SegcError
from .models import Workload
from .noise import measured
from .sweep import spread


@dataclass
class Timed:
    """One plan's calls in one process: whole-call seconds, the host's share (until
    the call returned) and the host's speed just before (:func:`host_probe`)."""

    times: list[float] = field(default_factory=list)
    host: list[float] = field(default_factory=list)
    probe: list[float] = field(default_factory=list)


PROBE_LOOP = 20_000  # about 0.6 ms on the H200's host at full speed


def host_probe() -> float:
    """Seconds for a fixed loop of pure Python: the host CPU's speed just now. On the
    H200's virtual machine the host switches between two speeds (this probe about 0.6
    and 1.1 ms) for seconds at a time, and a host-bound call with it
    (``benchmarks/host_jitter.py``; docs/experiments-log.md, "The eighteenth run")."""
    t0 = time.perf_counter()
    s = 0
    for i in range(PROBE_LOOP):
        s += i
    return time.perf_counter() - t0


SLOPE_T = 3.0  # adjust(): a slope whose t statistic is smaller is taken as none


def adjust(plans: Sequence[Sequence[Timed]]) -> tuple[list[list[Timed]], tuple[float, float]]:
    """Per plan, per process: the calls as if made with the host at its median speed,
    and the slopes used (seconds of call, and of host, per second of probe). Each call's
    time less ``slope * (its probe - the median probe)``, the slope fitted by least
    squares to every call's deviations from its own plan's and process's means, pooled:
    a regression adjustment on a covariate, so that neither the plans' differences nor a
    process's level set it, and the plans, timed in rounds alike, are shifted alike in
    expectation. A slope whose t statistic is under :data:`SLOPE_T` is taken as 0: where
    the probe does not track the calls (this CPU's, say) it would only add noise; so is
    one that would make some call's time (or host share) 0 or less. Calls without probes
    (runs before 2026-12-04): unchanged."""
    if any(len(p.probe) != len(p.times) or not p.probe for t in plans for p in t):
        return [list(t) for t in plans], (0.0, 0.0)
    groups = [p for t in plans for p in t]
    xs, ys, hs = ([d for p in groups for d in _centred(getattr(p, f))] for f in ("probe", "times", "host"))
    bt, bh = (_slope(xs, v, len(xs) - len(groups) - 1) for v in (ys, hs))
    ref = statistics.median(x for p in groups for x in p.probe)
    # a slope that would leave some call no time at all (a few short calls on a busy
    # host) says the probe does not describe the calls: taken as none
    bt, bh = (_positive(b, groups, f, ref) for b, f in ((bt, "times"), (bh, "host")))
    out = [
        [
            Timed(
                [y - bt * (x - ref) for x, y in zip(p.probe, p.times)],
                [h - bh * (x - ref) for x, h in zip(p.probe, p.host)],
                list(p.probe),
            )
            for p in t
        ]
        for t in plans
    ]
    return out, (bt, bh)


def _positive(slope: float, groups: list[Timed], field: str, ref: float) -> float:
    """``slope``, or 0 where adjusting by it would make some call's ``field`` 0 or less."""
    bad = any(y - slope * (x - ref) <= 0 for p in groups for x, y in zip(p.probe, getattr(p, field)))
    return 0.0 if bad else slope


def _centred(v: list[float]) -> list[float]:
    m = statistics.fmean(v)
    return [x - m for x in v]


def _slope(xs: list[float], ys: list[float], df: int) -> float:
    """The least-squares slope of ``ys`` on ``xs`` (both centred), 0 unless its t
    statistic on ``df`` degrees of freedom reaches :data:`SLOPE_T`."""
    xx, yy, xy = (sum(a * b for a, b in zip(u, v)) for u, v in ((xs, xs), (ys, ys), (xs, ys)))
    if xx <= 0 or yy <= 0 or df < 1:
        return 0.0
    r2 = min(xy * xy / (xx * yy), 1.0)
    t = math.inf if r2 >= 1 else math.sqrt(r2 * df / (1 - r2))
    return xy / xx if t >= SLOPE_T else 0.0


def warm(fn: Callable[..., Any], wl: Workload, calls: int) -> None:
    for _ in range(calls):
        a, k = wl.args()
        mx.eval(fn(*a, **k), wl.sync())


ORDERS = ("rounds", "blocks", "interleaved")
ROUND_BLOCK = 2  # "rounds": timed calls per plan and round, after one untimed call


def blocks(
    fns: Sequence[Callable[..., Any]],
    wl: Workload,
    repeats: int,
    *,
    warmup: int = 1,
    size: int | None = None,
    rotate: int = 0,
    step: Callable[[int], None] | None = None,
) -> list[Timed]:
    """Each function's ``repeats`` timed calls in blocks of ``size`` (``None``: one block
    of all), each block after ``warmup`` untimed calls of its own; in each round every
    function's block in turn, starting at ``rotate``."""
    out = [Timed() for _ in fns]
    size = repeats if size is None else max(size, 1)
    order = [(rotate + k) % len(fns) for k in range(len(fns))]
    left = repeats
    while left > 0:
        n = min(size, left)
        for i in order:
            warm(fns[i], wl, warmup)
            for _ in range(n):
                _call(fns[i], wl, out[i])
                if step is not None:
                    step(i)
        left -= n
    return out


def timed_calls(
    fns: Sequence[Callable[..., Any]],
    wl: Workload,
    repeats: int,
    order: str = "rounds",
    *,
    warmup: int = 1,
    rotate: int = 0,
    step: Callable[[int], None] | None = None,
) -> list[Timed]:
    """Time ``fns`` in ``order`` (``ORDERS``; ``warmup``: untimed calls before each of a
    plan's blocks in ``"blocks"``; one in ``"rounds"``)."""
    if order == "rounds":
        return blocks(fns, wl, repeats, warmup=1, size=ROUND_BLOCK, rotate=rotate, step=step)
    if order == "blocks":
        return blocks(fns, wl, repeats, warmup=warmup, rotate=rotate, step=step)
    if order == "interleaved":
        return round_robin(fns, wl, repeats, rotate=rotate, step=step)
    raise SegcError(f"timing order must be one of {ORDERS}, not {order!r}")


def _call(fn: Callable[..., Any], wl: Workload, into: Timed) -> None:
    a, k = wl.args()
    into.probe.append(host_probe())
    t0 = time.perf_counter()
    y = fn(*a, **k)
    t1 = time.perf_counter()
    mx.eval(y, wl.sync())
    t2 = time.perf_counter()
    into.times.append(t2 - t0)
    into.host.append(t1 - t0)


def round_robin(
    fns: Sequence[Callable[..., Any]],
    wl: Workload,
    repeats: int,
    *,
    rotate: int = 0,
    step: Callable[[int], None] | None = None,
) -> list[Timed]:
    """``repeats`` rounds, each calling every function once, starting at ``rotate``:
    :func:`blocks` of one call, with no warm-up between them."""
    return blocks(fns, wl, repeats, warmup=0, size=1, rotate=rotate, step=step)


@dataclass
class Job:
    """What one timing process runs: per workload, the plans as JSON (``None``: the model
    itself, eager)."""

    model: str
    boundaries: str
    commit: str
    repeats: int
    warmup: int
    workloads: list[tuple[str, list[str | None]]]
    rotate: int = 0
    order: str = "rounds"  # ORDERS


def time_in_processes(
    job: Job,
    processes: int,
    *,
    done: Callable[[int, float], None] | None = None,
    timeout: float = 900.0,
    deadline: float | None = None,
) -> list[list[list[Timed]]]:
    """Run ``job`` in ``processes`` fresh processes, one after another; per workload, per
    plan, per process: its calls. ``done(process, seconds)`` after each. A process that
    outlasts ``timeout`` seconds (a hang: far longer than a sweep's process takes) is killed
    and raises a ``SegcError``. Process ``p`` starts at plan ``job.rotate + p``. ``deadline`` (``time.monotonic()`` seconds): no further
    process is started where the longest one so far would end past it, so a time limit
    leaves fewer processes rather than none (the first always runs)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    res: list[list[list[Timed]]] = [[[] for _ in plans] for _, plans in job.workloads]
    longest = 0.0
    with tempfile.TemporaryDirectory(prefix="segc-timing-") as tmp:
        for p in range(processes):
            if p and deadline is not None and time.monotonic() + longest > deadline:
                break
            spec, out = Path(tmp) / f"job{p}.json", Path(tmp) / f"times{p}.json"
            spec.write_text(json.dumps(asdict(job) | {"rotate": job.rotate + p}))
            t0 = time.perf_counter()
            try:
                r = subprocess.run(
                    [sys.executable, "-m", "segc.research.timing", str(spec), str(out)],
                    capture_output=True, text=True, env=env, timeout=timeout,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                raise SegcError(f"timing process {p + 1} of {processes} outlasted {timeout} s") from None
            if r.returncode != 0 or not out.is_file():
                tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-12:])
                raise SegcError(f"timing process {p + 1} of {processes} failed (exit {r.returncode}):\n{tail}")
            got = json.loads(out.read_text())
            for w, per_plan in enumerate(got["workloads"]):
                for i, t in enumerate(per_plan):
                    res[w][i].append(Timed(t["times"], t["host"], t.get("probe", [])))
            longest = max(longest, time.perf_counter() - t0)
            if done is not None:
                done(p, time.perf_counter() - t0)
    return res


def run_job(job: Job) -> dict[str, Any]:
    """Time ``job`` in this process (what each timing process does)."""
    from ..passes import Plan
    from ..staging import jit
    from .models import load_model, make_workload

    model = load_model(job.model)
    out: list[list[dict[str, Any]]] = []
    for wspec, plans in job.workloads:
        wl = make_workload(wspec, model)
        wl.fresh = None
        fns: list[Callable[..., Any]] = []
        for text in plans:
            if text is None:
                fns.append(model)
                continue
            plan = Plan.from_json(text)
            fns.append(jit(model, boundaries=job.boundaries or None, strategy=plan, validate=False, commit=job.commit))
        for fn in fns:
            warm(fn, wl, 1 + job.warmup)  # the first call traces and compiles
        timed = timed_calls(fns, wl, job.repeats, job.order, warmup=max(job.warmup, 1), rotate=job.rotate)
        out.append([asdict(t) for t in timed])
        del fns
    return {"workloads": out, "pid": os.getpid()}


def record_timings(rows: list[dict[str, Any]], timed: list[list[Timed]], host_adjust: bool) -> None:
    """Each row's measured time from its calls (per process), with ``host_adjust`` as
    if made at the host's median speed (``timing.adjust``; ``host_slope``: seconds of
    call per second of probe); the calls as measured kept in ``calls``, so that a run
    can be read again either way (``benchmarks/repredict.py --host-adjust``)."""
    used, (slope, _) = adjust(timed) if host_adjust else (timed, (None, None))
    for row, raw, t in zip(rows, timed, used):
        _record(row, t)
        row["calls"], row["host_slope"] = [asdict(c) for c in raw], slope


def _record(row: dict[str, Any], timed: list[Timed]) -> None:
    """A row's measured time from its calls in each process (``noise.measured``)."""
    calls = [x for t in timed for x in t.times]
    s = spread(calls)
    row.update({f"measured_{k}_s": v for k, v in s.items() if k not in ("max", "median")})
    row["measured_median_s"] = measured([t.times for t in timed])
    row["host_median_s"] = statistics.median(x for t in timed for x in t.host)
    row["repeats"] = len(timed[0].times)
    row["processes"] = len(timed)
    if len(timed) >= 2:
        meds = [statistics.median(t.times) for t in timed]
        row["process_low_s"], row["process_high_s"] = min(meds), max(meds)
    row["times_s"] = [t.times for t in timed]


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m segc.research.timing JOB.json OUT.json", file=sys.stderr)
        return 2
    d = json.loads(Path(argv[0]).read_text())
    d["workloads"] = [(w, list(p)) for w, p in d["workloads"]]
    Path(argv[1]).write_text(json.dumps(run_job(Job(**d))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
