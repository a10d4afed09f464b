"""The quantized kernels' CUDA source for ``cuda_products.py``: each output row as MLX
0.32's ``qmv`` computes it (``mlx/backend/cuda/quantized/qmm/qmv.cu``, affine
quantization), on cutlass's types as MLX's kernel runs (MLX installs cutlass's headers
and its ``cute_dequant.cuh`` for its own JIT): the same dequantisation (each weight
times its scale plus its bias, in the dtype), the same per-lane sums (in the dtype for
fewer than 8 bits, as MLX keeps them), the same additions in float, the same warp
reduction and rounding. What follows a row is ``cuda_products.py``'s epilogue.
"""

from __future__ import annotations

QHEADER = r"""
// MLX's device headers (through libcu++) define the FP_* classification macros, which
// cutlass's NVRTC header declares as an enum (defining them again, with the same values)
#undef FP_NAN
#undef FP_INFINITE
#undef FP_ZERO
#undef FP_SUBNORMAL
#undef FP_NORMAL
#include "mlx/backend/cuda/device/cute_dequant.cuh"

namespace segc_q {
namespace cg = cooperative_groups;

template <typename T> struct ct { using type = T; };  // MLX's qmv runs on cutlass's types
template <> struct ct<__nv_bfloat16> { using type = cutlass::bfloat16_t; };
template <> struct ct<__half> { using type = cutlass::half_t; };
template <int B> struct qt;
template <> struct qt<2> { using type = cutlass::uint2b_t; };
template <> struct qt<3> { using type = cutlass::uint3b_t; };
template <> struct qt<4> { using type = cutlass::uint4b_t; };
template <> struct qt<5> { using type = cutlass::uint5b_t; };
template <> struct qt<6> { using type = cutlass::uint6b_t; };
template <> struct qt<8> { using type = uint8_t; };

// MLX 0.32's dequant_fma (mlx/backend/cuda/quantized/qmm/qmv.cu), both overloads as written
template <int N, bool has_bias, typename T, typename Q, typename S>
__device__ __forceinline__ void
dequant_fma(const T* x, const Q* w, S scale, T bias, T* out) {
  auto x_vec = *(reinterpret_cast<const cutlass::Array<T, N>*>(x));
  auto w_vec = *(reinterpret_cast<const cutlass::Array<Q, N>*>(w));
  auto* out_vec = reinterpret_cast<cutlass::Array<T, N>*>(out);
  cutlass::NumericArrayConverter<T, Q, N> converter_tq;
  cutlass::Array<T, N> w_dq = converter_tq(w_vec);
  if constexpr (has_bias) {
    if constexpr (cuda::std::is_same_v<T, float>) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        w_dq[i] = w_dq[i] * T(scale) + bias;
      }
    } else {
      w_dq = w_dq * T(scale) + bias;
    }
  } else {
    w_dq = w_dq * T(scale);
  }
  *out_vec = cutlass::fma(x_vec, w_dq, *out_vec);
}

template <
    int N,
    bool has_bias,
    typename T,
    typename Q,
    typename S,
    typename = cuda::std::enable_if_t<!cuda::std::is_same_v<T, float>>>
__device__ __forceinline__ void
dequant_fma(const T* x, const Q* w, S scale, T bias, float* out) {
  auto x_vec = *(reinterpret_cast<const cutlass::Array<T, N>*>(x));
  auto w_vec = *(reinterpret_cast<const cutlass::Array<Q, N>*>(w));
  auto* out_vec = reinterpret_cast<cutlass::Array<float, N>*>(out);
  cutlass::NumericArrayConverter<T, Q, N> converter_tq;
  cutlass::Array<T, N> w_dq = converter_tq(w_vec);
  if constexpr (has_bias) {
    w_dq = w_dq * T(scale) + bias;
  } else {
    w_dq = w_dq * T(scale);
  }
  cutlass::NumericArrayConverter<float, T, N> converter_ft;
  cutlass::Array<float, N> x_f = converter_ft(x_vec);
  cutlass::Array<float, N> w_f = converter_ft(w_dq);
  *out_vec = cutlass::fma(x_f, w_f, *out_vec);
}

// one warp's row of MLX's qmv_kernel_impl (affine: biases), up to the warp's float sum;
// x, scales and biases of cutlass's type T, the packed weight of Q
template <int group_size, typename T, typename Q>
__device__ float qmv_row(const T* x, const Q* w, const T* scales, const T* biases, int row, int k) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  constexpr int bits = cute::sizeof_bits_v<Q>;
  constexpr int elems_per_thread = (cute::sizeof_bits_v<T> <= 16 && bits <= 4) ? 16 : 8;
  auto w_step = [&](int idx) { return idx * (bits < 8 ? bits : 8) / 8; };  // MLX: cuda::std::min(8, bits)
  int groups_per_row = k / group_size;
  w += static_cast<int64_t>(row) * w_step(k);
  scales += static_cast<int64_t>(row) * groups_per_row;
  biases += static_cast<int64_t>(row) * groups_per_row;
  cuda::std::conditional_t<(bits >= 8), float, T> sums[elems_per_thread] = {};
  auto dequant_fma_tile = [&](int idx) {
    T scale = scales[idx / group_size];
    T bias = biases[idx / group_size];
    dequant_fma<elems_per_thread, true>(x + idx, w + w_step(idx), scale, bias, sums);
  };
  constexpr int elems_per_warp = 32 * elems_per_thread;
  for (int r = 0; r < k / elems_per_warp; ++r) {
    int idx = warp.thread_rank() * elems_per_thread + r * elems_per_warp;
    dequant_fma_tile(idx);
  }
  if (k % elems_per_warp) {
    int rest = k % elems_per_warp;
    int idx = warp.thread_rank() * elems_per_thread + k - rest;
    if (idx < k) {
      dequant_fma_tile(idx);
    }
  }
  float sum{0};
#pragma unroll
  for (int i = 0; i < elems_per_thread; ++i) {
    sum += sums[i];
  }
  return cg::reduce(warp, sum, cg::plus<float>{});
}

// the row's sum rounded as MLX's qmv writes it (cutlass's conversion), as the dtype
template <typename T>
__device__ T to_dtype(float sum) {
  typename ct<T>::type y = static_cast<typename ct<T>::type>(sum);
  return *reinterpret_cast<T*>(&y);
}

// segc_q::row over the kernel's own arrays (the CUDA types cuda_kernel gives them)
template <int GS, int BITS, typename T>
__device__ float qrow(const T* x, const uint32_t* w, const T* s, const T* b, int r, int k) {
  using CT = typename ct<T>::type;
  using Q = typename qt<BITS>::type;
  return qmv_row<GS>(reinterpret_cast<const CT*>(x), reinterpret_cast<const Q*>(w), reinterpret_cast<const CT*>(s),
                 reinterpret_cast<const CT*>(b), r, k);
}
}  // namespace segc_q
"""

