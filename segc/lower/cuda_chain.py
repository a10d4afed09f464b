"""The kernel of ``product_chain.py`` (a layer's MLP from the attention's output product
on) for MLX's CUDA backend (``mx.fast.cuda_kernel``): three or four stages in one launch.

1. ``h = r + o @ Wo.T``, rows of 8 a ticket, as the ``add`` kernel computes them;
2. ``a = silu(norm(h) @ Wg.T) * (norm(h) @ Wu.T)``, as the normed ``glu`` kernel does
   (each block normalises ``h`` once into shared memory);
3. ``out = h + a @ Wd.T``, as the ``add`` kernel does (``a`` copied into shared memory
   once a block).

With a fourth part (``product_chain.py``, "The next product too"):

4. ``yq = norm(out) @ Wq.T``, as the normed ``gemv`` kernel computes it (each block
   normalises ``out`` once, as in stage 2).

The code of each row is ``cuda_products.py``'s (the same bits). A stage reads what the
one before wrote, so the blocks take **tickets** in order (``cuda_tickets.py``: no
deadlock, whatever the grid). The grid is a block per ticket of the largest stage, as
many as the separate kernels' largest grid (``SEGC_CHAIN_BLOCKS`` sets another). The
counters, and after them the stages' rows ``h`` and ``a``, are a uint32
array of the launch's own, zeroed at each call (:func:`state`, ``scratch.py``), as the
attention kernel's counter is: two launches never share one, and the rows are no
outputs for MLX to allocate. Only imported on a machine whose MLX has
CUDA (importing needs no GPU).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..settings import env_choice, env_count
from . import scratch
from .cuda_kernel import cuda_kernel, launch_bounds
from .cuda_products import _HEADER, ROWS_PER_BLOCK
from .cuda_tickets import CHAIN_HEADER, COUNTERS, tickets
from .product_chain import aligned, shared_elems
from .product_match import ProductMatch, norm_blocks

_ROWS = f"""
    T* h = reinterpret_cast<T*>(const_cast<uint32_t*>(ctlin) + {COUNTERS});  // the rows, after the counters
    T* a = h + XO;
    __shared__ __align__(16) T buf[SH];
    T* xs = buf;         // the normalised row (stage 2), or the activation (stage 3)
    T* hrow = buf + XO;  // h (stage 2)
