"""What segc's CUDA lowering computes with its own kernels in a run of equations, found
once for the replay (which runs them) and for the cost model (which counts them): the
decomposed masked attentions, then the one-row products among the rest, then the rotated
KV writes, then each write paired with the attention that reads what it wrote (one
kernel, ``cuda_kvattention.py``; or, where the pair is a decode step's and the live
attention is on, ``live.py``, the write's kernel then MLX's attention: two kernels, one
unit for a cut); with chains, a pair and the chain after it (one kernel,
``cuda_layer.py``)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..ir import Eqn
from .attention import AttentionMatch, eager_fuses, find_attention
from .kvwrite import KVWriteMatch, find_kv_writes
from .layer_chain import attention_wanted, chain_layers
from .live import causal_row, live_wanted
from .product_chain import chain_products, chains_wanted
from .product_match import ProductMatch, find_products

# what segc's lowering takes on a CUDA GPU by default: every attention eager would fuse,
# products, writes, writes with attentions (a decode step's as the write, then MLX's
# attention over the live keys: live.py); a layer's MLP as one kernel only where turned
# on (product_chain.CHAIN_PRODUCTS, SEGC_CHAIN_PRODUCTS: cuda_defaults())
CUDA_DEFAULTS = {
    "attention": True,
    "where_eager_fuses": True,
    "products": True,
    "chains": False,
    "writes": True,
    "pairs": True,
    "live": True,
}


def cuda_defaults() -> dict[str, bool]:
    """:data:`CUDA_DEFAULTS` with chains and the live attention as this process's
    settings have them: what the cost model, ``legalize`` and ``segc segments`` count
    for a CUDA GPU."""
    return {**CUDA_DEFAULTS, "chains": chains_wanted(), "live": live_wanted()}


# the attention setting segments lowered in this context take (``lowering_for``), and
# flags that stand for the lowering's altogether, boxed (``pinning``: None inside is none)
_ATTENTION: ContextVar[Any] = ContextVar("segc_lowering_attention", default="auto")
_FLAGS: ContextVar[tuple[Mapping[str, bool] | None] | None] = ContextVar("segc_lowering_flags", default=None)


def kernel_flags(attention: Any = None) -> dict[str, bool] | None:
    """:func:`find_all`'s flags for the kernels that segments lowered in this process
    take with the attention setting ``attention`` (default: the one :func:`lowering_for`
    set, else ``"auto"``), as the executor builds them (``runtime.executor``); None where
    they take none of segc's kernels. Inside :func:`pinning` (no ``attention`` given),
    the flags it set."""
    boxed = _FLAGS.get()
    if attention is None and boxed is not None:
        return dict(boxed[0]) if boxed[0] is not None else None
    from .attention import attention_kernel
    from .kvwrite import kv_write_kernel
    from .products import product_kernel

    setting = _ATTENTION.get() if attention is None else attention
    kernel = attention_kernel(setting)
    write = kv_write_kernel(own_attention=not callable(setting))
    products = product_kernel() is not None
    flags = {
        "attention": kernel is not None,
        "where_eager_fuses": bool(getattr(kernel, "where_eager_fuses", False)),
        "products": products,
        "chains": products and chains_wanted(),
        "writes": write is not None,
        "pairs": getattr(write, "with_attention", None) is not None,
        "live": callable(getattr(write, "live", None)),
    }
    return flags if flags["attention"] or flags["products"] or flags["writes"] else None


@contextmanager
def lowering_for(attention: Any) -> Iterator[None]:
    """Within it, :func:`kernel_flags` answers for segments lowered with ``attention``
    (``segc.jit(attention=...)``): ``Traced.lower`` places its cuts inside one, so
    legality (``passes.legalize``: a cut through a kernel leaves the rest to MLX's
    kernels, and through an attention, to other bits) follows the jit's own lowering."""
    token = _ATTENTION.set(attention)
    try:
        yield
    finally:
        _ATTENTION.reset(token)


@contextmanager
def pinning(flags: Mapping[str, bool] | None) -> Iterator[None]:
    """Within it, :func:`kernel_flags` answers ``flags`` (None: no kernel of segc's):
    plans made for another machine than this one (``passes.make_plan(model=...)``)
    keep whole the kernels of that machine's lowering."""
    token = _FLAGS.set((flags,))
    try:
        yield
    finally:
        _FLAGS.reset(token)


