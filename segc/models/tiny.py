"""Tiny random mlx-lm models, for the demo, the tests and the benchmarks."""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn


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


class SiblingProducts(nn.Module):
    """``k`` products of one input (the output of a first layer), read back in several
    ways: one of them alone, concatenated, summed (``0 + the first sum + ...``, as
    ``sum()`` adds). A program for ``concat_projections`` (``tests/test_concat.py``,
    ``benchmarks/concat_bits.py``)."""

    def __init__(self, dim: int, outs: list[int], dtype: mx.Dtype, bias_first: bool, bias_heads: bool = False):
        super().__init__()
        self.pre = nn.Linear(dim, dim, bias=bias_first)
        self.heads = [nn.Linear(dim, n, bias=bias_heads) for n in outs]
        for m in [self.pre, *self.heads]:
            m.weight = m.weight.astype(dtype)
            if "bias" in m:
                m.bias = m.bias.astype(dtype)

    def __call__(self, x: mx.array) -> list[mx.array]:
        h = self.pre(x)
        ys = [m(h) for m in self.heads]
        return [ys[0], mx.concatenate(ys, axis=-1), cast(mx.array, sum(y.sum(axis=-1) for y in ys))]


def sibling_products(
    dim: int,
    outs: list[int],
    *,
    dtype: mx.Dtype = mx.float32,
    bias_first: bool = False,
    bias_heads: bool = False,
    seed: int = 0,
) -> SiblingProducts:
    """A :class:`SiblingProducts` with random weights under ``seed``, parameters evaluated."""
    mx.random.seed(seed)
    m = SiblingProducts(dim, outs, dtype, bias_first, bias_heads)
    mx.eval(m.parameters())
    return m
