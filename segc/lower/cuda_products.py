"""The kernels of ``products.py`` (which imports this module on first use) for MLX's CUDA
backend (``mx.fast.cuda_kernel``).

Each output row is one warp's dot product, written as MLX 0.32's ``gemv_impl``
(``mlx/backend/cuda/gemms/gemv.cu``) writes it: blocks of 8 warps, lane ``l`` summing
columns ``npt * l + j`` in steps of ``32 * npt`` in float (``sum += m * v``), ``npt`` 4,
2 or 1 as MLX picks it (the row length a multiple of 128 or 64 and both pointers
aligned to that many elements), then ``cooperative_groups::reduce`` over the warp, then
a rounding to the dtype. The loop is unrolled and the gate's and up's rows share it
(more loads in flight than MLX's loop keeps, each sum's additions in MLX's order). What follows uses MLX's own functors (``Add``, ``Sigmoid``,
``Multiply`` from its device headers) on the dtype, in the recorded operand order. A
norm before the products is MLX's ``rms_norm_small`` for one row, run by each block
into shared memory (the same threads' sums in the same order, the same block
reduction, ``rsqrt``, the weight's product rounded as MLX rounds it). The bits of MLX's
kernels, in one kernel. Over quantized weights each row is MLX's ``qmv`` instead
(``cuda_qmv.py``), with the same epilogues. Only imported on a machine whose MLX has CUDA.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .cuda_kernel import cuda_kernel
from .cuda_qmv import GLU_WARPS, QBODY, QHEADER, QINPUTS

ROWS_PER_BLOCK = 8  # MLX's gemv: a block of 8 warps, a warp per row

_HEADER = r"""
#include "mlx/backend/cuda/device/binary_ops.cuh"
#include "mlx/backend/cuda/device/unary_ops.cuh"
#include <cooperative_groups/reduce.h>

// MLX's per-lane sum for one row, its loop unrolled (more loads in flight: MLX's own loop
// keeps one per lane, and a decode product waits on memory); the additions stay in order
template <int NPT, typename T>
__device__ float segc_dot(const T* mat, const T* vec, int row, int cols, int lane) {
  float sum = 0.f;
#pragma unroll 8
  for (int col = NPT * lane; col < cols; col += 32 * NPT) {
    auto m = mlx::core::cu::unsafe_load_vector<NPT>(mat + row * cols + col, 0);
    auto v = mlx::core::cu::unsafe_load_vector<NPT>(vec + col, 0);
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
      sum += static_cast<float>(m[j]) * static_cast<float>(v[j]);
    }
  }
  return sum;
}

template <typename T>
__device__ int segc_npt(const T* mat, const T* vec, int cols) {
  if (cols % 128 == 0 && mlx::core::cu::is_aligned<4>(mat) && mlx::core::cu::is_aligned<4>(vec)) {
    return 4;
  }
  if (cols % 64 == 0 && mlx::core::cu::is_aligned<2>(mat) && mlx::core::cu::is_aligned<2>(vec)) {
    return 2;
  }
  return 1;
}

// one warp's row of MLX's gemv over `mat` (its base pointer: MLX checks its alignment)
template <typename T>
__device__ float segc_row(const T* mat, const T* vec, int row, int cols) {
  namespace cg = cooperative_groups;
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = warp.thread_rank();
  const int npt = segc_npt(mat, vec, cols);
  float sum = npt == 4 ? segc_dot<4>(mat, vec, row, cols, lane)
      : npt == 2       ? segc_dot<2>(mat, vec, row, cols, lane)
                       : segc_dot<1>(mat, vec, row, cols, lane);
  return cg::reduce(warp, sum, cg::plus<float>{});
}

// two rows' sums in one loop (the gate's and the up's: two chains, each in MLX's order)
template <int NPT, typename T>
__device__ void segc_dot2(const T* ma, int ra, const T* mb, int rb, const T* vec, int cols, int lane, float& sa, float& sb) {
  sa = 0.f;
  sb = 0.f;
#pragma unroll 4
  for (int col = NPT * lane; col < cols; col += 32 * NPT) {
    auto a = mlx::core::cu::unsafe_load_vector<NPT>(ma + ra * cols + col, 0);
    auto b = mlx::core::cu::unsafe_load_vector<NPT>(mb + rb * cols + col, 0);
    auto v = mlx::core::cu::unsafe_load_vector<NPT>(vec + col, 0);
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
      sa += static_cast<float>(a[j]) * static_cast<float>(v[j]);
      sb += static_cast<float>(b[j]) * static_cast<float>(v[j]);
    }
  }
}

