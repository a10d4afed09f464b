"""The experiment harness: every (model, workload, strategy) of a sweep, predicted by
the cost model and measured on this machine.

For each model and workload the graph is traced once; each strategy makes a plan on it
(saved as JSON beside the results, so any point can be re-run with
``segc passes --plan-in`` or ``segc.jit(..., strategy=Plan.load(path))``; the traced
graph is saved too, ``graphs/``, so that another machine can predict the plans again
as this device traced them: ``benchmarks/repredict.py``), which the cost
model predicts (``segc.passes.costmodel``). Then every plan runs through ``segc.jit``, the
real asynchronous pipeline: its first call (trace, passes, lowering, MLX's compile and
the run) is the compile time; its output is compared bit for bit with eager MLX's; its
peak memory is ``mx.get_peak_memory()`` over one call with nothing else alive but the
model, its inputs and caches; then the plans are timed, by default in rounds of short
blocks, each timed call after one of its own plan (``order``; ``timing.py`` says why), in
this process or in ``processes`` fresh ones (the median over processes of each one's
median; ``noise.py`` says whether the differences exceed the noise), each call
``y = f(); mx.eval(y, caches)`` under the runtime's ``commit`` policy. An ``eager`` row
times the model called directly. MLX gives no per-kernel device timer from Python, so
times are whole calls (median, quartiles) and the host's share (until the call returns),
by default adjusted to the host CPU's median speed (``host_adjust``; ``timing.adjust``).

With ``calibration`` plans (strategies, timed like the others and added to the sweep
where it lacks them), the machine model's overheads and throughput are fitted per model
to those plans' measured times, whole calls and the host's share (``fit.py``;
``overheads``: each workload's to its own plans, or one set for all; ``host_weight``)
and every plan is
predicted again with the fitted model; the plans that are none of the calibration plans
(nor the same cuts as one) are the held-out ones, whose rank correlation the summary
reports apart. An ``optimal`` plan is made with the machine model given, before the
fit, or with ``planners``' model for its model and workload: a run's calibrated models
(``report.read_fitted``), so that a second run measures the fitted model's own optimum
among the other plans; with ``fit_first``, the model this same run fits to its
calibration plans, timed first (:func:`_fit_first`).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..errors import ScheduleError, SegcError
from ..ir import to_text
from ..passes import make_plan
from ..passes.commits import check_commit
from ..passes.costmodel import MachineModel, default_model
from ..passes.plan import apply_plan
from ..passes.strategies import resolve
from ..runtime import resolve_commit
from ..staging import jit
from .calibrated import Prepared, calibrate, mark_held_out, predict_row
from .models import load_model, make_workload
from .report import Results
from .sweep import expand, expand_all, slug
from .timing import ORDERS, Job, record_timings, time_in_processes, timed_calls, warm

FIRST_SHARE = 0.3  # fit_first: the first phase's share of a time limit (four plans of some fifteen)
DEFAULT_STRATEGIES = ("none", "markers", "every:2", "balanced:2..18:4", "memory:0.5x..2x:0.5x", "optimal", "optimal:1x")


@dataclass
class Experiment:
    """What to sweep (see the module docstring and ``segc.research.models``)."""

    models: Sequence[str] = ("small",)
    workloads: Sequence[str] = ("decode:128", "prefill:128")
    strategies: Sequence[str] = DEFAULT_STRATEGIES
    repeats: int = 20
    warmup: int = 2
    boundaries: str = "layers.*"
    machine: MachineModel | None = None
    # per (model, workload): the machine model its plans are made with (``optimal``'s, say)
    # instead of ``machine``, e.g. a run's calibrated ones (report.read_fitted); the fit
    # still starts from ``machine``
    planners: Mapping[tuple[str, str], MachineModel] = field(default_factory=dict)
    out: str | Path | None = None
    plots: Sequence[str] = ("png", "svg")
    progress: bool = True
    eager: bool = True
    commit: str = "auto"  # the runtime's commit policy for every plan (segc.jit(commit=...))
    processes: int = 1  # > 1: time in that many fresh processes, one after another
    calibration: Sequence[str] = ()  # strategies whose measured times the machine model is fitted to
    overheads: str = (
        "group"  # calibration: each workload's its own ("group"), one set ("shared"), the device's only ("device")
    )
    order: str = "rounds"  # the timing order (timing.ORDERS): rounds of short blocks, whole blocks, or interleaved
    # calibration: the weight of the plans' measured host times in the fit (fit.py; 0: whole calls only)
    host_weight: float = 1.0
    # calibration: fit the host's saving on a segment that repeats an earlier one's
    # equations too (costmodel "Repeats"); None: on a GPU, where it was measured (on this
    # CPU the fit wanders to its bound: docs/experiments-log.md, "The eighteenth run")
    fit_repeats: bool | None = None
    # calibration: fit the device's time per command buffer too (segment_device_s); None:
    # on a GPU, where it ordered decode's plans better on three runs of four and worse on
    # none; on two CPU runs it did worse (docs/experiments-log.md, the twenty-third and
    # twenty-fourth runs)
    fit_segment_device: bool | None = None
    # each call's time adjusted to the host's median speed (timing.adjust: the host CPU's
    # speed, probed before each call, as a covariate); False: the times as measured
    host_adjust: bool = True
    # seconds for the whole run: timing processes that would end past it are not started
    # (timing.time_in_processes: fewer processes, each row saying how many); None: no limit
    time_limit: float | None = None
    # plan with the model this run fits: the calibration plans timed and fitted first,
    # then the whole sweep planned with that fit and timed (_fit_first)
    fit_first: bool = False
    log: Callable[[str], None] | None = field(default=None, repr=False)

    def check(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise SegcError(f"repeats must be >= 1 and warmup >= 0, got {self.repeats} and {self.warmup}")
        if not self.models or not self.workloads or not self.strategies:
            raise SegcError("an experiment needs at least one model, workload and strategy")
        if self.processes < 1:
            raise SegcError(f"processes must be >= 1, got {self.processes}")
        check_commit(self.commit)
        if self.time_limit is not None and not self.time_limit > 0:
            raise SegcError(f"time_limit must be > 0 seconds, got {self.time_limit}")
        if not self.host_weight >= 0:
            raise SegcError(f"host_weight must be >= 0, got {self.host_weight}")
        if self.fit_first and not self.calibration:
            raise SegcError("fit_first needs calibration plans: the first phase fits the machine model to them")
        if self.order not in ORDERS:
            raise SegcError(f"order must be one of {ORDERS}, not {self.order!r}")
        if self.overheads not in ("group", "shared", "device"):
            raise SegcError(f"overheads must be 'group', 'shared' or 'device', not {self.overheads!r}")
        if self.out is not None and Path(self.out).exists() and not Path(self.out).is_dir():
            raise SegcError(f"out {str(self.out)!r} is a file, not a directory (results go into a directory)")
        # every strategy is read before anything runs: a bad spec is a mistake, not a row
        for what, specs in (("strategy", self.strategies), ("calibration", self.calibration)):
            for spec in specs:
                try:
                    for x in expand(spec):
                        resolve(x)
                except ScheduleError as exc:
                    raise ScheduleError(f"{what} {spec!r}: {exc}") from None


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, on: bool):
        self.total, self.done, self.on, self.t0 = max(total, 1), 0, on, time.perf_counter()

    def step(self, what: str, n: int = 1) -> None:
        self.done += n
        if self.on:
            k = int(30 * self.done / self.total)
            el = time.perf_counter() - self.t0
            sys.stderr.write(f"\r[{'#' * k}{'.' * (30 - k)}] {self.done}/{self.total} {el:5.0f}s {what[:48]:<48}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.on:
            sys.stderr.write("\n")


def _bits(x: Any) -> list[tuple]:
    xs = x if isinstance(x, list | tuple) else [x]
    raws = dtypes.to_bytes_many(list(xs))  # on CUDA read together
    return [(tuple(a.shape), dtypes.short(a.dtype), r) for a, r in zip(xs, raws, strict=True)]


def run_experiment(exp: Experiment) -> Results:
    """Run the sweep; write the results (and plans, plots) to ``exp.out`` if given."""
    exp.check()
    if exp.fit_first:
        return _fit_first(exp)
    # timing processes end by 90% of the time limit: the rest for the fit and the files
    deadline = None if exp.time_limit is None else time.monotonic() + 0.9 * exp.time_limit
    policy = resolve_commit(exp.commit)
    gpu = mx.default_device() == mx.gpu
    machine = exp.machine or default_model()
    if machine.device != ("gpu" if gpu else "cpu"):  # "auto" commits as the device it runs on does
        machine = replace(machine, device="gpu" if gpu else "cpu")
    specs = expand_all(exp.strategies)
    calib = expand_all(exp.calibration)
    specs += [c for c in calib if c not in specs]
    out = Path(exp.out) if exp.out is not None else None
    own = ("machine", "log", "planners")
    res = Results(machine=machine, experiment={k: v for k, v in vars(exp).items() if k not in own})
    res.experiment["planned_with"] = {f"{m} {w}": p.source for (m, w), p in exp.planners.items()}
    res.experiment["strategies_expanded"] = specs
    res.experiment["commit_policy"] = policy
    n_plans = len(specs) + exp.eager
    timing = n_plans * exp.repeats if exp.processes == 1 else exp.processes / len(exp.workloads)
    bar = Progress(int(len(exp.models) * len(exp.workloads) * (2 * n_plans + timing)), exp.progress)
    try:
        for mspec in exp.models:
            model = load_model(mspec)
            preps = []
            for wspec in exp.workloads:
                planner = exp.planners.get((mspec, wspec))
                planner = machine if planner is None else replace(planner, device=machine.device)
                prep = _prepare(exp, planner, policy, specs, set(calib), mspec, model, wspec, out, bar)
                if exp.processes == 1:
                    _time_here(exp, prep, bar)
                preps.append(prep)
            if exp.processes > 1:
                _time_apart(exp, mspec, preps, bar, deadline)
            if calib:
                res.fitted[mspec] = calibrate(
                    machine,
                    policy,
                    preps,
                    exp.overheads,
                    exp.host_weight,
                    repeats=gpu if exp.fit_repeats is None else exp.fit_repeats,
                    segment_device=gpu if exp.fit_segment_device is None else exp.fit_segment_device,
                )
            for prep in preps:
                res.rows.extend(prep.rows)
            del model, preps
            gc.collect()
    finally:
        bar.close()
    if out is not None:
        res.write(out, plots=exp.plots)
    return res


def _fit_first(exp: Experiment) -> Results:
    """``exp`` in two phases. The calibration plans alone, timed as the experiment times,
    and the machine model fitted to them per model and workload (their results and
    ``fitted/`` in ``fit-first/``); then the whole sweep, calibration plans included,
    every plan made with those fits (``planners``: ``optimal`` the fitted model's own
    optimum) and timed in fresh processes, its calibration fitted again to its own
    calibration plans. So the held-out plans are planned before any is measured and
    measured beside the plans they are compared with (the first phase's timings rank
    nothing). The first phase gets ``FIRST_SHARE`` of a time limit."""
    t0 = time.monotonic()
    out = Path(exp.out) if exp.out is not None else None
    limit = None if exp.time_limit is None else FIRST_SHARE * exp.time_limit
    if exp.log is not None:
        exp.log(f"fit first: the calibration plans {', '.join(exp.calibration)}")
    r0 = run_experiment(
        replace(
            exp, strategies=list(exp.calibration), eager=False, fit_first=False, plots=(), time_limit=limit,
            out=out and out / "fit-first",
        )
    )  # fmt: skip
    planners = {**exp.planners, **r0.fitted_models("fitted first")}
    took = time.monotonic() - t0
    if exp.log is not None:
        exp.log(f"fit first: {len(planners)} fitted model(s) in {took:.0f} s; the sweep's plans made with them")
    rest = None if exp.time_limit is None else max(exp.time_limit - took, 1.0)
    # its plans and graphs saved as it goes; its results written again below, with the first phase's
    res = run_experiment(replace(exp, fit_first=False, planners=planners, plots=(), time_limit=rest))
    res.experiment.update(fit_first=True, plots=exp.plots, fit_first_seconds=took, fit_first_fitted=r0.fitted)
    if out is not None:
        res.write(out, plots=exp.plots)
    return res


def _prepare(
    exp: Experiment,
    machine: MachineModel,
    policy: str,
    specs: list[str],
    calib: set[str],
    mspec: str,
    model: Any,
    wspec: str,
    out: Path | None,
    bar: Progress,
) -> Prepared:
    wl = make_workload(wspec, model)
    ref = wl.reference(model)
    want = _bits(ref)  # held as host bytes: no MLX memory
    del ref
    wl.fresh = None  # nor the eager copy of the caches
    args, kw = wl.args()
    g = jit(model, boundaries=exp.boundaries or None).trace(*args, **kw).graph
    graph_file = None
    if out is not None:  # the trace as this device made it: plans can be predicted again elsewhere
        gpath = out / "graphs" / f"{slug(mspec)}_{slug(wspec)}.segc"
        gpath.parent.mkdir(parents=True, exist_ok=True)
        gpath.write_text(to_text(g))
        graph_file = str(gpath.relative_to(out))
    prep = Prepared(wl, [], [], {}, {})
    for spec in specs:
        row: dict[str, Any] = {"model": mspec, "workload": wspec, "strategy": spec}
        if graph_file:
            row["graph_file"] = graph_file
        if calib:
            row["calibration"] = spec in calib
        prep.rows.append(row)
        try:
            plan = make_plan(g, spec, model=machine)
        except SegcError as exc:
            row["error"] = str(exc)
            bar.step(f"{spec}: no plan", 2)
            continue
        cut = apply_plan(g, plan)
        prep.cuts[id(row)], prep.plans[id(row)] = cut, plan
        predict_row(row, cut, plan, machine, policy)
        if "predicted_s" in plan.info:  # optimal's own figure: its dynamic program's (report.optimal_gap)
            row["plan_predicted_s"] = plan.info["predicted_s"]
        if out is not None:
            path = out / "plans" / f"{slug(mspec)}_{slug(wspec)}_{slug(spec)}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            plan.save(path)
            row["plan_file"] = str(path.relative_to(out))
        # validate=False: a GPU's dynamic KV cache differs from eager in the last bits, and
        # validation would time exact mode instead (docs/performance.md); the row's bit
        # check against eager says so
        fn = jit(model, boundaries=exp.boundaries or None, strategy=plan, validate=False, commit=exp.commit)
        t0 = time.perf_counter()
        a, k = wl.args()
        try:
            y = fn(*a, **k)
            mx.eval(y, wl.sync())
        except Exception as exc:  # reported in the row; the sweep goes on
            row["error"] = f"{type(exc).__name__}: {exc}"
            bar.step(f"{spec}: failed", 2)
            continue
        row["compile_s"] = time.perf_counter() - t0
        row["bit_identical"] = _bits(y) == want
        del y
        prep.runs.append((row, fn))
        bar.step(f"{wspec} {spec}: compiled")
    if calib:
        mark_held_out(prep)
    if exp.eager:
        row = {"model": mspec, "workload": wspec, "strategy": "eager", "plan": "eager (mlx-lm, no segc)"}
        prep.rows.append(row)
        a, k = wl.args()
        row["bit_identical"] = _bits(model(*a, **k)) == want
        prep.runs.append((row, model))
        bar.step(f"{wspec} eager")
    for row, fn in prep.runs:  # warm up, then peak memory over one call with nothing else alive
        warm(fn, wl, exp.warmup)
        gc.collect()
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        row["measured_resident_bytes"] = mx.get_active_memory()
        a, k = wl.args()
        mx.eval(fn(*a, **k), wl.sync())
        row["measured_peak_bytes"] = mx.get_peak_memory()
        row["measured_activations_bytes"] = row["measured_peak_bytes"] - row["measured_resident_bytes"]
        bar.step(f"{wspec} {row['strategy']}: memory")
    return prep


def _time_here(exp: Experiment, prep: Prepared, bar: Progress) -> None:
    rows = [r for r, _ in prep.runs]
    timed = timed_calls(
        [fn for _, fn in prep.runs],
        prep.workload,
        exp.repeats,
        exp.order,
        warmup=max(exp.warmup, 1),
        step=lambda i: bar.step(f"{prep.workload.name} {rows[i]['strategy']}: timing"),
    )
    record_timings(rows, [[t] for t in timed], exp.host_adjust)


def _time_apart(
    exp: Experiment, mspec: str, preps: list[Prepared], bar: Progress, deadline: float | None = None
) -> None:
    """Time every workload's runs in ``exp.processes`` fresh processes (``timing.py``),
    fewer where ``deadline`` comes first."""
    wls: list[tuple[str, list[str | None]]] = []
    runs = []
    for prep in preps:
        plans = [prep.plans[id(r)].to_json() if id(r) in prep.plans else None for r, _ in prep.runs]
        wls.append((prep.workload.name, plans))
        runs.append([r for r, _ in prep.runs])
        prep.runs = []  # nothing of this process's plans stays alive while others time
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    job = Job(mspec, exp.boundaries, exp.commit, exp.repeats, exp.warmup, wls, order=exp.order)
    got = time_in_processes(
        job,
        exp.processes,
        done=lambda p, s: bar.step(f"timing process {p + 1}/{exp.processes} ({s:.0f} s)"),
        deadline=deadline,
    )
    ran = len(got[0][0]) if got and got[0] else exp.processes
    if ran < exp.processes and exp.log is not None:
        exp.log(f"{mspec}: {ran} of {exp.processes} timing processes within the time limit")
    for rows, timed in zip(runs, got):
        record_timings(rows, timed, exp.host_adjust)
