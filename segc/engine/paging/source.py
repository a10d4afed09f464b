"""Where paged weights come from: the safetensors files of a local mlx-lm directory.

A safetensors file is an 8-byte little-endian header length, a JSON header (per tensor:
dtype, shape, byte range) and the raw bytes. :func:`index` reads the headers only;
:class:`DiskSource` maps each file (``np.memmap``): :meth:`DiskSource.host` copies a
tensor's bytes into a numpy array and makes no MLX call (the pager thread reads with it:
MLX is not thread-safe), :meth:`DiskSource.read` makes an ``mx.array`` with one copy
from the mapped pages (on the dispatch thread). bfloat16, which numpy lacks, comes back
as ``uint16`` bits: :func:`as_dtype` views it on the dispatch thread. :class:`HostSource`
keeps every tensor's bytes in host memory first (for a device with its own memory: the
medium is then host RAM, not the disk).

A reader (``reader(info) -> np.ndarray``, the tensor's bytes) may replace the default
one, e.g. to inject a failure: any exception it raises comes back as a
:class:`~segc.errors.PagingError` naming the file and the tensor.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from ...errors import PagingError

if TYPE_CHECKING:
    from .cudacopy import CudaCopier

# safetensors dtype -> (numpy dtype of the bytes, the MLX dtype they hold)
DTYPES: dict[str, tuple[type, mx.Dtype]] = {
    "F32": (np.float32, mx.float32),
    "F16": (np.float16, mx.float16),
    "BF16": (np.uint16, mx.bfloat16),
    "F64": (np.float64, mx.float64),
    "U8": (np.uint8, mx.uint8),
    "I8": (np.int8, mx.int8),
    "U16": (np.uint16, mx.uint16),
    "I16": (np.int16, mx.int16),
    "U32": (np.uint32, mx.uint32),
    "I32": (np.int32, mx.int32),
    "U64": (np.uint64, mx.uint64),
    "I64": (np.int64, mx.int64),
    "BOOL": (np.bool_, mx.bool_),
}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a safetensors file: its absolute byte range ``[start, end)``."""

    name: str
    file: Path
    dtype: str  # safetensors' name (F32, BF16, U32, ...)
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def mx_dtype(self) -> mx.Dtype:
        return DTYPES[self.dtype][1]


Reader = Callable[[TensorInfo], np.ndarray]


def index(path: str | Path) -> dict[str, TensorInfo]:
    """Every tensor of the ``*.safetensors`` files in directory ``path``, by name."""
    p = Path(path)
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise PagingError(f"{p} has no *.safetensors weights")
    out: dict[str, TensorInfo] = {}
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, struct.error, ValueError) as exc:
            raise PagingError(f"{f}: not a safetensors file ({exc})") from exc
        size = f.stat().st_size
        for name, h in header.items():
            if name == "__metadata__":
                continue
            if h.get("dtype") not in DTYPES:
                raise PagingError(f"{f}: tensor {name!r} has dtype {h.get('dtype')!r}, which paging does not read")
            a, b = h["data_offsets"]
            if 8 + n + b > size:
                raise PagingError(f"{f}: tensor {name!r} ends at byte {8 + n + b}, past the end of the file ({size})")
            out[name] = TensorInfo(name, f, h["dtype"], tuple(h["shape"]), 8 + n + a, 8 + n + b)
    return out


def as_dtype(a: mx.array, dtype: mx.Dtype) -> mx.array:
    """``a`` as ``dtype`` (a view of its bits: bfloat16 arrives as uint16). Call it on the
    dispatch thread: a view is an MLX operation."""
    return a if a.dtype == dtype else a.view(dtype)


