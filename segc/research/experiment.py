"""The experiment harness: every (model, workload, strategy) of a sweep, predicted by
the cost model and measured on this machine.

For each model and workload the graph is traced once; each strategy makes a plan on it
(saved as JSON beside the results, so any point can be re-run with
``segc passes --plan-in`` or ``segc.jit(..., strategy=Plan.load(path))``), which the cost
model predicts (``segc.passes.costmodel``). Then every plan runs through ``segc.jit``, the
real asynchronous pipeline: its first call (trace, passes, lowering, MLX's compile and
the run) is the compile time; its output is compared bit for bit with eager MLX's; its
peak memory is ``mx.get_peak_memory()`` over one call with nothing else alive but the
model, its inputs and caches; then the plans are timed round-robin (each round calls
every plan once, so drift hits all alike), each call ``y = f(); mx.eval(y, caches)``.
An ``eager`` row times the model called directly. MLX gives no per-kernel device timer
from Python, so times are whole calls (median, quartiles) and the host's share (until
the call returns).
"""

from __future__ import annotations

import gc
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..errors import SegcError
from ..passes import Plan, make_plan
from ..passes.analysis import analyze
from ..passes.costmodel import MachineModel, default_model, predict_memory, predict_time
from ..passes.plan import apply_plan
from ..staging import jit
from .models import load_model, make_workload
from .report import Results
from .sweep import expand_all, spread

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
    out: str | Path | None = None
    plots: Sequence[str] = ("png", "svg")
    progress: bool = True
    eager: bool = True
    log: Callable[[str], None] | None = field(default=None, repr=False)

    def check(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise SegcError(f"repeats must be >= 1 and warmup >= 0, got {self.repeats} and {self.warmup}")
        if not self.models or not self.workloads or not self.strategies:
            raise SegcError("an experiment needs at least one model, workload and strategy")


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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def _bits(x: Any) -> list[tuple]:
    xs = x if isinstance(x, list | tuple) else [x]
    return [(tuple(a.shape), dtypes.short(a.dtype), dtypes.to_bytes(a)) for a in xs]


def run_experiment(exp: Experiment) -> Results:
    """Run the sweep; write the results (and plans, plots) to ``exp.out`` if given."""
    exp.check()
    machine = exp.machine or default_model()
    specs = expand_all(exp.strategies)
    out = Path(exp.out) if exp.out is not None else None
    if out is not None:
        (out / "plans").mkdir(parents=True, exist_ok=True)
    res = Results(machine=machine, experiment={k: v for k, v in vars(exp).items() if k not in ("machine", "log")})
    res.experiment["strategies_expanded"] = specs
    n_plans = len(specs) + exp.eager
    bar = Progress(len(exp.models) * len(exp.workloads) * n_plans * (2 + exp.repeats), exp.progress)
    try:
        for mspec in exp.models:
            model = load_model(mspec)
            for wspec in exp.workloads:
                res.rows.extend(_one(exp, machine, specs, mspec, model, wspec, out, bar))
            del model
            gc.collect()
    finally:
        bar.close()
    if out is not None:
        res.write(out, plots=exp.plots)
    return res


def _one(
    exp: Experiment,
    machine: MachineModel,
    specs: list[str],
    mspec: str,
    model: Any,
    wspec: str,
    out: Path | None,
    bar: Progress,
) -> list[dict[str, Any]]:
    wl = make_workload(wspec, model)
    ref = wl.reference(model)
    want = _bits(ref)  # held as host bytes: no MLX memory
    del ref
    wl.fresh = None  # nor the eager copy of the caches
    args, kw = wl.args()
    g = jit(model, boundaries=exp.boundaries or None).trace(*args, **kw).graph
    rows: list[dict[str, Any]] = []
    runs: list[tuple[dict[str, Any], Callable[..., Any]]] = []
    for spec in specs:
        row: dict[str, Any] = {"model": mspec, "workload": wspec, "strategy": spec}
        rows.append(row)
        try:
            plan = make_plan(g, spec, model=machine)
        except SegcError as exc:
            row["error"] = str(exc)
            bar.step(f"{spec}: no plan", 2 + exp.repeats)
            continue
        _predict(row, g, plan, machine)
        if out is not None:
            path = out / "plans" / f"{_slug(mspec)}_{_slug(wspec)}_{_slug(spec)}.json"
            plan.save(path)
            row["plan_file"] = str(path.relative_to(out))
        # validate=False: a GPU's dynamic KV cache differs from eager in the last bits, and
        # validation would time exact mode instead (docs/performance.md); the row's bit
        # check against eager says so
        fn = jit(model, boundaries=exp.boundaries or None, strategy=plan, validate=False)
        t0 = time.perf_counter()
        a, k = wl.args()
        try:
            y = fn(*a, **k)
            mx.eval(y, wl.sync())
        except Exception as exc:  # reported in the row; the sweep goes on
            row["error"] = f"{type(exc).__name__}: {exc}"
            bar.step(f"{spec}: failed", 2 + exp.repeats)
            continue
        row["compile_s"] = time.perf_counter() - t0
        row["bit_identical"] = _bits(y) == want
        del y
        runs.append((row, fn))
        bar.step(f"{wspec} {spec}: compiled")
    if exp.eager:
        row = {"model": mspec, "workload": wspec, "strategy": "eager", "plan": "eager (mlx-lm, no segc)"}
        rows.append(row)
        a, k = wl.args()
        row["bit_identical"] = _bits(model(*a, **k)) == want
        runs.append((row, model))
        bar.step(f"{wspec} eager")
    for row, fn in runs:  # warm up, then peak memory over one call with nothing else alive
        for _ in range(exp.warmup):
            a, k = wl.args()
            mx.eval(fn(*a, **k), wl.sync())
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
    times: dict[int, list[float]] = {id(r): [] for r, _ in runs}
    host: dict[int, list[float]] = {id(r): [] for r, _ in runs}
    for _ in range(exp.repeats):
        for row, fn in runs:
            a, k = wl.args()
            t0 = time.perf_counter()
            y = fn(*a, **k)
            t1 = time.perf_counter()
            mx.eval(y, wl.sync())
            t2 = time.perf_counter()
            times[id(row)].append(t2 - t0)
            host[id(row)].append(t1 - t0)
            del y
            bar.step(f"{wspec} {row['strategy']}: timing")
    for row, _ in runs:
        s = spread(times[id(row)])
        row.update({f"measured_{k}_s": v for k, v in s.items() if k != "max"})
        row["host_median_s"] = spread(host[id(row)])["median"]
        row["repeats"] = len(times[id(row)])
    return rows


def _predict(row: dict[str, Any], g: Any, plan: Plan, machine: MachineModel) -> None:
    cut = apply_plan(g, plan)
    tp = predict_time(cut, machine)
    mp = predict_memory(cut)
    st = analyze(cut, machine.roofline())
    row.update(
        {
            "plan": plan.strategy,
            "segments": len(tp.segments),
            "moved": len(plan.moved),
            "predicted_s": tp.total,
            "predicted_host_s": tp.host,
            "predicted_device_s": tp.device,
            "predicted_peak_bytes": mp.peak,
            "predicted_weights_bytes": mp.weights,
            "predicted_inputs_bytes": mp.inputs + mp.constants,
            "predicted_activations_bytes": mp.activations,
            "working_set_bytes": st.max_segment_peak,
            "boundary_bytes": st.boundary_bytes,
        }
    )
