"""Short dtype names used by the IR text, and conversions to MLX and NumPy."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .backend import on_cuda

# short name -> (mlx dtype, numpy dtype used to hold its raw bytes)
_TABLE: dict[str, tuple[mx.Dtype, type]] = {
    "bool": (mx.bool_, np.bool_),
    "u8": (mx.uint8, np.uint8),
    "u16": (mx.uint16, np.uint16),
    "u32": (mx.uint32, np.uint32),
    "u64": (mx.uint64, np.uint64),
    "i8": (mx.int8, np.int8),
    "i16": (mx.int16, np.int16),
    "i32": (mx.int32, np.int32),
    "i64": (mx.int64, np.int64),
    "f16": (mx.float16, np.float16),
    "bf16": (mx.bfloat16, np.uint16),  # NumPy has no bfloat16: raw bits as u16
    "f32": (mx.float32, np.float32),
    "f64": (mx.float64, np.float64),
    "c64": (mx.complex64, np.complex64),
}
_BY_MX = {v[0]: k for k, v in _TABLE.items()}


def short(dtype: mx.Dtype) -> str:
    """The IR's short name of an MLX dtype (``mx.float32`` -> ``"f32"``)."""
    return _BY_MX[dtype]


def to_mx(name: str) -> mx.Dtype:
    return _TABLE[name][0]


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype that holds a value of ``name`` (bfloat16: its raw bits, as u16)."""
    return np.dtype(_TABLE[name][1])


def is_dtype_name(name: str) -> bool:
    return name in _TABLE


def itemsize(name: str) -> int:
    return to_mx(name).size


_UNSIGNED = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


def to_bytes(a: mx.array) -> bytes:
    """Raw little-endian bytes of an evaluated array (bf16 as its 16-bit patterns). On
    CUDA, the bytes of a copy (:func:`read_apart`): ``a`` itself is never read by the
    host, and no buffer the host read is left for MLX to hand out again."""
    return to_bytes_many([a])[0]


def to_bytes_many(arrays: list[mx.array]) -> list[bytes]:
    """:func:`to_bytes` of each array; on CUDA their copies made, read and freed together
    (one evaluation and one emptying of MLX's cache, not one per array)."""
    # empty arrays read as nothing: MLX 0.32.4's CUDA build segfaults turning some to numpy
    some = [a.view(mx.uint16) if a.dtype == mx.bfloat16 else a for a in arrays if a.size]
    if some and on_cuda():
        raws = iter(read_apart(some))
    else:
        raws = iter(np.ascontiguousarray(np.array(a, copy=False)).tobytes() for a in some)
    return [next(raws) if a.size else b"" for a in arrays]


def same_bytes(a: mx.array, b: mx.array) -> bool:
    """Whether two arrays have one dtype, one shape and the same raw bytes (-0.0 is not
    0.0, NaN payloads count), both read at once (on CUDA one evaluation and one emptying of
    MLX's cache)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x, y = to_bytes_many([a, b])
    return x == y


def read_apart(arrays: list[mx.array]) -> list[bytes]:
    """The arrays' bytes, read from copies made for the purpose, whose buffers are then
    freed and MLX's buffer cache emptied.

    Why: MLX's CUDA build moves any buffer the host reads into CUDA managed memory for
    good (``Buffer::raw_ptr``), and its buffer cache hands a freed buffer to the next
    request of its size whatever memory it is. A device check that read its products on
    the host (``lower/concat.py``'s twelve draws) left twelve managed buffers of a decode
    layer's query, key and value size in the cache, and the decode's kernels then wrote
    and read 12 of 16 layers' queries in managed memory at every call (an H100,
    fifty-first session, ``benchmarks/kvattn_stamps.py --where``). Bit for bit: the copy
    is an integer OR with zero over the bytes' unsigned view (a float copy could turn
    -0.0 into 0.0)."""
    cs = [mx.bitwise_or(a.view(_UNSIGNED[a.dtype.size]), 0) for a in arrays]
    mx.eval(cs)
    raws = [np.ascontiguousarray(np.array(c, copy=False)).tobytes() for c in cs]
    del cs
    mx.clear_cache()
    return raws


def from_bytes(raw: bytes, shape: tuple[int, ...], name: str) -> mx.array:
    npdt = _TABLE[name][1]
    arr: np.ndarray = np.frombuffer(raw, dtype=npdt).reshape(shape)
    if name == "bf16":
        return mx.array(arr).view(mx.bfloat16)
    return mx.array(arr)


def to_numpy(raw: bytes, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Values as NumPy (bf16 widened to f32 exactly), for printing."""
    arr: np.ndarray = np.frombuffer(raw, dtype=_TABLE[name][1]).reshape(shape)
    if name == "bf16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def from_values(values: list, shape: tuple[int, ...], name: str) -> bytes:
    if name == "bf16":
        f = np.asarray(values, dtype=np.float32).reshape(shape)
        return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return np.asarray(values, dtype=_TABLE[name][1]).reshape(shape).tobytes()
