"""Calibrate a machine model for the cost model on this machine (JSON).

Microbenchmarks give the bandwidth and FLOP rate; then the per-kernel, per-segment and
per-commit figures (and one factor on the rates) are fitted to whole calls of a small
llama under a few plans (``--fit none`` skips that). To fit to the model under study,
use ``segc experiment --calibration``. The JSON goes to ``--out`` (default: stdout) and
is read by ``segc experiment --machine FILE`` and ``segc.passes.costmodel.MachineModel.load``.

Examples::

    segc calibrate --out cpu.json
    segc calibrate --fit none --repeats 3
    segc calibrate --fit llama:num_hidden_layers=2 --workloads decode:32
    segc calibrate --fit none --out gpu.json   # on a GPU: the host's figures measured apart,
    segc experiment --machine gpu.json --overheads device --calibration markers ...   # kept

``--host kinds`` (the default on a GPU) measures the host's time per segment, per product
kernel and per elementwise kernel on a grid of small segments (``host_kinds`` in
``segc.research.calibrate``); ``--host chain`` times a chain of tiny products (the CPU's
default).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", help="write the model here (default: print it)")
    p.add_argument("--name", help="the model's name (default: cpu or gpu)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per figure (median)")
    p.add_argument(
        "--fit",
        default="small",
        metavar="MODEL",
        help="fit the overheads on this model (segc experiment's model specs), or 'none'",
    )
    p.add_argument("--workloads", default="decode:64,prefill:32", help="workloads of the fit (comma list)")
    p.add_argument("--size", default="auto", choices=["auto", "small", "large"], help="microbenchmark sizes")
    p.add_argument("--commit", default="auto", help="the runtime's commit policy the fit's plans run under")
    p.add_argument(
        "--host", default="auto", choices=["auto", "kinds", "chain"], help="how the host's figures are measured"
    )


def run(args: argparse.Namespace) -> int:
    from segc.errors import SegcError
    from segc.research.calibrate import calibrate, fit_overheads

    if args.repeats < 1:
        print("segc calibrate: --repeats must be at least 1", file=sys.stderr)
        return 2
    try:
        m = calibrate(args.name, repeats=args.repeats, size=args.size, host=args.host)
        if args.fit != "none":
            wls = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
            m = fit_overheads(m, args.fit, workloads=wls, repeats=args.repeats, commit=args.commit)
    except SegcError as exc:
        print(f"segc calibrate: {exc}", file=sys.stderr)
        return 2
    if args.out:
        m.save(args.out)
        print(f"machine model {m.name!r} -> {args.out}", file=sys.stderr)
    else:
        print(m.to_json(), end="")
    return 0
