"""``PagedModel``: a local mlx-lm model run under a memory budget, its weights paged in
band by band (docs/paging.md).

Each band of layers is one call of a jitted model with a window over the band's
segments (as ``segc.engine.banded_prefill`` runs a tile): before the call the band's
page is admitted (the pager's ``resident`` event, with a timeout) and bound into the
model in place of its stand-ins; after the dispatch (``mx.async_eval``, no host drain)
the stand-ins go back and the pager is told which outputs the band makes; once they
exist (``reclaim``) its page may be evicted. The pager loads the next pages meanwhile.

The caller's caches are written only at the end of a call: the bands write into shallow
copies, so a call that fails (a tensor that cannot be read, a wait that times out)
leaves them, and every earlier output, as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx

from ...errors import PagingError, ScheduleError
from ...staging import jit
from ..banded import BandWindows
from .pager import EVICT, Pager
from .plan import CallPlan, Skeleton, band_members, call_plan
from .source import DiskSource, HostSource, Reader

Hook = Callable[[int, int, list[mx.array]], None]  # (band, chunk, the outputs it makes)


@dataclass
class PagingStats:
    calls: int = 0
    bands: int = 0  # band calls dispatched
    loaded_bytes: int = 0  # weight bytes read
    peak_resident: int = 0  # the most weight bytes held at once
    needed: int = 0  # the largest budget a call so far needed (the smallest that runs them all)


def _copy(c: Any) -> Any:
    p = object.__new__(type(c))
    p.__dict__.update(vars(c))
    return p


def _arrays(c: Any) -> list[mx.array]:
    return [v for v in vars(c).values() if isinstance(v, mx.array)]


def _drop_outputs(stash: dict[str, mx.array], outputs: list[Any]) -> None:
    """The window wrote the call's outputs (new KV buffers, logits) to the stash too; no
    later band reads them, and the caches and the caller hold them: drop them, or the
    stash would keep every tile's KV buffers alive until the end of a banded prefill."""
    ids = {id(a) for a in outputs if a is not None}
    for name in [n for n, a in stash.items() if id(a) in ids]:
        del stash[name]


