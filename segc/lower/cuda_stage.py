"""Each block of the decode attention (``cuda_attention.py``) reading its chunk's keys and
values into shared memory before it uses them (``SEGC_ATTENTION_STAGE=1``).

A decode step's buffers come from HBM, the weights read since the last layer having
pushed them out of L2, and a block that waits for memory once a key spends about a
microsecond a wait (docs/lowering.md). Staged, each thread issues all its loads of the
chunk at once, 16 bytes each where aligned, then stores them: one wait a block. The row
at ``SEGC_ROW`` (the offset's, where the rotated write puts the new key and value; ``-1``
for the plain attention) is read again through ``SEGC_KEY`` and ``SEGC_VAL``; the
copying write stages the chunk as it copies it (``SEGC_COPY_STAGES``). The arithmetic
after is the same in the same order: the same bytes, staged or not.
"""

from __future__ import annotations

from ..settings import env_choice

# the first kernel's shared array for the chunk, where it fits beside the rest (40 KB in all)
STAGE_DECLARE = r"""    // the chunk's keys, then its values, in shared memory where they fit beside the rest
#ifdef SEGC_STAGE
    constexpr bool STAGE = 2 * CHUNK * D * sizeof(T) + (R * D + R * CHUNK) * sizeof(float) <= 40960;
    __shared__ T kvs[STAGE ? 2 * CHUNK * D : 1];
#else
    constexpr bool STAGE = false;        // every load straight from memory where it is used
    T* kvs = nullptr;
#endif
"""

# the chunk read into it (after SEGC_VALUES, before the keys' loop)
STAGE_LOAD = r"""#ifndef SEGC_COPY_STAGES
    if (STAGE) {
        // every load of the chunk issued at once, 16 bytes a thread where aligned: one wait
        // for memory, not one a key (the buffers come from HBM in a decode step, where each
        // wait is about a microsecond); the row at SEGC_ROW (the offset's, where the new key
        // and value go) read again through SEGC_KEY and SEGC_VAL
        constexpr int VEC = 16 / sizeof(T);
        const size_t base = ((size_t)bh * C + start) * D;
        const bool vec = D % VEC == 0 && ((reinterpret_cast<uintptr_t>(k + base) | reinterpret_cast<uintptr_t>(v + base)) % 16) == 0;
        if (vec) {
            const int per = n * D / VEC;
            constexpr int U = 4;         // a thread's loads of a round issued together, then its stores
            for (int i0 = t; i0 < 2 * per; i0 += U * NT) {
                uint4 x[U];
                #pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int i = i0 + u * NT;
                    if (i < 2 * per) x[u] = *reinterpret_cast<const uint4*>((i < per ? k : v) + base + (i < per ? i : i - per) * VEC);
                }
                #pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int i = i0 + u * NT;
                    if (i < 2 * per) *reinterpret_cast<uint4*>(kvs + (i < per ? 0 : CHUNK * D - per * VEC) + i * VEC) = x[u];
                }
            }
            __syncthreads();
            const int j = SEGC_ROW - start;
            if (j >= 0 && j < n) {
                const size_t krow = (size_t)bh * C + start + j;
                for (int d = t; d < D; d += NT) {
                    kvs[j * D + d] = SEGC_KEY(k + krow * D, krow, d);
                    kvs[CHUNK * D + j * D + d] = SEGC_VAL(krow * D + d, start + j, d);
                }
            }
        } else {
            #pragma unroll 4
            for (int i = t; i < n * D; i += NT) {
                const int j = i / D, d = i % D;
                const size_t krow = (size_t)bh * C + start + j;
                kvs[i] = SEGC_KEY(k + krow * D, krow, d);
                kvs[CHUNK * D + i] = SEGC_VAL(krow * D + d, start + j, d);
            }
        }
    }
#endif
"""


def staged(in_place: bool = False) -> bool:
    """Whether the kernels read each chunk's keys and values into shared memory first
    (``SEGC_STAGE``): the environment's ``SEGC_ATTENTION_STAGE``, ``auto`` (the default:
    for the write in place with its attention, ``in_place``, and nothing else), ``0`` or
    ``1``. Measured on an H100 (docs/performance-log.md, forty-third session): the
    write in place with its attention 34 µs a layer staged against 37, the decode about
    0.1 ms faster; the copying write's and the plain attention's not faster (mixed, and slower).
    The same bytes either way."""
    choice = env_choice("SEGC_ATTENTION_STAGE", ("auto", "0", "1"), "auto")
    return in_place if choice == "auto" else choice == "1"


def stage_header(stage: bool) -> str:
    """The define that turns the staging on, or nothing."""
    return "#define SEGC_STAGE\n" if stage else ""
