"""Is eager MLX's quantized matmul reproducible on this device?

A diagnostic for the device machine (it runs on any MLX build). The GPU run of the zoo
tests found eager mlx-lm's own output of a quantized model changing from call to call
(once all zeros). This probe separates MLX from segc: nothing is traced or run by segc
here (segc only builds the zoo model).

- ``mx.quantized_matmul`` over the shapes of the zoo's tiny models (K 64/128, N 128,
  4 bits, group size 64, float32 and bfloat16) and rows M = 1, 8, each evaluated
  ``--repeats`` times on fresh copies of the same inputs: how many distinct results,
  how many all-zero ones, and the largest difference from the CPU's result. MLX's CUDA
  build (mlx/backend/cuda/quantized/quantized.cpp) runs ``qmv`` for one row; for more,
  ``qmm_sm90`` on compute capability 9 when K <= group size, else ``qmm_sm80`` (half
  types) or ``qmm_naive``, with ``qmv`` again below 8 rows.
- the tiny 4-bit llama of the zoo (``segc.models.zoo.build``), quantized with groups of
  64 (mlx-lm's default) and of 32 (the zoo's), called eagerly on prompts of 1 to 33
  tokens, the same way.

Each new shape is a JIT compile on CUDA (seconds to tens of seconds for the CUTLASS
kernels), so the tables are kept small; ``--wide`` adds 8 bits, N = 32 and M = 7, 33.

    PYTHONPATH=$PWD python benchmarks/probe_qmm.py [--repeats 20] [--wide] [--models-only]
"""

from __future__ import annotations

import argparse
import os
import time

import mlx.core as mx
import numpy as np


def distinct(outs: list[mx.array]) -> tuple[int, int]:
    """(distinct bit patterns, all-zero results) among ``outs``."""
    seen: list[mx.array] = []
    zeros = 0
    for o in outs:
        if not mx.any(o).item():
            zeros += 1
        if not any(mx.array_equal(o, s, equal_nan=True).item() for s in seen):
            seen.append(o)
    return len(seen), zeros


def qmm_table(repeats: int, wide: bool) -> None:
    print("== mx.quantized_matmul, eager, fresh input copies per call")
    print(f"{'dtype':9} {'bits':>4} {'K':>4} {'N':>4} {'M':>3}  distinct  zeros  max|gpu-cpu|")
    rng = np.random.default_rng(0)
    for dtype in (mx.float32, mx.bfloat16):
        for bits in (4, 8) if wide else (4,):
            for k in (64, 128):
                for n in (32, 128) if wide else (128,):
                    w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
                    wq, s, b = mx.quantize(w, group_size=64, bits=bits)
                    s, b = s.astype(dtype), b.astype(dtype)
                    for m in (1, 7, 8, 33) if wide else (1, 8):
                        x = mx.array(rng.standard_normal((1, m, k)).astype(np.float32)).astype(dtype)
                        mx.eval(x, wq, s, b)
                        cpu = mx.quantized_matmul(x, wq, s, b, group_size=64, bits=bits, stream=mx.cpu)
                        outs = []
                        for _ in range(repeats):
                            # copies: new buffers each time, as a model's activations are
                            xc = mx.array(np.array(x.astype(mx.float32))).astype(dtype)
                            o = mx.quantized_matmul(xc, wq, s, b, group_size=64, bits=bits)
                            mx.eval(o)
                            outs.append(o)
                        nd, nz = distinct(outs)
                        err = max(mx.max(mx.abs(o.astype(mx.float32) - cpu.astype(mx.float32))).item() for o in outs)
                        flag = "  <-- not reproducible" if nd > 1 or nz else ""
                        print(f"{dtype!s:9} {bits:>4} {k:>4} {n:>4} {m:>3}  {nd:>8}  {nz:>5}  {err:.3g}{flag}")


def model_table(repeats: int) -> None:
    from segc.models.zoo import build

    print("== tiny zoo models, eager, the same prompt called repeatedly")
    print(f"{'model':16} {'tokens':>6}  distinct  zeros  max|diff from first|")
    for arch, bits, gs in (("llama", 4, 64), ("llama", 4, 32)):
        model = build(arch, bits=bits, group_size=gs)
        for t in (1, 3, 7, 8, 33):
            x = mx.array([[(7 * i + 3) % 128 for i in range(t)]])
            outs = []
            for _ in range(repeats):
                o = model(x)
                mx.eval(o)
                outs.append(o)
            nd, nz = distinct(outs)
            err = max(mx.max(mx.abs(o - outs[0])).item() for o in outs)
            flag = "  <-- not reproducible" if nd > 1 or nz else ""
            print(f"{f'{arch}-q{bits}-g{gs}':16} {t:>6}  {nd:>8}  {nz:>5}  {err:.3g}{flag}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--models-only", action="store_true")
    ap.add_argument("--wide", action="store_true", help="also 8 bits, N = 32 and M = 7, 33 (minutes of JIT on CUDA)")
    args = ap.parse_args()
    env = {k: os.environ[k] for k in ("CUDA_LAUNCH_BLOCKING", "MLX_USE_CUDA_GRAPHS") if k in os.environ}
    print(f"mlx {mx.__version__} on {mx.default_device()}, env {env or '{}'}")
    t0 = time.perf_counter()
    if not args.models_only:
        qmm_table(args.repeats, args.wide)
    model_table(args.repeats)
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
