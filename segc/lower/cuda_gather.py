"""The kernels of the gathered patterns (``gather_match.py``) for MLX's CUDA backend:
a mixture-of-experts decode step's products, each row as MLX 0.32's ``gemv_gather``
computes it (``gemv_impl`` over the expert's weight, which ``cuda_products.py``
copies), then MLX's elementwise functors and its ``col_reduce_small`` sum over the
slots (in the dtype, from zero, in slot order), each rounded as eager's kernels round
it. One block of 8 warps per 8 output rows (``gglu``: of one slot); blocks along x
only. Only imported on a machine whose MLX has CUDA, or by the tests' emulator.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .cuda_kernel import cuda_kernel
from .cuda_products import _HEADER, ROWS_PER_BLOCK

_BODY = {
    "gglu": r"""
    const int per = (N + RPB - 1) / RPB;  // blocks a slot
    const int slot = blockIdx.x / per;
    const int row = (blockIdx.x % per) * RPB + threadIdx.y;
    if (row < N) {
        const int e = static_cast<int>(idx[slot]);
        float sg, su;
        segc_rows2<T>(wg, e * N + row, wu, e * N + row, x, K, sg, su);
        if (threadIdx.x == 0) {
            T g = static_cast<T>(sg);
            T u = static_cast<T>(su);
            T s = Sigmoid{}(g);
            T gs = GFIRST ? Multiply{}(g, s) : Multiply{}(s, g);
            out[slot * N + row] = GSFIRST ? Multiply{}(gs, u) : Multiply{}(u, gs);
        }
    }
""",
    "gmoe": r"""
    const int row = blockIdx.x * RPB + threadIdx.y;
    if (row < N) {
        T acc = static_cast<T>(0.f);  // MLX's col_reduce_small: from zero, in the dtype
        for (int j = 0; j < SLOTS; ++j) {
            const int e = static_cast<int>(idx[j]);
            // slot j's row of h: its alignment is h's, since K is a multiple of each
            // vector width MLX picks for it (segc_npt)
            float s = segc_row<T>(w, h + j * K, e * N + row, K);
            T y = static_cast<T>(s);
            // eager rounds the product (its multiply kernel) and then the sum (its
            // reduction): a product no add may contract into an fma
            T p = YFIRST ? segc_mul_rn(y, sc[j]) : segc_mul_rn(sc[j], y);
            if (SLOTS == 1) {
                acc = p;  // one slot: MLX's reduction copies it
            } else {
                acc = acc + p;
            }
        }
        if (threadIdx.x == 0) {
            out[row] = RFIRST ? Add{}(r[row], acc) : Add{}(acc, r[row]);
        }
    }
""",
}
# MLX's Multiply (``x * y``) as its own kernel computes it: rounded, whatever follows
_MUL_RN = r"""
__device__ inline float segc_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline __half segc_mul_rn(__half a, __half b) { return __hmul_rn(a, b); }
__device__ inline __nv_bfloat16 segc_mul_rn(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmul_rn(a, b); }
"""
_INPUTS = {"gglu": ["x", "wg", "wu", "idx"], "gmoe": ["h", "w", "sc", "r", "idx"]}


@functools.cache
def _kernel(kind: str) -> Any:
    return cuda_kernel(
        name=f"segc_gather_{kind}",
        input_names=_INPUTS[kind],
        output_names=["out"],
        source=_BODY[kind],
        header=_HEADER + _MUL_RN,
    )


def gathered(kind: str, ins: Sequence[mx.array], n: int, shape: tuple[int, ...], order: tuple[bool, ...]) -> mx.array:
    """``gglu`` over ``(x, wg[, wu], idx)`` or ``gmoe`` over ``(h, w, scores, r, idx)``
    (``products.ProductMatch``), ``n`` rows an expert's weight has."""
    x, w, idx = ins[0], ins[1], ins[-1]
    k, slots = x.shape[-1], idx.size
    blocks = (n + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK
    tmpl: list[tuple[str, Any]] = [("T", x.dtype), ("N", n), ("K", k), ("RPB", ROWS_PER_BLOCK)]
    if kind == "gglu":
        inputs = [x, w, ins[-2], idx]  # one weight for both: read twice
        tmpl += [("GFIRST", order[0]), ("GSFIRST", order[1])]
        blocks *= slots
    else:
        inputs = list(ins)
        tmpl += [("SLOTS", slots), ("YFIRST", order[0]), ("RFIRST", order[1])]
    (out,) = _kernel(kind)(
        inputs=inputs,
        template=tmpl,
        grid=(32 * blocks, ROWS_PER_BLOCK, 1),
        threadgroup=(32, ROWS_PER_BLOCK, 1),
        output_shapes=[shape],
        output_dtypes=[x.dtype],
    )
    return out
