"""The first call of each dynamic-KV-cache graph is checked against eager mlx-lm.

phi3small's block-sparse attention derives token positions from the length of the keys
its cache returns; a dynamic cache returns the whole (masked) buffer, so the model would
compute something else. segc must notice, roll the caches back, and fall back to exact
state, bit-identical to eager.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import same_bits

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.models.zoo import build

PROMPT = mx.array([[(5 * i + 1) % 97 for i in range(9)]])


def _greedy(step, model, steps: int = 4) -> tuple[list[mx.array], list[mx.array], list, list]:
    eager_cache, segc_cache = make_prompt_cache(model), make_prompt_cache(model)
    want = [model(PROMPT, cache=eager_cache)]
    got = [step(PROMPT, cache=segc_cache)]
    for _ in range(steps):
        tok = mx.argmax(want[-1][:, -1:], axis=-1)
        want.append(model(tok, cache=eager_cache))
        got.append(step(tok, cache=segc_cache))
    return want, got, eager_cache, segc_cache


def _same_cache(a, b) -> bool:
    # a cache's state holds its arrays and, for some caches, plain numbers
    return a.offset == b.offset and all(
        same_bits(x, y) if isinstance(x, mx.array) else x == y for x, y in zip(a.state, b.state)
    )


@pytest.fixture(scope="module")
def phi3small():
    return build("phi3small")


@pytest.mark.slow
def test_a_model_that_reads_the_key_length_falls_back_to_exact_state(phi3small) -> None:
    step = segc.jit(phi3small, boundaries="auto")
    want, got, eager_cache, segc_cache = _greedy(step, phi3small)
    for k, (a, b) in enumerate(zip(want, got)):
        assert same_bits(a, b), f"call {k}"
    assert all(_same_cache(a, b) for a, b in zip(eager_cache, segc_cache))
    info = step.cache_info()
    assert any("disagree with eager" in r and "exact" in r for r in info.aborted), info.aborted
    # by how much, so that a reader can tell a rounding from a wrong result
    assert any("max |segc - eager|" in r for r in info.aborted), info.aborted
    assert step.state_mode == "exact"


@pytest.mark.slow
def test_without_validation_the_dynamic_cache_would_be_wrong_there(phi3small) -> None:
    """Why the check exists: the same model through the dynamic cache, unchecked."""
    step = segc.jit(phi3small, boundaries="auto", validate=False)
    want, got, _, _ = _greedy(step, phi3small, steps=2)
    assert same_bits(want[0], got[0])  # the prefill is traced with eager's shapes
    assert not all(same_bits(a, b) for a, b in zip(want[1:], got[1:]))


def test_models_that_agree_keep_the_dynamic_cache() -> None:
    model = build("llama")
    step = segc.jit(model, boundaries="auto")
    want, got, eager_cache, segc_cache = _greedy(step, model, steps=6)
    assert all(same_bits(a, b) for a, b in zip(want, got))
    assert all(_same_cache(a, b) for a, b in zip(eager_cache, segc_cache))
    info = step.cache_info()
    assert not info.aborted and step.state_mode == "auto"
    assert info.traces == 2  # the prefill and one decode graph, validated once each


def test_exact_mode_runs_eagerly_past_its_trace_limit() -> None:
    """Exact mode traces once per token of a decode loop; past ``exact_trace_limit``
    such calls run the model eagerly (one warning), with eager's bits throughout."""
    model = build("llama", num_hidden_layers=2)
    step = segc.jit(model, state_mode="exact", exact_trace_limit=3)
    with pytest.warns(segc.SegcWarning, match="exact_trace_limit") as caught:
        want, got, eager_cache, segc_cache = _greedy(step, model, steps=8)
    assert len([w for w in caught if "exact_trace_limit" in str(w.message)]) == 1
    assert all(same_bits(a, b) for a, b in zip(want, got))
    assert all(_same_cache(a, b) for a, b in zip(eager_cache, segc_cache))
    info = step.cache_info()
    assert info.traces == 3 and info.eager_calls == 6  # the prompt and 2 tokens traced, 6 run eagerly


def test_a_failed_validation_then_runs_eagerly_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a GPU user whose dynamic graph misses the bound gets: exact mode, then eager."""
    from segc.staging import validate

    monkeypatch.setattr(validate, "disagreement", lambda *a: "outputs differ (forced)")
    model = build("llama", num_hidden_layers=2)
    step = segc.jit(model, exact_trace_limit=2)
    with pytest.warns(segc.SegcWarning, match="validate=False"):
        want, got, eager_cache, segc_cache = _greedy(step, model, steps=5)
    assert all(same_bits(a, b) for a, b in zip(want, got))
    assert all(_same_cache(a, b) for a, b in zip(eager_cache, segc_cache))
    info = step.cache_info()
    assert step.state_mode == "exact" and info.eager_calls > 0
    assert any("forced" in r for r in info.aborted), info.aborted


def test_exact_mode_keeps_hitting_its_cache_past_the_limit() -> None:
    """The limit stops new traces, not cached ones: the same position again hits."""
    model = build("llama", num_hidden_layers=2)
    step = segc.jit(model, state_mode="exact", exact_trace_limit=2)
    cache = make_prompt_cache(model)
    step(PROMPT, cache=cache)
    tok = mx.array([[3]])
    for _ in range(4):
        out = step(tok, cache=cache)
        for c in cache:
            c.offset -= 1  # write the same position again: the same exact-mode signature
    ref_cache = make_prompt_cache(model)
    model(PROMPT, cache=ref_cache)
    assert same_bits(out, model(tok, cache=ref_cache))
    info = step.cache_info()
    assert info.traces == 2 and info.eager_calls == 0 and info.hits == 3


@pytest.mark.parametrize("bad", [-1, 1.5, True, "16"])
def test_a_bad_exact_trace_limit_is_refused(bad) -> None:
    with pytest.raises(segc.TraceError, match="exact_trace_limit"):
        segc.jit(build("llama", num_hidden_layers=1), exact_trace_limit=bad)


def test_under_an_engines_effects_exact_mode_keeps_tracing() -> None:
    """An eager call would skip an engine's windows, events and timeline: with any of
    them set, the limit does not apply and each new offset is traced as before."""
    model = build("llama", num_hidden_layers=2)
    step = segc.jit(model, state_mode="exact", exact_trace_limit=1)
    step.record_timeline([])
    want, got, _, _ = _greedy(step, model, steps=3)
    assert all(same_bits(a, b) for a, b in zip(want, got))
    info = step.cache_info()
    assert info.traces == 4 and info.eager_calls == 0


def test_a_disagreement_says_by_how_much() -> None:
    from segc.staging.validate import disagreement

    got, want = [mx.array([1.0, 2.0, -3.0])], [mx.array([1.0, 2.5, -3.0])]
    why = disagreement(got, want, [], [])
    assert why == "outputs differ (output 0: max |segc - eager| 0.5, eager's largest |value| 3)", why
    same = [mx.array([4.0])]
    why = disagreement(same, same, [[mx.array([0.0, 1.0])]], [[mx.array([0.0, 1.25])]])
    assert why == "state[0] differs: max |segc - eager| 0.25, eager's largest |value| 1.25", why
    assert disagreement(same, same, [[mx.array([1, 2])]], [[mx.array([1, 3])]]) == "state[0] differs"  # integers
    assert disagreement(same, same, [], []) is None
