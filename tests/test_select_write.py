"""A one-position write at an array index lowered as a select (``segc.lower.shapes``).

On CUDA segc lowers such a ``DynamicSliceUpdate`` (its dynamic KV cache's decode write)
as ``where(arange == index, update, buffer)``, because MLX's own costs a kernel more and
about 15 us of host time. It must copy the same bytes as ``mx.slice_update``, whatever
the values (-0.0, NaN payloads); these tests force the select on this machine
(``SELECT_WRITE = "always"``) and compare with eager MLX byte for byte.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples, same_bits, state_close
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.ir import Eqn, Var
from segc.lower import kvwrite, shapes
from segc.models.zoo import build

DTYPES = [mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.uint8]


@pytest.fixture
def always(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The select forced on; returns a list that grows by one for each select made."""
    monkeypatch.setattr(shapes, "SELECT_WRITE", "always")
    made: list[int] = []
    pick = shapes._select_write

    def counted(x: mx.array, u: mx.array, axes) -> int | None:
        a = pick(x, u, axes)
        if a is not None:
            made.append(a)
        return a

    monkeypatch.setattr(shapes, "_select_write", counted)
    return made


def _odd_values(shape: tuple[int, ...], dtype: mx.Dtype, seed: int) -> mx.array:
    """Random bytes (NaNs with payloads, -0.0, infinities among them for floats)."""
    r = np.random.default_rng(seed)
    raw = r.integers(0, 256, size=int(np.prod(shape)) * dtype.size, dtype=np.uint8)
    return mx.array(raw).view(dtype).reshape(shape)


def _lower(x: mx.array, u: mx.array, start: mx.array, axis: int) -> mx.array:
    e = Eqn(0, "DynamicSliceUpdate", ("x", "u", "s"), (Var("y", x.shape, "float32"),), ((axis,),))
    return shapes._dynamic_slice_update([x, u, start], ((axis,),), e)


# the fixture's counter is cleared at the start of each example
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dt=hst.sampled_from(DTYPES),
    shape=hst.lists(hst.integers(1, 5), min_size=1, max_size=4),
    data=hst.data(),
    seed=hst.integers(0, 2**31),
)
def test_select_write_copies_the_bytes_slice_update_writes(dt, shape, data, seed, always) -> None:
    always.clear()
    axis = data.draw(hst.integers(0, len(shape) - 1))
    pos = data.draw(hst.integers(0, shape[axis] - 1))
    x = _odd_values(tuple(shape), dt, seed)
    ushape = list(shape)
    ushape[axis] = 1
    u = _odd_values(tuple(ushape), dt, seed + 1)
    start = mx.array([pos], dtype=mx.int32)
    want = mx.slice_update(x, u, start, [axis])
    got = _lower(x, u, start, axis)
    assert always == [axis], "the select was not made"
    assert same_bits(got, want)


def test_select_write_is_not_made_where_it_does_not_pay(always, monkeypatch: pytest.MonkeyPatch) -> None:
    x = mx.zeros((2, 8, 4))
    start = mx.array([3], dtype=mx.int32)
    for u, axis in [
        (mx.ones((2, 2, 4)), 1),  # two positions: the select cannot place them
        (mx.ones((1, 1, 4)), 1),  # not the whole of the other axes
    ]:
        assert same_bits(_lower(x, u, start, axis), mx.slice_update(x, u, start, [axis]))
    monkeypatch.setattr(shapes, "SELECT_WRITE_BYTES", x.nbytes - 1)  # a buffer over the limit
    u = mx.ones((2, 1, 4))
    assert same_bits(_lower(x, u, start, 1), mx.slice_update(x, u, start, [1]))
    assert always == []
    monkeypatch.setattr(shapes, "SELECT_WRITE", "auto")  # on this CPU: MLX's own write
    monkeypatch.setattr(shapes, "SELECT_WRITE_BYTES", 8 << 20)
    assert shapes._select_write(x, u, (1,)) is None or mx.default_device() == mx.gpu


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_decode_with_select_writes_keeps_the_bits(dtype, always, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-layer llama: prompt, then decode across a growth of the KV buffers (256 ->
    512 positions). segc with the select writes against segc with MLX's writes: logits
    and caches byte for byte (on every device); against eager mlx-lm: byte for byte on
    the CPU, within the GPU bound elsewhere (``conftest.state_close``; segc's dynamic
    decode graph is not eager's there, docs/models.md). The writes stay selects here:
    on CUDA a write whose keys are rotated is otherwise ``kvwrite.py``'s kernel."""
    monkeypatch.setattr(kvwrite, "FUSED_KV_WRITE", "never")
    model = build("llama", num_hidden_layers=2, dtype=dtype)
    sel, dsu = segc.jit(model, validate=False), segc.jit(model, validate=False)

    def with_dsu(*a, **k):  # MLX's own write wherever this jit lowers (it retraces at growth)
        monkeypatch.setattr(shapes, "SELECT_WRITE", "never")
        try:
            return dsu(*a, **k)
        finally:
            monkeypatch.setattr(shapes, "SELECT_WRITE", "always")

    ce, cs, cd = make_prompt_cache(model), make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[(5 * i + 1) % 128 for i in range(250)]])
    le, ls, ld = model(prompt, cache=ce), sel(prompt, cache=cs), with_dsu(prompt, cache=cd)
    for k in range(10):
        t = mx.argmax(ld[:, -1:], -1)
        le, ls, ld = model(t, cache=ce), sel(t, cache=cs), with_dsu(t, cache=cd)
        assert same_bits(ls, ld), f"decode step {k}: logits, select against MLX's write"
        assert state_close(le, ls), f"decode step {k}: logits against eager"
        for a, b, c in zip(ce, cs, cd):
            assert a.offset == b.offset == c.offset
            n = a.offset
            for x, y, z in ((a.keys, b.keys, c.keys), (a.values, b.values, c.values)):
                assert same_bits(y, z), f"decode step {k}: a cache buffer, select against MLX's write"
                assert state_close(x[..., :n, :], y[..., :n, :]), f"decode step {k}: a cache against eager"
    assert always, "no decode write was made a select"
