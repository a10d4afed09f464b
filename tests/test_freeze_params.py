"""``segc.jit(..., freeze_params=True)``: the module's parameters checked at the first
call, then taken as they were until ``clear_cache()`` (as ``mx.compile`` captures the
arrays a function closes over). Every result is compared with the module run eagerly
on the parameters the jit is meant to use, byte for byte."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import STATE_BIT_IDENTICAL, same_bits, same_caches
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.errors import UsageError
from segc.models.zoo import build

pytestmark = pytest.mark.timeout(120)


def _mlp() -> nn.Module:
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    mx.eval(m.parameters())
    return m


@pytest.mark.parametrize("freeze", [False, True])
def test_a_replaced_weight_is_seen_now_or_after_clear_cache(freeze) -> None:
    m = _mlp()
    f = segc.jit(m, freeze_params=freeze)
    x = mx.random.normal((3, 8), key=mx.random.key(1))
    before = m(x)
    assert same_bits(f(x), before)
    old = m.layers[2].weight
    m.layers[2].weight = old * 2
    after = m(x)
    assert not same_bits(after, before)
    assert same_bits(f(x), before if freeze else after)  # frozen: the arrays it checked
    f.clear_cache()
    assert same_bits(f(x), after)


def test_a_frozen_decode_keeps_eagers_bits_and_does_not_see_a_new_weight() -> None:
    model = build("llama", num_hidden_layers=2)
    step = segc.jit(model, freeze_params=True, validate=False)
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5]])
    assert same_bits(step(prompt, cache=cs), model(prompt, cache=ce))
    t = mx.array([[2]])
    for _ in range(3):
        assert same_bits(step(t, cache=cs), model(t, cache=ce))
    w = model.model.norm.weight
    model.model.norm.weight = w + 1  # not seen by the frozen jit: compare with the old weight
    got = step(t, cache=cs)
    model.model.norm.weight = w
    assert same_bits(got, model(t, cache=ce))


def test_freeze_params_must_be_a_bool() -> None:
    with pytest.raises(UsageError, match="freeze_params"):
        segc.jit(_mlp(), freeze_params="yes")


def _reference(model: nn.Module):
    """Eager MLX on the CPU; on a GPU, where a dynamic KV cache's decode is promised as
    segmented == unsegmented (docs/models.md), segc unfrozen with no boundaries."""
    return model if STATE_BIT_IDENTICAL else segc.jit(model, validate=False)


def _graph_params(entry: segc.Compiled) -> int:
    return sum(1 for i in entry.graph.inputs if i.kind == "param")


@pytest.mark.parametrize("concat", [False, True])
def test_frozen_segments_capture_the_parameters_and_keep_eagers_bits(concat) -> None:
    """After its first call a frozen entry's executor takes no parameter inputs (its
    segments close over the weights, as ``mx.compile`` does); decode over a segment per
    layer stays eager's bits, with the concatenated projections too."""
    model = build("llama", num_hidden_layers=3)
    ref = _reference(build("llama", num_hidden_layers=3))
    step = segc.jit(model, boundaries="layers.*", freeze_params=True, validate=False, concat_projections=concat)
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5]])
    assert same_bits(step(prompt, cache=cs), ref(prompt, cache=ce))
    for t in (2, 7, 1, 8):
        x = mx.array([[t]])
        assert same_bits(step(x, cache=cs), ref(x, cache=ce))
    assert same_caches(cs, ce)
    # with concat, the decode's first call rebound the weights the prompt's entry had
    # captured: that entry captures the views at its next call (test_concat.py)
    assert same_bits(step(prompt, cache=make_prompt_cache(model)), ref(prompt, cache=make_prompt_cache(model)))
    entries = step.entries()
    assert entries and all(_graph_params(e) > 0 for e in entries)
    for e in entries:
        n_params = _graph_params(e)
        assert e.executor.n_inputs == len(e.graph.inputs) - n_params, "parameters still passed per call"
        assert len(e.executor.graph.consts) == len(e.graph.consts) + n_params


