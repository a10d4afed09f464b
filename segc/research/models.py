"""Models and workloads for experiments, named by short specs.

Models (:func:`load_model`):

- ``reference``: the reference llama of docs/performance.md (hidden 2048, 16 layers,
  intermediate 8192, 32/8 heads, vocab 32000, bf16, random weights: 1.1 B parameters);
- ``small``: a llama for this CPU (hidden 256, 8 layers, intermediate 688, 8/4 heads,
  vocab 1024, float32);
- an mlx-lm architecture name from ``segc.models.zoo`` (``llama``, ``qwen3``,
  ``mixtral``, ...), tiny, random weights, with optional config fields as every
  ``segc`` subcommand's targets take them (``modelspec.py``: short names, any
  ``ModelArgs`` field, ``dtype``, ``bits``, ``group``; unknown keys refused):
  ``llama:layers=4,hidden=128`` or ``llama:hidden_size=128,num_hidden_layers=4``;
- a local mlx-lm model directory (``config.json`` and ``*.safetensors``);
- ``path/file.py:function``: a function of no arguments returning an ``nn.Module``.

Workloads (:func:`make_workload`): ``decode:C`` (one token with mlx-lm KV caches held
at context ``C``: every call writes position ``C`` again, so every call does the same
work) and ``prefill:L`` (``L`` tokens, no cache).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import SegcError, UsageError

REFERENCE: dict[str, Any] = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "tie_word_embeddings": True,
}
SMALL: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
}


def load_model(spec: str) -> nn.Module:
    """An evaluated ``nn.Module`` for a model spec (module docstring)."""
    from .modelspec import build_arch, parse_arch

    name, _, rest = spec.partition(":")
    if spec.endswith(".py") or (rest and name.endswith(".py")):
        return _from_file(Path(name), rest)
    if Path(spec).is_dir():
        from ..engine.generate import load_local_model

        return load_local_model(spec)[0]
    if name in ("reference", "small"):
        from ..models import zoo

        if rest:
            raise UsageError(f"model {spec!r}: {name} takes no configuration; resize llama:KEY=VALUE,... instead")
        if name == "small":
            return zoo.build("llama", seed=0, **SMALL)
        return zoo.build("llama", dtype=mx.bfloat16, seed=0, **REFERENCE)
    try:
        arch = parse_arch(name, rest)
    except SegcError as exc:
        raise UsageError(f"model {spec!r}: {exc}") from None
    return build_arch(arch, seed=0)


def _from_file(path: Path, fn: str) -> nn.Module:
    if not path.is_file():
        raise SegcError(f"model file {path} does not exist")
    if not fn:
        raise SegcError(f"model {path}: name the function, {path}:function")
    sp = importlib.util.spec_from_file_location(f"segc_experiment_{path.stem}", path)
    assert sp is not None and sp.loader is not None
    mod = importlib.util.module_from_spec(sp)
    try:
        sp.loader.exec_module(mod)
    except Exception as exc:  # the user's file: their mistake, named
        raise UsageError(f"model {path}:{fn}: importing {path} raised {type(exc).__name__}: {exc}") from exc
    f = getattr(mod, fn, None)
    if not callable(f):
        raise SegcError(f"model {path}:{fn}: no function {fn!r} in {path}")
    try:
        model = f()
    except Exception as exc:  # the user's builder: their mistake, named
        raise UsageError(f"model {path}:{fn}: {fn}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise SegcError(f"model {path}:{fn} returned a {type(model).__name__}, not an mlx.nn.Module")
    mx.eval(model.parameters())
    return model


# --------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    """One call to time: ``args()`` gives its positional and keyword arguments (the
    caches reset to the context, so every call does the same work), ``sync()`` the
    arrays a call leaves to wait for besides its outputs."""

    name: str
    tokens: mx.array
    caches: list[Any] | None = None
    context: int = 0
    fresh: Callable[[], list[Any]] | None = field(default=None, repr=False)

    def args(self) -> tuple[tuple, dict]:
        if self.caches is None:
            return (self.tokens,), {}
        for c in self.caches:
            c.offset = self.context
        return (self.tokens,), {"cache": self.caches}

    def sync(self) -> list[mx.array]:
        return [a for c in self.caches or [] for a in (c.keys, c.values)]

    def reference(self, model: nn.Module) -> mx.array:
        """Eager MLX's output for the call, on a copy of the caches."""
        if self.caches is None:
            out = model(self.tokens)
        else:
            assert self.fresh is not None
            out = model(self.tokens, cache=self.fresh())
        mx.eval(out)
        return out


def make_workload(spec: str, model: nn.Module, seed: int = 1) -> Workload:
    kind, _, n = spec.partition(":")
    try:
        size = int(n)
    except ValueError:
        raise SegcError(f"workload {spec!r}: decode:CONTEXT or prefill:TOKENS") from None
    if size < 1:
        raise SegcError(f"workload {spec!r}: the number must be at least 1")
    vocab = _vocab(model)
    if kind == "prefill":
        return Workload(spec, mx.array([[(7 * i + 3) % vocab for i in range(size)]], dtype=mx.int32))
    if kind != "decode":
        raise SegcError(f"workload {spec!r}: decode:CONTEXT or prefill:TOKENS")
    return _decode(spec, model, size, vocab, seed)


def _vocab(model: nn.Module) -> int:
    """The token ids a workload may use: the model's ``args.vocab_size`` (mlx-lm's),
    else its first embedding's rows (a token past them reads outside the table), else 32."""
    args = getattr(model, "args", None)
    v = getattr(args, "vocab_size", None) or getattr(getattr(args, "text_config", None), "vocab_size", None)
    if v:
        return int(v)
    for _, m in model.named_modules()[::-1]:  # in the order the model declares them
        if isinstance(m, nn.Embedding | nn.QuantizedEmbedding):
            return int(m.weight.shape[0])
    return 32


def _decode(spec: str, model: nn.Module, context: int, vocab: int, seed: int) -> Workload:
    try:
        from mlx_lm.models.cache import KVCache, make_prompt_cache
    except ImportError:
        raise SegcError("decode workloads need mlx-lm (pip install 'segc[lm]')") from None
    tok = mx.array([[1]], dtype=mx.int32)
    try:
        probe = make_prompt_cache(model)
        mx.eval(model(tok, cache=probe))
    except (AttributeError, TypeError) as exc:
        raise SegcError(f"workload {spec!r}: the model takes no mlx-lm KV caches ({exc})") from None
    if not all(type(c) is KVCache for c in probe):
        kinds = sorted({type(c).__name__ for c in probe})
        raise SegcError(f"workload {spec!r}: only plain KVCache models decode here, this one has {kinds}")
    filled = []
    for i, c in enumerate(probe):
        b, h, _, d = c.keys.shape
        k1, k2 = mx.random.split(mx.random.key(seed * 1000 + i))
        shape = (b, h, context + 1, d)  # room for the decoded token: no call grows a buffer
        filled.append(tuple(mx.random.normal(shape, key=k).astype(c.keys.dtype) for k in (k1, k2)))
    mx.eval(filled)

    def fresh() -> list[Any]:
        caches = make_prompt_cache(model)
        for c, (k, v) in zip(caches, filled):
            c.keys, c.values, c.offset = mx.array(k), mx.array(v), context
        mx.eval([(c.keys, c.values) for c in caches])
        return caches

    return Workload(spec, tok, fresh(), context, fresh)
