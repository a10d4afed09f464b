"""segc's decode attention kernels compiled for a GPU on a machine without one: their
text as MLX's ``build_kernel`` writes it (``cuda_emu.generated``, with a CUDA prelude in
place of the emulator's), compiled by NVRTC for ``--arch`` (sm_90: the H100 and H200),
each kernel's resource use (registers, stack, spills) printed from ``cuobjdump
-res-usage`` and its SASS written to ``--out``, where the order of its loads and waits
can be read (docs/lowering.md, "The prologue's reads issued first").

A developer's tool, not a test (pytest does not collect it). NVRTC, the CUDA headers and
cuobjdump come from PyPI's wheels, unpacked into one folder (``--cuda``)::

    pip download --no-deps "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-runtime==13.0.*" nvidia-cuda-cuobjdump
    for w in nvidia_cuda_*.whl; do unzip -q -o "$w" -d /tmp/nvx; done
    python tests/cuda_sass.py --cuda /tmp/nvx/nvidia/cu13 [--env SEGC_KV_IN_PLACE=1]

MLX's own kernels, for the arithmetic segc's reproduce: ``cuobjdump -xelf all -arch
sm_90a .../mlx/lib/libmlx.so`` unpacks its sm_90a cubins (MLX's CUDA wheel), and
``cuobjdump -sass`` of the one holding ``rope_single`` shows which product of each of
the rotation's sums is fused (the fiftieth session: ``kvwrite.sass`` against it).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cuda_emu import generated, recording

from segc.lower import cuda_attention, cuda_kvattention, cuda_kvwrite

PRELUDE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef int int32_t; typedef unsigned int uint32_t; typedef long long int64_t;
typedef unsigned long long uint64_t; typedef unsigned long long uintptr_t;
struct Shape { int32_t d[8]; __device__ int32_t operator[](int i) const { return d[i]; } };
struct Strides { int64_t d[8]; __device__ int64_t operator[](int i) const { return d[i]; } };
template <typename T> __device__ T min(T a, T b) { return a < b ? a : b; }
"""


def compile_cubin(cuda: Path, source: str, name: str, arch: str) -> bytes:
    """``source`` compiled by NVRTC (``cuda/lib``) for ``arch``: the cubin's bytes."""
    os.environ["LD_LIBRARY_PATH"] = f"{cuda / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    ctypes.CDLL(str(next((cuda / "lib").glob("libnvrtc-builtins.so*"))), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(next((cuda / "lib").glob("libnvrtc.so*"))))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None) != 0:
        raise SystemExit(f"{name}: NVRTC could not take the program")
    opts = [f"-arch={arch}".encode(), b"-std=c++17", f"-I{cuda / 'include'}".encode(), b"-default-device"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    if rc != 0:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise SystemExit(f"{name}: NVRTC failed\n{log.value.decode()[:4000]}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, buf)
    return buf.raw


def forms() -> dict[str, object]:
    """The reference llama's decode attention at context 1,024 (32 query heads over 8 KV
    heads of 64, a buffer of 1,280 positions, bfloat16): the write with its attention in
    place and copying, the one attention kernel, and the two kernels' first; and the
    rotated KV write alone at float32."""
    mx.random.seed(0)
    q = mx.random.normal((1, 32, 1, 64)).astype(mx.bfloat16)
    kb, vb = (mx.random.normal((1, 8, 1280, 64)).astype(mx.bfloat16) for _ in range(2))
    kn, vn = (mx.random.normal((1, 8, 1, 64)).astype(mx.bfloat16) for _ in range(2))
    mask = mx.array(np.arange(1280)[None, :] <= 1024)
    ins = [kb, kn, vb, vn, mx.array(1024, dtype=mx.int32), q]
    write = cuda_kvattention.kv_attention
    kf, nf = (mx.random.normal(s) for s in ((1, 8, 7, 64), (1, 8, 1, 64)))
    rows = [kf, nf, kf, nf, mx.array(1, dtype=mx.int32), mx.random.normal((1, 32, 1, 64))]
    return {
        # the rotated KV write alone at float32, where which product of a rotation's sum
        # is fused shows in the bytes (docs/lowering.md, "Same bits, by construction")
        "kvwrite": lambda: cuda_kvwrite.kv_write(rows, 64, False, 10000.0, 1.0, True, False),
        "inplace": lambda: write(ins, mask, 64, False, 10000.0, 1.0, False, 0.125, True),
        "copying": lambda: write(ins, mask, 64, False, 10000.0, 1.0, False, 0.125, False),
        "one": lambda: cuda_attention.cuda_attention(q, kb, vb, mask, 0.125, kernels=1),
        "partial": lambda: cuda_attention.cuda_attention(q, kb, vb, mask, 0.125, kernels=2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda", type=Path, required=True, help="the unpacked wheels' nvidia/cu13 folder")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", type=Path, default=Path("/tmp/segc-sass"))
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE set before the kernels are made")
    args = ap.parse_args()
    for kv in args.env:
        name, _, value = kv.partition("=")
        os.environ[name] = value
    args.out.mkdir(parents=True, exist_ok=True)
    for name, make in forms().items():
        patch = pytest.MonkeyPatch()
        rec = recording(patch)
        calls = next(rec)
        make()
        next(rec, None)
        patch.undo()
        made, call = calls[0]
        src = generated(made, call, PRELUDE).replace("\n__global__ void", '\nextern "C" __global__ void', 1)
        cubin = args.out / f"{name}.cubin"
        cubin.write_bytes(compile_cubin(args.cuda, src, name, args.arch))
        tool = str(args.cuda / "bin" / "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        (args.out / f"{name}.sass").write_text(sass)
        regs = " ".join(x.strip() for x in usage.splitlines() if "REG" in x)
        print(f"{name}: {regs}; about {sass.count(chr(10)) // 2} instructions -> {args.out / name}.sass")


if __name__ == "__main__":
    main()
