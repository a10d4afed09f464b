"""Predicted against measured, for every cut-placement strategy (issue 15).

Calibrates a machine model on this machine (microbenchmarks, then the overheads fitted
on a small llama), runs a sweep of every strategy over the given model and workloads
(``segc.research``), and prints the table, the summary and the checks of the issue:
Spearman's rank correlation of predicted and measured time across plans (>= 0.8), the
largest error of predicted peak memory against ``mx.get_peak_memory`` (<= 15%), and
bit-identity with eager MLX. Results (CSV, JSON, plans, plots) go to ``--out``; the
summary as JSON to ``--json``.

    python benchmarks/bench_experiment.py --out out/experiment --json out/experiment.json   # the H200 run
    python benchmarks/bench_experiment.py --model small --workloads decode:128,prefill:64 --repeats 10
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import mlx.core as mx

from segc.passes.costmodel import MachineModel
from segc.research import Experiment, run_experiment
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
    "min_boundary_bytes",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="reference")
    p.add_argument("--workloads", default="decode:1024,prefill:512")
    p.add_argument("--strategies", default=",".join(EVERY), help="comma list (ranges allowed)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--machine", metavar="FILE", help="a saved machine model instead of calibrating")
    p.add_argument(
        "--fit", default="small", help="the model the overheads are fitted on ('none': microbenchmarks only)"
    )
    p.add_argument("--fit-workloads", default="decode:256,prefill:128")
    p.add_argument("--out", default="out/experiment")
    p.add_argument("--plots", default="png,svg")
    p.add_argument("--json", metavar="FILE", help="write the summary and checks here")
    args = p.parse_args()

    t0 = time.perf_counter()
    if args.machine:
        machine = MachineModel.load(args.machine)
    else:
        machine = calibrate()
        if args.fit != "none":
            machine = fit_overheads(machine, args.fit, workloads=tuple(args.fit_workloads.split(",")))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    machine.save(Path(args.out) / "machine.json")
    t_cal = time.perf_counter() - t0
    print(f"machine model ({t_cal:.1f} s): {machine}", flush=True)
    plots = [f for f in args.plots.split(",") if f]
    if plots and importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed: no plots (pip install 'segc[research]')", flush=True)
        plots = []
    exp = Experiment(
        models=[args.model],
        workloads=args.workloads.split(","),
        strategies=args.strategies.split(","),
        repeats=args.repeats,
        warmup=args.warmup,
        machine=machine,
        out=args.out,
        plots=plots,
    )
    res = run_experiment(exp)
    print(res.table())
    checks = []
    for s in res.summary():
        rho, err = s["spearman_time"], s["max_peak_error"]
        checks.append(
            {
                "model": s["model"],
                "workload": s["workload"],
                "plans": s["plans"],
                "spearman_time": rho,
                "spearman_ok": rho is not None and rho >= 0.8,
                "max_peak_error": err,
                "peak_ok": err is not None and err <= 0.15,
                "bit_identical": s["bit_identical"],
                "errors": s["errors"],
            }
        )
        rho_s = "n/a" if rho is None else f"{rho:.2f}"
        err_s = "n/a" if err is None else f"{100 * err:.1f}%"
        print(
            f"{s['workload']}: {s['plans']} plans, Spearman(predicted, measured) {rho_s} (>= 0.8: "
            f"{checks[-1]['spearman_ok']}), largest peak-memory error {err_s} (<= 15%: {checks[-1]['peak_ok']}), "
            f"bit-identical {s['bit_identical']}, fastest measured {s['fastest_measured']}, predicted "
            f"{s['fastest_predicted']}"
        )
    total = time.perf_counter() - t0
    print(f"{total:.0f} s in all on {mx.default_device()}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"env": res.env, "machine": vars_of(machine), "checks": checks, "seconds": total}, indent=1)
        )
    return 0


def vars_of(m: MachineModel) -> dict:
    return json.loads(m.to_json())


if __name__ == "__main__":
    sys.exit(main())
