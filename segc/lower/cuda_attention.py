"""A fused masked decode attention for MLX's CUDA backend (``mx.fast.cuda_kernel``).

MLX 0.32's CUDA SDPA refuses array masks, so a dynamic KV cache's attention (whole buffer,
boolean mask) decomposes into about six kernels a layer, one of which copies the keys
once per query head of a group. This computes ``attention.AttentionMatch`` in two
kernels, split-K over the buffer as flash-decoding does:

1. ``partial``: a block per (batch, KV head, chunk of ``CHUNK`` = 32 keys) scores every
   query row of the group against the chunk's keys (a warp per key, reading it once for
   the whole group), and writes the chunk's max, sum of exponentials and weighted sum of
   values (a decode at 1,280 positions with 8 KV heads: 320 blocks);
2. ``combine``: a block per (batch, query head, row) merges the chunks.

By default the two are one kernel (``one``): the first kernel's blocks count themselves
done on a counter per (batch, KV head), and the last block of a group merges its chunks,
the same arithmetic as ``combine`` in the same order (the same bits), its loads issued
together (``cuda_merge.py``): one kernel a layer fewer for the host to launch. The
counter is the launch's own, zeroed at each call (``scratch.py``: kernels MLX may run at
once never share one); the last block sets it back to zero all the same.
``SEGC_ATTENTION_KERNELS=2`` (or ``kernels=2``) keeps the two kernels.

In a decode step the buffers come from HBM. The loops are unrolled so that their loads go
out together, a block reads its chunk's mask entries once at its start (not once a key
where the key's score is written: a wait for memory a key), and where
``cuda_stage.staged`` says so (``SEGC_ATTENTION_STAGE``) each block reads its chunk's
keys and values into shared memory first, 16 bytes a thread where aligned; the
arithmetic is the same in the same order either way (docs/lowering.md).

Everything is float32 until the one rounding to the output dtype. A row whose mask hides
every key gets the mean of the values (the fallback's softmax over equal scores). segc
imports it only where MLX has CUDA (importing needs no GPU; calling its kernels does).
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import mlx.core as mx

from ..errors import UsageError
from ..settings import env_choice
from . import scratch
from .cuda_kernel import cuda_kernel
from .cuda_merge import FAST_TAIL, LAST_BLOCK
from .cuda_stage import STAGE_DECLARE, STAGE_LOAD, stage_header, staged

CHUNK = 32  # keys per block of the first kernel by default (the layer kernel's always)
THREADS = 128  # four warps


def chunk() -> int:
    """Keys a block of the first kernel scores: ``SEGC_ATTENTION_CHUNK``, 32 (the default),
    64 or 128 (fewer partial results to merge; the bits depend on it)."""
    return int(env_choice("SEGC_ATTENTION_CHUNK", ("32", "64", "128"), str(CHUNK)))


_HEADER = "#define NEG_INF (-__int_as_float(0x7f800000))\n"
# what the kernels read: a query element, a key element, the values (plainly, here; the
# rotated write with the attention, ``cuda_kvattention.py``, rotates and writes them)
PLAIN = (
    "#define SEGC_Q(row, d) q[(size_t)(row) * D + (d)]\n"
    "#define SEGC_KEY(kr, krow, d) (kr)[d]\n"
    "#define SEGC_VAL(e, pos, d) v[e]\n"
    "#define SEGC_VALUES\n"
    "#define SEGC_VBUF v\n"
    "#define SEGC_ROW (-1)\n"  # no row read otherwise than plainly
)

_PARTIAL = (
    r"""
    const int C = k_shape[2];            // the buffer's capacity: no kernel per capacity
    const int S = (C + CHUNK - 1) / CHUNK;
    const int blk = blockIdx.x;
    const int s = blk % S;
    const int bh = blk / S;              // b * HKV + hk
    const int hk = bh % HKV;
    const int b = bh / HKV;
    const int t = threadIdx.x;
    const int warp = t / 32, lane = t % 32;
    constexpr int NW = NT / 32;
    static_assert(CHUNK % NW == 0, "a chunk's keys split evenly over the warps");
    static_assert(CHUNK % 32 == 0, "a chunk's keys split evenly over a warp's lanes");
    const int start = s * CHUNK;
    const int n = min(CHUNK, C - start);
    constexpr int R = REP * L;           // query rows of the group
    __shared__ float qs[R][D];
    __shared__ float sc[R][CHUNK];
    __shared__ bool mk[M][CHUNK];        // the chunk's mask, read once at the start
"""
    + STAGE_DECLARE
    + r"""#ifndef SEGC_PROLOGUE
#define SEGC_PROLOGUE
#endif
    SEGC_PROLOGUE
    // the chunk's mask first, its loads beside the queries' (read where each key's score
    // is written, a warp would wait for memory once a key)
    for (int i = t; i < M * CHUNK; i += NT) {
        const int mr = i / CHUNK, j = i % CHUNK;
        mk[mr][j] = j < n && mask[(size_t)mr * C + start + j];
    }
    for (int i = t; i < R * D; i += NT) {
        int r = i / D, d = i % D;
        int h = r / L, l = r % L;
        int hq = hk * REP + h;
        qs[r][d] = static_cast<float>(SEGC_Q((b * HQ + hq) * L + l, d)) * SCALE;
    }
    SEGC_VALUES
