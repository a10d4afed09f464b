"""segc.jit end to end on small functions and modules: tracing, cache, stages, errors."""

from __future__ import annotations

import os
import tempfile

import mlx.core as mx
import numpy as np
import pytest
from conftest import Block, Net, same_bits, seeded

import segc
from segc.ir import CUT
from segc.lower import PRIMS


def _mlp(x: mx.array, w: mx.array) -> mx.array:
    h = mx.maximum(x @ w, 0.0)
    h = segc.boundary(h, "relu")
    return mx.sum(mx.exp(h) * 0.5, axis=-1)


@pytest.fixture
def net() -> Net:
    return seeded(Net, 1)


def test_boundary_is_an_exact_identity_eagerly() -> None:
    x = mx.random.normal((4, 8))
    w = mx.random.normal((8, 8))
    y = segc.boundary(x, "b")
    assert same_bits(y, x)
    tree = segc.boundary({"a": x, "b": [w, 3]}, "t")
    assert same_bits(tree["a"], x) and same_bits(tree["b"][0], w) and tree["b"][1] == 3
    f = segc.jit(_mlp)
    assert same_bits(f(x, w), _mlp(x, w))


def test_function_markers_become_cuts_and_segments() -> None:
    x, w = mx.random.normal((4, 8)), mx.random.normal((8, 8))
    low = segc.jit(_mlp).lower(x, w)
    cuts = [e for e in low.graph.eqns if e.prim == CUT]
    assert [c.args for c in cuts] == [("relu",)]
    assert [s.name for s in low.segments] == ["relu", "tail"]
    assert "Depends" not in low.as_text()


def test_module_globs_cut_after_each_layer(net: Net) -> None:
    x = mx.random.normal((2, 16))
    step = segc.jit(net, boundaries="layers.*")
    low = step.lower(x)
    assert [s.name for s in low.segments] == ["layers.0", "layers.1", "layers.2", "tail"]
    assert same_bits(step(x), net(x))
    # the module is handed back untouched: no proxies, the same parameter arrays
    assert all(isinstance(layer, Block) for layer in net.layers)


def test_glob_matches_whole_path_components(net: Net) -> None:
    x = mx.random.normal((2, 16))
    low = segc.jit(net, boundaries=["layers.*.norm"]).lower(x)
    assert [s.name for s in low.segments] == ["layers.0.norm", "layers.1.norm", "layers.2.norm", "tail"]
    with pytest.raises(segc.TraceError, match="match no submodule"):
        segc.jit(net, boundaries="blocks.*")


def test_parameters_are_named_inputs_not_constants(net: Net) -> None:
    x = mx.random.normal((2, 16))
    g = segc.jit(net).lower(x).graph
    params = {i.path for i in g.inputs if i.kind == "param"}
    assert "layers.0.lin.weight" in params and "head.bias" in params
    assert all(c.var.nbytes < 64 for c in g.consts)
    # new parameter values flow through without a retrace
    step = segc.jit(net, boundaries="layers.*")
    y0 = step(x)
    net.head.weight = net.head.weight * 2
    y1 = step(x)
    assert step.cache_info().misses == 1
    assert same_bits(y1, net(x)) and not same_bits(y0, y1)


def test_stable_equation_ids_across_traces(net: Net) -> None:
    x = mx.random.normal((2, 16))
    g1 = segc.jit(net, boundaries="layers.*").lower(x).graph
    g2 = segc.jit(net, boundaries="layers.*").lower(x).graph
    assert [e.id for e in g1.eqns] == [e.id for e in g2.eqns]
    assert g1 == g2 and g1.fingerprint() == g2.fingerprint()


def test_lowered_text_parses_back(net: Net) -> None:
    low = segc.jit(net, boundaries="layers.*").lower(mx.random.normal((2, 16)))
    assert "-- segment 0 'layers.0'" in low.as_text()
    assert segc.parse(low.as_text()) == low.graph


