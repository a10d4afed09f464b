"""A decode step's matrix-vector products with the elementwise work around them, as one
kernel each: the setting, the kernel, and MLX's ops for the same thing.

A decode step multiplies one row by each weight matrix; MLX's CUDA backend runs each
such product as its ``gemv`` kernel (one warp per output row), then every elementwise
step after it as another kernel. On the H200 a decode step is bound by its kernel
count, not by bytes (docs/performance.md), so two patterns of a llama layer become one
kernel each (``product_match.py`` finds them, ``cuda_products.py`` computes them):

- ``add``: a product and the residual addition after it, ``r + x @ W.T`` (the
  attention's output projection, the MLP's down projection);
- ``glu``: the gate and up products and the gated activation between them,
  ``silu(x @ Wg.T) * (x @ Wu.T)`` as MLX writes it (``g * sigmoid(g)``), over two
  weights or over one concatenated weight's row ranges (``concat_projections``);
- a norm before the product: where the row is ``mx.fast.rms_norm``'s output read by
  nothing else, each block of the kernel normalises the row itself, as MLX's
  ``rms_norm_small`` kernel does (the same threads' sums, the same block reduction),
  before its products; this also makes a plain product (``gemv``: the attention's
  q/k/v product, the logits) one kernel with its norm, and each of several plain
  products reading one norm (q, k and v not concatenated). On a GPU the trace records
  ``RMSNorm`` whole; on the CPU it records its decomposition, and no norm is matched;
- a layer's MLP from the attention's output product on (an ``add``, a normed ``glu``,
  an ``add``) as one kernel: ``product_chain.py`` and ``cuda_chain.py``;
- a mixture of experts' products (``gather_mm`` of one row: ``gglu``, the experts' gate
  and up with SwiGLU; ``gmoe``, their down products weighted, summed and added to the
  residual): ``gather_match.py`` and ``cuda_gather.py``.

The kernel computes each output row exactly as MLX's ``gemv`` does (the same lanes, the
same order of additions, the same warp reduction, float accumulation), rounds it to the
dtype, and then applies MLX's own elementwise functors in the recorded order, each
rounded to the dtype as eager's separate kernels round it: the same bits as eager's
kernels (``tests/test_products_cuda.py``). :func:`reference_products` computes a match
with MLX's ops: the tests' stand-in on the CPU.

A pattern is taken only where nothing else reads its intermediate values, for one row
(``x`` of ``(1, K)``: where MLX's matmul uses ``gemv``), the weights of ``(N, K)`` and
the row, weights and result of one floating dtype. A quantized product
(``mx.quantized_matmul`` of an affine quantization, as mlx-lm's ``QuantizedLinear``
makes it) is taken where MLX runs it with its ``qmv`` kernel (one row, at most 16384
output rows and row length), which the kernel then copies as it copies ``gemv``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..backend import on_cuda
from ..errors import UsageError
from ..settings import env_choice
from .product_match import DTYPES as DTYPES
from .product_match import ProductMatch as ProductMatch
from .product_match import find_products as find_products
from .product_match import norm_blocks as norm_blocks


def _weights(m: ProductMatch, ins: Sequence[mx.array]) -> list[tuple[mx.array, ...]]:
    """The weights of ``m`` among ``ins`` (the row first): one array each, or three
    (packed weight, scales, biases) quantized."""
    width = 3 if m.quant is not None else 1
    count = {"gemv": 1, "add": 1, "gmoe": 1, "gglu": len(ins) - 2}.get(m.kind, (len(ins) - 1) // width)
    return [tuple(ins[1 + i * width : 1 + (i + 1) * width]) for i in range(count)]


def _mm(m: ProductMatch, x: mx.array, w: tuple[mx.array, ...]) -> mx.array:
    if m.quant is None:
        return mx.matmul(x, mx.transpose(w[0], (1, 0)))
    group, bits = m.quant
    wq, scales, biases = w
    return mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=group, bits=bits)


def reference_products(m: ProductMatch, ins: Sequence[mx.array]) -> Any:
    """What the kernel computes, in MLX's ops (the primitives eager records): the tests'
    stand-in for the kernel on a machine without CUDA (a list for ``m.outs`` of more
    than one)."""
    x = ins[0]
    if m.kind in ("gglu", "gmoe"):
        return _gathered(m, ins)
    if m.kind == "chain":
        return chained(m, ins)
    if m.kind == "layer":  # (its write's and attention's references are the lowering's, above this module)
        raise ValueError("a layer's reference is segc.lower.layer_chain.reference_layer")
    if m.eps is not None:
        x = mx.fast.rms_norm(x, ins[-1], m.eps)
        ins = ins[:-1]
        x = x.reshape(1, x.shape[-1]) if m.quant is None else x  # MLX's matmul flattens; quantized_matmul does not
    ws = _weights(m, ins)
    if m.kind == "gemv":
        return _mm(m, x, ws[0]).reshape(m.shape)
    if m.kind == "add":
        y = _mm(m, x, ws[0]).reshape(m.shape)
        r = ins[-1]
        return y + r if m.order[0] else r + y
    if len(ws) == 1:  # one concatenated product, sliced (as concat_projections made it)
        whole = _mm(m, x, ws[0])
        whole = whole.reshape(1, whole.shape[-1])
        gv, uv = (whole[:, first : first + m.n] for first in m.rows)
    else:
        gv, uv = _mm(m, x, ws[0]), _mm(m, x, ws[1])
    gv, uv = gv.reshape(m.shape), uv.reshape(m.shape)
    s = mx.sigmoid(gv)
    gs = gv * s if m.order[0] else s * gv
    return gs * uv if m.order[1] else uv * gs


def chained(m: ProductMatch, ins: Sequence[mx.array]) -> Any:
    """A chain (``product_chain.py``): its parts in turn, the activation flattened to the
    row the down product reads; with a fourth part, ``[out, its product]``."""
    a, b, c = m.parts[:3]
    nb = len(b.ins) - 1  # the gate's and up's weights (or one) and the norm's
    h = reference_products(a, ins[:3])
    act = reference_products(b, [h, *ins[3 : 3 + nb]])
    out = reference_products(c, [act.reshape(1, b.n), ins[3 + nb], h])
    if len(m.parts) == 3:
        return out
    return [out, reference_products(m.parts[3], [out, *ins[4 + nb :]])]


def _gathered(m: ProductMatch, ins: Sequence[mx.array]) -> mx.array:
    """``gglu`` and ``gmoe`` in MLX's ops, as mlx-lm's ``SwitchGLU`` and mixtral's
    block record them (``gather_match.py``)."""
    x, idx = ins[0], ins[-1]

    def mm(a: mx.array, w: mx.array) -> mx.array:
        return mx.gather_mm(a, mx.swapaxes(w, -1, -2), rhs_indices=idx)

    if m.kind == "gglu":
        ws = _weights(m, ins)
        gv, uv = mm(x, ws[0][0]), mm(x, ws[-1][0])
        s = mx.sigmoid(gv)
        gs = gv * s if m.order[0] else s * gv
        return gs * uv if m.order[1] else uv * gs
    y = mm(x, ins[1]).squeeze(-2)
    b = mx.broadcast_to(mx.expand_dims(ins[2], -1), y.shape)
    s = (y * b if m.order[0] else b * y).sum(axis=-2)
    return ins[3] + s if m.order[1] else s + ins[3]


# a match's kernel: its output, or a list of its outputs (``ProductMatch.outs``)
Kernel = Callable[[ProductMatch, Sequence[mx.array]], Any]

MLX_SERIES = "0.32."  # the MLX whose kernels the CUDA kernels copy
# "auto": the CUDA kernels where the default device is a CUDA GPU (unless the environment
# sets SEGC_FUSED_PRODUCTS=0) and MLX is of MLX_SERIES, none on the CPU; "never"; or a
# kernel (tests, research). Read when a graph is lowered.
FUSED_PRODUCTS: str | Kernel = "auto"


def cuda_wanted(setting: str, name: str) -> bool:
    """Whether ``setting`` (``"auto"`` or ``"never"``) of the setting ``name``
    (``FUSED_PRODUCTS``, ``FUSED_KV_WRITE``) asks for segc's CUDA kernel here: ``"auto"``
    where the default device is a CUDA GPU, MLX is of :data:`MLX_SERIES` (the kernels
    copy its code) and the environment does not set ``SEGC_<name>=0`` (``1`` or unset;
    another value is a ``UsageError``)."""
    if setting == "never":
        return False
    if setting != "auto":
        raise UsageError(f"{name} must be 'auto', 'never' or a kernel, not {setting!r}")
    off = env_choice(f"SEGC_{name}", ("1", "0"), "1") == "0"  # a bad value refused on any device
    cuda = on_cuda()
    if not cuda or off:
        return False
    return str(getattr(mx, "__version__", "")).startswith(MLX_SERIES)


def product_kernel(setting: str | Kernel | None = None) -> Kernel | None:
    """The kernel segments lower ``add`` and ``glu`` patterns to, or None (MLX's own
    kernels). ``setting`` defaults to :data:`FUSED_PRODUCTS`."""
    setting = FUSED_PRODUCTS if setting is None else setting
    if callable(setting):
        return setting
    return cuda_products if cuda_wanted(setting, "FUSED_PRODUCTS") else None


def cuda_products(m: ProductMatch, ins: Sequence[mx.array]) -> Any:
    """``m`` computed by one CUDA kernel (``cuda_products.py``, imported on first use)."""
    from .cuda_products import product

    if m.kind == "chain":
        from .cuda_chain import chain

        return chain(m, ins)
    if m.kind == "layer":
        from .cuda_layer import layer

        return layer(m, ins)
    if m.kind in ("gglu", "gmoe"):
        from .cuda_gather import gathered

        return gathered(m.kind, ins, m.n, m.shape, m.order)
    norm = None
    if m.eps is not None:
        blocks = norm_blocks(ins[0].shape[-1], dtypes.short(ins[0].dtype))
        assert blocks is not None  # (the finder took only such norms)
        norm = (m.eps, blocks)
    return product(m.kind, ins, m.rows, m.n, m.shape, m.order, norm, m.quant)


def fused_rule(m: ProductMatch, kernel: Kernel) -> Callable[[list[mx.array], tuple, Any], Any]:
    """A replay rule computing ``m`` with ``kernel`` (its output, or ``m.outs``' list)."""

    def run(ins: list[mx.array], args: tuple, e: Any) -> Any:
        return kernel(m, ins)

    return run
