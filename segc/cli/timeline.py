"""Run a target through segc and write its timeline as a Chrome trace (``--timeline
out.json``): every segment's dispatch and completion, waits, signals, window and stash
copies, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Examples::

    segc run llama:layers=4 --timeline llama.json
    segc run graph.segc --calls 3 --timeline g.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .common import positive_int
from .target import add_strategy_argument, add_target_arguments, cut, load, read_schedule, strategy_spec


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    add_strategy_argument(p)
    p.add_argument("--timeline", metavar="FILE", help="write the Chrome/Perfetto trace JSON here")
    p.add_argument("--calls", type=positive_int(), default=2, help="calls recorded (default 2; the first compiles)")
    p.add_argument("--schedule", metavar="FILE", help="a fence schedule (JSON): its signals and waits run too")


def writable(path: str) -> None:
    """Raise the ``OSError`` of opening ``path`` for writing, leaving no file behind."""
    existed = os.path.exists(path)
    open(path, "a").close()
    if not existed:
        os.remove(path)


def run(args: argparse.Namespace) -> int:
    import mlx.core as mx

    from ..ir import segments
    from ..runtime import Executor
    from ..runtime.perfetto import to_chrome_trace, wait_complete

    if args.timeline:  # before the work: a path that cannot be written is a mistake now
        writable(args.timeline)
    target = load(args)
    timeline: list = []
    if target.kind == "ir" or args.schedule:
        g, _ = cut(target.traced_graph(), args.strategy, legalize=not args.no_legalize)
        fences = None
        if args.schedule:
            from ..passes import run_pass
            from ..runtime.events import Event
            from ..runtime.fenced import Fences

            g = run_pass("fences", g, schedule=read_schedule(args.schedule))
            used = {str(e.args[0]) for e in g.eqns if e.prim in ("segc.signal", "segc.wait", "segc.host_event")}
            fences = Fences({n: Event(name=n) for n in sorted(used)}, timeout=10.0)
        ex = Executor(g)
        inputs = target.flat_inputs()
        for _ in range(args.calls):
            mx.eval(ex(list(inputs), fences=fences, timeline=timeline))
        fallbacks: list[str] = []
    else:
        step = target.jitted(strategy=strategy_spec(args.strategy)) if args.strategy != "markers" else target.jitted()
        step.record_timeline(timeline)
        for _ in range(args.calls):
            mx.eval(step(*target.args))
        step.record_timeline(None)
        g = step.entries()[-1].graph
        info = step.cache_info()
        fallbacks = list(info.aborted) + ([f"{info.eager_calls} calls ran eagerly"] if info.eager_calls else [])
    wait_complete(timeline)
    names = [s.name for s in segments(g)]
    trace = to_chrome_trace(timeline, names, process=f"segc run {target.label}")
    n = sum(1 for e in timeline if e[1] == "dispatch")
    print(f"{target.label}: {args.calls} calls, {len(names)} segments, {n} dispatches recorded")
    for why in fallbacks:
        print(f"segc run: fallback: {why}", file=sys.stderr)
    if args.timeline:  # written whole, only now that the run succeeded
        text = json.dumps(trace)
        with open(args.timeline, "w") as f:
            f.write(text)
        print(f"timeline: {len(trace['traceEvents'])} events -> {args.timeline} (open in ui.perfetto.dev)")
    return 0
