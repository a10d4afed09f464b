"""Why does a prefill on the H200 switch between two speeds (about 3.5 and 6.5 ms for
the reference llama's 512 tokens) for seconds at a time, within one process and
across processes? (issue 15: the experiment's prefill measurement agrees with itself
at only 0.5-0.7, run AW's processes spread 58%.)

Each mode is a process of its own, the modes in turn, ``--rounds`` times:

- ``free``: the process as started (the affinity it inherits);
- ``node``: pinned to the CPUs local to the GPU (its PCI device's ``local_cpulist``);
- ``core``: pinned to the first of those CPUs;
- ``core2``: pinned to the first two.

In each process, ``--calls`` rounds of: a fixed pure-Python loop (the host CPU's
speed), a fixed device-bound matrix product (the GPU's speed), then two timed calls
each of eager MLX and segc (its defaults, a segment per layer; its output checked
against eager's, raw bytes, once per process). Each call records the
CPU it ended on (``/proc/thread-self/stat``). ``nvidia-smi`` logs the SM clock, power
and temperature every 100 ms meanwhile. Prints, per mode and function, the median and
10th-90th percentiles of the calls, and the correlation of the calls' times with the
CPU probe, the GPU probe, the SM clock and a change of CPU; ``--json`` writes every
call.

    python benchmarks/host_jitter.py [--modes free,node,core] [--calls 40] [--rounds 1] [--json F]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path


def this_cpu() -> int:
    return int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])


def gpu_cpus() -> list[int]:
    """The CPUs local to the (first) NVIDIA GPU, within this process's affinity."""
    mine = sorted(os.sched_getaffinity(0))
    try:
        bus = subprocess.run(
            ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()[0]
        text = Path(f"/sys/bus/pci/devices/{bus[4:].lower()}/local_cpulist").read_text().strip()
    except (OSError, IndexError, subprocess.SubprocessError):
        return mine
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return [c for c in mine if c in cpus] or mine


def child(mode: str, calls: int, out: str, model_spec: str, workload: str, size: int) -> None:
    local = gpu_cpus()
    pick = {"free": None, "node": local, "core": local[:1], "core2": local[:2]}[mode]
    if pick is not None:
        os.sched_setaffinity(0, pick)
    import mlx.core as mx

    from segc import jit
    from segc.dtypes import to_bytes
    from segc.research import load_model, make_workload
    from segc.research.timing import host_probe

    def cpu_probe() -> float:  # ten of the experiment's own probes: about 6 ms at full speed
        return sum(host_probe() for _ in range(10))

    model = load_model(model_spec)
    wl = make_workload(workload, model)
    fns = {"eager": model, "segc": jit(model, boundaries="layers.*")}
    a = mx.random.normal((size, size)).astype(mx.bfloat16)
    mx.eval(a)

    def gpu_probe() -> float:
        t0 = time.perf_counter()
        mx.eval(a @ a @ a @ a)
        return time.perf_counter() - t0

    outs = {}
    for name, fn in fns.items():
        for _ in range(3):
            outs[name] = fn(*wl.args()[0])
            mx.eval(outs[name])
    same = to_bytes(outs["segc"]) == to_bytes(outs["eager"])
    del outs
    gpu_probe()
    rows = []
    for r in range(calls):
        cp, gp = cpu_probe(), gpu_probe()
        for name, fn in fns.items():
            for k in range(2):
                c0 = this_cpu()
                t0 = time.perf_counter()
                y = fn(*wl.args()[0])
                t1 = time.perf_counter()
                mx.eval(y)
                t2 = time.perf_counter()
                rows.append(dict(mode=mode, round=r, fn=name, k=k, at=time.time(), wall=t2 - t0, host=t1 - t0,
                                 cpu_probe=cp, gpu_probe=gp, cpu0=c0, cpu1=this_cpu()))  # fmt: skip
    Path(out).write_text(
        json.dumps({"mode": mode, "affinity": sorted(os.sched_getaffinity(0)), "same": same, "rows": rows})
    )


def corr(x: list[float], y: list[float]) -> float:
    if len(x) < 3 or any(v != v for v in y) or statistics.pstdev(x) == 0 or statistics.pstdev(y) == 0:
        return float("nan")
    return statistics.correlation(x, y)


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def shell(cmd: str) -> str:
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
    return (r.stdout + r.stderr).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="free,node,core")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--model", default="reference")
    ap.add_argument("--workload", default="prefill:512")
    ap.add_argument("--probe-size", type=int, default=8192, help="the GPU probe's matrices' side")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.calls, a.child[1], a.model, a.workload, a.probe_size)
        return
    print("affinity", sorted(os.sched_getaffinity(0)), "GPU-local", gpu_cpus())
    print(shell("lscpu | grep -E 'Model name|^CPU\\(s\\)|NUMA|MHz|Thread'"))
    print("governor", shell("cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"))
    print(shell("nvidia-smi topo -m | head -4"))
    print(
        shell(
            "nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,pstate --format=csv"
        )
    )
    log = Path("/tmp/host_jitter_smi.csv")
    log.unlink(missing_ok=True)
    smi = None if shutil.which("nvidia-smi") is None else subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=log.open("w"), stderr=subprocess.DEVNULL,
    )  # fmt: skip
    runs = []
    try:
        for r in range(a.rounds):
            for mode in a.modes.split(","):
                out = f"/tmp/host_jitter_{mode}_{r}.json"
                t0 = time.perf_counter()
                p = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--calls",
                        str(a.calls),
                        "--model",
                        a.model,
                        "--workload",
                        a.workload,
                        "--probe-size",
                        str(a.probe_size),
                        "--child",
                        mode,
                        out,
                    ],
                    timeout=600,
                )
                if p.returncode != 0:
                    raise SystemExit(f"{mode}: exit {p.returncode}")
                runs.append(json.loads(Path(out).read_text()))
                print(
                    f"{mode} round {r}: {time.perf_counter() - t0:.0f} s, affinity {runs[-1]['affinity']}", flush=True
                )
    finally:
        if smi is not None:
            smi.terminate()
    clocks: list[tuple[float, float]] = []
    for line in (log.read_text() if log.is_file() else "").splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            clocks.append((datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp(), float(f[1])))
        except (ValueError, IndexError):
            continue
    at = [c[0] for c in clocks]

    def sm(t: float) -> float:
        i = bisect.bisect_left(at, t)
        return clocks[min(i, len(clocks) - 1)][1] if clocks else float("nan")

    if clocks:
        sms = [c[1] for c in clocks]
        print(f"SM clock over the run: min {min(sms):.0f}, median {statistics.median(sms):.0f}, max {max(sms):.0f} MHz")
    print(
        "| mode | fn | median ms | p10-p90 ms | host median | r(cpu probe) | r(gpu probe) | r(SM clock) | r(CPU moved) | CPUs used |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for mode in a.modes.split(","):
        for fn in ("eager", "segc"):
            rows = [x for run in runs if run["mode"] == mode for x in run["rows"] if x["fn"] == fn]
            w = [x["wall"] * 1e3 for x in rows]
            moved = [float(x["cpu0"] != x["cpu1"]) for x in rows]
            print(f"| {mode} | {fn} | {statistics.median(w):.2f} | {pct(w, 0.1):.2f}-{pct(w, 0.9):.2f} | "
                  f"{statistics.median(x['host'] for x in rows) * 1e3:.2f} | "
                  f"{corr(w, [x['cpu_probe'] for x in rows]):.2f} | {corr(w, [x['gpu_probe'] for x in rows]):.2f} | "
                  f"{corr(w, [sm(x['at']) for x in rows]):.2f} | {corr(w, moved):.2f} | "
                  f"{len({x['cpu1'] for x in rows})} |")  # fmt: skip
        cp = [x["cpu_probe"] * 1e3 for run in runs if run["mode"] == mode for x in run["rows"]]
        gp = [x["gpu_probe"] * 1e3 for run in runs if run["mode"] == mode for x in run["rows"]]
        print(f"|   {mode} probes | cpu {statistics.median(cp):.2f} ({pct(cp, 0.1):.2f}-{pct(cp, 0.9):.2f}) ms, "
              f"gpu {statistics.median(gp):.2f} ({pct(gp, 0.1):.2f}-{pct(gp, 0.9):.2f}) ms |")  # fmt: skip
    print("segc's output has eager's bytes in every process:", all(run["same"] for run in runs))
    for run in runs:
        seq = " ".join(f"{x['wall'] * 1e3:.1f}" for x in run["rows"] if x["fn"] == "segc")
        print(f"{run['mode']} segc: {seq}")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "clocks": clocks}))


if __name__ == "__main__":
    main()