"""
    + STAGE_LOAD
    + r"""    __syncthreads();
    // a warp per key: its lanes read the key's row together (coalesced), one product per
    // query row of the group, summed across the warp; unrolled (the same arithmetic in
    // the same order)
    #pragma unroll
    for (int jj = 0; jj < CHUNK / NW; ++jj) {
        const int j = warp + jj * NW;
        float acc[R];
        #pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        if (j < n) {
            const size_t krow = (size_t)bh * C + start + j;
            const T* kr = k + krow * D;
            for (int d = lane; d < D; d += 32) {
                float kv = static_cast<float>(STAGE ? kvs[j * D + d] : SEGC_KEY(kr, krow, d));
                #pragma unroll
                for (int r = 0; r < R; ++r) acc[r] += qs[r][d] * kv;
            }
        }
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            float a = acc[r];
            for (int o = 16; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffff, a, o);
            if (lane == 0) {
                sc[r][j] = mk[(M == 1) ? 0 : r % L][j] ? a : NEG_INF;
            }
        }
    }
    __syncthreads();
    // a warp per row, a lane per key: the chunk's max and sum of exponentials; scores
    // become weights
    // (CHUNK / 32 keys a lane, taken in order before the warp's reduction)
    for (int r = warp; r < R; r += NW) {
        constexpr int KL = CHUNK / 32;
        float x[KL];
        #pragma unroll
        for (int u = 0; u < KL; ++u) x[u] = sc[r][lane + 32 * u];
        float m = x[0];
        #pragma unroll
        for (int u = 1; u < KL; ++u) m = fmaxf(m, x[u]);
        for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
        float sum = 0.f;
        #pragma unroll
        for (int u = 0; u < KL; ++u) {
            const float p = (m == NEG_INF) ? 0.f : expf(x[u] - m);
            sc[r][lane + 32 * u] = p;
            sum = u == 0 ? p : sum + p;
        }
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
        if (lane == 0) {
            int h = r / L, l = r % L;
            size_t row = ((size_t)(b * HQ + hk * REP + h) * L + l);
            pm[row * S + s] = m;
            pl[row * S + s] = sum;
        }
    }
    __syncthreads();
    for (int i = t; i < R * D; i += NT) {
        int r = i / D, d = i % D;
        float acc = 0.f;
        const T* vc = STAGE ? kvs + CHUNK * D + d : SEGC_VBUF + ((size_t)bh * C + start) * D + d;
        #pragma unroll 8
        for (int j = 0; j < n; ++j) acc += sc[r][j] * static_cast<float>(vc[(size_t)j * D]);
        int h = r / L, l = r % L;
        size_t row = ((size_t)(b * HQ + hk * REP + h) * L + l);
        po[(row * S + s) * D + d] = acc;
    }
"""
)

# a query row's chunks merged, for column ``d`` of row ``row`` of KV head group ``grp``:
# the second kernel's body and the one kernel's tail (the same text, so the same bits);
# ``SEGC_LD`` reads a partial result (plainly, or from L2 where other blocks wrote it)
_MERGE = r"""
        float mx_ = NEG_INF;
        #pragma unroll 8
        for (int c = 0; c < S; ++c) mx_ = fmaxf(mx_, SEGC_LD(pm + row * S + c));
        float res;
        if (mx_ == NEG_INF) {
            const T* vc = SEGC_VBUF + ((size_t)grp * C) * D + d;
            float acc = 0.f;
            for (int j = 0; j < C; ++j) acc += static_cast<float>(vc[(size_t)j * D]);
            res = acc / C;
        } else {
            float num = 0.f, den = 0.f;
            #pragma unroll 8
            for (int c = 0; c < S; ++c) {
                float w = expf(SEGC_LD(pm + row * S + c) - mx_);
                den += SEGC_LD(pl + row * S + c) * w;
                num += SEGC_LD(po + (row * S + c) * D + d) * w;
            }
            res = num / den;
        }
        out[row * D + d] = static_cast<T>(res);
