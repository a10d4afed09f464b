"""Views of constants that a segment makes again instead of reading them from an
earlier segment (``segc/runtime/remat.py``): fewer inputs per compiled segment call,
eager's bytes kept, and off with ``SEGC_REMAKE_VIEWS=0``."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import assert_same_bits, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.models import tiny_llama
from segc.runtime import measure_segments, remat

SIGNED = mx.array([1.5, -0.0, 3.0, float("nan")])  # -0.0 and NaN: bytes a wrong path would lose


def f(x: mx.array) -> mx.array:
    b = mx.broadcast_to(SIGNED.reshape(1, 4), (2, 4))  # views of a constant, read in every segment
    h = segc.boundary(x * b, "a")
    h = segc.boundary(h + b, "b")
    return h - b.T.T


def _steps(step: object) -> tuple:
    return step.entries()[0].executor.steps  # type: ignore[attr-defined]


@pytest.mark.parametrize("on", [True, False])
def test_a_view_of_a_constant_is_made_again_where_it_is_read(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(remat, "REMAKE_VIEWS", on)
    x = mx.array([[1.0, 2.0, -3.0, 0.5], [-0.0, 4.0, 5.0, -1.0]])
    step = segc.jit(f)
    assert_same_bits([step(x)], [f(x)])
    steps = _steps(step)
    assert [s.segment.name for s in steps] == ["a", "b", "tail"]
    later = steps[1:]
    g = step.entries()[0].graph  # type: ignore[attr-defined]
    chains = remat.view_chains(g)
    shared = [v for s in later for v in s.segment.inputs if v in chains]
    assert shared, "the broadcast should cross the cuts"
    for s in later:
        if on:
            assert not set(s.names) & set(chains) and len(s.reads) < len(s.segment.inputs)
        else:
            assert s.names == s.segment.inputs
    # the per-segment measurement runs the steps as the executor does
    times = measure_segments(g, [x], repeats=1)
    assert set(times) == {"a", "b", "tail"}


def test_a_negative_zero_scalar_constant_is_never_made_again() -> None:
    """A captured scalar ``-0.0`` loses its sign in ``mx.compile`` (``compile_loses``):
    its broadcast is read from the segment that made it, as before."""
    z = mx.array(-0.0)

    def g(x: mx.array) -> mx.array:
        b = mx.broadcast_to(z, x.shape)
        h = segc.boundary(x * b, "a")
        return h * b

    x = mx.array([1.0, -2.0, 0.0])
    step = segc.jit(g)
    assert_same_bits([step(x)], [g(x)])
    graph = step.entries()[0].graph  # type: ignore[attr-defined]
    assert not remat.view_chains(graph)


def test_view_chains_only_follow_views_of_constants() -> None:
    c = mx.array([2.0, 3.0])

    def g(x: mx.array) -> mx.array:
        v = mx.broadcast_to(c, (3, 2)).T  # views of a constant: made again
        e = mx.exp(c)  # computes: read, never made again
        w = mx.broadcast_to(e, (3, 2))  # a view of a computed value: read
        return segc.boundary(x * v.T + w, "a") * v.T + w

    x = mx.ones((3, 2))
    step = segc.jit(g)
    assert_same_bits([step(x)], [g(x)])
    graph = step.entries()[0].graph  # type: ignore[attr-defined]
    chains = remat.view_chains(graph)
    vs = graph.vars()
    made = {e.prim for ch in chains.values() for e in ch}
    assert made and made <= {"Broadcast", "Transpose", "Reshape"}
    tail = _steps(step)[1]
    assert any(vs[v].shape == (3, 2) for v in tail.names if v not in chains)  # w is read


def test_decode_layers_read_fewer_inputs_with_eager_bits() -> None:
    """The tiny llama's decode, a segment per layer: the later layers read fewer inputs
    and every token's logits and caches are eager mlx-lm's bytes."""
    model = tiny_llama(num_hidden_layers=4)
    step = segc.jit(model, boundaries="layers.*", freeze_params=True)
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    t = mx.array([[3, 1, 4, 1, 5]])
    assert_same_bits([step(t, cache=cs)], [model(t, cache=ce)], "prefill")
    for i in range(3):
        tok = mx.array([[i + 7]])
        assert_same_bits([step(tok, cache=cs)], [model(tok, cache=ce)], f"decode {i}")
        assert_same_bits([c.keys for c in cs], [c.keys for c in ce], f"keys {i}")
    entries = step.entries()
    assert len(entries) == 2  # the prefill's graph and the decode's
    fewer = [len(s.reads) < len(s.segment.inputs) for e in entries for s in e.executor.steps[1:-1]]  # type: ignore[attr-defined]
    assert len(fewer) == 2 * 3 and all(fewer)  # layers 1 to 3 of each graph


VIEWS = ("broadcast", "transpose", "reshape", "slice", "squeeze", "indexed")


def _view(c: mx.array, kind: str) -> mx.array:
    """``c`` (shape (4, 6)) through a view of kind ``kind``, shape (4, 6) again, so that
    views chain (``"indexed"`` is the one that is not a view)."""
    if kind == "broadcast":
        return mx.broadcast_to(c[:1], (4, 6))
    if kind == "transpose":
        return c.T.reshape(6, 4).T  # a transpose of a transpose: the same shape, another layout
    if kind == "reshape":
        return c.reshape(6, 4).reshape(4, 6)
    if kind == "slice":
        return c[::-1][::-1]  # two reversing slices: a strided view, the same values
    if kind == "squeeze":
        return mx.expand_dims(c, 0).squeeze(0)
    return mx.expand_dims(c, 0)[0]  # "indexed": an integer index is a Gather, which computes


@settings(max_examples=examples(25), deadline=None)
@given(
    chain=st.lists(st.sampled_from(VIEWS), min_size=1, max_size=3),
    uses=st.lists(st.sampled_from(("mul", "add", "sub", "max")), min_size=2, max_size=5),
    dtype=st.sampled_from((mx.float32, mx.bfloat16, mx.float16)),
    seed=st.integers(0, 2**16),
    on=st.booleans(),
)
def test_views_of_a_constant_read_across_random_cuts_keep_eager_bits(
    chain: list[str], uses: list[str], dtype: mx.Dtype, seed: int, on: bool
) -> None:
    """A constant with -0.0, NaN and infinities, a chain of views of it, read by a
    segment after each cut, with the remake on and off: eager's bytes every time."""
    key = mx.random.key(seed)
    base = mx.random.normal((4, 6), key=key)
    special = mx.array([-0.0, float("nan"), float("inf"), -float("inf"), 0.0, 1e-30])
    const = mx.concatenate([base[:3], special[None]], axis=0).astype(dtype)
    mx.eval(const)

    def fn(x: mx.array) -> mx.array:
        v = const
        for kind in chain:
            v = _view(v, kind)
        h = x
        for i, op in enumerate(uses):
            h = {"mul": mx.multiply, "add": mx.add, "sub": mx.subtract, "max": mx.maximum}[op](h, v)
            if i < len(uses) - 1:
                h = segc.boundary(h, f"cut{i}")
        return h

    x = mx.random.normal((4, 6), key=mx.random.split(key)[0]).astype(dtype)
    old = remat.REMAKE_VIEWS
    remat.REMAKE_VIEWS = on
    try:
        step = segc.jit(fn)
        assert_same_bits([step(x)], [fn(x)])
        steps = _steps(step)
        chains = remat.view_chains(step.entries()[0].graph)  # type: ignore[attr-defined]
        read = [v for s in steps for v in s.names if v in chains]
        crossing = [v for s in steps[1:] for v in s.segment.inputs if v in chains]
        # a view of the constant crosses the cuts, unless the chain has a Gather ("indexed")
        assert crossing or "indexed" in chain, chain
        if on:
            assert not read, read  # every view of the constant made where it is read
    finally:
        remat.REMAKE_VIEWS = old
