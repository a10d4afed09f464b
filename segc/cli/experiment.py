"""Sweep cut-placement strategies over models and workloads: predicted and measured time
and memory, bit-identity against eager MLX; CSV, JSON, plots and plans.

Models: ``small``, ``reference``, an mlx-lm architecture as every subcommand's targets
take it (``llama``, ``qwen3``, ``mixtral``; ``llama:layers=2,hidden=64`` or
``llama:hidden_size=64,num_hidden_layers=2``), a local model directory, or
``file.py:function``. Workloads: ``decode:CONTEXT``, ``prefill:TOKENS``. Strategies: any
spec of ``segc passes`` and ranges (``balanced:2..18``, ``balanced:2..18:4``,
``memory:0.5x..2x``, ``optimal:0.5x..2x:0.5x``).

Examples::

    segc experiment --out results/                         # small llama, default sweep
    segc experiment --model reference --workload decode:1024 --workload prefill:512 \\
        --strategy none --strategy markers --strategy balanced:2..18:4 --out h200/
    segc experiment --machine cpu.json --repeats 30 --out results/
    segc experiment --machine results/fitted --calibration ... --out again/   # optimal as results/ fitted it
    segc experiment --calibration none --calibration markers --calibration every:4 \\
        --calibration balanced:2 --processes 5 --repeats 10 --out results/   # fitted, held out
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", help="a model spec (repeatable; default small)")
    p.add_argument(
        "--workload", action="append", help="decode:C or prefill:L (repeatable; default decode:128, prefill:128)"
    )
    p.add_argument("--strategy", action="append", help="a strategy or a range (repeatable; default: a sweep of all)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per plan (and process; default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per plan first (default 2)")
    p.add_argument("--boundaries", default="layers.*", help="marker globs ('' for none)")
    p.add_argument(
        "--machine",
        metavar="FILE|DIR",
        help="a machine model from segc calibrate (default: built in), or an earlier experiment's fitted/ "
        "folder: each model and workload's plans made with the model that run fitted",
    )
    p.add_argument("--calibrate", action="store_true", help="calibrate a machine model first (as segc calibrate)")
    p.add_argument(
        "--calibration",
        action="append",
        metavar="STRATEGY",
        help="fit the machine model to this plan's measured times, per model (repeatable); the others are held out",
    )
    p.add_argument(
        "--overheads",
        default="group",
        choices=["group", "shared", "device"],
        help="calibration fits each workload's overheads to its own plans, one set for all, or the device's "
        "figures alone (the host's kept as the machine model has them: segc calibrate --fit none on a GPU)",
    )
    p.add_argument(
        "--host-weight",
        type=float,
        default=1.0,
        help="calibration: the weight of the measured host times in the fit (0: whole calls only)",
    )
    p.add_argument(
        "--fit-repeats",
        action=argparse.BooleanOptionalAction,
        help="calibration: fit the host's saving per equation of a segment that repeats an earlier one's equations too "
        "(default: on a GPU)",
    )
    p.add_argument(
        "--fit-segment-device",
        action=argparse.BooleanOptionalAction,
        help="calibration: fit the device's time per command buffer too (segment_device_s; default: on a GPU)",
    )
    p.add_argument(
        "--no-host-adjust",
        action="store_true",
        help="the calls' times as measured, not adjusted to the host's median speed (a probe before each call)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="a limit for the whole run: timing processes that would end past it are not started",
    )
    p.add_argument(
        "--fit-first",
        action="store_true",
        help="time the --calibration plans and fit the machine model to them first, then make every plan with "
        "that fit and time them all (in fit-first/ beside the results: that phase's own)",
    )
    p.add_argument("--processes", type=int, default=1, help="time in this many fresh processes, one after another")
    p.add_argument(
        "--order",
        default="rounds",
        choices=["rounds", "blocks", "interleaved"],
        help="rounds of short blocks (each timed call after one of its own plan), each plan's calls back to back, "
        "or round-robin over the plans (segc.research.timing)",
    )
    p.add_argument(
        "--commit", default="auto", help="the runtime's commit policy: auto, segment, fences, geometric, every:K"
    )
    p.add_argument("--out", metavar="DIR", help="results.csv, results.json, plans/ and plots here")
    p.add_argument("--plots", default="png,svg", help="plot formats (comma list; '' for none)")
    p.add_argument("--no-eager", action="store_true", help="leave out the eager row")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from segc.errors import SegcError
    from segc.passes.costmodel import MachineModel
    from segc.research import DEFAULT_STRATEGIES, Experiment, run_experiment

    if args.machine and args.calibrate:
        print(
            "segc experiment: --calibrate measures a machine model, --machine reads one: give one of them",
            file=sys.stderr,
        )
        return 2
    try:
        machine = None
        planners: dict = {}
        models = args.model or ["small"]
        workloads = args.workload or ["decode:128", "prefill:128"]
        if args.machine and Path(args.machine).is_dir():  # an experiment's fitted/: plans made with them
            from segc.research import read_fitted

            planners = read_fitted(args.machine, models, workloads)
        elif args.machine:
            machine = MachineModel.load(args.machine)
        elif args.calibrate:
            from segc.research.calibrate import calibrate, fit_overheads

            machine = fit_overheads(calibrate())
        exp = Experiment(
            models=models,
            workloads=workloads,
            strategies=args.strategy or list(DEFAULT_STRATEGIES),
            repeats=args.repeats,
            warmup=args.warmup,
            boundaries=args.boundaries,
            machine=machine,
            planners=planners,
            out=args.out,
            plots=[f for f in args.plots.split(",") if f.strip()],
            progress=not args.quiet,
            eager=not args.no_eager,
            commit=args.commit,
            processes=args.processes,
            order=args.order,
            host_weight=args.host_weight,
            host_adjust=not args.no_host_adjust,
            fit_repeats=args.fit_repeats,
            fit_segment_device=args.fit_segment_device,
            time_limit=args.time_limit,
            log=lambda m: print(m, file=sys.stderr),
            calibration=args.calibration or (),
            overheads=args.overheads,
            fit_first=args.fit_first,
        )
        res = run_experiment(exp)
    except SegcError as exc:
        print(f"segc experiment: {exc}", file=sys.stderr)
        return 2
    print(res.table())
    print()
    print(json.dumps(res.summary(), indent=1, default=str))
    if args.out:
        print(f"results in {args.out}", file=sys.stderr)
    return 0
