"""``PagedModel``: a local mlx-lm model run under a memory budget, its weights paged in
band by band (docs/paging.md).

Each band of layers is one call of a jitted model with a window over the band's
segments (as ``segc.engine.banded_prefill`` runs a tile): before the call the band's
page is admitted (the pager's ``resident`` event, with a timeout) and bound into the
model in place of its stand-ins; after the dispatch (``mx.async_eval``, no host drain)
the stand-ins go back and the pager is told which outputs the band makes; once they
exist (``reclaim``) its page may be evicted. The pager loads the next pages meanwhile.

The caller's caches are written only at the end of a call (the bands write into shallow
copies): a call that fails leaves them, and every earlier output, as they were.

With KV paging (``kv_paging``; "auto" pages the caches only when they do not fit beside
the pages) each band's cache buffers are read back from the KV store with its first
ticket (the pager thread reads them with the page, the admit fence covers both) and
written out once its last ticket's outputs exist (the ``done`` step of
``Pager.complete``), so only the bands in flight hold KV buffers in MLX's memory. The
caches then hold the store's lazy arrays (``kvstore.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx

from ...errors import PagingError, ScheduleError
from ...staging import jit
from ..banded import BandWindows, check_prompt
from . import cudacopy
from .kvplan import (
    at_capacity,
    cache_arrays,
    given_bytes,
    grow_ahead,
    grows,
    growth,
    paged_reserve,
    shallow_copy,
    unpageable,
)
from .kvstore import KVBlock, KVStore
from .options import OneCall, PagingStats, check_settings, kv_option
from .pager import Done, Pager
from .plan import CallPlan, Skeleton, band_members, call_plan
from .source import DiskSource, HostSource, Reader
from .tiles import Tiles, drop_outputs

Hook = Callable[[int, int, list[mx.array]], None]  # (band, chunk, the outputs it makes)


@dataclass(frozen=True)
class _Call:
    """How a call runs: whether it pages the KV caches, and the pager's limit for pages."""

    kv_paged: bool
    limit: int


