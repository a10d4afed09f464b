"""The GPU's clock inside the write with its attention (``cuda_kvattention.py``): with
``SEGC_KERNEL_STAMPS=1`` when a segment is lowered, each block's first thread writes
``%globaltimer`` at eleven points of the kernel, its SM, and its SM's cycles (``clock64``)
from the first point to the count's (with the nanoseconds between them: the SM's clock,
whether a slow call runs on a slower clock), into a buffer made when the
kernel is traced (:data:`BUFFERS`, in the order the kernels were made), after which the
first block writes its inputs' addresses (:data:`ADDRESSES`: which memory each call's
buffers are); one for every
call of the compiled segment, so ``benchmarks/kvattn_stamps.py`` runs one call at a time
and copies the stamps after each.

Why: inside a decode step the kernel takes 24 µs a layer in some calls and 45–55 in
others, whole calls at a time, where the attention alone holds at 21 (CUPTI's records,
docs/performance-log.md). The stamps (forty-fifth session, an H100) put all of it in
the first part, from the block's start to its queries read and rotated: 5–10 µs a
block in a fast call, 15–19 in a slow one; the chunk's loads, products, count and merge
hold. The points (:data:`POINTS`): the block's start; the offset read and the group's
first query element read (the first thread reads each once more, alone, for this); its
chunk's mask read (the first thread's share: whether a slow call waits on the mask or on
the queries and the offset, fifty-second session); its queries read and rotated (the
first thread's); its chunk's values written and, where
staged, its keys and values read (after the block's barrier); its keys' products; its softmax; its weighted values; past its count
(every block); the merge's end (the group's last block; a block that was last in an
earlier call keeps that call's stamp there). The kernel writes the stamps through its
input's pointer, as the in-place write does: a diagnostic, off by default, whose buffers
MLX believes unchanged.

The two reads alone (``SEGC_KERNEL_STAMPS=reads``) made the kernel ten times slower on
an H100 (forty-sixth session: 343-473 us a layer, the new parts 100-200 us each): they
measure the probe, a wait the kernel otherwise overlaps with its other loads. With
``SEGC_KERNEL_STAMPS=1`` the first thread reads nothing alone, the offset's and the query
element's stamps follow the start's at once, and the queries' part is the whole first
part, as the forty-fifth session measured it.
"""

from __future__ import annotations

import mlx.core as mx

from ..settings import env_choice
from .cuda_kernel import replace_once

BUFFERS: list[mx.array] = []
POINTS = ("start", "offset", "query", "masked", "queries", "staged", "keys", "softmax", "values", "counted", "merged")
SM = len(POINTS)  # the SM's word
CYCLES = SM + 1  # the word of the SM's cycles (clock64) from the start's stamp to the count's
WORDS = SM + 2  # a block's stamps: the points, its SM, its SM's cycles
# after every block's words, the kernel's inputs' addresses, written by the first block at
# its start (which memory each call's buffers are: benchmarks/kvattn_stamps.py --where)
ADDRESSES = ("q", "knew", "k", "vnew", "v", "off", "mask", "count")

