"""Banded (layer-major) prefill equals an ordinary chunked prefill of the same prompt:
the last chunk's logits and every layer's KV cache, bit for bit (docs/runtime.md)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from conftest import bits, state_close

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.engine import banded_prefill
from segc.models.zoo import ZOO, build


def chunked(model: Any, prompt: mx.array, chunk: int) -> tuple[mx.array, list]:
    """Eager mlx-lm: each chunk through every layer in turn."""
    cache = make_prompt_cache(model)
    for s in range(0, prompt.shape[1], chunk):
        logits = model(prompt[:, s : s + chunk], cache=cache)
    return logits, cache


def assert_prefill_equal(got: mx.array, want: mx.array, cache: list, cache_want: list) -> None:
    """Bit for bit on the CPU; off it within the bound docs/models.md gives, because the
    dynamic KV cache's masked attention rounds differently from eager's on CUDA."""
    if mx.default_device() == mx.cpu:
        assert bits(got) == bits(want)
        assert_same_caches(cache, cache_want)
    else:
        assert state_close(got, want)
        assert all(a.offset == b.offset and state_close(a.state[0], b.state[0]) for a, b in zip(cache, cache_want))


def assert_same_caches(got: list, want: list) -> None:
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.offset == b.offset, f"layer {k}: offset {a.offset}, want {b.offset}"
        n = b.offset
        assert bits(a.keys[..., :n, :]) == bits(b.keys[..., :n, :]), f"layer {k}: keys differ"
        assert bits(a.values[..., :n, :]) == bits(b.values[..., :n, :]), f"layer {k}: values differ"


@pytest.mark.parametrize(
    ("layers", "band", "chunk", "length"), [(4, 2, 16, 40), (4, 1, 8, 24), (5, 2, 7, 30), (4, 4, 64, 20)]
)
def test_banded_prefill_equals_chunked_prefill(layers: int, band: int, chunk: int, length: int) -> None:
    from segc.models import tiny_llama

    model = tiny_llama(num_hidden_layers=layers)
    prompt = mx.array([[(7 * i + 3) % 128 for i in range(length)]])
    want, cache_want = chunked(model, prompt, chunk)
    cache = make_prompt_cache(model)
    step = segc.jit(model, boundaries="auto", validate=False)
    timeline: list = []
    step.record_timeline(timeline)
    got = banded_prefill(model, prompt, cache, band=band, chunk=chunk, step=step)
    assert_prefill_equal(got, want, cache, cache_want)
    # band-major: each call ran one band's segments; every band ran once per chunk
    n_chunks = -(-length // chunk)
    n_bands = -(-layers // band)
    per_call: list[list[int]] = []
    for _, what, k, _ in timeline:
        if what == "call":
            per_call.append([])
        elif what == "dispatch":
            per_call[-1].append(k)
    assert len(per_call) == n_chunks * n_bands
    for b in range(n_bands):
        lo, hi = b * band, min((b + 1) * band, layers)
        want_segs = list(range(lo, hi)) + ([layers] if hi == layers else [])
        for t in range(n_chunks):
            assert per_call[b * n_chunks + t] == want_segs, (b, t, per_call[b * n_chunks + t])
    assert step.cache_info().traces <= 3  # the first chunk, the others, a shorter last one


@pytest.mark.slow
@pytest.mark.parametrize("arch", ZOO)
def test_banded_prefill_over_the_zoo(arch: str) -> None:
    model = build(arch)
    prompt = mx.array([[(5 * i + 1) % 100 for i in range(20)]])
    want, cache_want = chunked(model, prompt, 8)
    cache = make_prompt_cache(model)
    band = 2 if arch == "gemma3_text" else 1  # one full and one sliding-window layer a band
    got = banded_prefill(model, prompt, cache, band=band, chunk=8)
    assert_prefill_equal(got, want, cache, cache_want)


def test_mixed_cache_types_fill_like_a_chunked_prefill() -> None:
    """gemma3_text mixes KVCache (global) and RotatingKVCache (sliding-window) layers:
    bands of 2 hold one of each, and a 24-token prompt passes the 16-token window; a band
    of 1 is refused, naming the band sizes that work."""
    model = build("gemma3_text")
    kinds = {type(c).__name__ for c in make_prompt_cache(model)}
    assert kinds == {"KVCache", "RotatingKVCache"}, kinds
    prompt = mx.array([[(7 * i + 2) % 100 for i in range(24)]])
    want, cache_want = chunked(model, prompt, 8)
    cache = make_prompt_cache(model)
    got = banded_prefill(model, prompt, cache, band=2, chunk=8)
    assert_prefill_equal(got, want, cache, cache_want)
    with pytest.raises(segc.ScheduleError, match=r"layers 0\.\.0 has no \['KVCache'\].*band sizes that work: \[2\]"):
        banded_prefill(model, prompt, make_prompt_cache(model), band=1, chunk=8)


def test_bad_prompts_bands_and_steps_are_refused_up_front() -> None:
    """An empty or 1-D prompt, a band or chunk that is not an int >= 1, and a step that
    validates against eager (its first call per chunk length would run the whole model,
    which a band's window cannot match) are refused before any cache is touched."""
    from segc.models import tiny_llama

    model = tiny_llama(num_hidden_layers=2)
    prompt = mx.array([[(7 * i + 3) % 128 for i in range(12)]])
    cache = make_prompt_cache(model)
    refused = [
        ({"prompt": mx.zeros((1, 0), dtype=mx.int32)}, r"prompt.*shape \[1, 0\]"),
        ({"prompt": prompt[0]}, r"prompt.*shape \[12\]"),
        ({"prompt": [[1, 2, 3]]}, "prompt must be an mx.array"),
        ({"band": 2.5}, "band must be an int >= 1, got 2.5"),
        ({"band": True}, "band must be an int >= 1, got True"),
        ({"band": 0}, "band must be an int >= 1, got 0"),
        ({"chunk": 0.5}, "chunk must be an int >= 1, got 0.5"),
        ({"step": segc.jit(model, boundaries="auto")}, "validate=False"),
        ({"cache": None}, "NoneType for 2 layers"),
    ]
    for change, match in refused:
        kw: dict[str, Any] = {"prompt": prompt, "cache": cache, "band": 1, "chunk": 4, **change}
        with pytest.raises(segc.ScheduleError, match=match):
            banded_prefill(model, kw.pop("prompt"), kw.pop("cache"), **kw)
    assert [c.offset for c in cache] == [0, 0]
    want, cache_want = chunked(model, prompt, 4)
    got = banded_prefill(model, prompt, cache, band=1, chunk=4)
    assert_prefill_equal(got, want, cache, cache_want)
