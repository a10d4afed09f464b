"""``segc.jit``, the decorator: its options, documented once, and the ``Jitted`` it makes
(``jitted.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .jitted import Jitted


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Trace ``fn`` (a function or an ``nn.Module``) once per signature and run it segmented.

    Options: ``boundaries`` (globs over submodule paths, e.g. ``"layers.*"``: a boundary
    after each matching submodule; ``"auto"``: after each block of the model's
    ``layers`` list), ``static_argnums``, ``static_argnames``,
    ``drain`` (host ``mx.eval`` after every segment: a baseline for benchmarks),
    ``commit`` (when segments are committed to the device: ``"auto"``, ``"segment"``,
    ``"fences"``, ``"geometric"``, ``"every:K"``; see :mod:`segc.runtime.executor`), ``attention`` (``"auto"``, ``"on"``,
    ``"off"``: whether a dynamic KV cache's masked decode attention runs as segc's fused
    CUDA kernel; ``"auto"``: on a CUDA GPU unless ``SEGC_FUSED_ATTENTION=0``, see
    :mod:`segc.lower.attention`),
    ``name``,
    ``state`` (objects ``fn`` captures and mutates, e.g. KV caches; caches passed as
    arguments are found automatically), ``state_mode`` (``"auto"``: dynamic KV caches
    that do not retrace per token; ``"exact"``: every state object functionalized as
    is, retracing when its offset changes). See :mod:`segc.trace.state`.
    ``strategy`` (cut placement: ``"balanced:4"``, a saved ``segc.passes.Plan``, a
    callable, ...; see :mod:`segc.passes.strategies`), ``validate`` (default True: the
    first call of each graph with dynamic KV caches is also run eagerly on copies of the
    caches and compared; on a mismatch the function falls back to ``state_mode="exact"``),
    ``cache_size`` (default 64: the most signatures kept, least recently used out),
    ``concat_projections`` (default False; sibling products as one over concatenated
    weights, the module's weights rebound to views: :mod:`segc.passes.concat`),
    ``exact_trace_limit`` (default 16: the most traces with a state object in exact mode,
    which traces once per new offset, i.e. per token of a decode loop; calls past it that
    would trace run the function eagerly instead, with one ``SegcWarning``, as
    ``torch.compile`` falls back to eager past its recompile limit),
    ``freeze_params`` (default False: every call checks that the module's parameters are
    the arrays it traced with, and retraces or rebinds when one changed; True: checked
    at the first call, then taken as they were until ``clear_cache()``, as ``mx.compile``
    captures the arrays a function closes over and ``torch.compile``'s freezing takes
    weights as constants; saves about 0.06 ms a decode call of 16 layers on a GPU host),
    ``kv_in_place`` (CUDA: a decode step's KV write, taken with its attention into one
    kernel, writes the new row into the cache's buffers instead of copying them, where
    nothing else in the call reads them; True, False, or None (the default): the
    environment's ``SEGC_KV_IN_PLACE``, off unless ``1``. Same bits; about 0.2 ms less
    device time a decode step of the reference llama on an H100. What it gives up, as
    ``jax.jit``'s ``donate_argnums`` does: an array that shares a cache's buffer and
    outlives the call (a view the caller kept) sees the new row. See docs/lowering.md).
    Usable as ``@segc.jit`` or ``@segc.jit(boundaries=...)``.
    """
    if fn is None:
        return lambda f: Jitted(f, **options)
    return Jitted(fn, **options)