# a stamp: the clock read after every memory access before it in the text is issued (the
# "memory" clobber: a store of a loaded value waits for the load); the offset, then the
# group's first query element, read alone by the first thread, each value used (the
# clock waits for it)
HEADER = r"""
#define SEGC_STAMP(i) \
    if (t == 0) { \
        unsigned long long segc_g; \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(segc_g) :: "memory"); \
        const_cast<uint64_t*>(stamp)[(size_t)blk * @WORDS@ + (i)] = segc_g; \
        if ((i) == 0) { \
            unsigned segc_sm; \
            asm volatile("mov.u32 %0, %%smid;" : "=r"(segc_sm)); \
            const_cast<uint64_t*>(stamp)[(size_t)blk * @WORDS@ + @SM@] = segc_sm; \
            if (blk == 0) { \
                uint64_t* segc_a = const_cast<uint64_t*>(stamp) + (size_t)gridDim.x * @WORDS@; \
                const void* segc_in[@N@] = {@ADDRESSES@}; \
                for (int segc_j = 0; segc_j < @N@; ++segc_j) segc_a[segc_j] = reinterpret_cast<uintptr_t>(segc_in[segc_j]); \
            } \
        } \
        if ((i) == @COUNTED@) const_cast<uint64_t*>(stamp)[(size_t)blk * @WORDS@ + @CYCLES@] = clock64() - segc_c0; \
    }
#define SEGC_READ_OFFSET \
    if (t == 0) { \
        const int32_t segc_o = *reinterpret_cast<const volatile int32_t*>(off); \
        asm volatile("" :: "r"(segc_o) : "memory"); \
    }
#define SEGC_READ_QUERY \
    if (t == 0) { \
        const unsigned segc_q = *reinterpret_cast<const volatile unsigned char*>(q + (size_t)(b * HQ + hk * REP) * L * D); \
        asm volatile("" :: "r"(segc_q) : "memory"); \
    }
"""
for _k, _v in {
    "ADDRESSES": ", ".join(ADDRESSES),
    "N": len(ADDRESSES),
    "WORDS": WORDS,
    "SM": SM,
    "CYCLES": CYCLES,
    "COUNTED": POINTS.index("counted"),
}.items():
    HEADER = HEADER.replace(f"@{_k}@", str(_v))

# (a text, how many of its lines the stamps follow, what goes there)
_AFTER = (
    (
        "    const int n = min(CHUNK, C - start);\n",
        1,
        "    const long long segc_c0 = clock64();\n    SEGC_STAMP(0);\n    SEGC_READ_OFFSET\n    SEGC_STAMP(1);\n    SEGC_READ_QUERY\n    SEGC_STAMP(2);\n",
    ),
    ("mask[(size_t)mr * C + start + j];\n    }\n", 2, "    SEGC_STAMP(3);\n"),
    (") * SCALE;\n    }\n", 2, "    SEGC_STAMP(4);\n"),
    ("    __syncthreads();\n    // a warp per key", 1, "    SEGC_STAMP(5);\n"),
    ("    __syncthreads();\n    // a warp per row, a lane per key", 1, "    SEGC_STAMP(6);\n"),
    (
        "    __syncthreads();\n    for (int i = t; i < R * D; i += NT) {\n        int r = i / D, d = i % D;\n        float acc",
        1,
        "    SEGC_STAMP(7);\n",
    ),
)


def wanted() -> bool:
    return _setting() != "0"


def reads_alone() -> bool:
    """Whether the first thread reads the offset and a query element alone, each before
    its stamp (``SEGC_KERNEL_STAMPS=reads``; a different kernel, so a different name)."""
    return _setting() == "reads"


def _setting() -> str:
    return env_choice("SEGC_KERNEL_STAMPS", ("0", "1", "reads"), "0")


def header(reads: bool) -> str:
    """:data:`HEADER`, its two reads made empty unless ``reads``."""
    if reads:
        return HEADER
    return HEADER.split("#define SEGC_READ_OFFSET")[0] + "#define SEGC_READ_OFFSET\n#define SEGC_READ_QUERY\n"


def stamped(source: str) -> str:
    """``source`` (the one attention kernel's text) with the stamps at :data:`POINTS`; an
    error where the text no longer has one of the places."""
    for anchor, lines, text in _AFTER:
        head = "".join(anchor.splitlines(keepends=True)[:lines])
        source = replace_once(source, anchor, head + text + anchor[len(head) :])
    for anchor, text in (
        ("    // this block's partial results, seen", "    SEGC_STAMP(8);\n"),
        ("    if (!last) return;\n", "    SEGC_STAMP(9);\n"),
    ):
        source = replace_once(source, anchor, text + anchor)
    return source + "    __syncthreads();\n    SEGC_STAMP(10);\n"


def buffer(blocks: int) -> mx.array:
    """A zeroed buffer for a kernel of ``blocks`` blocks and its inputs' addresses,
    evaluated now (a constant of the segment being traced) and kept in :data:`BUFFERS`."""
    b = mx.zeros((blocks * WORDS + len(ADDRESSES),), dtype=mx.uint64)
    mx.eval(b)
    BUFFERS.append(b)
    return b
