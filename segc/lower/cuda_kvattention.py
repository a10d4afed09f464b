"""A decode layer's rotated KV write and its attention as one ``mx.fast.cuda_kernel``
(``kvwrite.KVWriteMatch`` with its queries, then ``attention.AttentionMatch`` over what
it wrote; the default on CUDA, ``SEGC_FUSED_KV_ATTENTION=0`` keeps the two kernels).

The attention kernel (``cuda_attention.py``, one kernel) reads each key once, a block per
KV head and chunk of 32 positions; here the same block also writes that chunk of the new
key and value buffers: it copies the chunk's keys and values, 16 bytes a thread where
aligned (the row at the offset the new key rotated, as ``cuda_kvwrite.py`` rotates it,
and the new value), then reads the keys from the old buffer (the row at the offset
rotated again: the same bytes) and weighs the values it wrote. The queries are rotated
as they are loaded. The attention's text is ``cuda_attention``'s with these reads in
place of its plain ones (its ``SEGC_*`` macros), and the rotations are
``cuda_kvwrite``'s function: the same bytes as the rotated write's kernel followed by
the attention's, in one kernel instead of two (``tests/test_cuda_emulated.py`` checks
the logic on the CPU). Only for one batch row, and head sizes equal for keys and values.
With ``SEGC_FUSED_QUERY_ROPE=mlx`` the queries come rotated by MLX's ``rope`` instead
(an experiment, :func:`queries_apart`), and with ``SEGC_KERNEL_STAMPS=1`` the kernel
stamps the GPU's clock (``cuda_stamps.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..settings import env_choice
from . import cuda_stamps
from .cuda_attention import (
    _HEADER,
    _PARTIAL,
    PACKED,
    THREADS,
    chunk,
    counter,
    packed_shape,
)
from .cuda_kernel import cuda_kernel
from .cuda_kvwrite import _HEADER as _ROTATE
from .cuda_kvwrite import _bits, rope_bits
from .cuda_merge import FAST_TAIL
from .cuda_stage import stage_header, staged

# what both forms share: the offset read once and the reads through it
_MACROS = r"""#define SEGC_PROLOGUE const int32_t segc_pos = off[0];  // the offset read once, into a register
#define SEGC_Q(row, d) segc_rotated<T, TRAD, DIMS, D, FREQS>(q, (row), (d), segc_pos, FREQ_PTR)
#define SEGC_KEY(kr, krow, d) segc_key<T, TRAD, DIMS, D, FREQS>((kr), knew, (krow), (d), bh, C, segc_pos, FREQ_PTR)
#define SEGC_VAL(e, p, d) ((p) == segc_pos ? vnew[(size_t)bh * D + (d)] : v[e])
#define SEGC_ROW segc_pos
"""
_LD = "#define SEGC_LD(p) __ldcg(p)\n"

_READS = (
    r"""
template <typename T, bool TRAD, int DIMS, int DK, bool FREQS>
__device__ T segc_key(const T* kr, const T* knew, size_t krow, int d, int bh, int C, int32_t pos, const float* freqs) {
  // a key's element: the old buffer's, or at the offset the new key rotated
  return (krow - static_cast<size_t>(bh) * C) == static_cast<size_t>(pos)
      ? segc_rotated<T, TRAD, DIMS, DK, FREQS>(knew, bh, d, pos, freqs) : kr[d];
}
template <typename T, bool TRAD, int DIMS, int DK, bool FREQS, int NT>
__device__ void segc_copy_chunk(const T* k, T* ko, const T* v, T* vo, const T* knew, const T* vnew, int bh, int C,
                                int start, int n, int t, int32_t pos, const float* freqs, T* ks, T* vs) {
  // the chunk's rows of both buffers copied to the new ones, 16 bytes a thread where
  // aligned; the row at the offset is the new key rotated and the new value; where ``ks``
  // and ``vs`` are given (SEGC_STAGE), the chunk's keys and values into them as well
  constexpr int VEC = 16 / sizeof(T);
  const size_t base = (static_cast<size_t>(bh) * C + start) * DK;
  const int total = n * DK;
  const int prow = pos - start;
  const bool vec = DK % VEC == 0 && ((reinterpret_cast<uintptr_t>(k + base) | reinterpret_cast<uintptr_t>(ko + base) |
      reinterpret_cast<uintptr_t>(v + base) | reinterpret_cast<uintptr_t>(vo + base)) % 16) == 0;
  const int w = vec ? VEC : 1;
  const int per = total / w;
  constexpr int U = 4;  // a thread's loads of a round issued together, then its stores
  for (int i0 = t; i0 < 2 * per; i0 += U * NT) {
    uint4 x[U];
    T y[U];
    #pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * NT;
      const bool key = i < per;
      const int e = (key ? i : i - per) * w;
      const T* src = (key ? k : v) + base;
      if (i < 2 * per && e / DK != prow) {
        if (vec) {
          x[u] = *reinterpret_cast<const uint4*>(src + e);
        } else {
          y[u] = src[e];
        }
      }
    }
    #pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * NT;
      if (i >= 2 * per) continue;
      const bool key = i < per;
      const int e = (key ? i : i - per) * w;
      T* dst = (key ? ko : vo) + base;
      T* st = key ? ks : vs;
      if (e / DK == prow) {
        for (int j = 0; j < w; ++j) {
          const int d = e % DK + j;
          const T z = key ? segc_rotated<T, TRAD, DIMS, DK, FREQS>(knew, bh, d, pos, freqs) : vnew[static_cast<size_t>(bh) * DK + d];
          dst[e + j] = z;
          if (st != nullptr) st[e + j] = z;
        }
      } else if (vec) {
        *reinterpret_cast<uint4*>(dst + e) = x[u];
        if (st != nullptr) *reinterpret_cast<uint4*>(st + e) = x[u];
      } else {
        dst[e] = y[u];
        if (st != nullptr) st[e] = y[u];
      }
    }
  }
}
"""
    + _MACROS
    + r"""#define SEGC_VALUES \
    segc_copy_chunk<T, TRAD, DIMS, D, FREQS, NT>(k, ko, v, vo, knew, vnew, bh, C, start, n, t, segc_pos, FREQ_PTR, \
                                                 STAGE ? kvs : nullptr, STAGE ? kvs + CHUNK * D : nullptr);