"""

# the last block of a (batch, KV head) group merges its chunks, a thread per (row, d)
_ONE_TAIL = (
    LAST_BLOCK
    + r"""
    const int grp = bh;
    for (int i = t; i < R * D; i += NT) {
        const int r = i / D, d = i % D;
        const int h = r / L, l = r % L;
        const size_t row = ((size_t)(b * HQ + hk * REP + h) * L + l);
"""
    + _MERGE
    + "    }\n"
)

# a block per query row, a thread per column
_COMBINE = (
    r"""
    const int C = v_shape[2];
    const int S = (C + CHUNK - 1) / CHUNK;
    const size_t row = blockIdx.x;       // (b * HQ + hq) * L + l
    const int d = threadIdx.x;
    const int grp = (row / L / HQ) * HKV + ((row / L) % HQ) / REP;
"""
    + _MERGE
)


@functools.cache
def _kernels(scale_bits: int, stage: bool = False) -> tuple[Any, Any]:
    """The two kernels, the scale written into the first as its float32 bits (one kernel
    per model's scale; no scale array to make and read per call)."""
    partial = cuda_kernel(
        name=f"segc_attention_partial_{scale_bits:08x}",
        input_names=["q", "k", "v", "mask"],
        output_names=["po", "pm", "pl"],
        source=_PARTIAL,
        header=_HEADER + PLAIN + stage_header(stage) + f"#define SCALE (__int_as_float(0x{scale_bits:08x}))\n",
    )
    combine = cuda_kernel(
        name="segc_attention_combine",
        input_names=["po", "pm", "pl", "v"],
        output_names=["out"],
        source=_COMBINE,
        header=_HEADER + PLAIN + "#define SEGC_LD(p) (*(p))\n",
    )
    return partial, combine


# the one kernel's partial results in one output, ``ps``: weighted sums, maxima, sums of
# exponentials, for every query row (two outputs fewer a layer for MLX to allocate)
PACKED = r"""
    const size_t segc_parts = (size_t)q_shape[0] * HQ * L * ((k_shape[2] + CHUNK - 1) / CHUNK);
    float* po = ps;
    float* pm = ps + segc_parts * D;
    float* pl = pm + segc_parts;
"""


def packed_shape(rows: int, chunks: int, d: int) -> tuple[int]:
    """The shape of :data:`PACKED`'s output for ``rows`` query rows over ``chunks``."""
    return (rows * chunks * (d + 2),)


@functools.cache
def _one_kernel(scale_bits: int, stage: bool = False) -> Any:
    """``partial`` and ``combine`` as one kernel (module docstring)."""
    return cuda_kernel(
        name=f"segc_attention_one_{scale_bits:08x}",
        input_names=["q", "k", "v", "mask", "count"],
        output_names=["out", "ps"],
        source=PACKED + _PARTIAL + FAST_TAIL,
        header=_HEADER
        + PLAIN
        + stage_header(stage)
        + "#define SEGC_LD(p) __ldcg(p)\n"
        + f"#define SCALE (__int_as_float(0x{scale_bits:08x}))\n",
    )


def counter(groups: int) -> mx.array:
    """A zeroed counter for the one kernel, an entry a group, of this launch's own and
    fresh at each call (``scratch.py``: calls of one compiled function evaluated together
    may run at once)."""
    return scratch.zeros(groups)


def attention_kernels() -> int:
    """How many kernels the decode attention runs as: 1 (the default) or 2, from the
    environment's ``SEGC_ATTENTION_KERNELS`` (module docstring)."""
    return int(env_choice("SEGC_ATTENTION_KERNELS", ("1", "2"), "1"))


def _how_many(kernels: int | None) -> int:
    if kernels is None:
        return attention_kernels()
    if kernels not in (1, 2):
        raise UsageError(f"the decode attention runs as 1 or 2 kernels, not {kernels!r}")
    return kernels


def cuda_attention(
    q: mx.array, k: mx.array, v: mx.array, mask: mx.array, scale: float, *, kernels: int | None = None
) -> mx.array:
    """``softmax(scale * q @ k^T, where=mask) @ v`` for ``q`` of ``(B, Hq, L, D)``, ``k``
    and ``v`` of ``(B, Hkv, C, D)``, ``mask`` boolean with ``C`` last and one row or ``L``.
    ``kernels``: 1 (the default, or ``SEGC_ATTENTION_KERNELS``) or 2 (module docstring)."""
    b, hq, lq, d = q.shape
    hkv, cap = k.shape[1], k.shape[2]
    rep = hq // hkv
    m = mask.reshape(-1, cap)
    ch = chunk()
    nchunks = (cap + ch - 1) // ch
    scale_bits = struct.unpack("<I", struct.pack("<f", scale))[0]
    tmpl: list[tuple[str, Any]] = [
        ("T", q.dtype),
        ("D", d),
        ("L", lq),
        ("M", m.shape[0]),
        ("REP", rep),
        ("HQ", hq),
        ("HKV", hkv),
        ("CHUNK", ch),
        ("NT", THREADS),
    ]
    rows = b * hq * lq
    partials = [(rows * nchunks * d,), (rows * nchunks,), (rows * nchunks,)]
    if _how_many(kernels) == 1:
        count = counter(b * hkv)
        out, *_ = _one_kernel(scale_bits, staged())(
            inputs=[q, k, v, m, count],
            template=tmpl,
            grid=(b * hkv * nchunks * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(b, hq, lq, d), packed_shape(rows, nchunks, d)],
            output_dtypes=[q.dtype, mx.float32],
        )
        return out
    partial, combine = _kernels(scale_bits, staged())
    po, pm, pl = partial(
        inputs=[q, k, v, m],
        template=tmpl,
        grid=(b * hkv * nchunks * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=partials,
        output_dtypes=[mx.float32, mx.float32, mx.float32],
    )
    (out,) = combine(
        inputs=[po, pm, pl, v],
        template=tmpl,
        grid=(rows * d, 1, 1),
        threadgroup=(d, 1, 1),
        output_shapes=[(b, hq, lq, d)],
        output_dtypes=[q.dtype],
    )
    return out
