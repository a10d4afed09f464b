"""The KV store: host copies of KV caches' buffers, for KV paging (docs/paging.md).

A layer's cache buffers leave MLX's memory as one small safetensors file per layer and
version (in a directory of host memory: ``/dev/shm`` where there is one). The file is
written once, from the evaluated buffers, on the dispatch thread (:meth:`KVStore.write`),
and never changed; what goes back into the cache is ``mx.load``'s *lazy* arrays of it:
ordinary ``mx.array``s, of the buffers' shapes and dtypes, that hold no MLX memory until
something evaluates them (MLX then reads the file). The store remembers which lazy
arrays it handed out (:meth:`KVStore.home`), so the next call reads that layer back from
the file rather than evaluating the caller's arrays.

The pager thread reads a block's bytes into host memory with :meth:`KVStore.host`
(numpy, no MLX call: MLX is not thread-safe); the dispatch thread copies them in.

A file lives while a lazy array of it does: when the last one is dropped (a cache
advanced by a later call, a failed call's copies), the file is renamed ``spare-*`` and
later overwritten by a new version (a new file costs the system fresh pages: writing
one on ``/dev/shm`` measured 10x slower than overwriting one), but only once no open
file of the process refers to it (``/proc/self/fd``: an array derived from a lazy one
may still read it; where that cannot be checked, it is removed instead). The spares are
at most as many as the live files. A lazy array that MLX has opened keeps reading its
file after the file is removed (an open file outlives its name), so removing the
store's directory never breaks a cache the caller holds.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ...errors import PagingError
from .source import DTYPES, TensorInfo

_NAMES = {mx_dtype: name for name, (_, mx_dtype) in DTYPES.items()}  # mx dtype -> safetensors name

Reader = Callable[[TensorInfo], np.ndarray]


@dataclass(frozen=True, slots=True)
class KVBlock:
    """One layer's cache buffers in the store: its file and each buffer's byte range,
    by the cache's attribute name (``keys``, ``values``)."""

    layer: int
    path: Path
    tensors: tuple[tuple[str, TensorInfo], ...]

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for _, i in self.tensors)


def _host_dir() -> str | None:
    """``/dev/shm`` (host memory) where it is writable and has 1 GiB free (a container's
    is often 64 MiB), else None: the system's temporary directory."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    return shm if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize >= 1 << 30 else None


def _open_files() -> set[str] | None:
    """The paths of the files this process has open (None where it cannot be told)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    out = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
    return out


