"""The rotated KV write (``kvwrite.KVWriteMatch``, through ``kvwrite.cuda_kv_write``) as
one ``mx.fast.cuda_kernel``.

A thread per 16 bytes of the new key and value buffers (the row at the offset computed,
every other row copied), then a thread per element of the rotated queries. An element of
a rotation is MLX 0.32's ``rope_single`` (``mlx/backend/cuda/rope.cu``) for the pair it
belongs to: the same expressions in the same order (``cos``, ``sin`` and ``exp2`` of
float, the products and sums of ``rope_single_impl``, one cast to the dtype), so the
same bits. Only imported on a machine whose MLX has CUDA.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from .cuda_kernel import cuda_kernel

THREADS = 256

_HEADER = r"""
template <typename T, bool TRAD, int DIMS, int DK>
__device__ void segc_rotation_loads(const T* x, int row, int d, T& a, T& b) {
  // the elements element d of row ``row`` of x is rotated from (past DIMS: itself, twice)
  const T* in = x + static_cast<int64_t>(row) * DK;
  if (d >= DIMS) {
    a = in[d];
    b = a;
    return;
  }
  constexpr int HALF = DIMS / 2;
  int p = TRAD ? d / 2 : (d < HALF ? d : d - HALF);
  int i1 = TRAD ? 2 * p : p;
  int i2 = TRAD ? i1 + 1 : i1 + HALF;
  a = in[i1];
  b = in[i2];
}

template <typename T, bool TRAD, int DIMS, bool FREQS>
__device__ T segc_rotation_apply(T a, T b, int d, int32_t offset, const float* freqs) {
  // element d after MLX's rope_single, from segc_rotation_loads's pair; past DIMS a copy
  if (d >= DIMS) {
    return a;
  }
  constexpr int HALF = DIMS / 2;
  int p = TRAD ? d / 2 : (d < HALF ? d : d - HALF);
  bool first = TRAD ? (d % 2) == 0 : d < HALF;
  float inv_freq;
  if (FREQS) {
    inv_freq = 1.0 / freqs[p];
  } else {
    float dd = static_cast<float>(p) / static_cast<float>(HALF);
    inv_freq = exp2(-dd * SEGC_LOG2_BASE);
  }
  float L = SEGC_SCALE * static_cast<float>(offset);
  float theta = L * inv_freq;
  float costheta = cos(theta);
  float sintheta = sin(theta);
  float x1 = static_cast<float>(a);
  float x2 = static_cast<float>(b);
  // rope_single's sums as MLX's build compiled them (its SASS, every dtype and form):
  // the first product fused, the second rounded; spelled out, as NVRTC's own choice
  // changed once this was split in two functions (float32 rows one ulp from MLX's)
  float r;
  if (first) {
    r = __fmaf_rn(x1, costheta, -__fmul_rn(x2, sintheta));
  } else {
    r = __fmaf_rn(x1, sintheta, __fmul_rn(x2, costheta));
  }
  return static_cast<T>(r);
}

template <typename T, bool TRAD, int DIMS, int DK, bool FREQS>
__device__ T segc_rotated(const T* x, int row, int d, int32_t offset, const float* freqs) {
  // element d of row ``row`` of x after MLX's rope_single; past DIMS a copy
  T a, b;
  segc_rotation_loads<T, TRAD, DIMS, DK>(x, row, d, a, b);
  return segc_rotation_apply<T, TRAD, DIMS, FREQS>(a, b, d, offset, freqs);
}