def test_an_unfrozen_entry_passes_its_parameters() -> None:
    m = _mlp()
    f = segc.jit(m)
    x = mx.ones((2, 8))
    assert same_bits(f(x), m(x))
    (e,) = f.entries()
    assert _graph_params(e) == 4 and e.executor.n_inputs == len(e.graph.inputs)


def test_captured_parameters_are_the_modules_arrays_not_copies() -> None:
    """The segments close over the module's own weight arrays: memory does not grow by
    the weights' size when the parameters are captured."""
    m = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))  # 8 MiB of weights
    mx.eval(m.parameters())
    x = mx.ones((1, 1024))
    want = m(x)
    mx.eval(want)
    f = segc.jit(m, freeze_params=True)
    base = mx.get_active_memory()
    y = f(x)
    mx.eval(y)
    assert same_bits(y, want)
    assert mx.get_active_memory() - base < 2 << 20  # far below the 8 MiB a copy would take
    (e,) = f.entries()
    held = {id(c.value) for c in e.executor.graph.consts}
    assert id(m.layers[0].weight) in held and id(m.layers[2].weight) in held


def test_a_window_on_a_frozen_function_keeps_its_bits() -> None:
    """Engine effects lower the cached traces again: the new entries capture too."""
    model = build("llama", num_hidden_layers=3)
    step = segc.jit(model, boundaries="layers.*", freeze_params=True, validate=False)
    x = mx.array([[3, 1, 4, 1, 5]])
    want = model(x)
    assert same_bits(step(x), want)
    g = step.lower(x).graph
    ids = [e.id for e in g.eqns]
    stash = step.set_window(ids[0], ids[-1])
    got = step(x)
    assert stash is not None and same_bits(got, want)
    (e,) = step.entries()  # lowered again for the window, and captured at its first call
    assert e.executor.n_inputs == len(e.graph.inputs) - _graph_params(e)
    step.clear_window()
    assert same_bits(step(x), want)
    (e,) = step.entries()
    assert e.executor.n_inputs == len(e.graph.inputs) - _graph_params(e)


@pytest.mark.parametrize(
    ("arch", "bits", "dtype"),
    [("qwen3", None, mx.bfloat16), ("mixtral", None, mx.float32), ("llama", 4, mx.float32), ("llama", 8, mx.bfloat16)],
)
def test_captured_parameters_across_architectures(arch, bits, dtype) -> None:
    """Quantized weights (packed, scales, biases), a mixture of experts and bfloat16,
    captured by a frozen jit cut per layer: prompt and decode steps are eager's bytes."""
    model = build(arch, num_hidden_layers=2, bits=bits, dtype=dtype)
    ref = _reference(build(arch, num_hidden_layers=2, bits=bits, dtype=dtype))
    step = segc.jit(model, boundaries="layers.*", freeze_params=True, validate=False)
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5, 9]])
    assert same_bits(step(prompt, cache=cs), ref(prompt, cache=ce))
    for t in (2, 6, 5):
        x = mx.array([[t]])
        assert same_bits(step(x, cache=cs), ref(x, cache=ce))
    assert all(e.executor.n_inputs == sum(i.kind != "param" for i in e.graph.inputs) for e in step.entries())


@pytest.mark.parametrize("freeze", [False, True])
def test_an_entry_builds_one_executor(freeze, monkeypatch) -> None:
    """A frozen entry builds its executor at its first call, on the graph with the
    parameters in it, and not also one that takes them as inputs; an unfrozen entry
    builds one up front. Either way one per entry, and the results are eager's."""
    from segc.staging import stages

    built: list[int] = []
    real = stages.Executor

    def counted(g, **kw):
        built.append(sum(i.kind == "param" for i in g.inputs))
        return real(g, **kw)

    monkeypatch.setattr(stages, "Executor", counted)
    m = _mlp()
    f = segc.jit(m, freeze_params=freeze, validate=False)
    x = mx.random.normal((3, 8), key=mx.random.key(2))
    for _ in range(3):
        assert same_bits(f(x), m(x))
    assert built == ([0] if freeze else [4])  # the MLP's two weights and two biases
