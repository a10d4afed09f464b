"""A jitted mlx-lm model where mlx-lm's own code, or a user, treats it as the model:
``generate_step`` with ``input_embeddings`` (mlx-lm asks ``inspect.signature`` of
``model.__call__``), a model whose ``__init__`` skipped ``nn.Module``'s, a decode whose
dynamic trace fails (a user's mask over the real keys) falling back to exact mode, and
the warnings for calls that retrace on every step."""

from __future__ import annotations

import warnings

import mlx.core as mx
import pytest
from conftest import assert_same_bits, state_close

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

import segc
from segc.models.zoo import build, tiny_config


def _generate(model: object, prompt: mx.array, n: int, **kw: object) -> tuple[list[int], list[mx.array]]:
    toks, lps = [], []
    for t, lp in generate_step(prompt, model, max_tokens=n, **kw):
        toks.append(int(t))
        lps.append(lp)
    return toks, lps


def test_generate_step_with_input_embeddings() -> None:
    model = build("llama")
    prompt = mx.array([1, 2, 3, 4, 5, 6], dtype=mx.uint32)
    emb = model.model.embed_tokens(prompt)
    want = _generate(model, prompt, 4, input_embeddings=emb)
    got = _generate(segc.jit(model, boundaries="auto"), prompt, 4, input_embeddings=emb)
    assert got[0] == want[0]
    assert_same_bits(got[1], want[1], "logprobs")


def test_a_model_whose_init_skipped_nn_modules() -> None:
    from mlx_lm.models import recurrent_gemma

    model = recurrent_gemma.Model(recurrent_gemma.ModelArgs.from_dict(tiny_config("recurrent_gemma")))
    mx.eval(model.parameters())
    assert "_training" not in vars(model)  # mlx-lm's Model.__init__ does not call nn.Module's
    x = mx.array([[1, 2, 3, 4]])
    assert_same_bits([segc.jit(model)(x)], [model(x)])


def test_a_failing_dynamic_trace_falls_back_to_exact_mode() -> None:
    from mlx_lm.models.base import create_causal_mask

    model = build("minicpm3")  # its Model.__call__ takes mask=
    step = segc.jit(model)
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    t = mx.array([[1, 2, 3, 4, 5, 6]])
    mask = create_causal_mask(6, 0)
    assert_same_bits([step(t, mask=mask, cache=cs)], [model(t, mask=mask, cache=ce)], "prefill")
    tok, dmask = mx.array([[9]]), mx.ones((1, 7), dtype=mx.bool_)  # over the 7 real keys
    got, want = step(tok, mask=dmask, cache=cs), model(tok, mask=dmask, cache=ce)
    assert any("dynamic caches' trace failed" in a for a in step.cache_info().aborted)
    # exact mode: eager's bits on the CPU; on the H200 this decode is mx.compile's, which
    # differs from eager's by 3e-7 (state_mode="exact" alone measured the same): the bound there
    assert state_close(got, want), "decode"


def test_tokens_as_python_lists_warn_that_they_retrace() -> None:
    model = build("llama")
    step = segc.jit(model, boundaries="auto")
    ce, cs = make_prompt_cache(model), make_prompt_cache(model)
    step(mx.array([[1, 2, 3]]), cache=cs)
    model(mx.array([[1, 2, 3]]), cache=ce)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(10):
            assert_same_bits([step([[i + 5]], cache=cs)], [model(mx.array([[i + 5]]), cache=ce)], f"step {i}")
    msgs = [str(w.message) for w in caught if issubclass(w.category, segc.SegcWarning)]
    assert len(msgs) == 1 and "differ only in static values" in msgs[0]
    assert step.cache_info().retraces[-1] == "static value args[0][0][0]: 13 -> 14"