class PagedModel:
    """Model directory ``path`` run in ``budget`` bytes (see docs/paging.md).

    ``band``: layers per page; ``depth``: pages loaded ahead of the running one;
    ``evict``: ``"mru"`` or ``"lru"``; ``mode``: ``"fenced"`` (a pager thread, events,
    no host drain) or ``"drain"`` (the host loads each page and waits for each band: the
    baseline); ``source``: ``"disk"`` or ``"host"`` (every tensor in host memory first);
    ``reader``: replaces the tensor reader (fault injection); ``timeout``: seconds any
    wait may block. ``budget`` may be changed between calls."""

    def __init__(
        self,
        path: str | Path,
        budget: int,
        *,
        band: int = 1,
        depth: int = 1,
        evict: str = "mru",
        mode: str = "fenced",
        source: str = "disk",
        reader: Reader | None = None,
        timeout: float = 10.0,
    ):
        if mode not in ("fenced", "drain"):
            raise ScheduleError(f"mode must be 'fenced' or 'drain', got {mode!r}")
        if source not in ("disk", "host"):
            raise ScheduleError(f"source must be 'disk' or 'host', got {source!r}")
        if evict not in EVICT:
            raise ScheduleError(f"evict must be one of {EVICT}, got {evict!r}")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise ScheduleError(f"prefetch depth must be an int >= 0, got {depth!r}")
        if not isinstance(band, int) or isinstance(band, bool) or band < 1:
            raise ScheduleError(f"band must be an int >= 1, got {band!r}")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise PagingError(f"the budget is a number of bytes (an int >= 1), got {budget!r}")
        self.path = Path(path)
        self.source = (HostSource if source == "host" else DiskSource)(self.path, reader=reader)
        self.skeleton = Skeleton(self.path, self.source.tensors)
        self.model = self.skeleton.model
        self.n_layers = self.skeleton.n_layers
        self.band = min(band, self.n_layers)
        self.budget, self.depth, self.evict, self.mode, self.timeout = budget, depth, evict, mode, timeout
        self.step = jit(self.model, boundaries="auto", validate=False, name=f"paged {self.path.name}")
        self.step.set_windows(BandWindows(self.n_layers, self.band))
        self.bands = band_members(self.n_layers, self.band)
        self.stats = PagingStats()
        self._plans: dict[Any, CallPlan] = {}
        self.pages: tuple[tuple[str, ...], ...] | None = None
        self.page_bytes: list[int] = []
        self.pager: Pager | None = None
        self._need = 0
        self.on_segment: Hook | None = None  # called after each band's dispatch
        cache = self.make_cache()
        self._check(self._plan(mx.array([[0]], dtype=mx.uint32), cache), 1)  # refused up front

    # ------------------------------------------------------------------ public

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model)

    @property
    def weight_bytes(self) -> int:
        return sum(self.source.tensors[n].nbytes for n in self.skeleton.slots)

    def min_budget(self, x: mx.array, cache: list[Any], chunks: int = 1) -> int:
        """The smallest budget that runs ``x`` (``chunks`` chunks of its shape at once)."""
        self._check(self._plan(x, cache), chunks, refuse=False)
        return self._need

    def __call__(self, x: mx.array, cache: list[Any]) -> mx.array:
        """``model(x, cache=cache)``: one chunk (a prompt or a token) through every band."""
        return self._run([x], cache, [(k, 0) for k in range(len(self.bands))])

    def prefill(self, prompt: mx.array, cache: list[Any], *, chunk: int = 256, banded: bool = True) -> mx.array:
        """Prefill ``cache`` with ``prompt`` (``[1, L]``) in chunks of ``chunk`` tokens;
        the last chunk's logits. ``banded``: band-major (each band's page loaded once per
        prompt); otherwise chunk by chunk (each page loaded once per chunk)."""
        if chunk < 1:
            raise ScheduleError(f"chunk must be >= 1, got {chunk}")
        xs = [prompt[:, s : s + chunk] for s in range(0, prompt.shape[1], chunk)]
        if not banded:
            out = None
            for x in xs:
                out = self(x, cache)
            assert out is not None
            return out
        order = [(k, t) for k in range(len(self.bands)) for t in range(len(xs))]
        return self._run(xs, cache, order)

    def generate(self, prompt: Sequence[int], max_tokens: int, *, chunk: int = 256) -> list[int]:
        """Greedy tokens after ``prompt``: banded prefill, then one token per call."""
        cache = self.make_cache()
        logits = self.prefill(mx.array([list(prompt)], dtype=mx.uint32), cache, chunk=chunk)
        out: list[int] = []
        for _ in range(max_tokens):
            tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
            out.append(int(cast(Any, tok.item())))
            logits = self(tok, cache)
        return out

    def close(self) -> None:
        """End the pager thread, drop every resident page and unmap the files (the next
        call maps them again)."""
        if self.pager is not None:
            self.pager.close()
            self.pager = None
        self.source.close()

    # ------------------------------------------------------------------ internals

    def _tile(self, caches: list[Any], members: range) -> list[Any]:
        like = caches[members[0]]
        out = []
        for i, c in enumerate(caches):
            if i in members:
                out.append(c)
            else:
                p = object.__new__(type(c))
                p.__dict__.update(vars(like))
                out.append(p)
        return out

    def _plan(self, x: mx.array, cache: list[Any]) -> CallPlan:
        key = (tuple(x.shape), str(x.dtype), tuple(tuple(a.shape) for c in cache for a in _arrays(c)))
        plan = self._plans.get(key)
        if plan is None:
            tile = self._tile([_copy(c) for c in cache], self.bands[0])
            g = self.step.lower(x, cache=tile).graph
            plan = self._plans[key] = call_plan(g, self.n_layers, self.band)
            if self.pages is None:
                self.pages = plan.pages
                self.page_bytes = [sum(self.source.tensors[n].nbytes for n in p) for p in plan.pages]
            elif plan.pages != self.pages:
                raise PagingError(f"{g.name}: its bands read other parameters than the first graph's")
        return plan

    def _check(self, plan: CallPlan, chunks: int, *, refuse: bool = True) -> int:
        """The pager's limit for a call: the budget less the call's reserve; a budget too
        small for one band's working set is refused with the smallest that works."""
        # fenced: pages copied in on the dispatch thread, one tensor's host copy beside its array
        fenced = self.mode == "fenced"
        transient = max(self.source.tensors[n].nbytes for n in self.skeleton.slots) if fenced else 0
        reserve = plan.reserve(chunks) + transient
        need = self._need = max(self.page_bytes) + reserve
        if not refuse:
            return self.budget - reserve
        self.stats.needed = max(self.stats.needed, need)
        if self.budget < need:
            raise PagingError(
                f"a budget of {self.budget} bytes is too small: one band's working set needs {need} bytes "
                f"(its page {max(self.page_bytes)}, activations and KV buffers {reserve}); "
                f"the smallest budget that works is {need}"
            )
        return self.budget - reserve

    def _pager(self, limit: int) -> Pager:
        assert self.pages is not None
        p = self.pager
        if p is None or p.error is not None:
            if p is not None:
                p.close()
            p = self.pager = Pager(
                self.source,
                self.pages,
                limit,
                depth=self.depth,
                evict=self.evict,
                threaded=self.mode == "fenced",
                timeout=self.timeout,
            )
        p.shrink(limit)
        return p

    def _run(self, xs: list[mx.array], cache: list[Any], order: list[tuple[int, int]]) -> mx.array:
        if len(cache) != self.n_layers:
            raise ScheduleError(f"paged call: {len(cache)} caches for {self.n_layers} layers")
        plan = self._plan(xs[0], cache)
        for x in xs[1:]:
            self._plan(x, cache)  # a shorter last chunk: its own graph, same pages
        pager = self._pager(self._check(plan, len(xs)))
        shadows = [_copy(c) for c in cache]  # the caller's caches are written at the end only
        stashes: list[dict[str, mx.array]] = [{} for _ in xs]
        out: mx.array | None = None
        try:
            tickets = pager.request([k for k, _ in order])
            for (k, t), ticket in zip(order, tickets):
                members = self.bands[k]
                where = f"band {k} (layers {members[0]}-{members[-1]}), chunk {t}"
                arrays = pager.admit(ticket, where)
                self.skeleton.bind(arrays)
                try:
                    self.step.use_window(f"band{k}", stashes[t])
                    y = self.step(xs[t], cache=self._tile(shadows, members))
                finally:
                    self.skeleton.unbind(arrays)
                    self.step.spec.params.gather()  # forget the page's arrays: reclaim frees them
                    del arrays
                kept = [a for i in members for a in _arrays(shadows[i])]
                _drop_outputs(stashes[t], [*kept, y])
                made = [*stashes[t].values(), *kept]
                if y is not None:
                    made.append(y)
                    out = y
                pager.complete(ticket, made)
                self.stats.bands += 1
                if self.on_segment is not None:
                    self.on_segment(k, t, made)
            pager.finish()
        except BaseException:
            self.close()  # the pager thread ends; the next call starts another
            raise
        finally:
            self.step.use_window(None)
        for c, s in zip(cache, shadows):
            c.__dict__.update(vars(s))
        self.stats.calls += 1
        self.stats.loaded_bytes = pager.loaded_bytes
        self.stats.peak_resident = max(self.stats.peak_resident, pager.peak_bytes)
        assert out is not None
        return out