"""

_ROWS_OF = "(H + RPB - 1) / RPB"
# the MLP's stages: (tickets, once, body), as ``tickets`` takes them
_MLP = [
    (
        _ROWS_OF,
        "",
        r"""
            if (row < H) {
                float s = segc_row<T>(wo, x, row, KA);
                if (threadIdx.x == 0) {
                    T y = static_cast<T>(s);
                    h[row] = PFA ? Add{}(y, r[row]) : Add{}(r[row], y);
                }
            }""",
    ),
    (
        "(NI + RPB - 1) / RPB",
        r"""
                segc_fetch<T>(hrow, h, H);
                segc_rms<T, NBS, NCH, NR>(hrow, nw, xs, H, EPS);""",
        r"""
            if (row < NI) {
                float sg, su;
                segc_rows2<T>(wg, OG + row, wu, OU + row, xs, H, sg, su);
                if (threadIdx.x == 0) {
                    a[row] = segc_glu<T, GFIRST, GSFIRST>(sg, su);
                }
            }""",
    ),
    (
        _ROWS_OF,
        r"""
                segc_fetch<T>(xs, a, NI);""",
        r"""
            if (row < H) {
                float s = segc_row<T>(wd, xs, row, NI);
                if (threadIdx.x == 0) {
                    T y = static_cast<T>(s);
                    T hr = segc_l2<T>(h + row);
                    out[row] = PFC ? Add{}(y, hr) : Add{}(hr, y);
                }
            }""",
    ),
]
# the fourth: the normed product of what the third wrote (the next layer's q, k and v,
# or the head), as the normed ``gemv`` kernel computes its rows
_NEXT = (
    "(NQ + RPB - 1) / RPB",
    r"""
                segc_fetch<T>(hrow, out, H);
                segc_rms<T, NBS, NCH, NR>(hrow, nw2, xs, H, EPS2);""",
    r"""
            if (row < NQ) {
                float s = segc_row<T>(wq, xs, row, H);
                if (threadIdx.x == 0) {
                    yq[row] = static_cast<T>(s);
                }
            }""",
)

INPUTS = ["x", "wo", "r", "wg", "wu", "nw", "wd"]


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def occupancy() -> int:
    """Blocks an SM the chain's and the layer's kernels are compiled to fit (NVRTC's
    launch bounds: ``cuda_kernel.launch_bounds``): the environment's
    ``SEGC_CHAIN_OCCUPANCY``, 1 to 8, or 0 (the default: the compiler's choice)."""
    return int(env_choice("SEGC_CHAIN_OCCUPANCY", [str(b) for b in range(9)], "0"))


@functools.cache
def _kernel(eps_bits: int, next_bits: int | None = None, blocks: int = 0) -> Any:
    """The chain's kernel; with ``next_bits`` (the fourth part's eps), of four stages;
    compiled to fit ``blocks`` blocks an SM (:func:`occupancy`)."""
    four = next_bits is not None
    header = _HEADER + CHAIN_HEADER + f"#define EPS (__int_as_float(0x{eps_bits:08x}))\n"
    if four:
        header += f"#define EPS2 (__int_as_float(0x{next_bits:08x}))\n"
    header += launch_bounds(32 * ROWS_PER_BLOCK, blocks)
    return cuda_kernel(
        name=f"segc_chain{'4' if four else ''}_{eps_bits:08x}" + (f"_{next_bits:08x}" if four else ""),
        input_names=[*INPUTS, *(["wq", "nw2"] if four else []), "ctlin"],
        output_names=["out", *(["yq"] if four else [])],
        source=_ROWS + tickets([*_MLP, *([_NEXT] if four else [])]),
        header=header,
    )


def state(hidden: int, inner: int, itemsize: int) -> mx.array:
    """A zeroed state for the kernel, of the launch's own at each call
    (``scratch.py``): its counters, then room for the stages' rows ``h`` and ``a``
    (``a`` 16-byte aligned), kept for the call instead of two outputs MLX would
    allocate."""
    words = -(-((aligned(hidden, itemsize) + inner) * itemsize) // 4)
    return scratch.zeros(COUNTERS + words)


def launch(m: ProductMatch, ins: Sequence[mx.array]) -> tuple[list[tuple[str, Any]], list[mx.array], int]:
    """The template, the inputs and the number of blocks of the chain ``m`` over ``ins``
    (``product_chain.chain_products``: o, Wo, r, the gate's and up's weights (one when
    concatenated), the norm's weight, Wd; with a fourth part its weight and its norm's)."""
    a, b, c = m.parts[:3]
    nb = len(b.ins) - 2  # the gate's and up's weights, or one
    x, wo, r = ins[0], ins[1], ins[2]
    wb = list(ins[3 : 3 + nb])
    nw, wd, rest = ins[3 + nb], ins[4 + nb], list(ins[5 + nb :])
    if len(wb) == 1:  # one concatenated weight, read twice
        wb = wb * 2
    hidden, inner, dt = a.n, b.n, x.dtype
    size = dtypes.itemsize(dtypes.short(dt))
    blocks = norm_blocks(hidden, dtypes.short(dt))
    assert blocks is not None and b.eps is not None  # (the finder took only such norms)
    tmpl: list[tuple[str, Any]] = [
        ("T", dt),
        ("KA", x.shape[-1]),
        ("H", hidden),
        ("NI", inner),
        ("RPB", ROWS_PER_BLOCK),
        ("OG", b.rows[0]),
        ("OU", b.rows[1]),
        ("PFA", a.order[0]),
        ("GFIRST", b.order[0]),
        ("GSFIRST", b.order[1]),
        ("PFC", c.order[0]),
        ("NBS", blocks[0]),
        ("NCH", blocks[1]),
        ("NR", blocks[2]),
        ("SH", shared_elems(hidden, inner, size)),
        ("XO", aligned(hidden, size)),
    ]
    rows = [hidden, inner]
    if len(m.parts) == 4:
        tmpl.append(("NQ", m.parts[3].n))
        rows.append(m.parts[3].n)
    # a block per ticket of the largest stage: the gate and up products as many warps
    # in flight as their own kernel has (any grid is correct; SEGC_CHAIN_BLOCKS)
    grid = max(-(-n // ROWS_PER_BLOCK) for n in rows)
    return tmpl, [x, wo, r, wb[0], wb[1], nw, wd, *rest, state(hidden, inner, size)], grid


def grid(blocks: int | None, most: int) -> int:
    """The blocks a launch takes: ``blocks``, else the environment's ``SEGC_CHAIN_BLOCKS``,
    else ``most`` (a block per ticket of the largest stage)."""
    if blocks is None:
        blocks = env_count("SEGC_CHAIN_BLOCKS", most, 1, "a number of blocks (1 or more)")
    return max(1, blocks)


def chain(m: ProductMatch, ins: Sequence[mx.array], blocks: int | None = None) -> Any:
    """The chain ``m`` over ``ins`` by one kernel: its output (``m.shape``), or with a
    fourth part ``[that, the fourth's]`` (``m.outs``). ``blocks``:
    the grid (default: the environment's ``SEGC_CHAIN_BLOCKS``, else as many blocks as
    the largest stage has tickets; any number is correct, module docstring)."""
    tmpl, inputs, most = launch(m, ins)
    blocks = grid(blocks, most)
    b, d = m.parts[1], m.parts[3] if len(m.parts) == 4 else None
    assert b.eps is not None and (d is None or d.eps is not None)  # (the finder took only such norms)
    outs = _kernel(_bits(b.eps), None if d is None or d.eps is None else _bits(d.eps), occupancy())(
        inputs=inputs,
        template=tmpl,
        grid=(32 * blocks, ROWS_PER_BLOCK, 1),
        threadgroup=(32, ROWS_PER_BLOCK, 1),
        output_shapes=[m.shape, *([d.shape] if d else [])],
        output_dtypes=[inputs[0].dtype] * (2 if d else 1),
    )
    return outs[0] if d is None else list(outs)
