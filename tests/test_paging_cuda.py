"""Paging's CUDA road (``segc/engine/paging/cudacopy.py``): a page's bytes sent by DMA
on the pager's own stream into MLX's managed buffers arrive whole, whether the source is
page-locked or staged in pieces, and are what a GPU kernel then reads; the ``transfer``
option is checked. The paged runs' bits on the GPU (``transfer="auto"`` is the CUDA road
there) are checked by ``test_paging.py`` and ``test_paging_kv.py`` on the GPU machine."""

from __future__ import annotations

import mmap
import time

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as hs

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from segc.engine.paging import PagedModel, save_model_dir
from segc.engine.paging.cudacopy import CudaCopier, available
from segc.errors import PagingError, ScheduleError
from segc.models.zoo import build, tiny_config

ON_CUDA = available()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    cfg = tiny_config("llama", num_hidden_layers=2)
    return save_model_dir(build("llama", seed=3, num_hidden_layers=2), cfg, tmp_path_factory.mktemp("tiny"))


def test_the_transfer_option_is_checked(tiny) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ScheduleError, match="transfer must be one of"):
        PagedModel(tiny, budget=1 << 30, transfer="dma")
    if ON_CUDA:
        pm = PagedModel(tiny, budget=1 << 30, transfer="cuda")
        assert pm.source.copier is not None
        pm.close()
    else:  # refused up front, naming what is missing
        with pytest.raises(PagingError, match="CUDA GPU"):
            PagedModel(tiny, budget=1 << 30, transfer="cuda")
    pm = PagedModel(tiny, budget=1 << 30, transfer="host")
    assert pm.source.copier is None
    pm.close()


@pytest.mark.skipif(not ON_CUDA, reason="DMA into MLX's managed memory needs MLX's CUDA build on a GPU")
@settings(max_examples=examples(12), deadline=None)
@given(
    n=hs.integers(1, 300_000),
    staging=hs.sampled_from([4096, 65536, 1 << 20]),
    pinned=hs.booleans(),
    dtype=hs.sampled_from([np.uint8, np.uint16, np.float32]),
    piece=hs.sampled_from([0, 4096, 65536]),
)
def test_dma_copies_arrive_whole_and_the_gpu_reads_them(
    n: int, staging: int, pinned: bool, dtype: type, piece: int
) -> None:
    """Sent whole or in pieces (``piece_bytes``), waited for by a mark (as the pager
    does) rather than a flush: the bytes arrive whole."""
    rng = np.random.default_rng(n)
    raw = rng.integers(0, 255, n * np.dtype(dtype).itemsize, dtype=np.uint8)
    if pinned:  # page-aligned memory of its own (two arrays in one page cannot both be registered)
        region = mmap.mmap(-1, raw.nbytes)
        src = np.frombuffer(region, dtype=np.uint8)
        src[:] = raw
        src = src.view(dtype)
    else:
        src = raw.view(dtype)
    buf = mx.array(np.zeros_like(src))  # a managed buffer, as a page's first copy is
    mx.eval(buf * 1)  # read once on the GPU: its pages migrate there, as a used page's have
    copier = CudaCopier(staging_bytes=staging, timeout=30)
    try:
        if pinned:
            assert copier.pin(src)
        copier.piece_bytes = piece
        copier.copy(np.asarray(buf), src)
        mark = copier.mark()
        deadline = time.monotonic() + 30
        while not copier.landed(mark):
            assert time.monotonic() < deadline, "the copies' mark never passed"
            time.sleep(1e-4)
        assert copier.copied_bytes == src.nbytes
        octets = buf.view(mx.uint8)
        on_gpu = octets + mx.zeros((), dtype=mx.uint8)  # a kernel reads the buffer on the device (exact)
        assert np.asarray(on_gpu).tobytes() == src.tobytes()
        assert np.asarray(buf).tobytes() == src.tobytes()
        with pytest.raises(PagingError, match="bytes into a buffer of"):
            copier.copy(np.asarray(buf)[:-1], src)
    finally:
        copier.close()