template <typename T>
__device__ void segc_rows2(const T* ma, int ra, const T* mb, int rb, const T* vec, int cols, float& sa, float& sb) {
  namespace cg = cooperative_groups;
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = warp.thread_rank();
  const int na = segc_npt(ma, vec, cols), nb = segc_npt(mb, vec, cols);
  if (na == nb && na == 4) {
    segc_dot2<4>(ma, ra, mb, rb, vec, cols, lane, sa, sb);
  } else if (na == nb && na == 2) {
    segc_dot2<2>(ma, ra, mb, rb, vec, cols, lane, sa, sb);
  } else if (na == nb) {
    segc_dot2<1>(ma, ra, mb, rb, vec, cols, lane, sa, sb);
  } else {  // the two weights aligned differently: each as MLX would sum it
    sa = na == 4 ? segc_dot<4>(ma, vec, ra, cols, lane) : na == 2 ? segc_dot<2>(ma, vec, ra, cols, lane)
                                                                  : segc_dot<1>(ma, vec, ra, cols, lane);
    sb = nb == 4 ? segc_dot<4>(mb, vec, rb, cols, lane) : nb == 2 ? segc_dot<2>(mb, vec, rb, cols, lane)
                                                                  : segc_dot<1>(mb, vec, rb, cols, lane);
  }
  sa = cg::reduce(warp, sa, cg::plus<float>{});
  sb = cg::reduce(warp, sb, cg::plus<float>{});
}

// the gated activation of a row's gate and up sums, each step rounded to the dtype as
// eager's kernels round it, the operands in the recorded order
template <typename T, bool GFIRST, bool GSFIRST>
__device__ __forceinline__ T segc_glu(float sg, float su) {
  T g = static_cast<T>(sg);
  T u = static_cast<T>(su);
  using mlx::core::cu::Multiply;
  T s = mlx::core::cu::Sigmoid{}(g);
  T gs = GFIRST ? Multiply{}(g, s) : Multiply{}(s, g);
  return GSFIRST ? Multiply{}(gs, u) : Multiply{}(u, gs);
}

// MLX's rms_norm_small<T, BS, NCH, ALIGNED, NR> for one row, by the block's first BS
// threads (the same sums in the same order, the same block reduction); the normalised
// row lands in `xs` for the products
template <typename T, int BS, int NCH, int NR>
__device__ void segc_rms(const T* x, const T* w, T* xs, int K, float eps) {
  namespace cg = cooperative_groups;
  auto block = cg::this_thread_block();
  auto warp = cg::tiled_partition<32>(block);
  __shared__ float temp[BS / 32];
  const int t = block.thread_rank();
  float normalizer = 0;
  if (t < BS) {
    for (int i = 0; i < NCH; i++) {
      const int offset = BS * i + t;
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        const int idx = offset * NR + j;
        float v = static_cast<float>(idx < K ? x[idx] : T(0));
        normalizer += v * v;
      }
    }
  }
  float part = cg::reduce(warp, normalizer, cg::plus<float>{});
  if (warp.thread_rank() == 0 && warp.meta_group_rank() < BS / 32) {
    temp[warp.meta_group_rank()] = part;
  }
  block.sync();
  float v2 = warp.thread_rank() < BS / 32 ? temp[warp.thread_rank()] : 0.f;
  float total = cg::reduce(warp, v2, cg::plus<float>{});
  const uint32_t axis_size = K;
  total = rsqrt(total / axis_size + eps);
  if (t < BS) {
    for (int i = 0; i < NCH; i++) {
      const int offset = BS * i + t;
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        const int idx = offset * NR + j;
        if (idx < K) {
          float y = static_cast<float>(x[idx]) * total;
          xs[idx] = w[idx] * static_cast<T>(y);
        }
      }
    }
  }
  block.sync();
}
"""

# the row the products read: the input itself, or normalised by every block first
_ROW = "    const T* vec = x;\n"
_ROW_NORM = """
    __shared__ __align__(16) T xs[K];
    segc_rms<T, NBS, NCH, NR>(x, nw, xs, K, EPS);
    const T* vec = xs;
