"""Arrays a trace would leave where the caller can see them: refused with a
``StateError`` naming the place, the caller's objects put back as they were
(docs/api.md, "Arrays stored where segc does not look")."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import assert_same_bits, bits, seeded
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.models import tiny_llama


def _cache_bits(cache: list) -> list:
    return [
        (c.offset, None if c.keys is None else bits(c.keys), None if c.values is None else bits(c.values))
        for c in cache
    ]


def test_a_kv_cache_the_function_closes_over_is_refused_and_left_as_it_was() -> None:
    model = tiny_llama(num_hidden_layers=2)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[5, 6]]), cache=cache))  # a cache with content
    before = _cache_bits(cache)
    step = segc.jit(lambda t: model(t, cache=cache))  # no state=
    with pytest.raises(segc.StateError, match=r"captured 'cache'\[0\]\.keys.*state="):
        step(mx.array([[1, 2, 3]]))
    assert _cache_bits(cache) == before
    # the cache still works eagerly, as a fresh copy of the same history does
    ref = make_prompt_cache(model)
    mx.eval(model(mx.array([[5, 6]]), cache=ref))
    assert_same_bits([model(mx.array([[7]]), cache=cache)], [model(mx.array([[7]]), cache=ref)], "next step")
    # passed as state=, the same function works
    ok = segc.jit(lambda t: model(t, cache=cache), state=cache)
    want_cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[5, 6]]), cache=want_cache), model(mx.array([[7]]), cache=want_cache))
    assert_same_bits([ok(mx.array([[8]]))], [model(mx.array([[8]]), cache=want_cache)], "with state=")


def test_a_list_the_function_appends_to_is_refused_and_restored() -> None:
    seen: list = [mx.array(1.0)]
    kept = seen[0]

    def f(x: mx.array) -> mx.array:
        y = x * 2
        seen.append(y)
        return y

    with pytest.raises(segc.StateError, match=r"captured 'seen'\[1\]"):
        segc.jit(f)(mx.ones(3))
    assert len(seen) == 1 and seen[0] is kept


def test_harmless_side_effects_at_trace_time_pass() -> None:
    calls = {"n": 0}
    w = mx.ones(3)

    def f(x: mx.array) -> mx.array:
        calls["n"] += 1  # a Python counter: runs at trace time only, as under jax.jit
        return x * w

    step = segc.jit(f)
    x = mx.arange(3.0)
    assert_same_bits([step(x), step(x)], [x * w, x * w])
    assert calls["n"] == 1


class Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm(4)

    def __call__(self, x: mx.array) -> mx.array:
        return self.bn(self.lin(x))


def test_batchnorm_statistics_in_train_mode_are_refused_eval_mode_runs() -> None:
    m = seeded(Normed, 0)
    x = mx.random.normal((8, 4), key=mx.random.key(0))
    m.train()
    mean0 = bits(m.bn.running_mean)
    with pytest.raises(segc.StateError, match=r"bn\.running_mean.*eval mode"):
        segc.jit(m)(x)
    assert bits(m.bn.running_mean) == mean0
    m.eval()
    assert_same_bits([segc.jit(m)(x)], [m(x)], "eval mode")


@pytest.mark.parametrize("how", ["setitem", "iadd"])
def test_a_write_into_an_argument_is_refused_and_the_argument_left_alone(how: str) -> None:
    def f(a: mx.array) -> mx.array:
        if how == "setitem":
            a[0] = 100.0
        else:
            a += 1.0
        return a * 2

    x = mx.zeros((2, 2))
    before = bits(x)
    with pytest.raises(segc.StateError, match=r"writes into its argument args\[0\] in place"):
        segc.jit(f)(x)
    assert bits(x) == before
    g = lambda a: a.at[0].add(100.0) * 2  # noqa: E731 - the functional form traces
    assert_same_bits([segc.jit(g)(x)], [g(x)])


class Lazy(nn.Module):
    """Keeps a table it computes on first use (as lazy RoPE implementations do)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self._cos: mx.array | None = None

    def __call__(self, x: mx.array) -> mx.array:
        if self._cos is None:
            self._cos = mx.cos(mx.arange(4, dtype=mx.float32))
        return self.lin(x) * self._cos


def test_a_table_of_constants_kept_on_first_use_is_left_alone() -> None:
    m = seeded(Lazy, 0)
    ref = seeded(Lazy, 0)
    x = mx.ones((2, 4))
    step = segc.jit(lambda t: m(t))  # m reached as a captured object, not traced as the jit's module
    assert_same_bits([step(x), step(x)], [ref(x), ref(x)])
    assert m._cos is not None
    assert_same_bits([m._cos], [mx.cos(mx.arange(4, dtype=mx.float32))], "the kept table")


class Proxy:
    """An object whose every attribute lookup raises (a context-local outside its context)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> None:
        raise RuntimeError(f"not configured: {name}")


PROXY = Proxy()


def test_a_global_whose_lookups_raise_is_passed_over() -> None:
    def f(x: mx.array) -> mx.array:
        _ = PROXY
        return x + 1

    x = mx.ones((3,))
    assert_same_bits([segc.jit(f)(x)], [f(x)])


def test_a_jitted_function_is_freed_with_its_last_reference() -> None:
    import weakref

    step = segc.jit(lambda a: a * 2)
    step(mx.ones(2))
    ref = weakref.ref(step)
    del step
    assert ref() is None  # no cycle through step.__call__


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"boundaries": "layers.*"},
        {"boundaries": "layers.*", "concat_projections": True, "freeze_params": True},
        {"boundaries": "layers.*", "drain": True},
        {"boundaries": "layers.*", "commit": "segment"},
    ],
    ids=["defaults", "layers", "frozen", "drain", "segment"],
)
def test_a_cached_call_leaves_no_reference_cycles(options: dict) -> None:
    """A decode step's cached call, and the trees it flattens and rebuilds, free what
    they made when the call returns: nothing is left for Python's cyclic collector
    (a closure that referred to itself kept each call's outputs alive until it ran)."""
    import gc

    from segc.trace.pytree import flatten, unflatten

    model = tiny_llama(num_hidden_layers=2)
    cache = make_prompt_cache(model)
    step = segc.jit(model, **options)
    mx.eval(step(mx.array([[1, 2]]), cache=cache))  # traced here
    mx.eval(step(mx.array([[3]]), cache=cache))  # and the decode shape
    gc.collect()
    gc.disable()
    try:
        for t in (4, 5, 6):
            mx.eval(step(mx.array([[t]]), cache=cache))
        leaves, _, td = flatten(({"a": [mx.ones(2), 3]}, (mx.zeros(1),)))
        unflatten(td, leaves)
        assert gc.collect() == 0
    finally:
        gc.enable()