def test_cache_hits_and_readable_retrace_reasons() -> None:
    f = segc.jit(lambda x, y: x * y + 1)
    a, b = mx.ones((2, 3)), mx.ones((2, 3))
    f(a, b)
    f(a, b)
    f(mx.ones((4, 3)), mx.ones((4, 3)))
    f(a.astype(mx.float16), b)
    f(a, y=b)
    info = f.cache_info()
    assert (info.hits, info.misses) == (1, 4)
    assert info.retraces[0] == "first call"
    assert "args[0]: f32[2,3] -> f32[4,3]" in info.retraces[1]
    assert "f16[2,3]" in info.retraces[2]
    assert "argument structure changed" in info.retraces[3]


def test_retrace_reason_names_the_path_against_the_nearest_cached_entry() -> None:
    f = segc.jit(lambda d: d["x"] * d["y"][1])
    x, y = mx.ones((2, 3)), mx.ones((2, 3))
    f({"x": x, "y": [x, y]})
    f({"x": x[:1], "y": [x[:1], y[:1]]})  # a second entry, now the latest call
    f({"x": x, "y": [x, y.astype(mx.float16)]})  # nearest: the first entry, not the previous call
    assert f.cache_info().retraces[2] == "args[0]['y'][1]: f32[2,3] -> f16[2,3]"


def test_static_arguments_are_part_of_the_key() -> None:
    def f(x: mx.array, n: int, *, mode: str = "a") -> mx.array:
        return x * n if mode == "a" else x + n

    g = segc.jit(f, static_argnames="mode")
    x = mx.arange(4, dtype=mx.float32)
    assert same_bits(g(x, 3), f(x, 3))
    assert same_bits(g(x, 3, mode="b"), f(x, 3, mode="b"))
    assert same_bits(g(x, 5), f(x, 5))
    assert g.cache_info().misses == 3


def test_pytrees_in_and_out() -> None:
    def f(d: dict, xs: list) -> tuple:
        return {"s": d["a"] + xs[0]}, [xs[1] * 2, None]

    g = segc.jit(f)
    d, xs = {"a": mx.ones((3,))}, [mx.arange(3, dtype=mx.float32), mx.ones((2,))]
    out = g(d, xs)
    ref = f(d, xs)
    assert same_bits(out[0]["s"], ref[0]["s"])
    assert same_bits(out[1][0], ref[1][0]) and out[1][1] is None


def test_outputs_that_are_inputs_or_constants() -> None:
    c = mx.array([1.0, 2.0])
    g = segc.jit(lambda x: (x, c, x + c))
    x = mx.array([3.0, 4.0])
    a, b, s = g(x)
    assert same_bits(a, x) and same_bits(b, c) and same_bits(s, x + c)


def test_drain_baseline_gives_the_same_bits(net: Net) -> None:
    x = mx.random.normal((2, 16))
    a = segc.jit(net, boundaries="layers.*")(x)
    b = segc.jit(net, boundaries="layers.*", drain=True)(x)
    assert same_bits(a, b) and same_bits(a, net(x))


# ------------------------------------------------------------------ bad input


def test_non_array_leaf_is_a_clear_error() -> None:
    f = segc.jit(lambda x: x + 1)
    with pytest.raises(segc.TraceError, match=r"argument args\[0\] is a numpy.ndarray"):
        f(np.ones(3))
    with pytest.raises(segc.TraceError, match=r"args\[0\]\[1\] is a builtins.object"):
        f([mx.ones(3), object()])
    assert f.cache_info().misses == 0


def test_non_array_output_is_a_clear_error() -> None:
    with pytest.raises(segc.TraceError, match="output"):
        segc.jit(lambda x: (x + 1, object()))(mx.ones(2))


