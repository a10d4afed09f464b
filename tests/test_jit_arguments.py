"""Arguments as a JAX user passes them: namedtuples and OrderedDicts keep their class
both ways; any hashable static value keys the cache; misspelt options are refused."""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict, namedtuple

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import Net, assert_same_bits, seeded

import segc

Pair = namedtuple("Pair", "a b")


def test_namedtuple_in_and_out_and_ordered_dict_out() -> None:
    x, y = mx.arange(3.0), mx.ones(3)
    step = segc.jit(lambda p: Pair(p.a + p.b, p.a * p.b))
    got = step(Pair(x, y))
    assert type(got) is Pair
    assert_same_bits(list(got), [x + y, x * y])
    od = segc.jit(lambda a: OrderedDict(z=a, y=a + 1))(x)
    assert type(od) is OrderedDict and list(od) == ["z", "y"]
    assert_same_bits(list(od.values()), [x, x + 1])


class Kind(enum.Enum):
    DOUBLE = 2
    TRIPLE = 3


@dataclasses.dataclass(frozen=True)
class Opts:
    k: int


def test_any_hashable_static_value_keys_the_cache() -> None:
    x = mx.arange(4.0)

    def f(a: mx.array, dt: mx.Dtype, kind: Kind, opts: Opts, g: object) -> mx.array:
        return g(a * kind.value + opts.k).astype(dt)  # type: ignore[operator]

    step = segc.jit(f, static_argnums=(2, 3, 4))
    for dt, kind, opts, g in [
        (mx.float16, Kind.DOUBLE, Opts(1), mx.exp),
        (mx.float32, Kind.DOUBLE, Opts(1), mx.exp),
        (mx.float32, Kind.TRIPLE, Opts(1), mx.exp),
        (mx.float32, Kind.TRIPLE, Opts(2), mx.exp),
        (mx.float32, Kind.TRIPLE, Opts(2), mx.sin),
    ]:
        assert_same_bits([step(x, dt, kind, opts, g)], [f(x, dt, kind, opts, g)], f"{dt} {kind} {opts} {g}")
    assert step.cache_info().misses == 5


def test_misspelt_options_are_refused() -> None:
    with pytest.raises(segc.TraceError, match=r"static_argnames \['typo'\] name no parameter"):
        segc.jit(lambda a, b: a + b, static_argnames=("typo",))
    segc.jit(lambda a, **kw: a, static_argnames=("anything",))  # **kwargs: any name may come
    net = seeded(lambda: Net(4, 2, 2), 0)
    with pytest.raises(segc.TraceError, match=r"boundaries \['layerz\.\*'\] match no submodule"):
        segc.jit(net, boundaries=["layers.*", "layerz.*"])
    with pytest.warns(segc.SegcWarning, match="found no list of blocks"):
        segc.jit(nn.Linear(2, 2), boundaries="auto")


@pytest.mark.parametrize("state", [5, "abc", object()])
def test_state_must_be_a_list(state: object) -> None:
    with pytest.raises(segc.StateError, match="takes a list"):
        segc.jit(lambda a: a, state=state)
    step = segc.jit(lambda a: a * 2, state=lambda: state)
    with pytest.raises(segc.StateError, match="returned a"):
        step(mx.ones(2))


def test_a_misspelt_strategy_is_refused_when_jitting() -> None:
    with pytest.raises(segc.ScheduleError, match="no strategy 'balancd'"):
        segc.jit(lambda a: a, strategy="balancd:2")
