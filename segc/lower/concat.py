"""Whether a product over concatenated weights keeps the bits of separate products.

The ``concat_projections`` pass (``segc.passes.concat``) asks this once per group shape:
both forms run on random data on the default device and their raw bytes are compared.
The arithmetic a kernel does depends on the shapes (which algorithm, which split of the
inner dimension), not on the values, so one comparison answers for every call of that
shape on this device; the answers are kept for the process (:func:`clear`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..ir import Var

_KNOWN: dict[tuple, bool] = {}


def clear() -> None:
    _KNOWN.clear()


def _random(shape: Sequence[int], dtype: str, key: mx.array) -> mx.array:
    dt = dtypes.to_mx(dtype)
    if dt == mx.uint32:  # packed quantized weights: any bits are valid
        return mx.random.randint(0, 2**31 - 1, tuple(shape), key=key).astype(mx.uint32)
    return (0.05 * mx.random.normal(tuple(shape), key=key)).astype(dt)


def _product(prim: str, x: mx.array, ws: list[mx.array], args: tuple[Any, ...]) -> mx.array:
    if prim == "Matmul":
        return x @ ws[0].T
    if prim == "AddMM":
        out = (*x.shape[:-1], ws[0].shape[0])
        return mx.addmm(mx.broadcast_to(ws[1], out), x, ws[0].T, alpha=args[0], beta=args[1])
    group_size, bits = int(args[0]), int(args[1])
    return mx.quantized_matmul(x, ws[0], ws[1], ws[2], transpose=True, group_size=group_size, bits=bits)


def same_bits(
    prim: str, x: Var, wshapes: Sequence[Sequence[tuple[int, ...]]], wdtypes: Sequence[str], args: tuple[Any, ...]
) -> bool:
    """Whether one product over the members' weights concatenated along their rows gives,
    sliced, each member's product byte for byte (on the default device)."""
    key = (
        prim,
        x.shape,
        x.dtype,
        tuple(tuple(map(tuple, w)) for w in wshapes),
        tuple(wdtypes),
        args,
        mx.default_device(),
    )
    if key in _KNOWN:
        return _KNOWN[key]
    if prim not in ("Matmul", "AddMM", "QuantizedMatmul") or (
        prim == "QuantizedMatmul" and (len(args) < 3 or args[2] != 0)
    ):
        _KNOWN[key] = False  # only the forms the pass makes, affine quantization
        return False
    keys = mx.random.split(mx.random.key(0), 1 + len(wshapes) * len(wdtypes))
    xa = _random(x.shape, x.dtype, keys[0])
    ws = [
        [_random(s, d, keys[1 + i * len(wdtypes) + j]) for j, (s, d) in enumerate(zip(m, wdtypes))]
        for i, m in enumerate(wshapes)
    ]
    cat = [mx.concatenate([m[j] for m in ws], axis=0) for j in range(len(wdtypes))]
    y = _product(prim, xa, cat, args)
    ok, start = True, 0
    for m in ws:
        ref = _product(prim, xa, m, args)
        n = ref.shape[-1]
        ok = ok and dtypes.to_bytes(y[..., start : start + n]) == dtypes.to_bytes(ref)
        start += n
    _KNOWN[key] = ok
    return ok
