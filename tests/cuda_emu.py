"""Run one of segc's CUDA kernels on the CPU: its source as MLX 0.32's
``build_kernel`` writes it, compiled by ``g++`` with each CUDA thread a host thread (a
block at a time; ``__syncthreads`` and a warp's shuffles are barriers; ``__shared__``
variables are a block's statics; ``atomicAdd`` is atomic). The arithmetic is the host's
(glibc's ``expf``, ``cos``, ...), not the GPU's, so results are compared within
float32's rounding, never for the GPU's bytes; what this checks is the kernels' logic:
indexing, synchronisation, the counters that carry over from one launch to the next.
What the product kernels take from MLX's device headers (its vector loads, ``Add``,
``Multiply``, ``Sigmoid``) and from cooperative groups is declared here as plain C++;
the quantized products (cutlass's types) are not run.
Used by ``tests/test_cuda_emulated.py``; ``tests/test_cuda_sources.py`` makes the
source the same way."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from segc.lower.cuda_kernel import expand

GXX = shutil.which("g++")
CACHE = Path(tempfile.gettempdir()) / "segc-cuda-emu"

CTYPES = {
    mx.bfloat16: "__nv_bfloat16",
    mx.float16: "__half",
    mx.float32: "float",
    mx.bool_: "bool",
    mx.int32: "int32_t",
    mx.uint32: "uint32_t",
    mx.uint64: "uint64_t",
}
NP = {mx.bfloat16: np.uint16, mx.float16: np.float16, mx.float32: np.float32, mx.bool_: np.bool_}
NP.update({mx.int32: np.int32, mx.uint32: np.uint32, mx.uint64: np.uint64})

# CUDA's built-ins, emulated (a run; compiled alone, a syntax and type check)
EMULATED = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
struct segc_dim3 { unsigned x, y, z; };
thread_local segc_dim3 threadIdx, blockIdx;
thread_local unsigned segc_lin;  // the thread's linear index in its block
segc_dim3 blockDim, gridDim;
std::barrier<>* segc_block;
std::vector<std::unique_ptr<std::barrier<>>> segc_warps;
float segc_slots[1024];
inline void __syncthreads() { segc_block->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  unsigned t = segc_lin, lane = t % 32, base = t - lane;
  segc_slots[t] = v;
  segc_warps[t / 32]->arrive_and_wait();
  float r = segc_slots[base + (lane ^ o)];
  segc_warps[t / 32]->arrive_and_wait();
  return r;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline float __ldcg(const float* p) { return *p; }
inline unsigned short __ldcg(const unsigned short* p) { return *p; }
inline unsigned __ldcg(const unsigned* p) { return *p; }
inline long long clock64() {  // a wait that never ends traps after a few thousand looks
  static std::atomic<long long> now{0};
  return now += 1ll << 20;
}
inline void __nanosleep(unsigned) {}
[[noreturn]] inline void __trap() { std::abort(); }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) {  // round to nearest even, as CUDA's __float2bfloat16
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) { bits = (u >> 16) | 0x40; return; }
    bits = (u + 0x7fff + ((u >> 16) & 1)) >> 16;
  }
  operator float() const { uint32_t u = uint32_t(bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
};
struct __half {
  _Float16 h;
  __half() = default;
  __half(float f) : h(static_cast<_Float16>(f)) {}
  operator float() const { return static_cast<float>(h); }
};
inline __nv_bfloat16 operator*(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16(float(a) * float(b)); }
inline __half operator*(__half a, __half b) { return __half(float(a) * float(b)); }
// CUDA's products that no add may contract into an fma (the host's never does)
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline __nv_bfloat16 __hmul_rn(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline __half __hmul_rn(__half a, __half b) { return a * b; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 __ldcg(const uint4* p) { return *p; }
struct Shape { int32_t v[8]; int32_t operator[](int i) const { return v[i]; } };
using Strides = Shape;
inline float rsqrt(float x) { return 1.f / std::sqrt(x); }
// what the product kernels take from MLX's device headers and cooperative groups
namespace cooperative_groups {
struct thread_block {
  unsigned thread_rank() const { return segc_lin; }
  void sync() const { __syncthreads(); }
};
inline thread_block this_thread_block() { return {}; }
template <int N> struct tile {
  unsigned thread_rank() const { return segc_lin % N; }
  unsigned meta_group_rank() const { return segc_lin / N; }
};
template <int N> tile<N> tiled_partition(thread_block) { return {}; }
template <typename U> struct plus { U operator()(U a, U b) const { return a + b; } };
template <int N, typename U, typename Op> U reduce(tile<N>, U v, Op op) {
  for (int o = N / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
}  // namespace cooperative_groups
namespace mlx::core::cu {
template <int N, typename T> struct segc_vec { T v[N]; T operator[](int i) const { return v[i]; } };
template <int N, typename T> segc_vec<N, T> unsafe_load_vector(const T* p, uint32_t off) {
  segc_vec<N, T> r;
  for (int i = 0; i < N; ++i) r.v[i] = p[off * N + i];
  return r;
}
template <int N, typename T> bool is_aligned(const T* p) { return reinterpret_cast<uintptr_t>(p) % (N * sizeof(T)) == 0; }
struct Add { template <typename T> T operator()(T a, T b) const { return T(float(a) + float(b)); } };
struct Multiply { template <typename T> T operator()(T a, T b) const { return T(float(a) * float(b)); } };
struct Sigmoid { template <typename T> T operator()(T x) const { return T(1.f / (1.f + std::exp(-float(x)))); } };
}  // namespace mlx::core::cu
"""