template <typename T, int VEC>
__device__ void segc_copy(const T* src, T* dst, int64_t e) {
  if (VEC > 1 && (reinterpret_cast<uintptr_t>(src) % 16) == 0 && (reinterpret_cast<uintptr_t>(dst) % 16) == 0) {
    *reinterpret_cast<uint4*>(dst + e) = *reinterpret_cast<const uint4*>(src + e);
  } else {
    for (int j = 0; j < VEC; ++j) dst[e + j] = src[e + j];
  }
}
"""

_BODY = r"""
    const int C = kb_shape[2];
    const int32_t pos = off[0];
    const int64_t nk = static_cast<int64_t>(H) * C * D / VEC;
    const int64_t nv = static_cast<int64_t>(H) * C * DV / VEC;
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < nk) {
        int64_t e = i * VEC;
        if ((e / D) % C == pos) {
            int h = static_cast<int>(e / (static_cast<int64_t>(C) * D));
            int d0 = static_cast<int>(e % D);
            for (int j = 0; j < VEC; ++j) {
                ko[e + j] = segc_rotated<T, TRAD, DIMS, D, FREQS>(k, h, d0 + j, pos, FREQ_PTR);
            }
        } else {
            segc_copy<T, VEC>(kb, ko, e);
        }
        return;
    }
    i -= nk;
    if (i < nv) {
        int64_t e = i * VEC;
        if ((e / DV) % C == pos) {
            int h = static_cast<int>(e / (static_cast<int64_t>(C) * DV));
            int d0 = static_cast<int>(e % DV);
            for (int j = 0; j < VEC; ++j) {
                vo[e + j] = v[static_cast<int64_t>(h) * DV + d0 + j];
            }
        } else {
            segc_copy<T, VEC>(vb, vo, e);
        }
        return;
    }
    i -= nv;
    QUERIES
"""

_QUERIES = r"""if (i < static_cast<int64_t>(HQ) * D) {
        qo[i] = segc_rotated<T, TRAD, DIMS, D, FREQS>(q, static_cast<int>(i / D), static_cast<int>(i % D), pos, FREQ_PTR);
    }"""


# in place (the live attention's write, ``live.py``): a thread per element of the new key
# and value rows, each written at the offset into the old buffers (made contiguous by the
# caller, so the caller's own memory), then a thread per element of the rotated queries
_ROWS_BODY = r"""
    const int C = kb_shape[2];
    const int32_t pos = off[0];
    const int64_t nk = static_cast<int64_t>(H) * D;
    const int64_t nv = static_cast<int64_t>(H) * DV;
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < nk) {
        int h = static_cast<int>(i / D);
        int d = static_cast<int>(i % D);
        const_cast<T*>(kb)[(static_cast<int64_t>(h) * C + pos) * D + d] =
            segc_rotated<T, TRAD, DIMS, D, FREQS>(k, h, d, pos, FREQ_PTR);
        return;
    }
    i -= nk;
    if (i < nv) {
        int h = static_cast<int>(i / DV);
        int d = static_cast<int>(i % DV);
        const_cast<T*>(vb)[(static_cast<int64_t>(h) * C + pos) * DV + d] = v[static_cast<int64_t>(h) * DV + d];
        return;
    }
    i -= nv;
    QUERIES
