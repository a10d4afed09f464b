"""segc's host reads of arrays (``dtypes.to_bytes``): on MLX's CUDA build each reads a
copy made for the purpose and then empties MLX's buffer cache, so that no buffer the host
read (which MLX moves into managed memory for good) is handed to a later kernel
(docs/gpu.md, "Host reads and managed memory"). The copy must have the array's bytes
exactly; these compare against NumPy's own reading of the array. The CUDA path itself is
taken here on the CPU by saying it is CUDA (the copy and the cache's emptying are the
same calls there); that the buffers then stay in device memory is measured on a GPU
(``benchmarks/kvattn_stamps.py --where``)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from segc import dtypes, parse
from segc.ir import Const, Graph, Var, to_text
from segc.lower import concat

_WORDS = {1: (mx.uint8, np.uint8), 2: (mx.uint16, np.uint16), 4: (mx.uint32, np.uint32), 8: (mx.uint64, np.uint64)}
_TYPES = [mx.float32, mx.float16, mx.bfloat16, mx.int8, mx.int32, mx.uint8, mx.bool_, mx.int64, mx.complex64]


def _numpy_bytes(a: mx.array) -> bytes:
    """The bytes as NumPy reads them (bfloat16 through its 16-bit view), not segc's code."""
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.ascontiguousarray(np.array(a)).tobytes()


def _patterned(dtype: mx.Dtype, shape: tuple[int, ...], seed: int) -> mx.array:
    """Arbitrary bit patterns of ``dtype`` (NaNs with payloads, -0.0, infinities
    included), made as unsigned words and viewed."""
    word, npword = _WORDS[dtype.size]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, np.iinfo(npword).max, size=shape, dtype=npword, endpoint=True)
    if dtype == mx.bool_:
        raw = raw & 1
    return mx.array(raw).astype(word).view(dtype) if dtype != mx.bool_ else mx.array(raw.astype(np.bool_))


@settings(max_examples=examples(60), deadline=None)
@given(
    dtype=st.sampled_from(_TYPES),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    strided=st.booleans(),
)
def test_the_copy_has_the_arrays_bytes(dtype: mx.Dtype, shape: list[int], seed: int, strided: bool) -> None:
    a = _patterned(dtype, tuple(shape), seed)
    if strided:
        a = a[..., ::2]  # a view with strides: the copy is contiguous, in row order
    want = _numpy_bytes(a)
    b = a.view(mx.uint16) if a.dtype == mx.bfloat16 else a
    assert dtypes.read_apart([b]) == [want]


def test_negative_zero_and_a_nan_payload_survive() -> None:
    """The cases a float copy would lose: -0.0 and a NaN's payload bits."""
    a = mx.array(np.array([0x80000000, 0x7FC00001, 0xFFA00000], dtype=np.uint32)).view(mx.float32)
    assert dtypes.read_apart([a])[0] == np.array([0x80000000, 0x7FC00001, 0xFFA00000], dtype="<u4").tobytes()


@pytest.fixture(name="cuda_reads")
def _cuda_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``to_bytes`` as on MLX's CUDA build; the cache's emptyings counted."""
    emptied: list[int] = []
    clear = mx.clear_cache
    monkeypatch.setattr(dtypes, "on_cuda", lambda: True)
    monkeypatch.setattr(dtypes.mx, "clear_cache", lambda: (emptied.append(1), clear())[1])
    return emptied


def test_on_cuda_to_bytes_reads_a_copy_and_empties_the_cache(cuda_reads: list[int]) -> None:
    for i, dtype in enumerate(_TYPES):
        a = _patterned(dtype, (3, 4), i)
        assert dtypes.to_bytes(a) == _numpy_bytes(a)
    assert len(cuda_reads) == len(_TYPES)


@settings(max_examples=examples(30), deadline=None)
@given(
    picks=st.lists(st.tuples(st.sampled_from(_TYPES), st.integers(0, 4), st.integers(0, 2**16)), max_size=6),
    cuda=st.booleans(),
)
def test_to_bytes_many_reads_each_and_on_cuda_empties_the_cache_once(
    picks: list[tuple[mx.Dtype, int, int]], cuda: bool
) -> None:
    """Empty arrays (no copy, no bytes) between others keep their places; only empty
    ones: nothing evaluated, the cache kept."""
    arrays = [_patterned(d, (n, 3), seed) for d, n, seed in picks]
    emptied: list[int] = []
    clear = mx.clear_cache
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dtypes, "on_cuda", lambda: cuda)
        m.setattr(dtypes.mx, "clear_cache", lambda: (emptied.append(1), clear())[1])
        got = dtypes.to_bytes_many(arrays)
    assert got == [_numpy_bytes(a) if a.size else b"" for a in arrays]
    assert len(emptied) == (1 if cuda and any(a.size for a in arrays) else 0)


def test_elsewhere_to_bytes_reads_the_array_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: off CUDA no copy is made and the cache is kept."""
    emptied: list[int] = []
    monkeypatch.setattr(dtypes, "on_cuda", lambda: False)
    monkeypatch.setattr(dtypes.mx, "clear_cache", lambda: emptied.append(1))
    a = _patterned(mx.float32, (2, 3), 5)
    assert dtypes.to_bytes(a) == _numpy_bytes(a) and emptied == []