@dataclass(frozen=True)
class Fused:
    """The matches, each equation in at most one; ``pairs`` are among ``writes`` and
    ``attention``, ``live`` among ``pairs`` (those run as the write, then MLX's attention
    over the live keys: ``live.py``)."""

    attention: list[AttentionMatch] = field(default_factory=list)
    products: list[ProductMatch] = field(default_factory=list)
    writes: list[KVWriteMatch] = field(default_factory=list)
    pairs: list[tuple[KVWriteMatch, AttentionMatch]] = field(default_factory=list)
    live: list[tuple[KVWriteMatch, AttentionMatch]] = field(default_factory=list)

    def kernels(self, launched: bool = False) -> list[frozenset[int]]:
        """The equations each kernel replaces: a paired write and its attention are one.
        ``launched``: the kernels the device runs (the cost model's count), where a live
        pair is two, the write's and MLX's attention; without it, the units a cut must
        not split (a live pair's attention cut from its write would be segc's kernel's,
        other bytes)."""
        paired = {id(x) for pair in self.pairs for x in pair}
        alone = [m.skip for m in self.attention if id(m) not in paired]
        alone += [p.skip for p in self.products]
        alone += [w.skip for w in self.writes if id(w) not in paired]
        split = {id(w) for w, _ in self.live} if launched else set()
        for w, m in self.pairs:
            alone += [w.skip, m.skip] if id(w) in split else [w.skip | m.skip]
        return alone

    def skip(self) -> set[int]:
        """The equations the kernels replace."""
        return {i for kernel in self.kernels() for i in kernel}


def find_all(
    eqns: Sequence[Eqn],
    keep: Sequence[str],
    consts: Mapping[str, Any],
    avals: Mapping[str, tuple],
    context: Sequence[Eqn] = (),
    program_outputs: Collection[str] = (),
    /,
    *,
    attention: bool = False,
    where_eager_fuses: bool = False,
    products: bool = False,
    chains: bool = False,
    writes: bool = False,
    pairs: bool = False,
    live: bool = False,
) -> Fused:
    """Every pattern asked for in ``eqns`` (a segment's, or a whole graph's for an
    estimate); ``keep`` the segment's outputs, ``consts`` the captured constants' values,
    ``avals`` every var's ``(shape, dtype)``, ``context`` the whole graph's equations.
    ``where_eager_fuses``: only the attentions eager MLX runs fused (``"auto"``);
    ``chains``: a layer's MLP products as one kernel (``product_chain.py``), with the
    attention before it where ``pairs`` are found (``layer_chain.py``);
    ``program_outputs``: the whole program's outputs (``KVWriteMatch.alone``); ``live``:
    the pairs whose mask is one query's causal row run as the write then MLX's attention
    (``live.causal_row``, as the replay decides)."""
    shapes = {n: a[0] for n, a in avals.items()}
    found = find_attention(eqns, keep, consts, shapes, context) if attention else []
    if where_eager_fuses:
        producers = {o.name: e for e in (*context, *eqns) for o in e.outs}
        found = [m for m in found if eager_fuses(m, shapes, producers)]
    skip = {i for m in found for i in m.skip}
    prods = [p for p in find_products(eqns, keep, avals, context) if not p.skip & skip] if products else []
    if chains:
        prods = chain_products(prods, eqns, keep, context)
    skip |= {i for p in prods for i in p.skip}
    ws = find_kv_writes(eqns, keep, avals, context, frozenset(skip), program_outputs=program_outputs) if writes else []
    two = _pairs(ws, found, eqns, keep, avals) if pairs else []
    if chains and two and attention_wanted():  # a chain and the pair before it: a layer
        prods, two = chain_layers(prods, two, eqns, keep, avals, context)
        taken = {id(x) for p in prods if p.pair is not None for x in p.pair}
        found, ws = [m for m in found if id(m) not in taken], [w for w in ws if id(w) not in taken]
    lives = [p for p in two if causal_row(p[1].mask, [*context, *eqns])] if live else []
    return Fused(found, prods, ws, two, lives)


def _pairs(
    writes: Sequence[KVWriteMatch],
    matches: Sequence[AttentionMatch],
    eqns: Sequence[Eqn],
    out_names: Sequence[str],
    avals: Mapping[str, tuple],
) -> list[tuple[KVWriteMatch, AttentionMatch]]:
    """Each rotated write whose new buffers and rotated queries an attention reads as its
    keys, values and queries, the queries read by nothing else, keys and values of one
    head size (``kvwrite.cuda_kv_write_with_attention``)."""
    by_qkv = {(m.q, m.k, m.v): m for m in matches}
    readers: dict[str, set[int]] = {}
    for e in eqns:
        for v in e.ins:
            readers.setdefault(v, set()).add(e.id)
    found = []
    for w in writes:
        if not w.queries:
            continue
        ko, vo, qr = w.outs
        m = by_qkv.get((qr, ko, vo))
        kshape, vshape = avals.get(w.ins[0], ((),))[0], avals.get(w.ins[2], ((),))[0]
        if m is None or qr in out_names or not readers.get(qr, set()) <= m.skip or kshape != vshape:
            continue
        found.append((w, m))
    return found
