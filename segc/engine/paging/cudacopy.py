"""Host-to-device page copies by DMA on the pager's own CUDA stream (CUDA only).

On MLX's CUDA build an array made on the host (``mx.array(numpy)``) lives in CUDA
managed memory: the host writes its pages, and the first kernel to read it migrates
them to the GPU on demand, fault by fault (2.3 GB/s for the host copy, 8.3 GB/s for the
migration on the H200: ``benchmarks/managed_memory.py``). A recycled page buffer
(``recycle.py``) is such an array, already on the GPU after its last use, so the pager
can do better without calling MLX: it asks the CUDA driver to copy the page's bytes
from page-locked host memory straight into the buffer (``cuMemcpyHtoDAsync`` on a
stream of its own, the copy engine working while the GPU computes the running band).
The buffers are on the GPU already (made there, or used there last), so the copy lands
in device memory: the GPU reads every buffer of the reference llama in 4.4 ms after it,
with or without a migration hint first (``prefetch=True``, which costs 25% of the DMA's
bandwidth: ``benchmarks/dma_pages.py``). The bytes are the same; only the road differs.

The driver API (``libcuda.so.1``, present wherever there is an NVIDIA driver) is bound
with ``ctypes``: no extra package. The source is page-locked with ``cuMemHostRegister``
where it lives in host memory for good (``HostSource``); otherwise each tensor goes
through two page-locked staging buffers in turns (a host copy into one while the other
is being sent). The copies are asynchronous: the pager says a page is resident once a
:meth:`CudaCopier.mark` recorded after its copies has passed (``thread.py``);
:meth:`CudaCopier.flush` waits for every copy (with a timeout).
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from ...backend import on_cuda
from ...errors import PagingError, WaitTimeout

_NOT_READY = 600  # CUDA_ERROR_NOT_READY
_MEM_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE


# A tensor is sent in copies of at most this many bytes. On the H200 a kernel launched
# while a copy into MLX's (managed) memory runs waits for that copy to end: a tiny
# computation took 0.65 ms beside copies of whole tensors (up to 33 MB), 0.17 ms beside
# copies of 8 or 2 MB, against 0.05 ms with none; smaller copies cost bandwidth (46.8 GB/s
# a tensor at a time, 46.5 in pieces of 16 MB, 42.7 of 4 MB, 36.6 of 1 MB:
# ``benchmarks/dma_pages.py``). Paged decode, f=0.25: 61.2 ms a token with whole
# tensors, 59.7 with 8 MB, 56.7 with 2 MB (``benchmarks/paging_timeline.py --piece``);
# ``bench_paging.py``: 0.75 of the transfer bound with 2 MB, 0.79 with 4 MB (one run each).
PIECE_BYTES = 4 << 20


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def _driver() -> Any:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def available() -> bool:
    """MLX runs on a CUDA GPU and the driver library loads."""
    return on_cuda() and _driver() is not None


class CudaCopier:
    """Copies host bytes into MLX's managed buffers on device ``device`` of MLX."""

    def __init__(
        self, device: int = 0, *, staging_bytes: int = 64 << 20, timeout: float = 10.0, prefetch: bool = False
    ):
        if not available():
            raise PagingError("transfer='cuda' needs MLX running on a CUDA GPU and the driver's libcuda.so.1")
        cu = _driver()
        self.cu, self.timeout, self.device = cu, timeout, device
        self._check(cu.cuInit(0), "cuInit")
        self.ctx = ctypes.c_void_p()
        dev = ctypes.c_int()
        self._check(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        self._check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self._dev = dev.value
        self._current()
        self.stream = ctypes.c_void_p()
        self._check(cu.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")  # non-blocking
        self._pinned: dict[int, int] = {}  # registered host ranges: start -> size
        self._staging: list[tuple[ctypes.c_void_p, ctypes.c_void_p]] = []  # (address, event of its last send)
        self._turn = 0
        self.staging_bytes = staging_bytes
        self.piece_bytes = PIECE_BYTES  # a copy at most this long (0: one per tensor): see PIECE_BYTES
        self.copied_bytes = 0
        self._marks: list[ctypes.c_void_p] = []  # events for :meth:`mark`, passed and free again
        # the migration hint before each copy: off by default, MLX's buffers the pager reads
        # into are on the GPU already, and the hint cost 25% of the DMA's bandwidth on the H200
        self.prefetch = prefetch
        self._prefetch = getattr(cu, "cuMemPrefetchAsync_v2", None)
        self._prefetch_v1 = getattr(cu, "cuMemPrefetchAsync", None) if self._prefetch is None else None

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.cu.cuGetErrorName(rc, ctypes.byref(name))
            raise PagingError(f"CUDA copies: {what} failed with {(name.value or b'?').decode()} ({rc})")

    def _current(self) -> None:
        self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def pin(self, a: np.ndarray) -> bool:
        """Page-lock host array ``a`` for good (a ``HostSource``'s bytes); False where the
        driver refuses (the copies of it are then staged)."""
        if a.nbytes == 0:
            return False
        self._current()
        ptr = a.ctypes.data
        if self.cu.cuMemHostRegister_v2(ctypes.c_void_p(ptr), ctypes.c_size_t(a.nbytes), 0) != 0:
            return False
        self._pinned[ptr] = a.nbytes
        return True

    def _is_pinned(self, a: np.ndarray) -> bool:
        ptr = a.ctypes.data
        return any(start <= ptr and ptr + a.nbytes <= start + size for start, size in self._pinned.items())

    def copy(self, out: np.ndarray, src: np.ndarray) -> None:
        """Start copying ``src``'s bytes into ``out`` (a host view of an MLX managed buffer
        of the same size); :meth:`flush` waits for it."""
        if out.nbytes != src.nbytes:
            raise PagingError(f"CUDA copies: {src.nbytes} bytes into a buffer of {out.nbytes}")
        if not (out.flags.c_contiguous and src.flags.c_contiguous):
            raise PagingError("CUDA copies: only contiguous arrays")
        self._current()
        dst, n = out.ctypes.data, out.nbytes
        self._to_device(dst, n)
        if self._is_pinned(src):
            step = self.piece_bytes or n
            for at in range(0, n, step):
                self._send(dst + at, src.ctypes.data + at, min(step, n - at))
        else:
            raw = src.reshape(-1).view(np.uint8)
            for at in range(0, n, self.staging_bytes):
                piece = raw[at : at + self.staging_bytes]
                addr, event = self._slot()
                ctypes.memmove(addr, piece.ctypes.data, piece.nbytes)
                self._send(dst + at, addr.value or 0, piece.nbytes)
                self._check(self.cu.cuEventRecord(event, self.stream), "cuEventRecord")
        self.copied_bytes += n

    def _send(self, dst: int, src: int, n: int) -> None:
        rc = self.cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dst), ctypes.c_void_p(src), ctypes.c_size_t(n), self.stream)
        self._check(rc, "cuMemcpyHtoDAsync")

    def _to_device(self, dst: int, n: int) -> None:
        """Keep ``[dst, dst + n)``'s managed pages on the GPU (a hint: skipped if the driver
        lacks it), so the copy lands there instead of in host pages read later by faults."""
        if not self.prefetch:
            return
        if self._prefetch is not None:
            loc = _Location(_MEM_DEVICE, self._dev)
            self._prefetch(ctypes.c_uint64(dst), ctypes.c_size_t(n), loc, ctypes.c_uint(0), self.stream)
        elif self._prefetch_v1 is not None:
            self._prefetch_v1(ctypes.c_uint64(dst), ctypes.c_size_t(n), ctypes.c_int(self._dev), self.stream)

    def _slot(self) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        """The next staging buffer, once the copy last sent from it is done."""
        if len(self._staging) < 2:
            addr = ctypes.c_void_p()
            self._check(
                self.cu.cuMemAllocHost_v2(ctypes.byref(addr), ctypes.c_size_t(self.staging_bytes)), "cuMemAllocHost"
            )
            event = ctypes.c_void_p()
            self._check(self.cu.cuEventCreate(ctypes.byref(event), 2), "cuEventCreate")  # no timing
            self._staging.append((addr, event))
            return self._staging[-1]
        slot = self._staging[self._turn]
        self._turn ^= 1
        self._wait(lambda: self.cu.cuEventQuery(slot[1]), "a staging buffer")
        return slot

    def _wait(self, query: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        pause = 2e-5
        while True:
            rc = query()
            if rc == 0:
                return
            if rc != _NOT_READY:
                self._check(rc, f"waiting for {what}")
            if time.monotonic() > deadline:
                raise WaitTimeout("CUDA copy", 1, 0, self.timeout, what)
            time.sleep(pause)
            pause = min(pause * 2, 2e-4)  # short: a page's copies end a band's wait

    def mark(self) -> ctypes.c_void_p:
        """An event recorded after the copies started so far (:meth:`landed`)."""
        self._current()
        ev = self._marks.pop() if self._marks else ctypes.c_void_p()
        if not ev.value:
            self._check(self.cu.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")  # no timing
        self._check(self.cu.cuEventRecord(ev, self.stream), "cuEventRecord")
        return ev

    def landed(self, mark: ctypes.c_void_p) -> bool:
        """Whether the copies before ``mark`` are done (the mark is then free again)."""
        rc = self.cu.cuEventQuery(mark)
        if rc == _NOT_READY:
            return False
        self._check(rc, "querying a mark")
        self._marks.append(mark)
        return True

    def flush(self) -> None:
        """Wait (at most ``timeout`` seconds) for every copy started."""
        self._current()
        self._wait(lambda: self.cu.cuStreamQuery(self.stream), "the pager's copies")

    def close(self) -> None:
        """Wait for the copies, then release the staging buffers and the registrations."""
        try:
            self.flush()
        finally:
            for addr, event in self._staging:
                self.cu.cuMemFreeHost(addr)
                self.cu.cuEventDestroy_v2(event)
            self._staging.clear()
            for ev in self._marks:
                self.cu.cuEventDestroy_v2(ev)
            self._marks.clear()
            for ptr in self._pinned:
                self.cu.cuMemHostUnregister(ctypes.c_void_p(ptr))
            self._pinned.clear()
            if self.stream:
                self.cu.cuStreamDestroy_v2(self.stream)
                self.stream = ctypes.c_void_p()
            self.cu.cuDevicePrimaryCtxRelease_v2(ctypes.c_int(self._dev))
