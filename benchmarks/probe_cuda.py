"""Small MLX programs that the lowering tests found to crash MLX's CUDA build, each run
in its own process (a SIGFPE kills the process, a CUDA error poisons its context).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/probe_cuda.py

Prints one line per program: its exit status (or the signal that killed it) and the last
line of its output. They involve segc only where the name says so.
"""

from __future__ import annotations

import subprocess
import sys

PRELUDE = "import mlx.core as mx\nx = mx.arange(3, dtype=mx.float32).reshape(1, 3)\nk = mx.array([0], dtype=mx.int32)\n"

PROGRAMS = {
    "eager gather from an empty slice x[1:, k]": "y = x[1:, k]; mx.eval(y); print(y.shape)",
    "mx.compile gather from an empty slice x[1:, k]": "y = mx.compile(lambda x, k: x[1:, k])(x, k); mx.eval(y); print(y.shape)",
    "mx.compile elementwise on an empty slice": "y = mx.compile(lambda x: x[1:] * 2 + 1)(x); mx.eval(y); print(y.shape)",
    "mx.compile gather, non-empty": "y = mx.compile(lambda x, k: x[:, k])(x, k); mx.eval(y); print(y.shape)",
    **{
        f"eager gather_mm {dt} m={m} k={k} n={n}{' sorted' if srt else ''}": (
            f"a = mx.ones((4, {m}, {k}), dtype=mx.{dt}); w = mx.ones((2, {k}, {n}), dtype=mx.{dt})\n"
            "ri = mx.array([0, 0, 1, 1], dtype=mx.uint32)\n"
            f"y = mx.gather_mm(a, w, None, ri, sorted_indices={srt}); mx.eval(y); mx.synchronize(); print(y.shape)"
        )
        for dt, m, k, n, srt in [
            ("bfloat16", 1, 3, 5, True),
            ("float32", 1, 3, 5, True),
            ("bfloat16", 1, 8, 8, True),
            ("bfloat16", 1, 3, 5, False),
            ("bfloat16", 2, 3, 1, False),
            ("float16", 2, 5, 1, False),
        ]
    },
    "segc gather from an empty slice": (
        "import segc\ny = segc.jit(lambda x, k: x[1:, k])(x, k); mx.eval(y); print(y.shape)"
    ),
}


def main() -> None:
    for name, body in PROGRAMS.items():
        try:
            r = subprocess.run(
                [sys.executable, "-c", PRELUDE + body], capture_output=True, text=True, timeout=60, check=False
            )
            rc = f"signal {-r.returncode}" if r.returncode < 0 else f"rc {r.returncode}"
            last = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
            print(f"{name}: {rc}: {last[0][:200]}")
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out after 60 s")


if __name__ == "__main__":
    main()
