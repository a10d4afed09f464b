"""Saving a model as a local mlx-lm directory (``config.json`` and safetensors), so that
tests, benchmarks and examples can page a tiny zoo model without any download."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ...errors import PagingError


def save_model_dir(model: nn.Module, config: dict[str, Any], path: str | Path, *, shard_bytes: int = 1 << 30) -> Path:
    """Write ``model``'s parameters (in files of at most ``shard_bytes``, a larger tensor
    alone in its file, with mlx-lm's ``model.safetensors.index.json``) and ``config``
    (the mlx-lm configuration it was built from; with ``quantization={"group_size": g,
    "bits": b}`` for a quantized model) to directory ``path``; returns the path."""
    if "model_type" not in config:
        raise PagingError("save_model_dir: the configuration has no model_type")
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, mx.array]] = [{}]
    size = 0
    for name, a in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        if shards[-1] and size + a.nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    where = {}
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(p / fname), shard, metadata={"format": "mlx"})
        where.update(dict.fromkeys(shard, fname))
    total = sum(a.nbytes for s in shards for a in s.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(where.items()))}
    (p / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (p / "config.json").write_text(json.dumps(config, indent=1))
    return p
