"""A decode layer as one kernel (``layer_chain.py``): the rotated KV write with its
attention as a first stage before the chain's (``cuda_chain.py``), for MLX's CUDA backend.

0. the attention: a ticket per (KV head, chunk of 32 positions) as a block of
   ``cuda_kvattention.py``'s kernel (rotating the queries and the new key, writing the
   new key and value buffers as it reads them); the last ticket of a KV head's group
   merges its chunks into the attention's output row, kept in the chain's state;
1. ``h = r + att @ Wo.T`` over that row (copied into shared memory once a block);
2. to 4. the chain's stages (the MLP, and the next normed product where taken).

The attention's code is ``cuda_attention``'s, whose every sum runs in an order that does
not depend on the block's threads (a warp per key, a lane per column of a key, a thread
per output element over the keys or chunks in turn), so its 256 threads here (the
chain's blocks) give the bytes its own kernel's 128 do; each product row is the product
kernels' code, as in the chain. So the bytes of the two kernels it replaces. The number
of attention tickets follows the buffer's capacity (``k_shape``), as the attention
kernel's grid does: one kernel for every capacity. Only imported on a machine whose MLX
has CUDA (importing needs no GPU).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .. import dtypes
from . import scratch
from .cuda_attention import _HEADER as _NEG_INF
from .cuda_attention import _MERGE, _ONE_TAIL, _PARTIAL, CHUNK, counter
from .cuda_chain import _MLP, _NEXT, _ROWS, _bits, grid, launch, occupancy
from .cuda_kernel import cuda_kernel, launch_bounds, replace_once
from .cuda_kvattention import _READS
from .cuda_kvwrite import _HEADER as _ROTATE
from .cuda_kvwrite import rope_bits
from .cuda_products import _HEADER, ROWS_PER_BLOCK
from .cuda_tickets import CHAIN_HEADER, COUNTERS, tickets
from .product_chain import aligned
from .product_match import ProductMatch, layer_parts

# the attention as a stage: a ticket is a block of its kernel, the block's threads
# numbered across the chain's two-dimensional block, the merge kept, not returned from
_ATTENTION = (
    replace_once(
        replace_once(_PARTIAL, "const int blk = blockIdx.x;", "const int blk = tk;"),
        "const int t = threadIdx.x;",
        "const int t = threadIdx.y * 32 + threadIdx.x;",
    )
    + replace_once(
        replace_once(_ONE_TAIL, "    if (!last) return;\n", "    if (last) {\n"),
        _MERGE,
        replace_once(_MERGE, "out[row * D + d]", "att[row * D + d]"),
    )
    + "    }\n"
)
_TICKETS = "HKV * ((k_shape[2] + CHUNK - 1) / CHUNK)"
# the output product over the attention's row (another block's: through L2, once a block)
_OPROJ = (
    _MLP[0][0],
    r"""
                segc_fetch<T>(xs, att, KA);""",
    replace_once(_MLP[0][2], "segc_row<T>(wo, x, row, KA)", "segc_row<T>(wo, xs, row, KA)"),
)


@functools.cache
def _kernel(
    freqs: bool, rope: tuple[int, int], scale_bits: int, eps_bits: int, next_bits: int | None, blocks: int = 0
) -> Any:
    """The kernel for a rotation's and an attention's constants, the norms' eps (float32
    bits: ``#define``d, named after them); with ``next_bits``, of the chain's four parts;
    compiled to fit ``blocks`` blocks an SM (``cuda_chain.occupancy``)."""
    four = next_bits is not None
    header = (
        _HEADER
        + CHAIN_HEADER
        + _NEG_INF
        + f"#define SEGC_LOG2_BASE (__int_as_float(0x{rope[0]:08x}))\n"
        + f"#define SEGC_SCALE (__int_as_float(0x{rope[1]:08x}))\n"
        + f"#define SCALE (__int_as_float(0x{scale_bits:08x}))\n"
        + f"#define FREQ_PTR {'freqs' if freqs else 'nullptr'}\n"
        + f"#define EPS (__int_as_float(0x{eps_bits:08x}))\n"
        + (f"#define EPS2 (__int_as_float(0x{next_bits:08x}))\n" if four else "")
        + _ROTATE
        + _READS
        + launch_bounds(32 * ROWS_PER_BLOCK, blocks)
    )
    ins = ["q", "knew", "k", "vnew", "v", "off", "mask", "count", *(["freqs"] if freqs else [])]
    ins += ["wo", "r", "wg", "wu", "nw", "wd", *(["wq", "nw2"] if four else []), "ctlin"]
    stages = [(_TICKETS, "", _ATTENTION), _OPROJ, *_MLP[1:], *([_NEXT] if four else [])]
    name = f"segc_layer{'4' if four else ''}{'_f' if freqs else ''}_{rope[0]:08x}_{rope[1]:08x}_{scale_bits:08x}"
    return cuda_kernel(
        name=f"{name}_{eps_bits:08x}" + (f"_{next_bits:08x}" if four else ""),
        input_names=ins,
        output_names=["ko", "vo", "out", *(["yq"] if four else []), "po", "pm", "pl"],
        source=_ROWS + "    T* att = a + AO;  // the attention's row, after `a`\n" + tickets(stages),
        header=header,
    )


def state(hidden: int, inner: int, row: int, itemsize: int) -> mx.array:
    """The chain's state (``cuda_chain.state``) with room for the attention's row of
    ``row`` values after ``a``."""
    words = -(-((aligned(hidden, itemsize) + aligned(inner, itemsize) + row) * itemsize) // 4)
    return scratch.zeros(COUNTERS + words)


def layer(m: ProductMatch, ins: Sequence[mx.array], blocks: int | None = None) -> list[mx.array]:
    """The layer ``m`` (``layer_chain.py``: its ``pair``, a rotated write and the
    attention reading it, then its chain) over ``ins`` (the write's inputs, the
    attention's mask, the chain's inputs after its row) by one kernel: ``[new key
    buffer, new value buffer, the chain's outputs]`` (``m.outs``). ``blocks``: the grid
    (default: ``SEGC_CHAIN_BLOCKS``, else a block per ticket of the largest stage; any
    number is correct)."""
    w, att, chain, write, (mask, *rest) = layer_parts(m, ins)
    kb, k, vb, v, off, q, *freqs = write
    _, hkv, cap, d = kb.shape
    hq = q.shape[1]
    if kb.shape[0] != 1 or vb.shape != kb.shape or q.shape != (1, hq, 1, d):
        raise ValueError(f"one batch row, one query, equal head sizes only: keys {kb.shape}, queries {q.shape}")
    tmpl, chain_ins, most = launch(chain, [q.reshape(1, hq * d), *rest])
    size = dtypes.itemsize(dtypes.short(q.dtype))
    hidden, inner = m.parts[0].n, m.parts[1].n
    masks = mask.reshape(-1, cap)
    tmpl = [
        *[(n, x) for n, x in tmpl if n != "SH"],
        ("SH", max(dict(tmpl)["SH"], hq * d)),  # the attention's row too
        ("AO", aligned(inner, size)),
        ("D", d),
        ("L", 1),
        ("M", masks.shape[0]),
        ("REP", hq // hkv),
        ("HQ", hq),
        ("HKV", hkv),
        ("CHUNK", CHUNK),
        ("NT", 32 * ROWS_PER_BLOCK),
        ("DIMS", w.dims),
        ("TRAD", w.traditional),
        ("FREQS", w.freqs),
    ]
    nchunks = -(-cap // CHUNK)
    blocks = grid(blocks, max(most, hkv * nchunks))
    d4 = m.parts[3] if len(m.parts) == 4 else None
    b = m.parts[1]
    assert b.eps is not None and (d4 is None or d4.eps is not None)  # (the finder took only such norms)
    kernel = _kernel(
        w.freqs,
        rope_bits(w.base, w.scale),
        _bits(att.scale),
        _bits(b.eps),
        None if d4 is None or d4.eps is None else _bits(d4.eps),
        occupancy(),
    )
    weights = chain_ins[1:-1]  # Wo, r, Wg, Wu, the norm's weight, Wd (and Wq, the next norm's)
    off = off.reshape(()) if off.ndim else off
    made = [kb.shape, vb.shape, m.shape, *([d4.shape] if d4 else [])]  # hq rows: one query a head
    partials = [(hq * nchunks * d,), (hq * nchunks,), (hq * nchunks,)]
    outs = kernel(
        inputs=[q, k, kb, v, vb, off, masks, counter(hkv), *freqs, *weights, state(hidden, inner, hq * d, size)],
        template=tmpl,
        grid=(32 * blocks, ROWS_PER_BLOCK, 1),
        threadgroup=(32, ROWS_PER_BLOCK, 1),
        output_shapes=[*made, *partials],
        output_dtypes=[*[q.dtype] * len(made), *[mx.float32] * 3],
    )
    return list(outs[: len(made)])