"""


def rope_bits(base: float | None, scale: float) -> tuple[int, int]:
    """The rotation's constants as the kernels ``#define`` them (float32 bits): log2 of
    the base, computed in float as MLX does (``std::log2`` of a float), and the scale."""
    return _bits(float(np.log2(np.float32(base))) if base is not None else 0.0), _bits(scale)


def _bits(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


@functools.cache
def _kernel(queries: bool, freqs: bool, log2_base_bits: int, scale_bits: int, rows: bool = False) -> Any:
    """The kernel for a rotation's constants (float32 bits: they are ``#define``d, so a
    kernel per rotation, named after them) with or without queries and frequencies;
    ``rows``: the rows written into the old buffers (queries only), nothing copied."""
    ins = ["kb", "k", "vb", "v", "off", *(["q"] if queries else []), *(["freqs"] if freqs else [])]
    outs = [*([] if rows else ["ko", "vo"]), *(["qo"] if queries else [])]
    body = _ROWS_BODY if rows else _BODY
    source = body.replace("QUERIES", _QUERIES if queries else "").replace("FREQ_PTR", "freqs" if freqs else "nullptr")
    header = (
        f"#define SEGC_LOG2_BASE (__int_as_float(0x{log2_base_bits:08x}))\n"
        f"#define SEGC_SCALE (__int_as_float(0x{scale_bits:08x}))\n" + _HEADER
    )
    form = f"{'_rows' if rows else ''}{'_q' if queries else ''}{'_f' if freqs else ''}"
    name = f"segc_kv_write{form}_{log2_base_bits:08x}_{scale_bits:08x}"
    return cuda_kernel(name=name, input_names=ins, output_names=outs, source=source, header=header)


def _template(kb: mx.array, vb: mx.array, hq: int, dims: int, trad: bool, freqs: bool) -> list[tuple[str, Any]]:
    """The write kernels' template arguments: dtype, heads, head sizes, query heads, rotation."""
    _, h, _, d = kb.shape
    return [
        ("T", kb.dtype),
        ("H", h),
        ("D", d),
        ("DV", vb.shape[3]),
        ("HQ", hq),
        ("DIMS", dims),
        ("TRAD", trad),
        ("FREQS", freqs),
    ]


def kv_write_rows(
    ins: Sequence[mx.array], dims: int, traditional: bool, base: float | None, scale: float, freqs: bool
) -> list[mx.array]:
    """:func:`kv_write` with the queries, in place: the offset's rows written into the old
    key and value buffers (made contiguous first, which shares a contiguous buffer), the
    queries rotated; ``[key buffer, value buffer, rotated queries]``, the buffers ordered
    after the kernel by ``mx.depends`` (MLX's kernels cannot alias an output with an
    input). Only for buffers nothing else reads (``KVWriteMatch.alone``)."""
    kb, k, vb, v, off, q = ins[:6]
    kb, vb = mx.contiguous(kb), mx.contiguous(vb)
    h, d, dv, hq = kb.shape[1], kb.shape[3], vb.shape[3], q.shape[1]
    threads = h * d + h * dv + hq * d
    kernel = _kernel(True, freqs, *rope_bits(base, scale), rows=True)
    (qo,) = kernel(
        inputs=[kb, k, vb, v, off.reshape(()) if off.ndim else off, q, *ins[6:7]],
        template=_template(kb, vb, hq, dims, traditional, freqs),
        grid=(-(-threads // THREADS) * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )
    ko, vo = mx.depends([kb, vb], [qo])
    return [ko, vo, qo]


def kv_write(
    ins: Sequence[mx.array], dims: int, traditional: bool, base: float | None, scale: float, queries: bool, freqs: bool
) -> list[mx.array]:
    """The key buffer, new keys, value buffer, new values and offset in ``ins`` (then the
    queries with ``queries``, the frequencies with ``freqs``) rotated with ``dims``,
    ``traditional``, ``base`` and ``scale`` and written, by one CUDA kernel."""
    kb, k, vb, v, off = ins[:5]
    q = ins[5] if queries else None
    _, h, c, d = kb.shape
    dv = vb.shape[3]
    vec = 16 // kb.dtype.size
    vec = vec if d % vec == 0 and dv % vec == 0 else 1
    hq = q.shape[1] if q is not None else 0
    threads = h * c * d // vec + h * c * dv // vec + hq * d
    tmpl = [*_template(kb, vb, hq, dims, traditional, freqs), ("VEC", vec)]
    shapes = [kb.shape, vb.shape, *([q.shape] if q is not None else [])]
    kernel = _kernel(queries, freqs, *rope_bits(base, scale))
    return list(
        kernel(
            inputs=[kb, k, vb, v, off.reshape(()) if off.ndim else off, *ins[5:]],
            template=tmpl,
            grid=(-(-threads // THREADS) * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=shapes,
            output_dtypes=[kb.dtype] * len(shapes),
        )
    )