# the same over quantized weights (MLX's qmv for each row; glu: the gate's and the up's rows
# by warps of their own, ``GLU_WARPS`` per block row)
QBODY = {
    "gemv": r"""
    const int row = blockIdx.x * RPB + threadIdx.y;
    if (row < N) {
        float s = segc_q::qrow<GS, BITS, T>(vec, w, ws, wb, row, K);
        if (threadIdx.x == 0) {
            out[row] = segc_q::to_dtype<T>(s);
        }
    }
""",
    "add": r"""
    const int row = blockIdx.x * RPB + threadIdx.y;
    if (row < N) {
        float s = segc_q::qrow<GS, BITS, T>(vec, w, ws, wb, row, K);
        if (threadIdx.x == 0) {
            T y = segc_q::to_dtype<T>(s);
            out[row] = PFIRST ? Add{}(y, r[row]) : Add{}(r[row], y);
        }
    }
""",
    "glu": r"""
    // a block of 2 * RPB warps: the first RPB sum the gate's rows, the others the up's
    // (each row one warp, as MLX's qmv over the concatenated weight gives it)
    __shared__ float segc_up[RPB];
    const int wy = threadIdx.y % RPB;
    const bool up = threadIdx.y >= RPB;
    const int row = blockIdx.x * RPB + wy;
    float sum = 0.f;
    if (row < N) {
        sum = up ? segc_q::qrow<GS, BITS, T>(vec, wu, us, ub, OU + row, K)
                 : segc_q::qrow<GS, BITS, T>(vec, wg, gs, gb, OG + row, K);
        if (up && threadIdx.x == 0) {
            segc_up[wy] = sum;
        }
    }
    __syncthreads();
    if (!up && row < N && threadIdx.x == 0) {
        T g = segc_q::to_dtype<T>(sum);
        T u = segc_q::to_dtype<T>(segc_up[wy]);
        T s = Sigmoid{}(g);
        T gsv = GFIRST ? Multiply{}(g, s) : Multiply{}(s, g);
        out[row] = GSFIRST ? Multiply{}(gsv, u) : Multiply{}(u, gsv);
    }
""",
}
GLU_WARPS = 2  # the quantized glu's launch, as its body lays it out: RPB warps for the gate's rows, RPB for the up's
QINPUTS = {
    "gemv": ["x", "w", "ws", "wb"],
    "add": ["x", "w", "ws", "wb", "r"],
    "glu": ["x", "wg", "gs", "gb", "wu", "us", "ub"],
}