"""

_BODY = {
    "gemv": r"""
    const int row = blockIdx.x * RPB + threadIdx.y;
    if (row < N) {
        float s = segc_row<T>(w, vec, row, K);
        if (threadIdx.x == 0) {
            out[row] = static_cast<T>(s);
        }
    }
""",
    "add": r"""
    const int row = blockIdx.x * RPB + threadIdx.y;
    if (row < N) {
        float s = segc_row<T>(w, vec, row, K);
        if (threadIdx.x == 0) {
            T y = static_cast<T>(s);
            out[row] = PFIRST ? Add{}(y, r[row]) : Add{}(r[row], y);
        }
    }
""",
    "glu": r"""
    const int row = blockIdx.x * RPB + threadIdx.y;
    if (row < N) {
        float sg, su;
        segc_rows2<T>(wg, OG + row, wu, OU + row, vec, K, sg, su);
        if (threadIdx.x == 0) {
            out[row] = segc_glu<T, GFIRST, GSFIRST>(sg, su);
        }
    }
""",
}
_INPUTS = {"gemv": ["x", "w"], "add": ["x", "w", "r"], "glu": ["x", "wg", "wu"]}


@functools.cache
def _kernel(kind: str, eps_bits: int | None, quant: bool = False) -> Any:
    """The kernel of ``kind``; with ``eps_bits`` (a float32's bits), the norm first;
    ``quant``: over quantized weights."""
    inputs, body = (QINPUTS, QBODY) if quant else (_INPUTS, _BODY)
    header = _HEADER + (QHEADER if quant else "")
    name = f"segc_{'qmv' if quant else 'gemv'}_{kind}"
    if eps_bits is None:
        return cuda_kernel(
            name=name, input_names=inputs[kind], output_names=["out"], source=_ROW + body[kind], header=header
        )
    return cuda_kernel(
        name=f"segc_rms_{name[5:]}_{eps_bits:08x}",
        input_names=[*inputs[kind], "nw"],
        output_names=["out"],
        source=_ROW_NORM + body[kind],
        header=header + f"#define EPS (__int_as_float(0x{eps_bits:08x}))\n",
    )


def product(
    kind: str,
    ins: Sequence[mx.array],
    rows: tuple[int, ...],
    n: int,
    shape: tuple[int, ...],
    order: tuple[bool, ...],
    norm: tuple[float, tuple[int, int, int]] | None = None,
    quant: tuple[int, int] | None = None,
) -> mx.array:
    """One ``kind`` (``gemv``, ``add``, ``glu``: ``products.ProductMatch``) over ``ins``
    (the row, the weights (each three arrays with ``quant``: (group size, bits)), the
    addend, then the norm's weight with ``norm``: its eps and MLX's launch of it,
    ``products.norm_blocks``)."""
    x = ins[0]
    k = x.shape[-1]
    blocks = (n + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK
    tmpl: list[tuple[str, Any]] = [("T", x.dtype), ("N", n), ("K", k), ("RPB", ROWS_PER_BLOCK)]
    if kind == "add":
        tmpl.append(("PFIRST", order[0]))
    elif kind == "glu":
        tmpl += [("OG", rows[0]), ("OU", rows[1]), ("GFIRST", order[0]), ("GSFIRST", order[1])]
    if quant is not None:
        tmpl += [("GS", quant[0]), ("BITS", quant[1])]
    eps_bits = None
    if norm is not None:
        eps_bits = struct.unpack("<I", struct.pack("<f", norm[0]))[0]
        nbs, nch, nr = norm[1]
        tmpl += [("NBS", nbs), ("NCH", nch), ("NR", nr)]
    inputs = list(ins)
    width = 1 if quant is None else 3
    if kind == "glu" and len(inputs) == 1 + width + (norm is not None):  # one concatenated weight, read twice
        inputs[1 + width : 1 + width] = inputs[1 : 1 + width]
    warps = ROWS_PER_BLOCK * (GLU_WARPS if quant is not None and kind == "glu" else 1)
    (out,) = _kernel(kind, eps_bits, quant is not None)(
        inputs=inputs,
        template=tmpl,
        grid=(32 * blocks, warps, 1),
        threadgroup=(32, warps, 1),
        output_shapes=[shape],
        output_dtypes=[x.dtype],
    )
    return out
