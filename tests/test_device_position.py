"""The decode offset made on the device (``segc.trace.kvcache._on_device``): on CUDA the
offset every cache of a call shares is four copies of the host's scalar made by a
kernel (device memory rather than MLX's managed scalar pool). It must be the same value,
dtype and shape as the host's scalar, and a decode with it the same bits as eager's. The
CPU build has no CUDA, so the tests stand it in (``_device_position``); whether it is
faster is a GPU figure (``benchmarks/gpu_decode.sh offset``), never a test."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from conftest import assert_decodes_agree, bits, examples
from hypothesis import given, settings
from hypothesis import strategies as hst

import segc
from segc.models.tiny import tiny_llama
from segc.trace import kvcache

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")


@pytest.fixture
def on_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's offset, as on CUDA; the positions made before it forgotten."""
    monkeypatch.setattr(kvcache, "_device_position", lambda: True)
    monkeypatch.setattr(kvcache, "_POSITIONS", {})


@settings(max_examples=examples(30), deadline=None)
@given(n=hst.integers(0, 2**31 - 1))
def test_the_devices_offset_is_the_hosts_value(n: int) -> None:
    """Value, dtype and shape of the host's ``int32`` scalar, whatever the offset."""
    want = mx.array(n, dtype=mx.int32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kvcache, "_device_position", lambda: True)
        got = kvcache._on_device(mx.array(n, dtype=mx.int32))
    assert bits(got) == bits(want)
    assert got.item() == n


def test_one_offset_serves_every_cache_of_a_call(on_device: None) -> None:
    """The positions' cache hands the same device array to every cache of a call."""
    a, b = kvcache.position(7), kvcache.position(7)
    assert a is b and a.item() == 7 and a.shape == () and a.dtype == mx.int32


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SEGC_DEVICE_POSITION=0`` keeps the host's scalar; without CUDA it is always kept."""
    monkeypatch.setenv("SEGC_DEVICE_POSITION", "0")
    assert kvcache._device_position() is False
    monkeypatch.setenv("SEGC_DEVICE_POSITION", "1")
    assert kvcache._device_position() is mx.cuda.is_available()


def test_a_decode_with_it_keeps_eagers_bits(on_device: None) -> None:
    """A jitted llama's decode (prompt and ten steps, caches too) against eager mlx-lm,
    byte for byte, with the device's offset in every step."""
    model: Any = tiny_llama(seed=3)
    step = segc.jit(model, validate=False)
    assert_decodes_agree(model, step, model)
    assert kvcache._POSITIONS, "no decode step made its offset"
