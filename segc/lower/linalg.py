"""FFTs and MLX's linear algebra (``mx.linalg``: LAPACK on the CPU stream only, as MLX
runs it; every rule passes ``stream=mx.cpu``, as the eager call must)."""

from __future__ import annotations

import mlx.core as mx

from ..ir import Eqn
from .prim import matmul_flops, rule

_CPU = {"stream": mx.cpu}


@rule("FFT")
def _fft(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``FFT(axes, inverse, real)``: the sizes along ``axes`` are the input's (a real
    forward transform, padded or cut to them before) or the output's (a real inverse)."""
    axes, inverse, real = list(args[0]), args[1], args[2]
    (x,) = ins
    if not real:
        return (mx.fft.ifftn if inverse else mx.fft.fftn)(x, axes=axes)
    if inverse:
        return mx.fft.irfftn(x, s=tuple(e.outs[0].shape[a] for a in axes), axes=axes)
    return mx.fft.rfftn(x, s=tuple(x.shape[a] for a in axes), axes=axes)


@rule("Inverse", flops=matmul_flops)
def _inverse(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    tri, upper = args
    if tri:
        return mx.linalg.tri_inv(ins[0], upper=upper, **_CPU)
    return mx.linalg.inv(ins[0], **_CPU)


@rule("Cholesky", flops=matmul_flops)
def _cholesky(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.linalg.cholesky(ins[0], upper=args[0], **_CPU)


@rule("QRF", flops=matmul_flops)
def _qr(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    return list(mx.linalg.qr(ins[0], **_CPU))


@rule("SVD", flops=matmul_flops)
def _svd(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    out = mx.linalg.svd(ins[0], compute_uv=bool(args[0]), **_CPU)
    return list(out) if isinstance(out, tuple | list) else [out]


@rule("Eigh", flops=matmul_flops)
def _eigh(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    uplo, vectors = args
    if vectors:
        return list(mx.linalg.eigh(ins[0], UPLO=uplo, **_CPU))
    return [mx.linalg.eigvalsh(ins[0], UPLO=uplo, **_CPU)]


@rule("Eig", flops=matmul_flops)
def _eig(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    if args[0]:
        return list(mx.linalg.eig(ins[0], **_CPU))
    return [mx.linalg.eigvals(ins[0], **_CPU)]
