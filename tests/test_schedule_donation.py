"""KV-cache donation under a boundary schedule (docs/runtime.md): a cached decode call
under a schedule updates its caches in place, as the stock path does, and a wait that
times out leaves the caches as they were before the call. The reference is eager mlx-lm
on the CPU, unsegmented segc on a GPU (docs/models.md)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from conftest import cut_ids, same_bits, same_caches

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.passes import Schedule
from segc.passes.fences import CutNode, WaitNode


def _model() -> Any:
    from segc.models import tiny_llama

    # K/V buffers of 1 MiB each, far above a decode step's other allocations
    return tiny_llama(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2)


def _ref(model: Any) -> Any:
    return model if mx.default_device() == mx.cpu else segc.jit(model)


@pytest.mark.slow
def test_a_scheduled_decode_updates_its_caches_in_place() -> None:
    model = _model()
    ref = _ref(model)
    ref_cache, cache = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.random.randint(0, 128, (1, 1000))
    ref(prompt, cache=ref_cache)
    step = segc.jit(model, boundaries="layers.*")
    step(prompt, cache=cache)
    ends, starts = cut_ids(
        step.trace(mx.array([[1]]), cache=cache).graph
    )  # the decode graph: a cache that holds the prompt
    done, admit = segc.Event(name="done"), segc.Event(2**40, name="admit")
    sched = Schedule(
        tuple(CutNode(i, ("done", n + 1)) for n, i in enumerate(ends)),
        tuple(WaitNode(i, "admit", 1) for i in starts),
        ("admit",),
    )
    step.set_boundary_schedule(sched, {"done": done, "admit": admit}, stride=len(ends))
    one_buffer = cache[0].keys.nbytes
    for i in range(4):
        x = mx.array([[i + 1]])
        mx.eval([(c.keys, c.values) for c in cache], [(c.keys, c.values) for c in ref_cache])
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        y = step(x, cache=cache)
        mx.eval(y, [(c.keys, c.values) for c in cache])
        grown = mx.get_peak_memory() - base
        assert same_bits(y, ref(x, cache=ref_cache))
        assert same_caches(cache, ref_cache)
        if i > 0:  # the first decode call of this signature copies; later ones do not
            assert grown < one_buffer, (i, grown, one_buffer)
    done.wait(4 * len(ends), timeout=10)


def test_a_timed_out_wait_leaves_donated_caches_as_they_were() -> None:
    model = _model()
    ref = _ref(model)
    ref_cache, cache = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    step = segc.jit(model, boundaries="layers.*")
    assert same_bits(step(prompt, cache=cache), ref(prompt, cache=ref_cache))
    for t in range(2):  # the decode graph has run: its next calls donate
        x = mx.array([[t + 1]])
        assert same_bits(step(x, cache=cache), ref(x, cache=ref_cache))
    _, starts = cut_ids(step.trace(mx.array([[1]]), cache=cache).graph)
    never = segc.Event(name="never")
    step.set_boundary_schedule(
        Schedule((), (WaitNode(starts[0], "never", 1),), ("never",)), {"never": never}, timeout=0.2
    )
    before = [(c.offset, c.keys[..., : c.offset, :], c.values[..., : c.offset, :]) for c in cache]
    mx.eval([b[1:] for b in before])
    with pytest.raises(segc.WaitTimeout, match=r"never.*model.layers.1"):
        step(mx.array([[7]]), cache=cache)
    for c, (off, k, v) in zip(cache, before):
        assert c.offset == off
        assert c.keys is not None and c.values is not None
        assert same_bits(c.keys[..., :off, :], k) and same_bits(c.values[..., :off, :], v)
    step.clear_boundary_schedule()
    for t in range(3):  # usable, and still eager's bits
        x = mx.array([[t + 7]])
        assert same_bits(step(x, cache=cache), ref(x, cache=ref_cache))
