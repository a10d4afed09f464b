"""Time a target three ways on this machine: eager MLX, one ``mx.compile`` of the whole
function, and segc (segmented). Each call is waited for (``mx.eval``); the table gives
the median, the spread (min, max, interquartile range) and the ratio to eager.

Examples::

    segc bench llama:layers=4,hidden=256 --tokens 128
    segc bench graph.segc --repeats 50 --format json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from .common import add_format, emit, positive_int, progress
from .target import add_strategy_argument, add_target_arguments, load, strategy_spec

COLUMNS = [
    ("mode", "mode"),
    ("median_s", "median>"),
    ("min_s", "min>"),
    ("max_s", "max>"),
    ("iqr_s", "IQR>"),
    ("ratio", "vs eager>"),
    ("calls", "calls>"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    add_strategy_argument(p)
    p.add_argument("--repeats", type=positive_int(), default=20, help="timed calls of each (default 20)")
    p.add_argument("--warmup", type=positive_int(0), default=2, help="untimed calls first (default 2)")
    add_format(p)


def candidates(target: Any, strategy: str) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The three ways to run ``target``, and its ``Jitted`` (None for an IR file)."""
    import mlx.core as mx

    if target.kind == "ir":
        from ..passes import run_pass
        from ..runtime import Executor
        from .target import cut

        g = target.graph
        whole = run_pass("strip_cuts", g)
        inputs = target.flat_inputs()
        eager, compiled, seg = Executor(whole, compile=False), Executor(whole), Executor(cut(g, strategy)[0])
        fns = {
            "eager (op by op)": lambda: eager(list(inputs)),
            "mx.compile": lambda: compiled(list(inputs)),
            "segc": lambda: seg(list(inputs)),
        }
        return fns, None
    fn, xs = target.fn, target.args
    comp = mx.compile(fn)
    step = target.jitted(strategy=strategy_spec(strategy)) if strategy != "markers" else target.jitted()
    return {"eager": lambda: fn(*xs), "mx.compile": lambda: comp(*xs), "segc": lambda: step(*xs)}, step


def run(args: argparse.Namespace) -> int:
    import mlx.core as mx

    target = load(args)
    fns, step = candidates(target, args.strategy)
    times: dict[str, list[float]] = {k: [] for k in fns}
    with progress(len(fns) * (args.repeats + args.warmup), "timing") as bar:
        for name, fn in fns.items():
            for i in range(args.warmup + args.repeats):
                t0 = time.perf_counter()
                mx.eval(fn())
                dt = time.perf_counter() - t0
                if i >= args.warmup:
                    times[name].append(dt)
                bar.advance(what=f"timing {name}")
    base = statistics.median(next(iter(times.values())))
    rows = []
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        med = statistics.median(ts)
        rows.append(
            {
                "mode": name,
                "median_s": med,
                "min_s": min(ts),
                "max_s": max(ts),
                "iqr_s": q[2] - q[0],
                "ratio": med / base,  # raw in csv and json; two decimals in the table (common.cell)
                "calls": len(ts),
            }
        )
    if step is not None:
        for why in step.cache_info().aborted:  # automatic fallbacks, reported
            print(f"segc bench: fallback: {why}", file=sys.stderr)
    dev = str(mx.default_device())
    meta = {"target": target.label, "device": dev, "repeats": args.repeats, "warmup": args.warmup}
    emit(rows, COLUMNS, args.format, title=f"{target.label} on {dev} (measured, seconds per call)", meta=meta)
    return 0