def test_lazy_weights_from_mx_load_are_a_clear_error() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.safetensors")
        mx.save_safetensors(path, {"w": mx.ones((3, 3))})
        w = mx.load(path)["w"]  # lazy: nothing read yet
        f = segc.jit(lambda x: x @ w)
        with pytest.raises(segc.UnsupportedPrimitive, match=r"Load.*mx\.eval") as info:
            f(mx.ones((2, 3)))
        assert info.value.primitive == "Load"
        mx.eval(w)
        assert same_bits(f(mx.ones((2, 3))), mx.ones((2, 3)) @ w)


def test_module_state_is_untouched_after_a_failed_trace(net: Net) -> None:
    before = {k: v for k, v in net.parameters().items()}

    def bad(x: mx.array) -> mx.array:
        raise ValueError("boom")

    net.layers[1].__call__ = bad  # instance attribute: not what Module calls
    step = segc.jit(net, boundaries="layers.*")
    with pytest.raises(segc.TraceError, match="object"):
        step(object())  # type: ignore[arg-type]
    assert net.parameters().keys() == before.keys()
    assert all(isinstance(layer, Block) for layer in net.layers)


def test_unexportable_primitive_is_named() -> None:
    f = segc.jit(lambda x: mx.contiguous(x.T) * 2)
    with pytest.raises(segc.UnsupportedPrimitive, match="Contiguous"):
        f(mx.ones((3, 4)))


def test_primitive_without_rule_fails_before_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(PRIMS, "Exp")
    x, w = mx.random.normal((4, 8)), mx.random.normal((8, 8))
    low = segc.jit(_mlp).lower(x, w)
    with pytest.raises(segc.UnsupportedPrimitive, match=r"'Exp'.*after boundary 'relu'") as info:
        low.compile()
    assert info.value.primitive == "Exp"


def test_compiled_refuses_a_mismatched_pytree() -> None:
    f = segc.jit(lambda x, y: x + y)
    c = f.lower(mx.ones(3), mx.ones(3)).compile()
    assert same_bits(c(mx.ones(3), mx.ones(3)), mx.full((3,), 2.0))
    with pytest.raises(segc.SignatureError, match="argument structure changed"):
        c((mx.ones(3),), mx.ones(3))
    with pytest.raises(segc.SignatureError, match="f32\\[3\\] -> f32\\[4\\]"):
        c(mx.ones(4), mx.ones(3))


def test_jit_rejects_non_callables_and_bad_static() -> None:
    with pytest.raises(segc.TraceError, match=r"function or an nn\.Module"):
        segc.jit(3)
    f = segc.jit(lambda x, s: x, static_argnums=1)
    with pytest.raises(segc.SignatureError, match="not hashable"):
        f(mx.ones(2), [1])
    with pytest.raises(segc.TraceError, match="non-empty string"):
        segc.boundary(mx.ones(2), "")


def test_calls_that_do_not_fit_the_signature_are_signature_errors(net: Net) -> None:
    step = segc.jit(net)
    with pytest.raises(segc.SignatureError, match="missing a required argument: 'x'"):
        step()
    with pytest.raises(segc.SignatureError, match="unexpected keyword argument 'foo'"):
        step(mx.ones((2, 16)), foo=1)
    assert step.cache_info().misses == 0


def test_bad_jit_options_are_named() -> None:
    with pytest.raises(segc.TraceError, match="boundaries= takes a glob"):
        segc.jit(Net(), boundaries=3)
    with pytest.raises(segc.TraceError, match="static_argnums takes ints"):
        segc.jit(lambda x: x, static_argnums="a")
    with pytest.raises(segc.TraceError, match="static_argnames takes strings"):
        segc.jit(lambda x: x, static_argnames=[1])


def test_errors_inside_mlx_during_a_trace_name_the_function() -> None:
    def f(x: mx.array, y: mx.array) -> mx.array:
        return x @ y

    with pytest.raises(segc.TraceError, match=r"tracing .*f failed: \[matmul\]"):
        segc.jit(f)(mx.ones((2, 3)), mx.ones((4, 5)))
