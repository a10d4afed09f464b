"""Greedy generation through segc, with mlx-lm's own decode loop.

:func:`generate_tokens` drives ``mlx_lm.generate.generate_step`` (chunked prefill,
``mx.async_eval`` of the next token before the current one is read) with either the
eager model or ``segc.jit(model, boundaries=...)`` in its place, so eager and segc
timings come from the same loop. The caller's KV cache is an ordinary mlx-lm cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import SegcError
from ..staging import jit


@dataclass
class GenerationStats:
    """Filled in while :func:`generate_tokens` runs."""

    prompt_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    first_token_s: float = 0.0  # prefill and the first token
    decode_s: float = 0.0  # every later token
    jitted: Any = None  # the segc.Jitted, when segc ran the model

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def traces(self) -> int:
        return 0 if self.jitted is None else self.jitted.cache_info().traces


# The fastest decode measured on a GPU (docs/performance.md, "Generation"): one segment,
# sibling products as one, the parameters captured, the caches written in place; for a
# loop that owns its model and caches, where what the options give up (the module's
# weights rebound to views, weights replaced later unseen, arrays sharing a cache's
# buffer seeing the write) does not arise. The same bits as the defaults.
FAST_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"boundaries": None, "concat_projections": True, "freeze_params": True, "kv_in_place": True}
)  # (read-only: a caller's dict(FAST_OPTIONS) is theirs to change)


def _greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def generate_tokens(
    model: nn.Module,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    use_segc: bool = True,
    boundaries: str | Sequence[str] | None = "auto",
    cache: list[Any] | None = None,
    eos: Callable[[int], bool] | None = None,
    stats: GenerationStats | None = None,
    **jit_options: Any,
) -> Iterator[int]:
    """Yield up to ``max_tokens`` greedy tokens after ``prompt``, eagerly or through segc."""
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    if not prompt:
        raise SegcError("generate: the prompt is empty; give at least one token")
    if max_tokens < 1:
        raise SegcError(f"generate: max_tokens must be at least 1, got {max_tokens}")
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(prompt)
    cache = cache if cache is not None else make_prompt_cache(model)
    fn: Any = model
    if use_segc:
        fn = jit(model, boundaries=boundaries, **jit_options)
        stats.jitted = fn
    t0 = time.perf_counter()
    # uint32 like the sampled tokens (argmax), so the prompt's last token and the sampled
    # ones share one decode signature: one trace fewer
    ids = mx.array(list(prompt), dtype=mx.uint32)
    steps = generate_step(ids, fn, max_tokens=max_tokens, sampler=_greedy, prompt_cache=cache)
    for tok, _ in steps:
        now = time.perf_counter()
        if not stats.tokens:
            stats.first_token_s = now - t0
        else:
            stats.decode_s += now - t0
        t0 = now
        stats.tokens.append(int(tok))
        yield int(tok)
        t0 = time.perf_counter()
        if eos is not None and eos(int(tok)):
            break


def load_local_model(path: str | Path) -> tuple[nn.Module, Any]:
    """An mlx-lm model (and its tokenizer, or None) from a local directory holding
    ``config.json`` and ``*.safetensors``; never touches the network."""
    from mlx_lm.utils import load_model, load_tokenizer

    p = Path(path)
    if not (p / "config.json").is_file():
        raise SegcError(f"{p} has no config.json: give a local mlx-lm model directory")
    if not list(p.glob("*.safetensors")):
        raise SegcError(f"{p} has no *.safetensors weights")
    try:
        model, _ = load_model(p)
    except (ValueError, FileNotFoundError) as exc:
        raise SegcError(f"loading {p}: {exc}") from exc
    tokenizer = None
    if (p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file():
        try:
            tokenizer = load_tokenizer(p)
        except Exception:  # a broken tokenizer: fall back to token ids
            tokenizer = None
    return model, tokenizer
