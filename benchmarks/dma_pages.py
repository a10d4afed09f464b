"""The CUDA road's bandwidth as the pager uses it (``cudacopy.py``), page by page (CUDA
only). Every layer's tensors are one page; each line sends every page once:

- ``one flush``: every copy started, one wait at the end (``read_bandwidth``, the
  bound ``bench_paging.py`` reports);
- ``flush per page``: a wait after each page's copies (the pager marks a page resident
  only once its bytes are there);
- ``... no prefetch``: without the ``cuMemPrefetchAsync`` hint before each copy;
- ``... fresh buffers``: each page into buffers made for it (``mx.zeros``), not
  buffers a page used before;
- ``... while the GPU computes``: a matrix product runs on MLX's stream meanwhile.

    python3 benchmarks/dma_pages.py --dir /tmp/refmodel   # after paging_timeline.py made it
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from segc.engine.paging import HostSource, cudacopy
    from segc.engine.paging.recycle import fresh_buffers

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    if not mx.cuda.is_available():
        p.exit(2, "dma_pages.py: the CUDA road of a page's bytes needs MLX's CUDA build and a GPU\n")
    src = HostSource(Path(a.dir))
    copier = cudacopy.CudaCopier(prefetch=True)  # the hint toggled below
    src.attach(copier)
    pages: dict[str, list[str]] = {}
    for n in src.tensors:
        m = re.search(r"layers\.(\d+)\.", n)
        pages.setdefault(m.group(1) if m else n, []).append(n)
    total = sum(i.nbytes for i in src.tensors.values())
    make = fresh_buffers(src)
    bufs = {n: make(n) for n in src.tensors}
    views = {n: np.asarray(b) for n, b in bufs.items()}
    print(f"{len(pages)} pages, {total / 1e9:.2f} GB")

    def send(per_page: bool, fresh: bool) -> float:
        t0 = time.perf_counter()
        for names in pages.values():
            vs = {n: np.asarray(make(n)) for n in names} if fresh else views
            for n in names:
                src.read_into(n, vs[n])
            if per_page:
                src.flush()
        src.flush()
        return total / (time.perf_counter() - t0)

    def busy() -> mx.array:
        x = mx.random.normal((8192, 8192), dtype=mx.bfloat16)
        y = x
        for _ in range(40):
            y = y @ x
        return y

    cases = [  # (name, flush per page, fresh buffers, prefetch, GPU busy)
        ("one flush", False, False, True, False),
        ("flush per page", True, False, True, False),
        ("flush per page, fresh buffers", True, True, True, False),
        ("flush per page, while the GPU computes", True, False, True, True),
        ("one flush, no prefetch", False, False, False, False),
        ("flush per page, no prefetch", True, False, False, False),
        ("flush per page, fresh buffers, no prefetch", True, True, False, False),
        ("flush per page, while the GPU computes, no prefetch", True, False, False, True),
    ]
    res: dict[str, list[float]] = {c[0]: [] for c in cases}
    after: dict[str, list[float]] = {c[0]: [] for c in cases}
    for _ in range(a.rounds):
        for name, per_page, fresh, hint, gpu in cases:
            copier.prefetch = hint
            y = busy() if gpu else None
            if y is not None:
                mx.async_eval(y)
            res[name].append(send(per_page, fresh))
            if y is not None:
                mx.eval(y)
            t0 = time.perf_counter()  # the GPU reads every buffer: slow if the bytes landed in host pages
            mx.eval([b.astype(mx.float32).sum() for b in bufs.values()])
            after[name].append(time.perf_counter() - t0)
    copier.prefetch = False
    for name, v in res.items():
        print(
            f"{name}: median {statistics.median(v) / 1e9:.2f} GB/s (max {max(v) / 1e9:.2f}); "
            f"the GPU then reads every buffer in {statistics.median(after[name]) * 1e3:.1f} ms"
        )
    stall(src, copier, pages)
    src.close()


def stall(src: Any, copier: Any, pages: dict[str, list[str]]) -> None:
    """How long a tiny MLX computation takes while every page is being sent: on an array
    made on the host (managed memory the GPU has not touched: its first kernel faults the
    pages over) and on one made on the GPU, against no copy in flight; then the copies
    sent in pieces of 8 MB."""
    make_views = {n: np.asarray(b) for n, b in _fresh(src).items()}

    def tiny(host: bool) -> float:
        x = mx.array(np.arange(4, dtype=np.int32)) if host else mx.full((4,), 3, dtype=mx.int32)
        if not host:
            mx.eval(x)
        t0 = time.perf_counter()
        mx.eval(x + 1)
        return time.perf_counter() - t0

    for piece in (0, 8 << 20, 2 << 20):
        copier.piece_bytes = piece
        for host in (True, False):
            quiet, busy = [], []
            for _ in range(5):
                quiet.append(tiny(host))
                for names in pages.values():
                    for n in names:
                        src.read_into(n, make_views[n])
                busy.append(tiny(host))
                src.flush()
            print(
                f"a tiny computation on an array made on the {'host' if host else 'GPU'}"
                f"{f', copies in pieces of {piece >> 20} MB' if piece else ''}: "
                f"{statistics.median(quiet) * 1e3:.2f} ms, {statistics.median(busy) * 1e3:.2f} ms with every page in flight"
            )
    for piece in (0, 16 << 20, 4 << 20, 1 << 20):  # the bandwidth with pieces (no wait per page)
        copier.piece_bytes = piece
        bw = []
        for _ in range(3):
            t0 = time.perf_counter()
            for names in pages.values():
                for n in names:
                    src.read_into(n, make_views[n])
            src.flush()
            bw.append(sum(src.tensors[n].nbytes for n in src.tensors) / (time.perf_counter() - t0))
        print(f"copies in pieces of {piece >> 20 if piece else 'a tensor,'} MB: {max(bw) / 1e9:.2f} GB/s")


def _fresh(src: Any) -> dict[str, mx.array]:
    from segc.engine.paging.recycle import fresh_buffers

    make = fresh_buffers(src)
    return {n: make(n) for n in src.tensors}


if __name__ == "__main__":
    main()
