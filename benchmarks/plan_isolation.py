"""Does timing plans round-robin in one process, as the experiment does, change what
they measure? (issue 15: plans that cut inside a layer measured 0.1-0.4 ms slower than
predicted on run AR, those whose segments repeat a layer's did not.)

MLX's CUDA build keeps one instantiated CUDA graph per command buffer *topology* (its
kinds of node and their edges, not its kernels: ``CommandEncoder::commit`` in
mlx/backend/cuda/device.cpp, an LRU of ``MLX_CUDA_GRAPH_CACHE_SIZE`` = 400 entries),
updated with each new buffer of that topology (``cudaGraphExecUpdate``), instantiated
afresh where the update fails. So the plans timed in one process share those graphs,
and a plan's time may depend on which plans ran before it. Three modes, each process
of its own, ``--processes`` each, interleaved:

- ``rr``: every plan in turn, each process's rounds starting at another plan
  (``segc.research.timing``'s ``"interleaved"`` order, the experiment's before
  2026-12-04);
- ``alone``: each plan's calls back to back, after its own warm-up, one plan at a
  time in the same process (the ``"blocks"`` order);
- ``rrcache``: ``rr`` with ``MLX_CUDA_GRAPH_CACHE_SIZE=100000`` (no eviction);
- ``rounds`` (not in the default ``--modes``): rounds of short blocks, each timed call
  after one of its own plan (the ``"rounds"`` order, the experiment's since).

Prints each plan's median over processes of each process's median, per mode, and
the Spearman of each mode against the others; ``--json`` writes them.

    python benchmarks/plan_isolation.py [--workloads decode:1024,prefill:512] [--processes 3] [--repeats 10] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx

from segc import jit
from segc.passes import make_plan
from segc.passes.costmodel import default_model
from segc.research import expand, load_model, make_workload, spearman
from segc.research.timing import timed_calls

STRATEGIES = "none,markers,every:2,every:4,balanced:2..18:4,memory:1x..2x:1x,optimal,optimal:1x,min_boundary_bytes"
MODES = ("rr", "alone", "rrcache", "rounds")
ORDER = {"rr": "interleaved", "alone": "blocks", "rrcache": "interleaved", "rounds": "rounds"}


def child(a: argparse.Namespace) -> dict:
    model = load_model(a.model)
    specs = [s for spec in a.strategies.split(",") for s in expand(spec)]
    machine = default_model()
    out: dict = {}
    for wspec in a.workloads.split(","):
        wl = make_workload(wspec, model)
        wl.fresh = None
        args, kw = wl.args()
        g = jit(model, boundaries="layers.*").trace(*args, **kw).graph
        names, fns = ["eager"], [model]
        for spec in specs:
            plan = make_plan(g, spec, model=machine)
            names.append(spec)
            fns.append(jit(model, boundaries="layers.*", strategy=plan, validate=False, commit="auto"))
        for fn in fns:  # the first call traces and compiles
            for _ in range(1 + a.warmup):
                args, kw = wl.args()
                mx.eval(fn(*args, **kw), wl.sync())
        got = timed_calls(fns, wl, a.repeats, ORDER[a.child], warmup=a.warmup, rotate=a.rotate)
        times = [t.times for t in got]
        out[wspec] = {name: statistics.median(t) for name, t in zip(names, times)}
        del fns
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="reference")
    ap.add_argument("--workloads", default="decode:1024,prefill:512")
    ap.add_argument("--strategies", default=STRATEGIES)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default="rr,alone,rrcache")
    ap.add_argument("--json")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--rotate", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        Path(a.result).write_text(json.dumps(child(a)))
        return
    modes = a.modes.split(",")
    got: dict[str, list[dict]] = {m: [] for m in modes}
    t_all = time.perf_counter()
    for p in range(a.processes):
        for m in modes:
            env = dict(os.environ)
            if m == "rrcache":
                env["MLX_CUDA_GRAPH_CACHE_SIZE"] = "100000"
            res = Path(f"/tmp/plan_isolation_{os.getpid()}_{m}_{p}.json")
            cmd = [sys.executable, __file__, "--child", m, "--rotate", str(p), "--result", str(res)]
            cmd += ["--model", a.model, "--workloads", a.workloads, "--strategies", a.strategies]
            cmd += ["--repeats", str(a.repeats), "--warmup", str(a.warmup)]
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                sys.exit(f"{m} process {p} failed:\n{r.stderr[-3000:]}")
            got[m].append(json.loads(res.read_text()))
            res.unlink()
            print(f"process {p} {m}: {time.perf_counter() - t0:.0f} s", flush=True)
    summary: dict = {"device": str(mx.default_device()), "modes": {}}
    for w in a.workloads.split(","):
        names = list(got[modes[0]][0][w])
        med = {m: {n: statistics.median(run[w][n] for run in got[m]) for n in names} for m in modes}
        summary["modes"][w] = med
        print(f"\n{w}: median over {a.processes} processes of each one's median, ms")
        print(f"{'plan':22s}" + "".join(f"{m:>10s}" for m in modes))
        for n in names:
            print(f"{n:22s}" + "".join(f"{1e3 * med[m][n]:10.3f}" for m in modes))
        planned = [n for n in names if n != "eager"]
        for i, m1 in enumerate(modes):
            for m2 in modes[i + 1 :]:
                rho = spearman([med[m1][n] for n in planned], [med[m2][n] for n in planned])
                print(f"Spearman {m1} vs {m2} over the plans: {'n/a' if rho is None else f'{rho:.2f}'}")
    print(f"{time.perf_counter() - t_all:.0f} s in all")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