def _bytes_of(a: mx.array) -> np.ndarray:
    """A host view of an evaluated array's buffer (bfloat16 as its ``uint16`` bits); no
    copy for a contiguous buffer. On the dispatch thread: a view is an MLX operation."""
    return np.asarray(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


class KVStore:
    """Host copies of cache buffers in ``directory`` (default: a new directory in
    ``/dev/shm`` where it has 1 GiB free, else in the system's temporary directory;
    removed with the store).
    ``reader(info) -> numpy bytes`` replaces the file reader (tests inject failures)."""

    def __init__(self, directory: str | Path | None = None, *, reader: Reader | None = None):
        self._parent = Path(directory) if directory is not None else None
        self._dir: Path | None = None
        self.reader = reader
        self._count = itertools.count()
        self._lock = threading.RLock()  # a weak reference's callback may run inside it
        # id(lazy array) -> (a weak reference to it, its block, its attribute name)
        self._homes: dict[int, tuple[weakref.ref[mx.array], KVBlock, str]] = {}
        self._live: dict[Path, int] = {}  # lazy arrays alive per file
        self._dead: list[Path] = []  # spares no array reads, perhaps still open (an array derived from one)
        self._spare: list[Path] = []  # spares no open file refers to: overwritten by the next writes
        self.written_bytes = 0
        self.read_bytes = 0
        self._finalizer: weakref.finalize | None = None

    @property
    def directory(self) -> Path:
        if self._dir is None:
            parent = self._parent if self._parent is not None else _host_dir()
            try:
                if parent is not None:
                    Path(parent).mkdir(parents=True, exist_ok=True)
                self._dir = Path(tempfile.mkdtemp(prefix="segc-kv-", dir=parent))
            except OSError as exc:
                raise PagingError(f"the KV store cannot make its directory in {parent}: {exc}") from exc
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(self._dir), True)
        return self._dir

    # ------------------------------------------------------------ dispatch thread

    def home(self, cache: Any) -> KVBlock | None:
        """The block whose lazy arrays ``cache`` holds (every array attribute of it, as
        the store handed them out), else None (an empty cache, or buffers of the caller's)."""
        arrays = {n: a for n, a in vars(cache).items() if isinstance(a, mx.array)}
        if not arrays:
            return None
        block: KVBlock | None = None
        with self._lock:
            for name, a in arrays.items():
                rec = self._homes.get(id(a))
                if rec is None or rec[0]() is not a or rec[2] != name or (block is not None and rec[1] != block):
                    return None
                block = rec[1]
        assert block is not None
        return block if {n for n, _ in block.tensors} == set(arrays) else None

    def write(self, layer: int, arrays: dict[str, mx.array]) -> dict[str, mx.array]:
        """Write ``arrays`` (a cache's evaluated buffers, by attribute name) to a new
        file (a spare overwritten, if there is one); the lazy arrays of it, to put in the
        cache in their place."""
        path = self.directory / f"layer{layer:04d}-{next(self._count)}.safetensors"
        header: dict[str, Any] = {}
        start = 0
        views = []
        for name, a in arrays.items():
            if a.dtype not in _NAMES:
                raise PagingError(f"KV paging: layer {layer}'s {name} is {a.dtype}, which the KV store does not hold")
            v = _bytes_of(a)
            header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [start, start + v.nbytes]}
            start += v.nbytes
            views.append(v)
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        try:
            spare = self._take_spare(8 + len(raw) + start)
            if spare is not None:
                os.rename(spare, path)
            with open(path, "r+b" if spare is not None else "wb") as f:
                f.write(len(raw).to_bytes(8, "little"))
                f.write(raw)
                for v in views:
                    v.tofile(f)
                f.truncate()
        except OSError as exc:
            path.unlink(missing_ok=True)
            raise PagingError(f"KV paging: writing layer {layer}'s cache to {path}: {exc}") from exc
        del views
        self.written_bytes += start
        base = 8 + len(raw)
        infos = tuple(
            (
                name,
                TensorInfo(
                    name, path, h["dtype"], tuple(h["shape"]), base + h["data_offsets"][0], base + h["data_offsets"][1]
                ),
            )
            for name, h in header.items()
        )
        block = KVBlock(layer, path, infos)
        lazy = mx.load(str(path))  # nothing read: MLX reads the file when an array is evaluated
        assert isinstance(lazy, dict)
        out = {name: lazy[name] for name in arrays}
        with self._lock:
            self._live[path] = len(out)
            for name, a in out.items():
                key = id(a)
                self._homes[key] = (weakref.ref(a, self._dropper(key, path)), block, name)
        return out

    def _dropper(self, key: int, path: Path) -> Callable[[Any], None]:
        def dropped(_: Any) -> None:
            with self._lock:
                rec = self._homes.get(key)
                if rec is not None and rec[0]() is None:
                    del self._homes[key]
                left = self._live[path] = self._live.get(path, 1) - 1
                if left <= 0:
                    self._live.pop(path, None)
                    spare = path.with_name(f"spare-{next(self._count)}.safetensors")
                    try:
                        os.rename(path, spare)
                        self._dead.append(spare)
                    except OSError:  # the directory is gone (closed)
                        pass

        return dropped

    def _take_spare(self, nbytes: int) -> Path | None:
        """A spare file to overwrite (the smallest of at least ``nbytes``, else the
        largest), or None. Spares beyond the number of live files are removed."""
        with self._lock:
            dead, self._dead = self._dead, []
        if dead:
            opened = _open_files()
            for p in dead:
                if opened is None:
                    p.unlink(missing_ok=True)  # no way to tell whether an array still reads it
                elif str(p) in opened:
                    with self._lock:
                        self._dead.append(p)  # again at a later write
                else:
                    self._spare.append(p)
        while len(self._spare) > max(len(self._live), 1):
            self._spare.pop(0).unlink(missing_ok=True)
        if not self._spare:
            return None
        sizes = []
        for p in self._spare:
            try:
                sizes.append((p.stat().st_size, p))
            except OSError:
                sizes.append((-1, p))
        fits = [x for x in sizes if x[0] >= nbytes]
        _, best = min(fits) if fits else max(sizes)
        self._spare.remove(best)
        return best

    # ------------------------------------------------------------ any thread, no MLX

    def host(self, block: KVBlock) -> dict[str, np.ndarray]:
        """``block``'s buffers copied into host memory (numpy; bfloat16 as ``uint16``
        bits), by attribute name. Makes no MLX call: the pager thread reads with it."""
        out: dict[str, np.ndarray] = {}
        for name, info in block.tensors:
            try:
                raw = self.reader(info) if self.reader is not None else self._read(info)
                out[name] = np.asarray(raw).view(DTYPES[info.dtype][0]).reshape(info.shape)
            except PagingError:
                raise
            except Exception as exc:
                raise PagingError(
                    f"KV paging: reading layer {block.layer}'s {name} from {info.file}: {type(exc).__name__}: {exc}"
                ) from exc
            self.read_bytes += info.nbytes
        return out

    @staticmethod
    def _read(info: TensorInfo) -> np.ndarray:
        raw = np.fromfile(info.file, dtype=np.uint8, count=info.nbytes, offset=info.start)
        if raw.size != info.nbytes:
            raise OSError(f"the file ends before the buffer's end (byte {info.end})")
        return raw

    def close(self) -> None:
        """Remove the directory (lazy arrays MLX has opened still read their files)."""
        with self._lock:
            self._homes.clear()
            self._live.clear()
            self._dead.clear()
        self._spare.clear()
        if self._finalizer is not None:
            self._finalizer()
        self._dir = None