def test_the_projections_check_reads_through_it(cuda_reads: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """``concat.same_bits``'s draws (a decode layer's query, key and value products, the
    check whose buffers were left in MLX's cache): every product it reads is read
    through ``to_bytes``'s copy, a slice and its product together, and the verdict is
    the same."""
    monkeypatch.setattr(concat, "_KNOWN", {})
    x = Var("x", (1, 1, 64), "bf16")
    assert concat.same_bits("Matmul", x, [[(64, 64)], [(16, 64)], [(16, 64)]], ["bf16"], ()) is True
    assert len(cuda_reads) == 3 * concat.DRAWS  # each draw: three slices, each read with its product


@settings(max_examples=examples(40), deadline=None)
@given(
    picks=st.tuples(st.sampled_from(_TYPES), st.sampled_from(_TYPES)),
    shapes=st.tuples(st.sampled_from([(2, 3), (3, 2), (6,), (0, 3)]), st.sampled_from([(2, 3), (3, 2), (6,), (0, 3)])),
    seeds=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    cuda=st.booleans(),
)
def test_same_bytes_is_dtype_shape_and_numpys_bytes(
    picks: tuple[mx.Dtype, mx.Dtype], shapes: tuple[tuple[int, ...], ...], seeds: tuple[int, int], cuda: bool
) -> None:
    """Seeds drawn from four so that equal arrays come up; on CUDA one emptying of the
    cache for the pair (none where there is nothing to read or nothing to compare)."""
    a, b = (_patterned(d, s, seed) for d, s, seed in zip(picks, shapes, seeds, strict=True))
    emptied: list[int] = []
    clear = mx.clear_cache
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dtypes, "on_cuda", lambda: cuda)
        m.setattr(dtypes.mx, "clear_cache", lambda: (emptied.append(1), clear())[1])
        got = dtypes.same_bytes(a, b)
    alike = a.dtype == b.dtype and a.shape == b.shape
    assert got == (alike and _numpy_bytes(a) == _numpy_bytes(b))
    assert len(emptied) == (1 if cuda and alike and a.size else 0)


def test_same_bytes_tells_negative_zero_and_nan_payloads_apart() -> None:
    """What ``mx.array_equal`` cannot: -0.0 against 0.0, and two NaNs' payloads."""

    def f32(*words: int) -> mx.array:
        return mx.array(np.array(words, dtype=np.uint32)).view(mx.float32)

    assert not dtypes.same_bytes(f32(0x80000000), f32(0))
    assert not dtypes.same_bytes(f32(0x7FC00001), f32(0x7FC00000))
    assert dtypes.same_bytes(f32(0x7FC00001, 5), f32(0x7FC00001, 5))


def _constants_graph(values: list[mx.array]) -> Graph:
    consts = tuple(Const(Var(f"c{i}", tuple(v.shape), dtypes.short(v.dtype)), v) for i, v in enumerate(values))
    return Graph("k", (), consts, (), tuple(c.var.name for c in consts))


def test_printing_reads_the_constants_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph's shown constants read with one emptying of the cache on CUDA (one a
    constant before), an elided one not read, and the text the same as off CUDA."""
    values = [_patterned(d, (2, 3), i) for i, d in enumerate([mx.float32, mx.bfloat16, mx.int32, mx.uint8])]
    g = _constants_graph([*values, mx.zeros((128, 256))])
    off = to_text(g)
    emptied: list[int] = []
    clear = mx.clear_cache
    monkeypatch.setattr(dtypes, "on_cuda", lambda: True)
    monkeypatch.setattr(dtypes.mx, "clear_cache", lambda: (emptied.append(1), clear())[1])
    assert to_text(g) == off and len(emptied) == 1
    assert off.count("= elided") == 1
    back = parse(off).consts
    assert [_numpy_bytes(c.value) for c in back[: len(values)]] == [_numpy_bytes(v) for v in values]


def test_constants_compare_by_bytes_read_once(cuda_reads: list[int]) -> None:
    """-0.0 and 0.0 are different constants; equal bytes are one; one read for the pair."""
    zero = mx.array(np.array([0], dtype=np.uint32)).view(mx.float32)
    negzero = mx.array(np.array([0x80000000], dtype=np.uint32)).view(mx.float32)
    a, b, c = (_constants_graph([v]).consts[0] for v in (zero, negzero, mx.array([0.0])))
    assert a != b and a == c
    assert len(cuda_reads) == 2