#define SEGC_COPY_STAGES  // the copy stages the chunk: no second read
#define SEGC_VBUF vo
"""
    + _LD
)

# in place (``SEGC_KV_IN_PLACE=1``): the row at the offset written into the old buffers,
# nothing copied; the block whose chunk holds the offset writes it before it reads it
_IN_PLACE = (
    r"""
template <typename T, bool TRAD, int DIMS, int DK, bool FREQS>
__device__ T segc_key(const T* kr, const T* knew, size_t krow, int d, int bh, int C, int32_t pos, const float* freqs) {
  // a key's element: the buffer's, or at the offset the new key rotated, written into the buffer
  if ((krow - static_cast<size_t>(bh) * C) != static_cast<size_t>(pos)) {
    return kr[d];
  }
  T x = segc_rotated<T, TRAD, DIMS, DK, FREQS>(knew, bh, d, pos, freqs);
  const_cast<T*>(kr)[d] = x;
  return x;
}
"""
    + _MACROS
    + r"""#define SEGC_VALUES \
    if (segc_pos >= start && segc_pos < start + n) { \
        for (int dd = t; dd < D; dd += NT) { \
            const_cast<T*>(v)[((size_t)bh * C + segc_pos) * D + dd] = vnew[(size_t)bh * D + dd]; \
        } \
    }
#define SEGC_VBUF v
"""
    + _LD
)


# SEGC_FUSED_QUERY_ROPE=mlx: the queries come rotated (by MLX's kernel), read plainly
_ROTATED_QUERIES = "#undef SEGC_Q\n#define SEGC_Q(row, d) q[(size_t)(row) * D + (d)]\n"


def queries_apart() -> bool:
    """``SEGC_FUSED_QUERY_ROPE``: ``kernel`` (the default) rotates the queries as the
    kernel loads them; ``mlx`` rotates them first with MLX's kernel, one more a layer (an
    experiment: the slow calls' time is in the kernel's first part, which the queries'
    rotation is; docs/performance-log.md). The same bytes either way."""
    return env_choice("SEGC_FUSED_QUERY_ROPE", ("kernel", "mlx"), "kernel") == "mlx"


@dataclass(frozen=True)
class Form:
    """What a lowering asks of the kernel beyond its rotation's and scale's constants,
    read once from the settings (:meth:`from_settings`): the write in place or copying,
    the chunk staged in shared memory, the GPU's clock stamped (and the two reads made
    alone), the queries rotated by MLX first. A key of the kernels' cache; each choice
    off the default adds to the kernel's name."""

    in_place: bool = False
    stage: bool = False
    stamps: bool = False
    reads: bool = False
    rotated: bool = False

    @classmethod
    def from_settings(cls, in_place: bool) -> Form:
        stamps = cuda_stamps.wanted()
        return cls(
            in_place=in_place,
            stage=staged(in_place),
            stamps=stamps,
            reads=stamps and cuda_stamps.reads_alone(),
            rotated=queries_apart(),
        )