class PagedModel:
    """Model directory ``path`` run in ``budget`` bytes: its settings (``band``,
    ``depth``, ``evict``, ``mode``, ``source``, ``reader``, ``timeout``, ``kv_paging``,
    ``kv_dir``, ``recycle``, ``transfer``) are the table in docs/paging.md, "Settings".
    ``budget`` may be changed between calls; ``timeline`` set to a list records the
    pager's and the dispatch thread's steps (``Pager.timeline``). Calls from several
    threads run one at a time (``options.OneCall``)."""

    def __init__(
        self,
        path: str | Path,
        budget: int,
        *,
        band: int = 1,
        depth: int = 1,
        evict: str = "spread",
        mode: str = "fenced",
        source: str = "disk",
        reader: Reader | None = None,
        timeout: float = 10.0,
        kv_paging: bool | str = "auto",
        kv_dir: str | Path | None = None,
        recycle: bool = True,
        transfer: str = "auto",
    ):
        timeout = check_settings(
            budget=budget,
            band=band,
            depth=depth,
            timeout=timeout,
            recycle=recycle,
            mode=mode,
            source=source,
            evict=evict,
            transfer=transfer,
        )
        kv_paging = kv_option(kv_paging)
        self.path = Path(path)
        self.source = (HostSource if source == "host" else DiskSource)(self.path, reader=reader)
        self.transfer = ("cuda" if cudacopy.available() else "host") if transfer == "auto" else transfer
        if self.transfer == "cuda":
            self.source.attach(cudacopy.CudaCopier(timeout=timeout))
        self.skeleton = Skeleton(self.path, self.source.tensors)
        self.model = self.skeleton.model
        self.n_layers = self.skeleton.n_layers
        self.band = min(band, self.n_layers)
        self.budget, self.depth, self.evict, self.mode, self.timeout = budget, depth, evict, mode, timeout
        self.kv_paging, self.recycle = kv_paging, recycle
        self.kv = KVStore(kv_dir)  # outlives ``close``: the caches the caller holds read from it
        self.step = jit(self.model, boundaries="auto", validate=False, name=f"paged {self.path.name}")
        self.step.set_windows(BandWindows(self.n_layers, self.band))
        self.bands = band_members(self.n_layers, self.band)
        self.stats = PagingStats()
        self._plans: dict[Any, CallPlan] = {}
        self._aliased = False  # a traced graph hands on a view of a parameter: no recycling
        self._tiles = Tiles()  # the band calls' cache objects
        self.pages: tuple[tuple[str, ...], ...] | None = None
        self.page_bytes: list[int] = []
        self.pager: Pager | None = None
        self._need = 0
        self.on_segment: Hook | None = None  # called after each band's dispatch
        self.timeline: list[tuple[float, str, int]] | None = None
        self._one = OneCall(f"paged {self.path.name}")  # one call at a time, whatever the thread
        self._prepare([mx.array([[0]], dtype=mx.uint32)], self.make_cache())  # refused up front

    # ------------------------------------------------------------------ public

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model)

    @property
    def weight_bytes(self) -> int:
        return sum(self.source.tensors[n].nbytes for n in self.skeleton.slots)

    def min_budget(self, x: mx.array, cache: list[Any], chunks: int = 1) -> int:
        """The smallest budget that runs ``x`` (``chunks`` chunks of its shape at once),
        with the KV caches paged where ``kv_paging`` allows it and that needs less."""
        self._check_call(x, cache, "min_budget")
        with self._one.hold("min_budget", self.timeout):
            self._prepare([x] * chunks, cache, refuse=False)
            return self._need

    def __call__(self, x: mx.array, cache: list[Any]) -> mx.array:
        """``model(x, cache=cache)``: one chunk (a prompt or a token) through every band."""
        self._check_call(x, cache, "call")
        return self._run([x], cache, [(k, 0) for k in range(len(self.bands))])

    def prefill(self, prompt: mx.array, cache: list[Any], *, chunk: int = 256, banded: bool = True) -> mx.array:
        """Prefill ``cache`` with ``prompt`` (``[1, L]``) in chunks of ``chunk`` tokens;
        the last chunk's logits. ``banded``: band-major (each band's page loaded once per
        prompt); otherwise chunk by chunk (each page loaded once per chunk)."""
        self._check_call(prompt, cache, "prefill")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ScheduleError(f"prefill: chunk must be an int >= 1, got {chunk!r}")
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
        call maps them again). The KV store stays: caches the caller holds read from it
        (its directory goes with the ``PagedModel``). Waits for a call another thread runs."""
        with self._one.hold("close", self.timeout):
            self._close()

    def _close(self) -> None:
        if self.pager is not None:
            self.pager.close()
            self.pager = None
        self.source.close()

    # ------------------------------------------------------------------ internals

    def _check_call(self, x: Any, cache: Any, what: str) -> None:
        """A call's tokens (``[1, L]``, at least one) and caches (one per layer)."""
        check_prompt(x, f"paged {what}")
        if not isinstance(cache, list | tuple) or len(cache) != self.n_layers:
            got = f"{len(cache)} caches" if isinstance(cache, list | tuple) else f"a {type(cache).__name__}"
            raise PagingError(
                f"paged {what}: {got} for {self.n_layers} layers (a list of mlx-lm caches: pm.make_cache())"
            )

    def _plan(self, x: mx.array, cache: list[Any]) -> CallPlan:
        shapes = tuple(tuple(a.shape) for c in cache for a in cache_arrays(c))
        key = (tuple(x.shape), str(x.dtype), shapes, grows(cache, x.shape[1]))
        plan = self._plans.get(key)
        if plan is None:
            g = self.step.lower(x, cache=self._tiles.fill(cache, self.bands[0])).graph
            self._tiles.clear()
            plan = self._plans[key] = call_plan(g, self.n_layers, self.band)
            self._aliased |= plan.aliased  # then no page's buffers are recycled (pager.py)
            if self.pages is None:
                self.pages = plan.pages
                self.page_bytes = [sum(self.source.tensors[n].nbytes for n in p) for p in plan.pages]
            elif plan.pages != self.pages:
                raise PagingError(f"{g.name}: its bands read other parameters than the first graph's")
        return plan

    def _plans_for(self, xs: list[mx.array], cache: list[Any], *, at_end: bool) -> tuple[CallPlan, ...]:
        """The first chunk's plan, then the later chunks' (their largest graphs: a long
        prompt's last chunks attend over every position before them): traced at the
        capacity the caches reach by the end of the call when ``at_end`` or when they
        grow past the first chunk's buffers; else with the caches as they are."""
        first = self._plan(xs[0], cache)
        later = {tuple(x.shape): x for x in xs[1:]}
        if not later:
            return (first,)
        if unpageable(cache) is not None:
            return (first, *(self._plan(x, cache) for x in later.values()))
        sizes = [x.shape[1] for x in xs]
        caps = growth(cache, sizes).final
        if not at_end and caps == growth(cache, sizes[:1]).final:
            return (first, *(self._plan(x, cache) for x in later.values()))
        return (first, *(self._plan(x, at_capacity(cache, first, caps, x.shape[1])) for x in later.values()))

    def _prepare(self, xs: list[mx.array], cache: list[Any], *, refuse: bool = True) -> _Call:
        """Plan a call: whether it pages the KV caches, and the pager's limit (the budget
        less the call's reserve). A budget too small for one band's working set is
        refused with the smallest that works (``self._need``)."""
        self.kv_paging = kv_option(self.kv_paging)  # it may have been set since
        plans = self._plans_for(xs, cache, at_end=False)
        chunks = len(xs)
        fenced = self.mode == "fenced"
        # fenced: pages copied in on the dispatch thread, one tensor's host copy beside its array
        transient = max(self.source.tensors[n].nbytes for n in self.skeleton.slots) if fenced else 0
        page = max(self.page_bytes)
        reserve = {"resident": max(p.reserve(chunks) for p in plans) + transient}
        why = "kv_paging=False" if self.kv_paging is False else unpageable(cache)
        if why is None:
            given = [given_bytes(cache, m) for m in self.bands]
            in_flight = self.depth + 1 if fenced else 1
            grown = growth(cache, [x.shape[1] for x in xs]).any
            at_end = self._plans_for(xs, cache, at_end=True)
            reserve["paged"] = paged_reserve(at_end, chunks, in_flight, max(given), grown) + transient
        elif self.kv_paging is True:
            raise PagingError(f"KV paging cannot page these caches: {why}")
        if self.kv_paging is True:
            choice = "paged"
        elif self.kv_paging is False or "paged" not in reserve or self.budget >= page + reserve["resident"]:
            choice = "resident"
        else:
            choice = "paged"
        need = page + reserve[choice]
        self._need = page + min(reserve.values()) if self.kv_paging == "auto" else need
        call = _Call(choice == "paged", self.budget - reserve[choice])
        if not refuse:
            return call
        self.stats.needed = max(self.stats.needed, need)
        if self.budget < need:
            kv = " with the KV caches paged" if choice == "paged" else ""
            raise PagingError(
                f"a budget of {self.budget} bytes is too small: one band's working set needs {need} bytes{kv} "
                f"(its page {page}, activations and KV buffers {reserve[choice]}); "
                f"the smallest budget that works is {self._need}"
            )
        return call

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
                kv_store=self.kv,
                direct=self.transfer != "host",
            )
        p.shrink(limit)
        p.timeline = self.timeline
        return p

    def _kv_schedule(
        self, order: list[tuple[int, int]], cache: list[Any]
    ) -> tuple[list[list[KVBlock] | None], dict[int, int]]:
        """Per ticket, the KV blocks it reads back (a band's first ticket: its layers'
        buffers the store holds), and per band its last ticket (its buffers go out after)."""
        homes = [self.kv.home(c) for c in cache]
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for j, (k, _) in enumerate(order):
            if k in last and last[k] != j - 1:
                raise ScheduleError(f"KV paging: band {k}'s calls are not consecutive")
            first.setdefault(k, j)
            last[k] = j
        reads: list[list[KVBlock] | None] = [None] * len(order)
        for k, j in first.items():
            reads[j] = [b for i in self.bands[k] if (b := homes[i]) is not None] or None
        return reads, last

    def _write_out(self, shadows: list[Any], members: range) -> Done:
        """The band's new buffers to the KV store (once they exist), the store's lazy
        arrays in their place: MLX's memory holds them no longer."""

        def done() -> None:
            for i in members:
                bufs = {n: a for n, a in vars(shadows[i]).items() if isinstance(a, mx.array)}
                if bufs:
                    shadows[i].__dict__.update(self.kv.write(i, bufs))

        return done

    def _run(self, xs: list[mx.array], cache: list[Any], order: list[tuple[int, int]]) -> mx.array:
        with self._one.hold("call", self.timeout):
            return self._run_bands(xs, cache, order)

    def _run_bands(self, xs: list[mx.array], cache: list[Any], order: list[tuple[int, int]]) -> mx.array:
        call = self._prepare(xs, cache)
        pager = self._pager(call.limit)
        pager.recycle = self.recycle and not self._aliased
        shadows = [shallow_copy(c) for c in cache]  # the caller's caches are written at the end only
        stashes: list[dict[str, mx.array]] = [{} for _ in xs]
        reads, last = self._kv_schedule(order, cache) if call.kv_paged else (None, {})
        out: mx.array | None = None
        try:
            tickets = pager.request([k for k, _ in order], reads)
            for j, ((k, t), ticket) in enumerate(zip(order, tickets)):
                members = self.bands[k]
                where = f"band {k} (layers {members[0]}-{members[-1]}), chunk {t}"
                arrays = pager.admit(ticket, where)
                for i, bufs in pager.take_kv(ticket).items():  # the band's KV, read back
                    shadows[i].__dict__.update(bufs)
                for i in members:
                    grow_ahead(shadows[i], xs[t].shape[1])
                self.skeleton.bind(arrays)
                tile = self._tiles.fill(shadows, members)
                try:
                    self.step.use_window(f"band{k}", stashes[t])
                    y = self.step(xs[t], cache=tile)
                    pager.note("called", ticket)
                    for i in members:  # the band's new buffers and offsets
                        shadows[i].__dict__.update(vars(tile[i]))
                finally:
                    self.skeleton.unbind(arrays)
                    self.step.spec.params.gather()  # forget the page's arrays: reclaim frees them
                    del arrays
                    self._tiles.clear()  # the jit keeps the last call's objects: they keep no buffer
                kept = [a for i in members for a in cache_arrays(shadows[i])]
                drop_outputs(stashes[t], [*kept, y])
                made = [*stashes[t].values(), *kept, *([y] if y is not None else [])]
                out = y if y is not None else out
                pager.complete(ticket, made, self._write_out(shadows, members) if last.get(k) == j else None)
                pager.note("completed", ticket)
                self.stats.bands += 1
                self._one.progress()
                if self.on_segment is not None:
                    self.on_segment(k, t, made)
                del made, kept, y  # a band's buffers live no longer than its write-out needs
            pager.finish()
        except BaseException:
            self._close()  # the pager thread ends; the next call starts another
            raise
        finally:
            self.step.use_window(None)
        for c, s in zip(cache, shadows):
            c.__dict__.update(vars(s))
        self.stats.calls += 1
        self.stats.kv_paged_calls += call.kv_paged
        self.stats.kv_read_bytes, self.stats.kv_written_bytes = self.kv.read_bytes, self.kv.written_bytes
        self.stats.loaded_bytes, self.stats.recycled_bytes = pager.loaded_bytes, pager.recycled_bytes
        self.stats.peak_resident = max(self.stats.peak_resident, pager.peak_bytes)
        assert out is not None
        return out
