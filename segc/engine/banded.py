"""Banded (layer-major) prefill: a long prompt run as tiles of (band of layers) x (chunk
of tokens), band by band, through one jitted model.

Each tile is a call of the jitted model with a window over its band's segments
(``Jitted.set_windows`` / ``use_window``): the band's entry activations (the residual
stream after the band before it, and what the first segment computed for every layer,
such as the attention mask) come from the chunk's stash, its exit activations go back
to it. So each band's weights are read once per chunk while they are hot, band after
band, and every layer's KV cache is filled chunk by chunk exactly as an ordinary chunked
prefill fills it: the final logits and caches are the same bits (on the CPU; a GPU
within the bound docs/models.md states).

The caches of the layers outside a tile's band are stood in for by proxies at the
tile's offset (a proxy's buffers are those of the band's first cache of its type, so it
costs no memory): they keep the call's signature the same for every band of a chunk, so
each chunk length is traced once, and the window leaves them untouched. A model that
mixes cache types (gemma3_text: full and sliding-window layers) needs bands that hold
one cache of each type; other band sizes are refused, naming those that work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import ScheduleError
from ..ir import Graph, segments
from ..staging import Jitted, jit


def _layer_list(model: nn.Module) -> Sequence[nn.Module]:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list | tuple) or not layers:
        raise ScheduleError(
            f"banded prefill needs a model whose layers are a plain list (model.layers); got {type(layers)}"
        )
    return layers


@dataclass(frozen=True)
class BandWindows:
    """``windows(graph)`` for ``Jitted.set_windows``: ``band<k>`` over the segments of
    layers ``[k * band, (k + 1) * band)``, the first band from the graph's first equation
    (the embedding), the last to its last (the head). Equal for equal bands, so placing
    them again lowers nothing again."""

    n_layers: int
    band: int

    def __call__(self, g: Graph) -> dict[str, tuple[int, int]]:
        n, band = self.n_layers, self.band
        segs = segments(g)
        if len(segs) != n + 1:  # a segment per layer, then the tail
            raise ScheduleError(f"{g.name}: {len(segs)} segments for {n} layers; trace with one boundary per layer")
        ids = [[e.id for e in s.eqns(g)] for s in segs]
        out = {}
        for k, lo in enumerate(range(0, n, band)):
            hi = min(lo + band, n) - 1
            last = ids[-1][-1] if hi == n - 1 else ids[hi][-1]
            out[f"band{k}"] = (ids[lo][0], last)
        return out


def check_prompt(prompt: Any, what: str) -> None:
    """A prompt is an ``mx.array`` of token ids, of shape ``[batch, L]`` (``[1, L]``
    for one prompt) with at least one token, else ScheduleError."""
    if not isinstance(prompt, mx.array):
        raise ScheduleError(f"{what}: the prompt must be an mx.array of shape [1, L], got {type(prompt).__name__}")
    if prompt.ndim != 2 or prompt.size == 0:
        raise ScheduleError(
            f"{what}: the prompt must have shape [1, L] (a batch of token rows) with L >= 1 tokens, "
            f"got shape {list(prompt.shape)}"
        )


def _proxy(cache: Any, like: Any) -> Any:
    """A stand-in for ``cache`` at ``like``'s offset and buffer shape (``like``'s own
    buffers: their contents are never read, the tile's window does not run its layer)."""
    p = object.__new__(type(cache))
    p.__dict__.update(vars(like))
    return p


def _check_kinds(cache: list[Any], band: int) -> None:
    """Every band must hold a cache of every type the model uses: a proxy copies one of
    its band's caches of its own type (a model mixing cache types, such as gemma3_text's
    full and sliding-window layers, needs bands that span its pattern)."""
    kinds = {type(c) for c in cache}
    if len(kinds) == 1:
        return
    n = len(cache)
    for lo in range(0, n, band):
        have = {type(c) for c in cache[lo : lo + band]}
        if have != kinds:
            fits = [
                b for b in range(1, n + 1) if all({type(c) for c in cache[i : i + b]} == kinds for i in range(0, n, b))
            ]
            raise ScheduleError(
                f"banded prefill: the band of layers {lo}..{min(lo + band, n) - 1} has no "
                f"{sorted(k.__name__ for k in kinds - have)} cache; this model mixes "
                f"{sorted(k.__name__ for k in kinds)}, and every band needs one of each: band sizes that work: {fits}"
            )


def banded_prefill(
    model: nn.Module,
    prompt: mx.array,
    cache: list[Any],
    *,
    band: int = 4,
    chunk: int = 256,
    step: Jitted | None = None,
) -> mx.array:
    """Prefill ``cache`` (mlx-lm caches, one per layer) with ``prompt`` (``[1, L]``
    tokens) band by band; return the logits of the last chunk, as
    ``model(prompt[:, -last:], cache=cache)`` would after the earlier chunks.

    ``step`` is a ``segc.jit`` of ``model`` with one boundary per layer and
    ``validate=False`` (made if not given; pass one to reuse its traces)."""
    layers = _layer_list(model)
    n = len(layers)
    check_prompt(prompt, "banded prefill")
    if not isinstance(cache, list | tuple) or len(cache) != n:
        got = f"{len(cache)} caches" if isinstance(cache, list | tuple) else f"a {type(cache).__name__}"
        raise ScheduleError(f"banded prefill: {got} for {n} layers (a list of one mlx-lm cache per layer)")
    for what, v in (("band", band), ("chunk", chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScheduleError(f"banded prefill: {what} must be an int >= 1, got {v!r}")
    _check_kinds(cache, band)
    if step is None:
        step = jit(model, boundaries="auto", validate=False)
    elif not isinstance(step, Jitted):
        raise ScheduleError(f"banded prefill: step must be a segc.jit of the model, got {type(step).__name__}")
    elif step.validate:  # its first call per chunk length would run the whole model eagerly, window or not
        raise ScheduleError(
            "banded prefill: step must be jitted with validate=False (a validating call checks the whole "
            "model against eager, which a band's window cannot be): segc.jit(model, boundaries=..., validate=False)"
        )
    step.set_windows(BandWindows(n, band))
    length = prompt.shape[1]
    chunks = [prompt[:, s : s + chunk] for s in range(0, length, chunk)]
    stashes: list[dict[str, mx.array]] = [{} for _ in chunks]
    out = None
    try:
        for k, lo in enumerate(range(0, n, band)):
            members = range(lo, min(lo + band, n))
            for t, x in enumerate(chunks):
                like = {type(cache[i]): cache[i] for i in reversed(members)}  # the first of each type
                tile = [cache[i] if i in members else _proxy(cache[i], like[type(cache[i])]) for i in range(n)]
                step.use_window(f"band{k}", stashes[t])
                out = step(x, cache=tile)
    finally:
        step.use_window(None)  # the windows stay placed (a later prefill reuses them), none runs
    assert out is not None
    return out
