"""Tiny random mlx-lm models, for the demo, the tests and the benchmarks."""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def tiny_llama(
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 4,
    intermediate_size: int = 128,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vocab_size: int = 128,
    dtype: mx.Dtype = mx.float32,
    seed: int = 0,
    **extra: Any,
) -> Any:
    """An mlx-lm ``llama`` model with random weights, parameters evaluated."""
    try:
        from mlx_lm.models import llama
    except ImportError as exc:  # pragma: no cover - the lm extra is part of make's install
        raise ImportError("segc's built-in models need mlx-lm: pip install 'segc[lm]'") from exc
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        **extra,
    )
    model = llama.Model(args)
    if dtype != mx.float32:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model
