"""Does timing plans round-robin in one process, as the experiment did, change what
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

The plans are made here, as the experiment makes them; each process is one of the
experiment's timing processes (``segc.research.timing``'s ``Job``) in that mode's
order. Prints each plan's median over processes of each process's median, per mode, and
the Spearman of each mode against the others; ``--json`` writes them.

    python benchmarks/plan_isolation.py [--workloads decode:1024,prefill:512] [--processes 3] [--repeats 10] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from segc import jit
from segc.passes import make_plan
from segc.passes.costmodel import default_model
from segc.research import expand, load_model, make_workload, spearman
from segc.research.timing import Job, time_in_processes

STRATEGIES = "none,markers,every:2,every:4,balanced:2..18:4,memory:1x..2x:1x,optimal,optimal:1x,min_boundary_bytes"
MODES = ("rr", "alone", "rrcache", "rounds")
ORDER = {"rr": "interleaved", "alone": "blocks", "rrcache": "interleaved", "rounds": "rounds"}


def plans(a: argparse.Namespace) -> tuple[list[str], list[tuple[str, list[str | None]]]]:
    """The plans' names (eager first) and, per workload, the plans as JSON (``None``:
    eager), made here on the model's trace as the experiment makes them."""
    model = load_model(a.model)
    specs = [s for spec in a.strategies.split(",") for s in expand(spec)]
    wls: list[tuple[str, list[str | None]]] = []
    for wspec in a.workloads.split(","):
        wl = make_workload(wspec, model)
        args, kw = wl.args()
        g = jit(model, boundaries="layers.*").trace(*args, **kw).graph
        wls.append((wspec, [None, *(make_plan(g, s, model=default_model()).to_json() for s in specs)]))
    return ["eager", *specs], wls


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
    a = ap.parse_args()
    modes = a.modes.split(",")
    names, wls = plans(a)
    job = Job(a.model, "layers.*", "auto", a.repeats, a.warmup, wls)
    # per mode, per workload, per plan: each process's median
    got: dict[str, list[list[list[float]]]] = {m: [[[] for _ in names] for _ in wls] for m in modes}
    t_all = time.perf_counter()
    for p in range(a.processes):
        for m in modes:
            before = os.environ.get("MLX_CUDA_GRAPH_CACHE_SIZE")
            if m == "rrcache":  # read by the timing process's MLX
                os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"] = "100000"
            t0 = time.perf_counter()
            try:
                timed = time_in_processes(replace(job, order=ORDER[m], rotate=p), 1)
            finally:
                if before is None:
                    os.environ.pop("MLX_CUDA_GRAPH_CACHE_SIZE", None)
                else:
                    os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"] = before
            for w, per_plan in enumerate(timed):
                for i, (t,) in enumerate(per_plan):
                    got[m][w][i].append(statistics.median(t.times))
            print(f"process {p} {m}: {time.perf_counter() - t0:.0f} s", flush=True)
    summary: dict = {"device": str(mx.default_device()), "modes": {}}
    for w, (wspec, _) in enumerate(wls):
        med = {m: {n: statistics.median(got[m][w][i]) for i, n in enumerate(names)} for m in modes}
        summary["modes"][wspec] = med
        print(f"\n{wspec}: median over {a.processes} processes of each one's median, ms")
        print(f"{'plan':22s}" + "".join(f"{m:>10s}" for m in modes))
        for n in names:
            print(f"{n:22s}" + "".join(f"{1e3 * med[m][n]:10.3f}" for m in modes))
        planned = names[1:]
        for i, m1 in enumerate(modes):
            for m2 in modes[i + 1 :]:
                rho = spearman([med[m1][n] for n in planned], [med[m2][n] for n in planned])
                print(f"Spearman {m1} vs {m2} over the plans: {'n/a' if rho is None else f'{rho:.2f}'}")
    print(f"{time.perf_counter() - t_all:.0f} s in all")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
