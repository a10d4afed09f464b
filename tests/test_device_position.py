"""``SEGC_DEVICE_POSITION=1``: the KV caches' offset as the last element of a 16-byte array
a kernel makes on the device rather than a host-made scalar (which MLX's CUDA build keeps in a managed
pool the host writes; docs/gpu.md, "Host reads and managed memory"). The setting acts
on CUDA only; here it is taken on the CPU by saying it is CUDA, and a decode through it
must keep eager's bits and the caches' offsets."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from conftest import assert_decodes_agree

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")
import segc
from segc.errors import UsageError
from segc.models import tiny_llama
from segc.trace import kvcache


@pytest.fixture(name="on_device")
def _on_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGC_DEVICE_POSITION", "1")
    monkeypatch.setattr(kvcache, "on_cuda", lambda: True)
    monkeypatch.setattr(kvcache, "_POSITIONS", {})


@pytest.mark.parametrize("n", [0, 7, 1023, 2**31 - 1])
def test_the_position_is_an_int32_scalar_of_the_offset(on_device: None, n: int) -> None:
    a = kvcache.position(n)
    assert a.shape == () and a.dtype == mx.int32 and a.item() == n
    assert kvcache.position(n) is a  # one object for every cache of a call


def test_a_bad_value_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGC_DEVICE_POSITION", "yes")
    monkeypatch.setattr(kvcache, "_POSITIONS", {})
    with pytest.raises(UsageError, match="SEGC_DEVICE_POSITION"):
        kvcache.position(3)


def test_a_decode_through_it_keeps_eagers_bits(on_device: None, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    arange = mx.arange
    # (the positions' aranges have a start and a stop; the masks' a stop alone)
    monkeypatch.setattr(kvcache.mx, "arange", lambda *a, **k: (made.extend(a[1:] and [a[1] - 1]), arange(*a, **k))[1])
    model: Any = tiny_llama(num_hidden_layers=2)
    ref = model if mx.default_device() == mx.cpu else segc.jit(model)
    assert_decodes_agree(model, segc.jit(model, boundaries="layers.*"), ref, steps=5)
    # every call's offset made on the device, once for both caches: the 12-token prompt's
    # 0, then the five decode steps'
    assert [v for v in made if isinstance(v, int)] == [0, 12, 13, 14, 15, 16]