@functools.cache
def _kernel(freqs: bool, log2_base_bits: int, rope_scale_bits: int, scale_bits: int, form: Form = Form()) -> Any:
    ins = ["q", "knew", "k", "vnew", "v", "off", "mask", "count", *(["freqs"] if freqs else [])]
    ins += ["stamp"] if form.stamps else []
    header = (
        _HEADER
        + stage_header(form.stage)
        + f"#define SEGC_LOG2_BASE (__int_as_float(0x{log2_base_bits:08x}))\n"
        + f"#define SEGC_SCALE (__int_as_float(0x{rope_scale_bits:08x}))\n"
        + f"#define SCALE (__int_as_float(0x{scale_bits:08x}))\n"
        + f"#define FREQ_PTR {'freqs' if freqs else 'nullptr'}\n"
        + _ROTATE
        + (_IN_PLACE if form.in_place else _READS)
        + (_ROTATED_QUERIES if form.rotated else "")
        + (cuda_stamps.header(form.reads) if form.stamps else "")
    )
    name = f"segc_kv_attention{'_f' if freqs else ''}{'_i' if form.in_place else ''}"
    name += f"_{log2_base_bits:08x}_{rope_scale_bits:08x}_{scale_bits:08x}{'_q' if form.rotated else ''}"
    name += ("_str" if form.reads else "_st") if form.stamps else ""
    outs = ["out", *([] if form.in_place else ["ko", "vo"]), "ps"]
    source = PACKED + _PARTIAL + FAST_TAIL
    return cuda_kernel(name, ins, outs, cuda_stamps.stamped(source) if form.stamps else source, header)


def kv_attention(
    ins: Sequence[mx.array],
    mask: mx.array,
    dims: int,
    traditional: bool,
    base: float | None,
    rope_scale: float,
    freqs: bool,
    scale: float,
    in_place: bool = False,
) -> list[mx.array]:
    """The key buffer, new keys, value buffer, new values, offset and queries in ``ins``
    (``KVWriteMatch.ins`` with its queries; then the frequencies with ``freqs``), rotated
    with ``dims``, ``traditional``, ``base`` and ``rope_scale`` and written, and the
    attention of the rotated queries over the written buffers with ``mask`` and
    ``scale``: ``[new key buffer, new value buffer, attention output]``. With
    ``in_place`` the kernel writes the offset's row into the old buffers (made contiguous
    first, which shares a contiguous buffer), and the new buffers are those, ordered
    after the kernel by ``mx.depends``: only for buffers nothing else reads
    (``KVWriteMatch.alone``; docs/lowering.md)."""
    kb, k, vb, v, off, q = ins[:6]
    off = off.reshape(()) if off.ndim else off
    b, hkv, cap, d = kb.shape
    hq, lq = q.shape[1], q.shape[2]
    if b != 1 or vb.shape != kb.shape or q.shape[3] != d:
        raise ValueError(
            f"one batch row and equal head sizes only: keys {kb.shape}, values {vb.shape}, queries {q.shape}"
        )
    m = mask.reshape(-1, cap)
    ch = chunk()
    nchunks = (cap + ch - 1) // ch
    tmpl: list[tuple[str, Any]] = [
        ("T", q.dtype),
        ("D", d),
        ("L", lq),
        ("M", m.shape[0]),
        ("REP", hq // hkv),
        ("HQ", hq),
        ("HKV", hkv),
        ("CHUNK", ch),
        ("NT", THREADS),
        ("DIMS", dims),
        ("TRAD", traditional),
        ("FREQS", freqs),
    ]
    rows = hq * lq
    form = Form.from_settings(in_place)
    kernel = _kernel(freqs, *rope_bits(base, rope_scale), _bits(scale), form)
    if form.rotated:  # MLX's rope_single, whose arithmetic the kernel's rotation is (cuda_kvwrite.py)
        f = ins[6] if freqs else None
        q = mx.fast.rope(q, dims, traditional=traditional, base=base, scale=rope_scale, offset=off, freqs=f)
    if in_place:
        kb, vb = mx.contiguous(kb), mx.contiguous(vb)
    bufs = [] if in_place else [kb.shape, vb.shape]
    outs = kernel(
        inputs=[
            *[q, k, kb, v, vb, off, m, counter(hkv), *ins[6:7]],
            *([cuda_stamps.buffer(hkv * nchunks)] if form.stamps else []),
        ],
        template=tmpl,
        grid=(hkv * nchunks * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[q.shape, *bufs, packed_shape(rows, nchunks, d)],
        output_dtypes=[q.dtype, *[kb.dtype] * len(bufs), mx.float32],
    )
    out = outs[0]
    ko, vo = mx.depends([kb, vb], [out]) if in_place else outs[1:3]
    return [ko, vo, out]
