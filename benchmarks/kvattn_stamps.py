"""The write with its attention inside a decode step, part by part, on the GPU's own clock
(issue 13: the kernel takes 24 µs a layer in some calls and 45–55 in others, whole
calls at a time; which part grows?).

Each step (``device_time.py``'s variants: ``segc``, ``segcinplace``, ...; a reference
llama at context 1024) is lowered with ``SEGC_KERNEL_STAMPS=1`` (``segc.lower.cuda_stamps``):
every block of every layer's kernel writes the GPU's clock at eleven points, its SM and its
SM's cycles from its start to its count (``mhz``: the SM's clock, cycles over ns).
After three calls to warm up, each of ``--calls`` calls is run alone (the host waits for
it) and its stamps copied. Per call, averaged over the layers: the kernel's span (first
block's start to the last stamp), the spread of the blocks' starts, and each part's
median over the blocks (the offset read, a query element read, the chunk's mask read, the queries rotated, the chunk's values written and staged, keys'
products, softmax, weighted values, the count past the fence; the merge, the groups'
last blocks), the SM's clock (the blocks' median); then the calls
split into fast and slow by their span (the midpoint of the fastest and slowest), each
part's mean in each, and whether the slow calls run on other SMs.

    MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=1000000 \\
      python benchmarks/kvattn_stamps.py [--steps segc,segcinplace] [--calls 30] [--where]

With ``--where``, each call's kernels' input addresses too (the first block writes them,
``cuda_stamps.ADDRESSES``), each asked of CUDA's driver right after the call: device,
managed or host memory (MLX moves a buffer the host reads into managed memory for good,
and its cache hands such a buffer to the device again); per call, how many layers read
each input from managed memory, and layer 0's addresses; per mode, how many distinct
addresses each input had. ``--clear-cache`` empties MLX's buffer cache after each step's
warm-up (a control: no buffer left there by earlier work is handed to the step).

Needs MLX's CUDA build and a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from segc.lower import cuda_stamps  # (its settings are read when a segment is lowered)

PARTS = cuda_stamps.POINTS[1:-1]  # offset, query, masked, queries, staged, keys, softmax, values, counted
_N = len(cuda_stamps.POINTS)
_COUNTED, _MERGED = cuda_stamps.POINTS.index("counted"), cuda_stamps.POINTS.index("merged")


def phases(stamps: np.ndarray) -> dict[str, float]:
    """One kernel's stamps (``blocks x WORDS``: the points in ns, the last only where a
    block merged, then its SM and its cycles from its start to its count) as µs:
    ``span`` (first start to last stamp), ``starts`` (the spread of the blocks'
    starts), each of :data:`PARTS` (the median over the blocks
    of the time from the point before), ``merge`` (the median over the blocks that merged
    in this call, from their count to the merge's end); ``mhz``, the median over the
    blocks of their SM's cycles over the ns from start to count (the SM's clock)."""
    s = stamps[:, :_N].astype(np.int64)
    start = s[:, 0]
    merged = s[:, _MERGED] > s[:, _COUNTED]  # (a block last in an earlier call keeps that call's stamp)
    last = np.where(merged, s[:, _MERGED], s[:, _COUNTED])
    out = {"span": (last.max() - start.min()) / 1e3, "starts": (start.max() - start.min()) / 1e3}
    for i, part in enumerate(PARTS, start=1):
        out[part] = float(np.median(s[:, i] - s[:, i - 1])) / 1e3
    out["merge"] = float(np.median(s[merged, _MERGED] - s[merged, _COUNTED])) / 1e3 if merged.any() else float("nan")
    ns = np.maximum(s[:, _COUNTED] - s[:, 0], 1)
    out["mhz"] = float(np.median(stamps[:, cuda_stamps.CYCLES].astype(np.float64) / ns)) * 1e3
    return out


def call_row(kernels: list[np.ndarray]) -> dict[str, float]:
    """A call's kernels' :func:`phases`, averaged over them (µs)."""
    each = [phases(k) for k in kernels]
    return {key: statistics.fmean(p[key] for p in each) for key in each[0]}


def split(rows: list[dict[str, float]]) -> tuple[list[int], list[int]]:
    """The calls' indices split at the midpoint of the fastest and slowest span."""
    spans = [r["span"] for r in rows]
    mid = (min(spans) + max(spans)) / 2
    return [i for i, x in enumerate(spans) if x <= mid], [i for i, x in enumerate(spans) if x > mid]


def report(name: str, rows: list[dict[str, float]], sms: list[set[int]]) -> None:
    keys = ["span", "starts", *PARTS, "merge", "mhz"]
    print(f"\n{name}: {len(rows)} calls, µs a layer's kernel (means over the layers)")
    print("  call " + "".join(f"{k:>9}" for k in keys))
    for i, r in enumerate(rows):
        print(f"  {i:4d} " + "".join(f"{r[k]:9.2f}" for k in keys))
    fast, slow = split(rows)
    for label, idx in (("fast", fast), ("slow", slow)):
        if idx:
            means = "".join(f"{statistics.fmean(rows[i][k] for i in idx):9.2f}" for k in keys)
            used = set().union(*(sms[i] for i in idx))
            print(f"  {label:>4} {means}   ({len(idx)} calls, {len(used)} SMs)")