def generated(made: dict[str, Any], call: dict[str, Any], prelude: str = "") -> str:
    """The kernel's source as MLX's ``build_kernel`` writes it for one call (``made``:
    ``mx.fast.cuda_kernel``'s arguments, ``call``: the kernel call's), after ``prelude``
    (default: :data:`EMULATED`)."""
    prelude = prelude or EMULATED
    made = dict(made, source=expand(made["source"]), header=expand(made["header"]))
    src = made["source"]
    params = []
    for name, x in zip(made["input_names"], call["inputs"], strict=True):
        params.append(f"const {CTYPES[x.dtype]}* {name}")
        if x.ndim > 0 and f"{name}_shape" in src:
            params.append(f"const __grid_constant__ Shape {name}_shape")
        if x.ndim > 0 and f"{name}_strides" in src:
            params.append(f"const __grid_constant__ Strides {name}_strides")
    params += [f"{CTYPES[t]}* {n}" for n, t in zip(made["output_names"], call["output_dtypes"], strict=True)]
    consts = []
    for name, arg in call["template"]:
        if isinstance(arg, bool):
            consts.append(f"  constexpr bool {name} = {'true' if arg else 'false'};")
        elif isinstance(arg, int):
            consts.append(f"  constexpr int {name} = {arg};")
        else:
            consts.append(f"  using {name} = {CTYPES[arg]};")
    return (
        prelude
        + made["header"]
        + "namespace mlx::core::cu {\n__global__ void "
        + made["name"]
        + "(\n    "
        + ",\n    ".join(params)
        + ") {\n"
        + "\n".join(consts)
        + "\n"
        + src
        + "\n}\n}  // namespace mlx::core::cu\n"
    )


