"""The device's own time for each plan of an experiment (issue 15: why prefill plans that
cut inside layers measure slower than layer-aligned ones the cost model predicts alike;
for decode, why a plan's device finishes later after the host than predicted).

Each plan of one workload (made here from ``--strategies`` on this device's trace) runs
through ``segc.jit`` under a commit policy (``--commit``) between two kernels that read
the GPU's clock (``device_time.stamped``): the device's span of one call. Under
``fences`` with ``MLX_MAX_OPS_PER_BUFFER`` and ``MLX_MAX_MB_PER_BUFFER`` set past a call's
size (in the environment, before MLX starts), MLX
launches the call as one CUDA graph after the host has encoded all of it, so the span
is the device's own time for the plan, no wait for the host in it; under ``segment`` it
is the span of the real pipeline, the host's waits included. Every plan's output is
compared with eager MLX's, byte for byte (exit 1 if one differs). On a machine without
CUDA the spans are wall-clock times (host and device together).

    MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=100000 \\
        python benchmarks/plan_device.py --workload prefill:512 --commit fences
    python benchmarks/plan_device.py --workload prefill:512 --commit segment

A decode workload (``decode:1024``) has its caches reset to the context before every
call, as the experiment's calls have (``Workload.args``), and its caches' new buffers
are among the outputs the span ends on.

Before every call the host's speed is probed as the experiment's calls are
(``segc.research.timing.host_probe``), and the host's time until the call returns is
kept: each plan's row gives its span in the host's fast and slow halves (the calls
split at the median probe of every plan's) and its host time, since on the H200's
machine the device's part was found slower while the host ran fast
(docs/experiments.md, "Offline: the device's speed in each half").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

STRATEGIES = "none,markers,every:2,every:4,balanced:6,balanced:10,memory:1x,memory:2x,optimal,min_boundary_bytes"


def main() -> None:
    from device_time import stamped

    import segc
    from segc import dtypes
    from segc.ir import segments
    from segc.passes import make_plan
    from segc.passes.plan import apply_plan
    from segc.research.models import load_model, make_workload
    from segc.research.timing import host_probe

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="reference")
    ap.add_argument("--workload", default="prefill:512")
    ap.add_argument("--strategies", default=STRATEGIES)
    ap.add_argument("--commit", default="fences")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every plan, each plan's calls in a row")
    args = ap.parse_args()

    model = load_model(args.model)
    wl = make_workload(args.workload, model)
    want = dtypes.to_bytes(wl.reference(model))
    a, k = wl.args()
    g = segc.jit(model, boundaries="layers.*").trace(*a, **k).graph
    fns = {}
    for spec in args.strategies.split(","):
        plan = make_plan(g, spec)
        fn = segc.jit(model, boundaries="layers.*", strategy=plan, validate=False, commit=args.commit)
        a, k = wl.args()  # a decode call's caches reset to the context, as the experiment's calls are
        out = fn(*a, **k)
        mx.eval(out, wl.sync())
        fns[spec] = (fn, len(segments(apply_plan(g, plan))), dtypes.to_bytes(out) == want)
    calls: dict[str, list[tuple[float, float, float]]] = {s: [] for s in fns}  # (span, host, probe)
    for _ in range(args.rounds):
        for spec, (fn, _, _) in fns.items():
            host: list[float] = []

            def body(y: mx.array, fn=fn, host=host) -> list[mx.array]:
                _, k = wl.args()
                t = time.perf_counter()
                out = fn(y, **k)
                host.append(time.perf_counter() - t)
                return [out, *wl.sync()]

            for _ in range(2):
                stamped(wl.tokens, body)
            for _ in range(args.repeats):
                probe = host_probe()
                calls[spec].append((stamped(wl.tokens, body), host[-1], probe))
    mid = statistics.median(c[2] for cs in calls.values() for c in cs)
    print(f"{mx.default_device()}: {args.model} {args.workload}, commit {args.commit}, device span per call (ms)")
    print(f"host halves split at a probe of {1e3 * mid:.3f} ms")
    print("| plan | segments | median | min | host fast: span | host slow: span | host until return | eager's bits |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for spec, (_, n, same) in fns.items():
        t = [c[0] for c in calls[spec]]
        halves = [_median([c[0] for c in calls[spec] if (c[2] < mid) == fast]) for fast in (True, False)]
        print(
            f"| `{spec}` | {n} | {1e3 * statistics.median(t):.3f} | {1e3 * min(t):.3f} | {halves[0]} | "
            f"{halves[1]} | {1e3 * statistics.median(c[1] for c in calls[spec]):.3f} | {'yes' if same else 'NO'} |"
        )
    if not all(same for _, _, same in fns.values()):
        sys.exit(1)  # a plan's output is not eager's


def _median(xs: list[float]) -> str:
    """Milliseconds, or "n/a" for a half without a call."""
    return f"{1e3 * statistics.median(xs):.3f}" if xs else "n/a"


if __name__ == "__main__":
    main()
