"""Predicted against measured, for every cut-placement strategy (issue 15).

Runs a sweep of strategies over one model and its workloads (``segc.research``) and
prints the table, the summary and the checks of the issue: Spearman's rank correlation
of predicted and measured time across plans (>= 0.8), the largest error of predicted
peak memory against ``mx.get_peak_memory`` (<= 15%), and bit-identity with eager MLX.

The machine model: the built-in one of this device (``--machine FILE`` for a saved one,
``--microbench`` to measure its rates here first, ``--fit MODEL`` to fit its overheads on
another model first); then, with ``--calibration`` plans (the default: none, markers,
every:4, balanced:2), its overheads and throughput are fitted to those plans' measured
times on the model under study (each workload's to its own plans; ``--overheads shared``:
one set for every workload) and every plan is predicted again; the correlation is
reported over every plan and over the held-out ones (the others). ``--processes N``
times every plan in N fresh processes (the median of their medians) and the summary
says whether the measured differences exceed the noise. ``--fit-first`` times the calibration plans and fits to them before any
other plan is made, so that ``optimal`` is this run's own model's optimum
(``Experiment.fit_first``). ``--commit segment`` times the
seed's commit per segment instead of the runtime's default policy; ``--commit
auto,segment`` runs the experiment once for each.

Results (CSV, JSON, plans, plots) go to ``--out``; with ``--json``, every run's results,
fitted models and checks also go to that one file.

    python benchmarks/bench_experiment.py --processes 4 --repeats 10 --commit auto,segment --json x.json
    python benchmarks/bench_experiment.py --model small --workloads decode:128,prefill:64 --processes 5 --repeats 10
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from segc.passes.costmodel import MachineModel, default_model
from segc.research import Experiment, read_fitted, run_experiment
from segc.research.calibrate import calibrate, fit_overheads

EVERY = [
    "none",
    "markers",
    "every:2",
    "every:4",
    "balanced:2..18:4",
    "memory:0.5x..2x:0.5x",
    "optimal",
    "optimal:1x",
    "optimal:markers",
    "min_boundary_bytes",
]
CALIBRATION = "none,min_boundary_bytes,every:4,balanced:2"


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="reference")
    p.add_argument("--workloads", default="decode:1024,prefill:512")
    p.add_argument("--strategies", default=",".join(EVERY), help="comma list (ranges allowed)")
    p.add_argument("--calibration", default=CALIBRATION, help="calibration plans (comma list; '' for none)")
    p.add_argument(
        "--overheads", default="group", choices=("group", "shared", "device"),
        help="calibration: each workload's overheads fitted to its own plans, one set for all, or the device's alone"
    )  # fmt: skip
    p.add_argument("--processes", type=int, default=1, help="fresh timing processes per plan")
    p.add_argument(
        "--commit", default="auto", help="the runtime's commit policy (auto, segment, fences, geometric); a comma list "
        "runs the experiment once per policy"
    )  # fmt: skip
    p.add_argument(
        "--order", default="rounds", choices=("rounds", "blocks", "interleaved"),
        help="rounds of short blocks, each plan's calls back to back, or round-robin (segc.research.timing)"
    )  # fmt: skip
    p.add_argument("--host-weight", type=float, default=1.0, help="calibration: the measured host times' weight")
    p.add_argument(
        "--fit-repeats", action=argparse.BooleanOptionalAction,
        help="calibration: fit the host's saving on a segment that repeats an earlier one's equations too "
        "(default: on a GPU)"
    )  # fmt: skip
    p.add_argument(
        "--fit-segment-device", action=argparse.BooleanOptionalAction,
        help="calibration: fit the device's time per command buffer too (segment_device_s; default: on a GPU)"
    )  # fmt: skip
    p.add_argument(
        "--no-host-adjust", action="store_true",
        help="the calls' times as measured, not adjusted to the host's median speed (segc.research.timing.adjust)"
    )  # fmt: skip
    p.add_argument(
        "--time-limit", type=float, metavar="SECONDS",
        help="per policy: timing processes that would end past it are not started (fewer processes, not none)"
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--machine",
        metavar="FILE|DIR",
        help="a saved machine model instead of the built-in one, or an earlier run's fitted/ folder (each "
        "model and workload's plans, optimal's among them, made with the model that run fitted)",
    )
    p.add_argument(
        "--fit-first", action="store_true",
        help="time the calibration plans and fit to them first, then plan every strategy with that fit "
        "(optimal: this run's own model's optimum) and time them all (segc.research.Experiment.fit_first)"
    )  # fmt: skip
    p.add_argument("--microbench", action="store_true", help="measure the bandwidth and FLOP rate here first")
    p.add_argument("--fit", default="none", help="fit the overheads on this model first (before any calibration)")
    p.add_argument("--fit-workloads", default="decode:256,prefill:128")
    p.add_argument("--out", default="out/experiment", help="a folder; with several policies, one folder in it each")
    p.add_argument("--plots", default="png,svg")
    p.add_argument("--json", metavar="FILE", help="write the results, fitted models and checks here (one file)")
    args = p.parse_args()

    t0 = time.perf_counter()
    commits = _list(args.commit)
    fitted_dir = bool(args.machine) and Path(args.machine).is_dir()  # an earlier run's fitted/: plans made with them
    planners = read_fitted(args.machine, [args.model], _list(args.workloads)) if fitted_dir else {}
    machine = MachineModel.load(args.machine) if args.machine and not fitted_dir else default_model()
    if args.microbench:
        machine = calibrate()
    if args.fit != "none":
        machine = fit_overheads(machine, args.fit, workloads=tuple(_list(args.fit_workloads)), commit=commits[0])
    print(f"machine model ({time.perf_counter() - t0:.1f} s): {machine}", flush=True)
    plots = _list(args.plots)
    if plots and importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed: no plots (pip install 'segc[research]')", flush=True)
        plots = []
    runs = []
    for commit in commits:
        t1 = time.perf_counter()
        exp = Experiment(
            models=[args.model],
            workloads=_list(args.workloads),
            strategies=_list(args.strategies),
            calibration=_list(args.calibration),
            overheads=args.overheads,
            processes=args.processes,
            order=args.order,
            host_weight=args.host_weight,
            host_adjust=not args.no_host_adjust,
            fit_repeats=args.fit_repeats,
            fit_segment_device=args.fit_segment_device,
            time_limit=args.time_limit,
            fit_first=args.fit_first,
            log=lambda m: print(m, flush=True),
            commit=commit,
            repeats=args.repeats,
            warmup=args.warmup,
            machine=machine,
            planners=planners,
            out=Path(args.out) / f"commit-{commit}" if len(commits) > 1 else args.out,
            plots=plots,
            progress=sys.stderr.isatty(),
        )
        res = run_experiment(exp)
        checks = report(res)
        took = time.perf_counter() - t1
        print(f"commit policy {commit} ({res.experiment['commit_policy']} here): {took:.0f} s", flush=True)
        runs.append(json.loads(res.to_json()) | {"commit": commit, "checks": checks, "seconds": took})
        if args.json:  # everything in one file, after every run (a time limit keeps the runs done)
            Path(args.json).write_text(json.dumps({"runs": runs, "seconds": time.perf_counter() - t0}, indent=1))
    print(f"{time.perf_counter() - t0:.0f} s in all on {mx.default_device()}")
    return 0


def report(res: Any) -> list[dict[str, Any]]:
    """Print the table, the fitted models and the checks; the checks."""
    print(res.table())
    for m, fit in res.fitted.items():
        for w, mm in fit["machines"].items():  # the overheads per workload, or the same for every one
            print(
                f"fitted on {m} {w} ({', '.join(fit['plans'])}; {fit['observations']} timings, overheads "
                f"{fit.get('overheads', 'shared')}): throughput of the base rates x{1 / fit['scales'][w]:.3g}; launch "
                f"{_us(mm['launch_s'])}, dispatch {_us(mm['dispatch_s'])}, host per kernel {_us(mm['host_op_s'])}, "
                f"commit {_us(mm['commit_s'])}, size {mm.get('segment_sq_s', 0.0):.3g} s per kernel squared "
                f"(fitted: {', '.join(fit['free'])})"
            )
    checks = [check(s) for s in res.summary()]
    for c in checks:
        print(line(c))
    return checks


def check(s: dict[str, Any]) -> dict[str, Any]:
    rho, held, err = s["spearman_time"], s["spearman_heldout"], s["max_peak_error"]
    n = s["noise"] or {}
    return {
        "model": s["model"],
        "workload": s["workload"],
        "plans": s["plans"],
        "spearman_time": rho,
        "spearman_ok": rho is not None and rho >= 0.8,
        "heldout_plans": s["heldout_plans"],
        "spearman_heldout": held,
        "spearman_heldout_ok": held is not None and held >= 0.8,
        "spearman_min": s.get("spearman_min"),
        "spearman_min_heldout": s.get("spearman_min_heldout"),
        "spearman_paired": s.get("spearman_paired"),
        "spearman_paired_heldout": s.get("spearman_paired_heldout"),
        "ceiling_paired": n.get("ceiling_paired"),
        "heldout_ceiling_paired": (n.get("heldout") or {}).get("ceiling_paired"),
        "spearman_ci": n.get("spearman_ci"),
        "modes": n.get("modes"),
        "spearman_fast": s.get("spearman_fast"),
        "spearman_fast_heldout": s.get("spearman_fast_heldout"),
        "ceiling_fast": (n.get("fast_mode") or {}).get("ceiling"),
        "heldout_ceiling_fast": ((n.get("heldout") or {}).get("fast_mode") or {}).get("ceiling"),
        "self_spearman": n.get("self_spearman"),
        "ceiling": n.get("ceiling"),
        "heldout_ceiling": (n.get("heldout") or {}).get("ceiling"),
        "separable_pairs": n.get("separable_pairs"),
        "plan_spread": n.get("plan_spread"),
        "process_spread": n.get("process_spread"),
        "host_slope": s.get("host_slope"),
        "verdict": s["verdict"],
        "time_error_mean": s.get("time_error_mean"),
        "time_error_max": s.get("time_error_max"),
        "time_error_heldout_mean": s.get("time_error_heldout_mean"),
        "max_peak_error": err,
        "optimal_gap": s.get("optimal_gap"),
        "peak_ok": err is not None and err <= 0.15,
        "bit_identical": s["bit_identical"],
        "fastest_measured": s["fastest_measured"],
        "fastest_predicted": s["fastest_predicted"],
        "errors": s["errors"],
    }


def line(c: dict[str, Any]) -> str:
    def f(x: float | None, fmt: str = "{:.2f}") -> str:
        return "n/a" if x is None else fmt.format(x)

    ci = c["spearman_ci"]
    held = (
        f"; held out ({c['heldout_plans']} plans) {f(c['spearman_heldout'])} (>= 0.8: {c['spearman_heldout_ok']}, "
        f"ceiling {f(c['heldout_ceiling'])})"
        if c["heldout_plans"] is not None
        else ""
    )
    return (
        f"{c['workload']}: {c['plans']} plans, Spearman(predicted, measured) {f(c['spearman_time'])} "
        f"(90% CI {f(ci[0]) if ci else 'n/a'}..{f(ci[1]) if ci else 'n/a'}; >= 0.8: {c['spearman_ok']}){held}; "
        f"against each plan's fastest call {f(c['spearman_min'])} (held out {f(c['spearman_min_heldout'])}); "
        f"paired {f(c['spearman_paired'])} (held out {f(c['spearman_paired_heldout'])}, ceiling "
        f"{f(c['ceiling_paired'])}, held out {f(c['heldout_ceiling_paired'])}); "
        f"{fast_mode(c)}noise: self-agreement {f(c['self_spearman'])}, ceiling {f(c['ceiling'])}, separable pairs "
        f"{f(c['separable_pairs'], '{:.0%}')}, plans spread {f(c['plan_spread'], '{:.1%}')}, processes spread "
        f"{f(c['process_spread'], '{:.1%}')}, host slope {f(c['host_slope'])} -> {c['verdict']}; predicted time off by "
        f"{f(c['time_error_mean'], '{:.1%}')} on average (at most {f(c['time_error_max'], '{:.1%}')}, held out "
        f"{f(c['time_error_heldout_mean'], '{:.1%}')}); largest peak-memory error "
        f"{f(c['max_peak_error'], '{:.1%}')} (<= 15%: {c['peak_ok']}), bit-identical {c['bit_identical']}, fastest "
        f"measured {c['fastest_measured']}, predicted {c['fastest_predicted']}; optimal's own figure off the "
        f"model's by {f(c.get('optimal_gap'), '{:.2e}')}"
    )


def fast_mode(c: dict[str, Any]) -> str:
    """The fastest mode's figures where the processes fell into modes (``noise.py``)."""
    m = c.get("modes")
    if not m:
        return ""

    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    return (
        f"fastest mode (processes {m['fast']}; the others {m['step']:.2f}x slower or more) {f(c['spearman_fast'])} "
        f"(held out {f(c['spearman_fast_heldout'])}, ceiling {f(c['ceiling_fast'])}, held out "
        f"{f(c['heldout_ceiling_fast'])}); "
    )


def _us(s: float) -> str:
    return f"{s * 1e6:.3g} us"


if __name__ == "__main__":
    sys.exit(main())