class DiskSource:
    """Tensors read from the files of a local directory through memory maps."""

    def __init__(self, path: str | Path, *, reader: Reader | None = None):
        self.path = Path(path)
        self.tensors = index(self.path)
        self.reader = reader
        self._maps: dict[Path, np.memmap] = {}
        self.copier: CudaCopier | None = None  # CUDA: copies into MLX buffers by DMA (cudacopy.py)

    def attach(self, copier: CudaCopier | None) -> None:
        """Copy into MLX buffers (:meth:`read_into`) with ``copier`` from now on."""
        self.copier = copier

    def _raw(self, info: TensorInfo) -> np.ndarray:
        m = self._maps.get(info.file)
        if m is None:
            m = self._maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="r")
        raw = m[info.start : info.end]
        if raw.size != info.nbytes:
            raise OSError(f"the file ends at byte {m.size}, before the tensor's end ({info.end})")
        return raw

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes as a host array of its numpy dtype and shape (not copied)."""
        raw = self.reader(info) if self.reader is not None else self._raw(info)
        return np.asarray(raw).view(DTYPES[info.dtype][0]).reshape(info.shape)

    def read(self, name: str) -> mx.array:
        """Tensor ``name`` as an evaluated ``mx.array`` (bfloat16 as uint16 bits)."""
        return self._get(name, mx.array)

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Tensor ``name``'s bytes copied into ``out`` (a host view of an MLX buffer of its
        numpy dtype and shape): one copy, no MLX call (the pager thread's recycled pages).
        With a copier the copy is a DMA that may still be running: :meth:`flush`."""
        c = self.copier
        self._get(name, lambda raw: np.copyto(out, raw, casting="no") if c is None else c.copy(out, raw))

    def flush(self) -> None:
        """Wait for the copies :meth:`read_into` started (with a copier; a timeout)."""
        if self.copier is not None:
            self.copier.flush()

    def mark(self) -> Any:
        """A mark after the copies :meth:`read_into` started so far (None without a copier:
        they are done); :meth:`landed` says whether they are."""
        return self.copier.mark() if self.copier is not None else None

    def landed(self, mark: Any) -> bool:
        return mark is None or self.copier is None or self.copier.landed(mark)

    def host(self, name: str) -> np.ndarray:
        """Tensor ``name``'s bytes copied into host memory (a numpy array): read from the
        medium without touching MLX, for :func:`to_device` on the dispatch thread."""
        return self._get(name, np.array)

    def _get(self, name: str, make: Callable[[np.ndarray], Any]) -> Any:
        info = self.tensors.get(name)
        if info is None:
            raise PagingError(f"{self.path}: no file holds tensor {name!r}")
        try:
            return make(self.raw(info))
        except PagingError:
            raise
        except Exception as exc:
            raise PagingError(f"reading tensor {name!r} from {info.file}: {type(exc).__name__}: {exc}") from exc

    def read_bandwidth(self, names: list[str] | None = None) -> float:
        """Bytes per second of :meth:`read` over ``names`` (default: every tensor), or with
        a copier of :meth:`read_into` (a DMA into MLX buffers, one wait at the end): the
        medium's bandwidth as the pager sees it (the bound of a paged run)."""
        names = list(self.tensors) if names is None else names
        keep, views = [], {}
        if self.copier is not None:  # the road a recycled page takes: into MLX buffers by DMA
            for n in names:
                i = self.tensors[n]
                if (i.shape, i.dtype) not in views:  # made on the GPU, as the pager's buffers are
                    keep.append(mx.zeros(i.shape, mx.uint16 if i.dtype == "BF16" else DTYPES[i.dtype][1]))
                    mx.eval(keep[-1])
                    views[i.shape, i.dtype] = np.asarray(keep[-1])
        piece = self.copier.piece_bytes if self.copier is not None else 0
        if self.copier is not None:  # the medium's best: a copy per tensor (the pager sends pieces)
            self.copier.piece_bytes = 0
        t0 = time.perf_counter()
        total = 0
        try:
            for n in names:
                i = self.tensors[n]
                if views:
                    self.read_into(n, views[i.shape, i.dtype])
                else:
                    a = self.read(n)
                    del a
                total += i.nbytes
            self.flush()
        finally:
            if self.copier is not None:
                self.copier.piece_bytes = piece
        return total / max(time.perf_counter() - t0, 1e-9)

    def close(self) -> None:
        self._maps.clear()
        if self.copier is not None:
            self.copier.close()
            self.copier = None


class HostSource(DiskSource):
    """Every tensor's bytes copied into host memory up front; :meth:`read` copies from
    there. For a device with its own memory: the pager then streams host to device."""

    def __init__(self, path: str | Path, *, reader: Reader | None = None):
        super().__init__(path, reader=reader)
        self._host = {n: np.array(DiskSource._raw(self, i)) for n, i in self.tensors.items()}
        self._maps.clear()

    def _raw(self, info: TensorInfo) -> np.ndarray:
        return self._host[info.name]

    def attach(self, copier: CudaCopier | None) -> None:
        """As :meth:`DiskSource.attach`, and every tensor's host bytes page-locked (a DMA
        reads them directly; where the driver refuses, the copier stages them)."""
        super().attach(copier)
        if copier is not None:
            for a in self._host.values():
                copier.pin(a)