def _main(made: dict[str, Any], call: dict[str, Any], launches: int) -> str:
    """A ``main`` that reads the inputs, runs the grid ``launches`` times (the inputs, a
    counter among them, kept between launches; the outputs filled with a pattern before
    each, as fresh buffers; the blocks in order, then in reverse) and writes each
    launch's outputs."""
    ins, outs = call["inputs"], call["output_shapes"]
    lines = ["int main(int argc, char** argv) {", "  (void)argc;", "  const char* dir = argv[1];", "  char path[4096];"]
    args = []
    for i, x in enumerate(ins):
        n = max(x.nbytes, 1)
        lines += [
            f"  std::vector<unsigned char> in{i}({n});",
            f'  snprintf(path, sizeof path, "%s/in{i}.bin", dir);',
            f'  {{ FILE* f = fopen(path, "rb"); if (!f || fread(in{i}.data(), 1, {x.nbytes}, f) != {x.nbytes}) return 2; fclose(f); }}',
        ]
        args.append(f"reinterpret_cast<const {CTYPES[x.dtype]}*>(in{i}.data())")
        if x.ndim > 0 and f"{made['input_names'][i]}_shape" in made["source"]:
            dims = ", ".join(str(s) for s in x.shape)
            lines.append(f"  Shape shape{i} = {{{{{dims}}}}};")
            args.append(f"shape{i}")
    for j, (shape, dt) in enumerate(zip(outs, call["output_dtypes"], strict=True)):
        size = int(np.prod(shape)) * dt.size
        lines.append(
            f"  std::vector<unsigned char> out{j}({max(size, 1)}, 0xA5);  // not zero: an unwritten output shows"
        )
        args.append(f"reinterpret_cast<{CTYPES[dt]}*>(out{j}.data())")
    (gx, gy, gz), (tx, ty, tz) = call["grid"], call["threadgroup"]
    assert gy == ty and gz == tz == 1, "one block along y and z"
    nblocks = -(-gx // tx)
    nt = tx * ty
    lines += [
        f"  blockDim = {{{tx}u, {ty}u, 1u}}; gridDim = {{{nblocks}u, 1u, 1u}};",
        f"  for (int launch = 0; launch < {launches}; ++launch) {{",
        *(f"    std::fill(out{j}.begin(), out{j}.end(), 0xA5);  // a fresh buffer a launch" for j in range(len(outs))),
        f"    for (unsigned i = 0; i < {nblocks}u; ++i) {{",
        f"      unsigned blk = launch % 2 ? {nblocks}u - 1u - i : i;  // blocks in either order",
        f"      std::barrier<> block({nt});",
        "      segc_block = &block;",
        "      segc_warps.clear();",
        f"      for (unsigned w = 0; w < {-(-nt // 32)}u; ++w) segc_warps.emplace_back(new std::barrier<>(std::min(32u, {nt}u - 32u * w)));",
        "      std::vector<std::thread> threads;",
        f"      for (unsigned t = 0; t < {nt}u; ++t) threads.emplace_back([&, t] {{",
        f"        segc_lin = t; threadIdx = {{t % {tx}u, t / {tx}u, 0u}}; blockIdx = {{blk, 0u, 0u}};",
        f"        mlx::core::cu::{made['name']}({', '.join(args)});",
        "        segc_warps[t / 32]->arrive_and_drop();",
        "        block.arrive_and_drop();",
        "      });",
        "      for (auto& th : threads) th.join();",
        "    }",
    ]
    for j, _ in enumerate(outs):
        lines += [
            f'    snprintf(path, sizeof path, "%s/out{j}_%d.bin", dir, launch);',
            f'    {{ FILE* f = fopen(path, "wb"); fwrite(out{j}.data(), 1, out{j}.size(), f); fclose(f); }}',
        ]
    for i, _ in enumerate(ins):  # the inputs as the launch left them (a counter's state)
        lines += [
            f'    snprintf(path, sizeof path, "%s/in{i}_%d.bin", dir, launch);',
            f'    {{ FILE* f = fopen(path, "wb"); fwrite(in{i}.data(), 1, in{i}.size(), f); fclose(f); }}',
        ]
    lines += ["  }", "  return 0;", "}"]
    return "\n".join(lines) + "\n"


def run(
    made: dict[str, Any],
    call: dict[str, Any],
    launches: int = 1,
    inputs: bool = False,
    flags: tuple[str, ...] = (),
) -> list[list[np.ndarray]]:
    """Each launch's outputs (numpy arrays; bfloat16 as its uint16 bits); with
    ``inputs``, followed by the inputs as the launch left them. ``flags``: more of the
    host compiler's (``CONTRACTED``: a product and a sum made one FMA wherever the
    compiler likes, as NVRTC may; without, it never does)."""
    assert GXX is not None
    header = "".join(
        x
        for x in expand(made["header"]).splitlines(True)
        if not x.startswith(('#include "mlx/', "#include <cooperative"))
    )
    text = generated(dict(made, header=header), call, EMULATED) + _main(made, call, launches)
    CACHE.mkdir(exist_ok=True)
    exe = CACHE / hashlib.sha1((text + " ".join(flags)).encode()).hexdigest()[:16]
    if not exe.exists():  # compiled under another name, then moved: processes may race
        tmp = exe.with_suffix(f".{os.getpid()}")
        cmd = [GXX, "-std=c++20", "-O1", "-pthread", "-w", *flags, "-x", "c++", "-", "-o", str(tmp)]
        res = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        os.replace(tmp, exe)
    with tempfile.TemporaryDirectory() as d:
        for i, x in enumerate(call["inputs"]):
            Path(d, f"in{i}.bin").write_bytes(np.array(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x).tobytes())
        res = subprocess.run([str(exe), d], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"the emulated kernel failed ({res.returncode}): {res.stderr[-2000:]}"
        got = [
            [
                np.frombuffer(Path(d, f"out{j}_{k}.bin").read_bytes(), dtype=NP[dt]).reshape(shape)
                for j, (shape, dt) in enumerate(zip(call["output_shapes"], call["output_dtypes"], strict=True))
            ]
            for k in range(launches)
        ]
        if inputs:
            for k in range(launches):
                got[k] += [
                    np.frombuffer(Path(d, f"in{i}_{k}.bin").read_bytes()[: x.nbytes], dtype=NP[x.dtype]).reshape(
                        x.shape
                    )
                    for i, x in enumerate(call["inputs"])
                ]
        return got


# the host compiler contracting products into sums as it likes (x86's FMA instructions;
# GCC contracts from -O2)
CONTRACTED = ("-O2", "-mfma", "-ffp-contract=fast")


def recorder() -> tuple[Any, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """A stand-in for ``mx.fast.cuda_kernel`` that keeps every kernel made and called
    (the arguments of each) and returns zeros, and the list it keeps them in."""
    calls: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def make(**made: Any) -> Any:
        def call(**kw: Any) -> list[mx.array]:
            calls.append((made, kw))
            return [mx.zeros(s, dtype=t) for s, t in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)]

        return call

    return make, calls


def recording(monkeypatch: Any) -> Iterator[list[tuple[dict[str, Any], dict[str, Any]]]]:
    """A fixture's body: segc's CUDA kernels made and called through :func:`recorder`
    while a test runs (the kernel makers' caches emptied before and after)."""
    from segc.lower import cuda_kernel

    make, calls = recorder()
    monkeypatch.setattr(cuda_kernel.mx.fast, "cuda_kernel", make)
    for f in kernel_makers():
        f.cache_clear()
    yield calls
    for f in kernel_makers():
        f.cache_clear()  # no recorder left in the caches


def kernel_makers() -> tuple[Any, ...]:
    """segc's functions that make its CUDA kernels (each ``functools.cache``'d: a test
    that replaces ``mx.fast.cuda_kernel`` empties their caches before and after)."""
    from segc.lower import (
        cuda_attention,
        cuda_chain,
        cuda_gather,
        cuda_kvattention,
        cuda_kvwrite,
        cuda_layer,
        cuda_products,
    )

    return (
        cuda_chain._kernel,
        cuda_layer._kernel,
        cuda_gather._kernel,
        cuda_attention._kernels,
        cuda_attention._one_kernel,
        cuda_kvwrite._kernel,
        cuda_kvattention._kernel,
        cuda_products._kernel,
    )
