"""Run one of segc's CUDA kernels on the CPU: its source as MLX 0.32's
``build_kernel`` writes it, compiled by ``g++`` with each CUDA thread a fiber of one host thread (a
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
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <type_traits>
#include <ucontext.h>
// as few of the standard headers as will do: each compiled kernel parses them again
template <typename T> constexpr const T& min(const T& a, const T& b) { return b < a ? b : a; }
template <typename T> constexpr const T& max(const T& a, const T& b) { return a < b ? b : a; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
struct segc_dim3 { unsigned x, y, z; };
// A block's CUDA threads are fibers of one host thread: each runs until it waits at a
// barrier (the block's, or its warp's in a shuffle) or ends; once every fiber still
// running waits at a barrier, the scheduler lets them go. The scheduler sets the running
// fiber's indices before it resumes it.
#if defined(__x86_64__)
// a switch of stacks that saves the callee-saved registers alone (glibc's swapcontext
// also saves the signal mask: a system call a switch, most of a run's time)
struct segc_ctx { void* sp; };
extern "C" void segc_switch(void** from, void* to);
asm(".text\n.globl segc_switch\n.type segc_switch,@function\nsegc_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n");
inline void segc_swap(segc_ctx& from, segc_ctx& to) { segc_switch(&from.sp, to.sp); }
inline void segc_make(segc_ctx& c, char* stack, size_t size, void (*entry)()) {
  auto* sp = reinterpret_cast<uintptr_t*>((reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15));
  *--sp = 0;  // the entry's return address: it never returns
  *--sp = reinterpret_cast<uintptr_t>(entry);
  for (int i = 0; i < 6; ++i) *--sp = 0;  // the six registers segc_switch pops
  c.sp = sp;
}
#else
struct segc_ctx { ucontext_t uc; };
inline void segc_swap(segc_ctx& from, segc_ctx& to) { swapcontext(&from.uc, &to.uc); }
inline void segc_make(segc_ctx& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif
segc_dim3 threadIdx, blockIdx, blockDim, gridDim;
unsigned segc_lin;  // the running thread's linear index in its block
enum segc_state : unsigned char { SEGC_RUN, SEGC_BLOCK, SEGC_WARP, SEGC_DONE };
struct segc_fiber { segc_ctx ctx; segc_state state; };
segc_fiber segc_fibers[1024];
segc_ctx segc_sched;
inline void segc_yield(segc_state s) {
  segc_fiber& f = segc_fibers[segc_lin];
  f.state = s;
  segc_swap(f.ctx, segc_sched);
}
float segc_slots[1024];
inline void __syncthreads() { segc_yield(SEGC_BLOCK); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  unsigned t = segc_lin, lane = t % 32, base = t - lane;
  segc_slots[t] = v;
  segc_yield(SEGC_WARP);
  float r = segc_slots[base + (lane ^ o)];
  segc_yield(SEGC_WARP);
  return r;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __ldcg(const float* p) { return *p; }
inline unsigned short __ldcg(const unsigned short* p) { return *p; }
inline unsigned __ldcg(const unsigned* p) { return *p; }
inline long long clock64() {  // a wait that never ends traps after a few thousand looks
  static long long now = 0;
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


# A block run as fibers (EMULATED): each pass resumes every runnable fiber until it waits
# or ends, the passes in turn forward and backward (a read of another thread's write with
# no barrier between them sees the old value in one of the two); then a barrier whose live
# fibers all wait lets them go. Fibers that wait where none can pass end the run.
SCHEDULER = r"""
void* segc_body;  // the launch's call of the kernel (a lambda of main's) and its caller
void (*segc_call)(void*);
template <typename F> void segc_set_body(F& f) {
  segc_body = &f;
  segc_call = [](void* p) { (*static_cast<F*>(p))(); };
}
static void segc_entry() {
  segc_call(segc_body);
  segc_fibers[segc_lin].state = SEGC_DONE;
  segc_swap(segc_fibers[segc_lin].ctx, segc_sched);  // never resumed
  std::abort();
}
void segc_block_run(segc_dim3 blk, unsigned nt) {
  static char* stacks[1024];
  constexpr size_t stack = 256 * 1024;
  blockIdx = blk;
  for (unsigned t = 0; t < nt; ++t) {
    if (!stacks[t]) stacks[t] = new char[stack];
    segc_make(segc_fibers[t].ctx, stacks[t], stack, segc_entry);
    segc_fibers[t].state = SEGC_RUN;
  }
  for (unsigned pass = 0;; ++pass) {
    for (unsigned k = 0; k < nt; ++k) {
      unsigned t = pass % 2 ? nt - 1 - k : k;
      if (segc_fibers[t].state != SEGC_RUN) continue;
      segc_lin = t;
      threadIdx = {t % blockDim.x, t / blockDim.x, 0u};
      segc_swap(segc_sched, segc_fibers[t].ctx);
    }
    unsigned live = 0, at_block = 0;
    for (unsigned t = 0; t < nt; ++t) {
      live += segc_fibers[t].state != SEGC_DONE;
      at_block += segc_fibers[t].state == SEGC_BLOCK;
    }
    if (live == 0) return;
    bool went = false;
    if (at_block == live) {  // the block's barrier
      for (unsigned t = 0; t < nt; ++t) if (segc_fibers[t].state == SEGC_BLOCK) segc_fibers[t].state = SEGC_RUN;
      went = true;
    }
    for (unsigned lo = 0; lo < nt; lo += 32) {  // each warp whose live threads all wait in a shuffle
      unsigned hi = min(nt, lo + 32), warp_live = 0, waiting = 0;
      for (unsigned t = lo; t < hi; ++t) {
        warp_live += segc_fibers[t].state != SEGC_DONE;
        waiting += segc_fibers[t].state == SEGC_WARP;
      }
      if (warp_live == 0 || waiting != warp_live) continue;
      for (unsigned t = lo; t < hi; ++t) if (segc_fibers[t].state == SEGC_WARP) segc_fibers[t].state = SEGC_RUN;
      went = true;
    }
    if (!went) {
      std::fprintf(stderr, "block %u: its threads wait at barriers none of them can pass\n", blk.x);
      std::abort();
    }
  }
}
"""


def _main(made: dict[str, Any], call: dict[str, Any], launches: int) -> str:
    """A ``main`` that reads the inputs, runs the grid ``launches`` times (the inputs, a
    counter among them, kept between launches; the outputs filled with a pattern before
    each, as fresh buffers; the blocks in order, then in reverse) and writes each
    launch's outputs."""
    ins, outs = call["inputs"], call["output_shapes"]
    in_bytes = [max(x.nbytes, 1) for x in ins]
    out_bytes = [max(int(np.prod(s)) * d.size, 1) for s, d in zip(outs, call["output_dtypes"], strict=True)]
    lines = [
        SCHEDULER,
        "int main(int argc, char** argv) {",
        "  (void)argc;",
        "  const char* dir = argv[1];",
        "  char path[4096];",
    ]
    args = []
    for i, x in enumerate(ins):
        lines += [
            f"  unsigned char* in{i} = new unsigned char[{in_bytes[i]}];",
            f'  snprintf(path, sizeof path, "%s/in{i}.bin", dir);',
            f'  {{ FILE* f = fopen(path, "rb"); if (!f || fread(in{i}, 1, {x.nbytes}, f) != {x.nbytes}) return 2; fclose(f); }}',
        ]
        args.append(f"reinterpret_cast<const {CTYPES[x.dtype]}*>(in{i})")
        if x.ndim > 0 and f"{made['input_names'][i]}_shape" in made["source"]:
            dims = ", ".join(str(s) for s in x.shape)
            lines.append(f"  Shape shape{i} = {{{{{dims}}}}};")
            args.append(f"shape{i}")
    for j, dt in enumerate(call["output_dtypes"]):
        lines.append(f"  unsigned char* out{j} = new unsigned char[{out_bytes[j]}];")
        args.append(f"reinterpret_cast<{CTYPES[dt]}*>(out{j})")
    (gx, gy, gz), (tx, ty, tz) = call["grid"], call["threadgroup"]
    assert gy == ty and gz == tz == 1, "one block along y and z"
    nblocks = -(-gx // tx)
    nt = tx * ty
    lines += [
        f"  blockDim = {{{tx}u, {ty}u, 1u}}; gridDim = {{{nblocks}u, 1u, 1u}};",
        f"  auto body = [&] {{ mlx::core::cu::{made['name']}({', '.join(args)}); }};",
        "  segc_set_body(body);",
        f"  for (int launch = 0; launch < {launches}; ++launch) {{",
        *(
            f"    memset(out{j}, 0xA5, {n});  // a fresh buffer a launch; not zero: an unwritten output shows"
            for j, n in enumerate(out_bytes)
        ),
        f"    for (unsigned i = 0; i < {nblocks}u; ++i) {{",
        f"      unsigned blk = launch % 2 ? {nblocks}u - 1u - i : i;  // blocks in either order",
        f"      segc_block_run({{blk, 0u, 0u}}, {nt}u);",
        "    }",
    ]
    for j, n in enumerate(out_bytes):
        lines += [
            f'    snprintf(path, sizeof path, "%s/out{j}_%d.bin", dir, launch);',
            f'    {{ FILE* f = fopen(path, "wb"); fwrite(out{j}, 1, {n}, f); fclose(f); }}',
        ]
    for i, n in enumerate(in_bytes):  # the inputs as the launch left them (a counter's state)
        lines += [
            f'    snprintf(path, sizeof path, "%s/in{i}_%d.bin", dir, launch);',
            f'    {{ FILE* f = fopen(path, "wb"); fwrite(in{i}, 1, {n}, f); fclose(f); }}',
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
