"""Where a decode call's host time goes, process by process, and the commit schedules
side by side inside each process (issue 13: one segment in place ran at 1.6-1.8 ms in
some processes and 2-3 ms in others, its host time then nearly the step's).

The reference llama at a fixed context (``bench_llama.FixedContext``); each of
``--variants`` is ``eager`` (mlx-lm as it is) or a ``SEGC_LIVE_COMMITS`` schedule for
one segment, concatenated, frozen, in place (``wholefrozen+inplace``; ``default``: the
variable unset; ``tune``: chosen by the segment over 80 calls of its own before the
others', each waited for, and the tuner's choice printed; a suffix ``@t`` commits on a thread of its own, ``SEGC_COMMIT_THREAD=1``,
``@t50`` with ``SEGC_COMMIT_SWITCH=50``), a model of its own, its calls interleaved with the others' (a change
of the host's speed hits every variant alike; the variants share MLX's caches, whose
keys differ). Each segc call is split by timing wrappers around its ``mx.compile``'d
stretches (building the lazy graph) and ``mx.async_eval`` (MLX's encoding and the
commits). Per variant, ``--calls`` calls after ten to warm up: the median of each part,
the call's host time (until it returns), the wait after it, the main thread's context
switches a call (voluntary: it blocked; involuntary: it was preempted), each commit's
median by its place (``--by-place``), and whether one more call's logits are eager's
bytes (``=eager``, where eager is among the variants; the models and caches are seeded
alike); per process, the median of ``bench_llama.host_probe``
(``probe``: the host's speed) and the CPU the main thread last ran on. ``--processes``
fresh processes run one after another. With ``tune`` and two fixed schedules or more
(not eager, no committing thread), a line a process says whether the tuner chose the
schedule whose step was the fastest interleaved there, and tune's step against it; the
last line, in how many processes it did (``verdict``).

    python benchmarks/host_modes.py [--processes 8] [--calls 40] [--variants default]
    python benchmarks/host_modes.py --processes 3 --variants eager default 1,1,2 1,2,1,2,1,2,1,2,1,2,1,2
    python benchmarks/host_modes.py --processes 2 --variants eager default default@t 4@t default@t100
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

PARTS = ("step", "host", "stretch", "async", "wait", "vcsw", "ivcsw")


def child(variants: list[str], calls: int, context: int, preset: str) -> dict[str, Any]:
    from bench_llama import FixedContext, boundaries_of, host_probe, make_model, raw_bytes

    import segc

    spent = {"stretch": 0.0, "async": 0.0}
    commits: list[float] = []
    real_compile, real_async = mx.compile, mx.async_eval

    def timed_compile(fn: Any, *a: Any, **k: Any) -> Any:
        c = real_compile(fn, *a, **k)

        def run(*xs: Any) -> Any:
            t = time.perf_counter()
            r = c(*xs)
            spent["stretch"] += time.perf_counter() - t
            return r

        return run

    def timed_async(*xs: Any) -> None:
        t = time.perf_counter()
        real_async(*xs)
        d = time.perf_counter() - t
        spent["async"] += d
        commits.append(d)

    mx.compile, mx.async_eval = timed_compile, timed_async  # type: ignore[assignment]
    x = mx.array([[7]])
    steps: dict[str, tuple[Any, Any]] = {}
    for v in variants:
        model = make_model(preset)  # seeded: every variant the same weights
        fc = FixedContext(model, context)
        if v == "eager":
            steps[v] = (model, fc)
            continue
        schedule, _, thread = v.partition("@")  # "@t": SEGC_COMMIT_THREAD=1; "@t50": its switch interval 50 us
        for name in ("SEGC_LIVE_COMMITS", "SEGC_COMMIT_THREAD", "SEGC_COMMIT_SWITCH"):
            os.environ.pop(name, None)
        if schedule != "default":
            os.environ["SEGC_LIVE_COMMITS"] = schedule
        if thread:
            os.environ["SEGC_COMMIT_THREAD"] = "1"
            if thread[1:]:
                os.environ["SEGC_COMMIT_SWITCH"] = thread[1:]
        step = segc.jit(model, boundaries=boundaries_of("wholefrozen", model), validate=False,
                        concat_projections=True, freeze_params=True, kv_in_place=True)  # fmt: skip
        mx.eval(step(x, cache=fc.reset()), fc.arrays())  # traced and built under this schedule
        steps[v] = (step, fc)
    rows: dict[str, list[tuple[float, ...]]] = {v: [] for v in variants}
    places: dict[str, list[list[float]]] = {v: [] for v in variants}
    probes = []
    for v in variants:  # a tuner's calls alone first, so that its periods are its own calls (75 to settle)
        if v.startswith("tune"):
            fn, fc = steps[v]
            for _ in range(80):
                mx.eval(fn(x, cache=fc.reset()), fc.arrays())
    for i in range(10 + calls):
        probes.append(host_probe())
        for v in variants:
            fn, fc = steps[v]
            spent.update({"stretch": 0.0, "async": 0.0})
            commits.clear()
            u0 = resource.getrusage(resource.RUSAGE_THREAD)
            t0 = time.perf_counter()
            out = fn(x, cache=fc.reset())
            t1 = time.perf_counter()
            u1 = resource.getrusage(resource.RUSAGE_THREAD)
            mx.eval(out, fc.arrays())
            t2 = time.perf_counter()
            if i >= 10:
                switches = (u1.ru_nvcsw - u0.ru_nvcsw, u1.ru_nivcsw - u0.ru_nivcsw)
                rows[v].append((t2 - t0, t1 - t0, spent["stretch"], spent["async"], t2 - t1, *switches))
                places[v].append(list(commits))
    got = {}
    for v in variants:  # one more call each, its logits' bytes (the caches seeded alike: FixedContext)
        fn, fc = steps[v]
        got[v] = raw_bytes(fn(x, cache=fc.reset()))
    out: dict[str, Any] = {"probe": statistics.median(probes) * 1e3}
    out["cpu"] = Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36]
    for v in variants:
        med = {p: statistics.median(r[j] for r in rows[v]) * (1e3 if j < 5 else 1) for j, p in enumerate(PARTS)}
        n = min(len(c) for c in places[v])
        med["places"] = [statistics.median(c[j] for c in places[v]) * 1e3 for j in range(n)]
        med["as_eager"] = got[v] == got["eager"] if "eager" in got else None
        med["tuned"] = [] if v == "eager" else tuned(steps[v][0])
        out[v] = med
    return out


def tuned(step: Any) -> list[dict[str, Any]]:
    """The reports of a jitted step's commit-schedule tuners, one a segment run as
    stretches (``SEGC_LIVE_COMMITS=tune``: ``segc.lower.live_tune``); none otherwise."""
    out = []
    for entry in step.entries():
        for st in getattr(getattr(entry, "_executor", None), "steps", ()):
            t = getattr(st.fn, "tuner", None)
            if t is not None:
                out.append(t.report())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--preset", default="reference", help="bench_llama.py's preset (tiny: a smoke run)")
    ap.add_argument("--by-place", action="store_true", help="each commit's median by its place in the call")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.variants, a.calls, a.context, a.preset)))
        return
    picks: list[tuple[bool, float]] = []  # per process with a settled tuner: (chose the fastest?, tune's step / it)
    print(f"MLX {mx.__version__} on {mx.default_device()}; ms a call, medians; rest = host - stretch - async")
    head = f"{'proc':>4s} {'probe':>6s} {'cpu':>3s} {'variant':24s} {'step':>7s} {'host':>7s} {'stretch':>8s} {'async':>7s}"
    print(head + f" {'rest':>7s} {'wait':>7s} {'vcsw':>5s} {'ivcsw':>5s} {'=eager':>6s}")
    for p in range(a.processes):
        cmd = [sys.executable, __file__, "--child", "--calls", str(a.calls), "--context", str(a.context)]
        cmd += ["--preset", a.preset, "--variants"]
        r = subprocess.run([*cmd, *a.variants], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            print(f"{p:4d} failed rc={r.returncode}: {r.stderr[-400:]}")
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        for v in a.variants:
            m = d[v]
            # with a committing thread (@t) async counts that thread's time too: no rest
            rest = "-" if "@t" in v else f"{m['host'] - m['stretch'] - m['async']:.3f}"
            line = f"{p:4d} {d['probe']:6.3f} {d['cpu']:>3s} {v[:24]:24s} {m['step']:7.3f} {m['host']:7.3f}"
            line += (
                f" {m['stretch']:8.3f} {m['async']:7.3f} {rest:>7s} {m['wait']:7.3f} {m['vcsw']:5.1f} {m['ivcsw']:5.1f}"
            )
            line += f" {'-' if m['as_eager'] is None else m['as_eager']!s:>6s}"
            if a.by_place:
                line += "  " + " ".join(f"{c:.3f}" for c in m["places"])
            for t in m["tuned"]:  # the schedule a tuner chose, and each candidate's median period (ms)
                meds = " ".join(f"{x * 1e3:.3f}" if x is not None else "-" for x in t["medians"])
                line += f"  tuned to {t['chosen']} of {' '.join(t['schedules'])}: {meds}"
            print(line, flush=True)
        said = verdict(d, a.variants)
        if said is not None:
            print(f"proc {p}: {said[0]}", flush=True)
            picks.append(said[1:])
    if picks:
        hits = sum(1 for ok, _ in picks if ok)
        ratio = statistics.median(r for _, r in picks)
        print(f"tune picked the interleaved fastest schedule in {hits} of {len(picks)} processes;"
              f" its step {ratio:.3f}x the fastest's (median)")  # fmt: skip


def verdict(d: dict[str, Any], variants: list[str]) -> tuple[str, bool, float] | None:
    """Whether a process's tuner chose the schedule that ran fastest interleaved there
    (the fixed schedules among ``variants``: not eager, not tune, no committing thread),
    and tune's step against that one's: its line, the answer, the ratio. None without a
    tune variant whose tuner settled or without two fixed schedules to rank."""
    from segc.lower.live import LIVE_COMMIT_SCHEDULE

    fixed = [v for v in variants if v not in ("eager", "tune") and "@" not in v]
    tuned = d.get("tune", {}).get("tuned") or []
    if len(fixed) < 2 or not tuned or tuned[0]["chosen"] is None:
        return None
    default = ",".join(map(str, LIVE_COMMIT_SCHEDULE))
    fastest = min(fixed, key=lambda v: d[v]["step"])
    name = default if fastest == "default" else fastest
    chosen = [t["chosen"] for t in tuned]
    ok = all(c == name for c in chosen)
    ratio = d["tune"]["step"] / d[fastest]["step"]
    return f"tune chose {' '.join(chosen)}; fastest interleaved {name} ({ok}); tune's step {ratio:.3f}x its", ok, ratio


if __name__ == "__main__":
    main()