@functools.cache
def _driver() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def memory_kind(address: int) -> str:
    """``device``, ``managed``, ``host`` or ``?<error>``: where ``address`` lives, by
    CUDA's driver (``cuPointerGetAttribute``)."""
    cuda = _driver()
    flag, kind = ctypes.c_uint(0), ctypes.c_uint(0)
    ptr = ctypes.c_uint64(address)
    err = cuda.cuPointerGetAttribute(ctypes.byref(flag), 8, ptr)  # CU_POINTER_ATTRIBUTE_IS_MANAGED
    if err:
        return f"?{err}"
    if flag.value:
        return "managed"
    err = cuda.cuPointerGetAttribute(ctypes.byref(kind), 2, ptr)  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    return f"?{err}" if err else {1: "host", 2: "device"}.get(kind.value, f"type{kind.value}")


def where_row(addresses: np.ndarray, kinds: list[list[str]]) -> str:
    """A call's line: per input, how many layers read it from memory other than the
    device's (``addresses``, ``kinds``: a row a layer, a column an input), then layer 0's
    addresses by their 4-KB page."""
    names = cuda_stamps.ADDRESSES
    off = [sum(k[j] != "device" for k in kinds) for j in range(len(names))]
    return (
        " ".join(f"{n}:{o}" for n, o in zip(names, off, strict=True))
        + "  | "
        + " ".join(f"{int(a) >> 12:x}" for a in addresses[0])
    )


def where_report(rows: list[dict[str, float]], where: list[tuple[np.ndarray, list[list[str]]]]) -> None:
    fast, slow = split(rows)
    names = cuda_stamps.ADDRESSES
    print("  call  mode  inputs not in device memory (of the layers)  | layer 0's input addresses (4-KB pages)")
    for i, (a, k) in enumerate(where):
        print(f"  {i:4d}  {'fast' if i in fast else 'slow'}  {where_row(a, k)}")
    kinds = sorted({x for _, k in where for row in k for x in row})
    print(f"  kinds seen: {', '.join(kinds)}")
    for label, idx in (("fast", fast), ("slow", slow)):
        if idx:
            distinct = [
                len({int(where[i][0][layer, j]) for i in idx for layer in range(where[i][0].shape[0])})
                for j in range(len(names))
            ]
            print(
                f"  {label}: distinct addresses over the layers: "
                + " ".join(f"{n}:{d}" for n, d in zip(names, distinct, strict=True))
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="segc,segcinplace")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument(
        "--reads", action="store_true",
        help="the first thread reads the offset and a query element alone before their stamps "
        "(SEGC_KERNEL_STAMPS=reads: ten times slower on an H100, it measures the probe)"
    )  # fmt: skip
    ap.add_argument("--where", action="store_true", help="each call's input addresses and their memory")
    ap.add_argument(
        "--clear-cache", action="store_true",
        help="MLX's buffer cache emptied after each step's warm-up (no managed buffer left in it to hand out)"
    )  # fmt: skip
    args = ap.parse_args()
    os.environ["SEGC_KERNEL_STAMPS"] = "reads" if args.reads else "1"
    from device_time import CUDA, step_body

    if not CUDA:
        raise SystemExit("needs MLX's CUDA build and a GPU")
    print(f"mlx {mx.__version__} on {mx.default_device()}; decode steps at context 1024, the kernels' own stamps")
    x = mx.array([[1]])
    for name in args.steps.split(","):
        cuda_stamps.BUFFERS.clear()
        body = step_body(name, args.layers, None)
        bufs = cuda_stamps.BUFFERS[-args.layers :]  # the last lowering's kernels
        if len(bufs) != args.layers:
            print(f"\n{name}: {len(cuda_stamps.BUFFERS)} stamped kernels, not {args.layers}: not shown")
            continue
        for _ in range(3):
            mx.eval(body(x))
        if args.clear_cache:  # what the lowering and earlier steps left in MLX's cache, freed
            mx.synchronize()
            mx.clear_cache()
            for _ in range(3):
                mx.eval(body(x))
        snaps: list[list[Any]] = []
        held: list[mx.array] = []  # read on the host, so managed for good: kept, never handed out again
        where: list[tuple[np.ndarray, list[list[str]]]] = []
        n = len(cuda_stamps.ADDRESSES)
        for _ in range(args.calls):
            mx.eval(body(x))
            mx.synchronize()
            copies = [b + 0 for b in bufs]  # the buffers as this call left them
            mx.eval(copies)
            snaps.append(copies)
            if args.where:
                held.append(mx.concatenate([c[-n:] for c in copies]).reshape(-1, n))
                addresses = np.array(held[-1])
                where.append((addresses, [[memory_kind(int(a)) for a in row] for row in addresses]))
        rows, sms = [], []
        for copies in snaps:
            kernels = [np.array(c)[:-n].reshape(-1, cuda_stamps.WORDS) for c in copies]
            rows.append(call_row(kernels))
            sms.append({int(v) for k in kernels for v in k[:, cuda_stamps.SM]})
        report(name, rows, sms)
        if where:
            where_report(rows, where)


if __name__ == "__main__":
    main()
