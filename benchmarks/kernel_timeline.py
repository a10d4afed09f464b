"""Every kernel of a decode step on the GPU's own clock, from CUPTI's activity records
(issue 13: segc's step costs the device more than eager's; which kernels, and how much
is gaps between them?).

For each step variant (``device_time.py``'s: ``eager``, ``compile``, ``segc``,
``segcinplace``, ``segcnokv``, ...; each a reference llama of its own at context 1024),
after three calls to warm up, ``--calls`` calls are recorded with CUPTI's kernel, memcpy
and memset activities, one call at a time (the host waits for each). Per call: its span
(first kernel's start to last kernel's end), the time some kernel runs (the union of the
kernels' intervals), the gaps (the rest), the kernels' count, and memcpy/memset work; and
what CUDA's default memory pool held after each call (``mempool.py``; ``--pool-keep``: the
pool keeps what it reserves, releasing nothing at a synchronization).
Then the kernels by name over the calls: count and device time a step, the largest
first. Then, apart (the counters may slow what they watch), a few calls more with
unified memory's counters (MLX puts an array made on the host in managed memory): page faults and
bytes moved a call (``--no-uvm`` skips them). ``--moving``: each call decodes the next
position, as a generation does (segc's offset a new array made on the host each call),
instead of position 1,024 again. ``--by-layer REGEX``: the kernels whose names match, in launch order within a call, each
occurrence's time and the gap before it, and each call's sum (are slow steps slow in
some layers or in some calls?). ``--cache-limit 0``: MLX's buffer cache off
(``mx.set_cache_limit``). With ``MLX_MAX_OPS_PER_BUFFER`` and ``MLX_MAX_MB_PER_BUFFER`` set past a step's
size a step is one CUDA graph and its gaps are the device's own, no wait for the host.

Needs ``cupti-python`` (with ``nvidia-cuda-cupti`` and ``cuda-bindings`` of MLX's CUDA
major version; ``make gpu-prepare`` packs them into ``.gpu/cupti``, docs/gpu.md):

    python benchmarks/kernel_timeline.py [--steps eager,segc,segcinplace,segcnokv] [--calls 20] [--top 25] [--by-layer REGEX] [--cache-limit N]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import re
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

import mempool
from device_time import step_body


@functools.cache
def demangled(name: str) -> str:
    """``name`` as ``c++filt`` reads it where that tool is installed (CUPTI gives the
    mangled names), else ``name``."""
    tool = shutil.which("c++filt")
    if tool is None or not name.startswith("_Z"):
        return name
    res = subprocess.run([tool, name], capture_output=True, text=True, timeout=10)
    return res.stdout.strip() or name if res.returncode == 0 else name


def short(name: str) -> str:
    """A kernel's name without its template arguments and parameters (a readable key)."""
    name = re.sub(r"\(.*\)$", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    s = "".join(out).replace("void ", "").strip()
    return s[-70:]


def busy(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of ``intervals`` (ns)."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


class Recorder:
    """CUPTI's kernel, memcpy and memset records, collected as they are flushed."""

    def __init__(self) -> None:
        from cupti import cupti

        self.cupti = cupti
        self.records: list[tuple[str, int, int, str]] = []  # (kind, start, end, name)
        self.kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET]
        cupti.activity_register_callbacks(self.requested, self.completed)

    def with_uvm(self) -> bool:
        """Also record unified memory's page faults and transfers (an array made on the
        host is managed memory; a kernel's output is not); False where CUPTI refuses."""
        c = self.cupti
        kinds = c.ActivityUnifiedMemoryCounterKind
        wanted = [
            kinds.BYTES_TRANSFER_HTOD,
            kinds.BYTES_TRANSFER_DTOH,
            kinds.CPU_PAGE_FAULT_COUNT,
            kinds.GPU_PAGE_FAULT,
        ]
        try:
            cfg = c.ActivityUnifiedMemoryCounterConfig(len(wanted))
            cfg.scope, cfg.device_id, cfg.enable = 1, 0, 1
            for i, kind in enumerate(wanted):
                cfg[i].kind = kind
            c.activity_configure_unified_memory_counter(cfg.ptr, len(wanted))
        except Exception as e:  # a probe: report it and go on without
            print(f"(no unified memory counters: {e})")
            return False
        c.activity_enable(c.ActivityKind.UNIFIED_MEMORY_COUNTER)
        return True

    def requested(self) -> tuple[int, int]:
        return 8 * 1024 * 1024, 0

    def completed(self, activities: list[Any]) -> None:
        k = self.cupti.ActivityKind
        for a in activities:
            if a.kind == k.CONCURRENT_KERNEL:
                self.records.append(("kernel", a.start, a.end, a.name))
            elif a.kind == k.MEMCPY:
                self.records.append(("memcpy", a.start, a.end, f"memcpy {a.bytes} B"))
            elif a.kind == k.MEMSET:
                self.records.append(("memset", a.start, a.end, f"memset {a.bytes} B"))
            elif a.kind == k.UNIFIED_MEMORY_COUNTER:
                kind = self.cupti.ActivityUnifiedMemoryCounterKind(a.counter_kind).name
                self.records.append(("uvm", a.start, a.end, f"{kind} {a.value}"))

    def now(self) -> int:
        return int(self.cupti.get_timestamp())

    def start(self) -> None:
        """Enabled before any step is built: a CUDA graph instantiated before may not be
        traced, and MLX keeps its graphs."""
        for kind in self.kinds:
            self.cupti.activity_enable(kind)

    def take(self) -> list[tuple[str, int, int, str]]:
        """Every record so far (flushed), and none kept."""
        self.cupti.activity_flush_all(1)
        out, self.records = self.records, []
        return out


def record(rec: Recorder, body: Any, calls: int) -> list[list[tuple[str, int, int, str]]]:
    """Each call's records, a call's window the host's timestamps around it."""
    x = mx.array([[1]])
    for _ in range(3):
        mx.eval(body(x))
    mx.synchronize()
    rec.take()  # the warm-up's records
    windows, pool = [], []
    for _ in range(calls):
        t0 = rec.now()
        mx.eval(body(x))
        mx.synchronize()
        windows.append((t0, rec.now()))
        pool.append(mempool.reserved())  # read after the window: not in any call's records
    records = rec.take()
    if pool and None not in pool:  # did CUDA's pool hand memory back (or take more) between calls?
        mb = [b / 2**20 for b in pool]
        moves = sum(a != b for a, b in itertools.pairwise(pool))
        print(f"  (CUDA's pool after each call: {min(mb):.1f}-{max(mb):.1f} MiB reserved, {moves} changes)")
    return [[r for r in records if a <= r[1] <= b] for a, b in windows]


def summarize(per_call: list[list[tuple[str, int, int, str]]]) -> dict[str, Any]:
    """Per call (one with kernels): its span, the kernels' running time, the gaps, the
    kernel count and the memcpy/memset time (ns); and by kernel name (``short``) or
    ``memcpy``/``memset``: the records' count and time over every call."""
    out: dict[str, Any] = {"spans": [], "running": [], "gaps": [], "kernels": [], "copies": []}
    by_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for call in per_call:
        ks = [r for r in call if r[0] == "kernel"]
        if not ks:
            continue
        span = max(r[2] for r in ks) - min(r[1] for r in ks)
        run = busy([(r[1], r[2]) for r in ks])
        out["spans"].append(span)
        out["running"].append(run)
        out["gaps"].append(span - run)
        out["kernels"].append(len(ks))
        out["copies"].append(sum(r[2] - r[1] for r in call if r[0] in ("memcpy", "memset")))
        for r in call:
            if r[0] == "uvm":  # a counter: its kind, the records' count and their values' sum
                kind, value = r[3].rsplit(" ", 1)
                entry = by_name[f"uvm {kind}"]
                entry[0] += 1
                entry[1] += int(value)
                continue
            entry = by_name[short(demangled(r[3])) if r[0] == "kernel" else r[0]]
            entry[0] += 1
            entry[1] += r[2] - r[1]
    out["by_name"] = dict(by_name)
    return out


def _med_us(xs: list[int]) -> float:
    """The median of ``xs`` (ns) in µs."""
    return statistics.median(xs) / 1e3


def by_layer(per_call: list[list[tuple[str, int, int, str]]], pattern: str) -> None:
    """The kernels whose names match ``pattern``, in launch order within a call: each
    occurrence's duration and the gap before it (from the kernel before it to its start),
    medians over the calls, µs; then each call's sum of them. Slow layers the same in
    every call point at their buffers, slow calls at the call."""
    rx = re.compile(pattern)
    rows: list[list[tuple[int, int]]] = []
    for call in per_call:
        ks = sorted((r for r in call if r[0] == "kernel"), key=lambda r: r[1])
        got = [(r[2] - r[1], r[1] - ks[i - 1][2] if i else 0) for i, r in enumerate(ks) if rx.search(demangled(r[3]))]
        if got:
            rows.append(got)
    if not rows or len({len(r) for r in rows}) != 1:
        print(f"  by layer ({pattern}): {sorted({len(r) for r in rows})} matches a call, not one count: not shown")
        return
    n = len(rows[0])
    durs = " ".join(f"{_med_us([r[i][0] for r in rows]):.1f}" for i in range(n))
    gaps = " ".join(f"{_med_us([r[i][1] for r in rows]):.1f}" for i in range(n))
    sums = " ".join(f"{sum(d for d, _ in r) / 1e3:.0f}" for r in rows)
    print(f"  by layer ({pattern}), {n} a call: durations {durs}\n    gaps before {gaps}\n    each call's sum {sums}")


def report(name: str, per_call: list[list[tuple[str, int, int, str]]], top: int, layered: str = "") -> None:
    s = summarize(per_call)
    n = len(s["spans"])
    if not n:
        print(f"\n{name}: no kernels recorded")
        return
    print(
        f"\n{name}: {n} calls; span {_med_us(s['spans']):.1f} us (min {min(s['spans']) / 1e3:.1f}, max "
        f"{max(s['spans']) / 1e3:.1f}), kernels running {_med_us(s['running']):.1f} us, gaps {_med_us(s['gaps']):.1f} us, "
        f"{statistics.median(s['kernels']):.0f} kernels, memcpy/memset {_med_us(s['copies']):.1f} us a call",
        flush=True,
    )
    named = {k: v for k, v in s["by_name"].items() if not k.startswith("uvm ")}
    for k, (c, t) in sorted(named.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {t / n / 1e3:9.1f} us {c / n:6.1f}x  {k}")
    if layered:
        by_layer(per_call, layered)
    for k, (c, v) in sorted(s["by_name"].items()):
        if k.startswith("uvm "):
            print(f"  {k}: {c / n:.1f} records, {v / n:.0f} a call (bytes or faults)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="eager,segc,segcinplace,segcnokv")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--moving", action="store_true", help="each call decodes the next position (a new offset array a call)"
    )
    ap.add_argument("--by-layer", default="", help="a regex of kernel names: each occurrence's time in a call")
    ap.add_argument(
        "--cache-limit", type=int, default=-1, help="mx.set_cache_limit (0: no buffer handed out again; default MLX's)"
    )
    ap.add_argument("--no-uvm", dest="uvm", action="store_false", help="skip the unified memory counters' pass")
    ap.add_argument(
        "--pool-keep", action="store_true", help="CUDA's default pool keeps what it reserves (mempool.keep)"
    )
    args = ap.parse_args()
    print(f"mlx {mx.__version__} on {mx.default_device()}; decode steps at context 1024, CUPTI's records")
    if args.cache_limit >= 0:
        mx.set_cache_limit(args.cache_limit)
    if args.pool_keep:
        mempool.keep()
    rec = Recorder()
    rec.start()
    bodies = {name: step_body(name, args.layers, None, args.moving) for name in args.steps.split(",")}
    for name, body in bodies.items():
        report(name, record(rec, body, args.calls), args.top, args.by_layer)
    if args.uvm and rec.with_uvm():  # apart: the counters may slow what they watch
        print("\nagain, with unified memory's counters (their spans are not the figures above):")
        for name, body in bodies.items():
            report(f"{name}, counted", record(rec, body, max(args.calls // 4, 3)), 0)


if __name__ == "__main__":
    main()
