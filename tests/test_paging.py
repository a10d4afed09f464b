"""Paging (docs/paging.md): a model run under a memory budget, its weights paged in band
by band, gives the resident (eager mlx-lm) run's logits and caches bit for bit, for
decode, chunked prefill and banded prefill, on a dense llama, a quantized llama and an
MoE architecture; the budget is kept at every band; failures name the file and tensor."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits, examples
from hypothesis import example, given, settings
from hypothesis import strategies as hs

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from segc.engine import load_local_model
from segc.engine.paging import PagedModel, cudacopy, save_model_dir
from segc.errors import PagingError, ScheduleError, WaitTimeout
from segc.models.zoo import build, tiny_config

ARCHS = {
    "llama": ("llama", None, {"num_hidden_layers": 4}),
    "llama-q4": ("llama", 4, {"num_hidden_layers": 4}),
    "mixtral": ("mixtral", None, {"num_hidden_layers": 3}),
}
TRANSFERS = ["host", "direct", *(["cuda"] if cudacopy.available() else [])]
PROMPT = mx.array([[(7 * i + 3) % 128 for i in range(37)]], dtype=mx.uint32)


def save(path: Path, arch: str, shard_bytes: int = 1 << 30) -> Path:
    model_type, q, extra = ARCHS[arch]
    cfg = tiny_config(model_type, **extra)
    if q is not None:
        cfg["quantization"] = {"group_size": 32, "bits": q}
    return save_model_dir(build(model_type, bits=q, seed=5, **extra), cfg, path, shard_bytes=shard_bytes)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # several files per model, so pages cross files
    return {a: save(tmp_path_factory.mktemp(a), a, shard_bytes=60_000) for a in ARCHS}


def cache_bits(cache: list[Any]) -> list[Any]:
    """Each cache's offset and buffers (mlx-lm's own bytes, the zeros past the offset too)."""
    return [(int(c.offset), bits(c.keys), bits(c.values)) for c in cache]


def resident(path: Path, chunk: int, steps: int) -> list[Any]:
    """Eager mlx-lm with every weight resident: the chunked prefill's logits and caches,
    then ``steps`` greedy decode steps'. On a GPU, where segc's dynamic KV cache is within
    a bound of eager rather than equal (docs/models.md), the resident run is segc's own:
    the same engine with a budget that holds every page (nothing is ever evicted)."""
    if mx.default_device() != mx.cpu:
        pm = PagedModel(path, budget=1 << 40, timeout=30)
        try:
            return paged_run(pm, chunk, steps, banded=False)
        finally:
            pm.close()
    model, _ = load_local_model(path)
    cache = make_prompt_cache(model)
    for s in range(0, PROMPT.shape[1], chunk):
        logits = model(PROMPT[:, s : s + chunk], cache=cache)
    out = [(bits(logits), cache_bits(cache))]
    for _ in range(steps):
        tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
        logits = model(tok, cache=cache)
        out.append((bits(logits), cache_bits(cache)))
    return out


def paged_run(pm: PagedModel, chunk: int, steps: int, banded: bool) -> list[Any]:
    cache = pm.make_cache()
    logits = pm.prefill(PROMPT, cache, chunk=chunk, banded=banded)
    out = [(bits(logits), cache_bits(cache))]
    for _ in range(steps):
        tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
        logits = pm(tok, cache)
        out.append((bits(logits), cache_bits(cache)))
    return out


def tight(path: Path, chunk: int, steps: int, spare: bool = True, **options: Any) -> int:
    """The largest working set of the run (measured by a first run), plus, with
    ``spare``, about two pages beside it: pages are evicted and read again."""
    pm = PagedModel(path, budget=1 << 40, **options)
    try:
        paged_run(pm, chunk, steps, banded=True)
        paged_run(pm, chunk, 0, banded=False)
        return pm.stats.needed + (min(pm.page_bytes) if spare else 0)
    finally:
        pm.close()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_paged_runs_are_the_resident_run(dirs: dict[str, Path], arch: str) -> None:
    want = resident(dirs[arch], 16, 4)
    pm = PagedModel(dirs[arch], budget=tight(dirs[arch], 16, 4), timeout=30)
    try:
        assert paged_run(pm, 16, 4, banded=True) == want  # banded prefill, then decode
        assert paged_run(pm, 16, 4, banded=False) == want  # chunked prefill, then decode
        # every page of every band was read again and again: the budget forced evictions
        assert pm.stats.loaded_bytes > 2 * pm.weight_bytes
        assert pm.stats.peak_resident <= pm.budget
        # and evicted pages' buffers were read into again (the layers' pages match)
        assert 0 < pm.stats.recycled_bytes < pm.stats.loaded_bytes
    finally:
        pm.close()
    drain = {"mode": "drain", "evict": "lru", "depth": 0}
    drained = PagedModel(dirs[arch], budget=tight(dirs[arch], 16, 2, spare=False, **drain), **drain)
    try:
        assert paged_run(drained, 16, 2, banded=False) == want[:3]  # each chunk reads every page
        assert 0 < drained.stats.recycled_bytes < drained.stats.loaded_bytes  # the drain reads into them too
    finally:
        drained.close()
    fresh = PagedModel(dirs[arch], budget=pm.budget, recycle=False, timeout=30)
    try:
        assert paged_run(fresh, 16, 2, banded=True) == want[:3]
        assert fresh.stats.recycled_bytes == 0
    finally:
        fresh.close()


@settings(max_examples=examples(6))
@example(band=1, depth=0, evict="lru", chunk=16, source="disk", recycle=True, transfer="direct", mode="fenced")
@example(band=2, depth=2, evict="mru", chunk=8, source="host", recycle=False, transfer="host", mode="fenced")
@example(band=1, depth=1, evict="mru", chunk=16, source="host", recycle=True, transfer="direct", mode="drain")
@example(band=1, depth=0, evict="spread", chunk=37, source="disk", recycle=True, transfer="direct", mode="fenced")
@given(
    band=hs.integers(1, 4),
    depth=hs.integers(0, 2),
    evict=hs.sampled_from(["spread", "lru", "mru"]),
    chunk=hs.sampled_from([8, 16, 37]),
    source=hs.sampled_from(["disk", "host"]),
    recycle=hs.booleans(),
    transfer=hs.sampled_from(TRANSFERS),
    mode=hs.sampled_from(["fenced", "drain"]),
)
def test_paging_settings_keep_the_bits(
    tmp_path_factory: pytest.TempPathFactory,
    band: int,
    depth: int,
    evict: str,
    chunk: int,
    source: str,
    recycle: bool,
    transfer: str,
    mode: str,
) -> None:
    path = llama_dir(tmp_path_factory)
    want = resident(path, chunk, 2)
    options = {"band": band, "depth": depth, "evict": evict, "mode": mode}
    budget = tight(path, chunk, 2, **options)
    pm = PagedModel(path, budget=budget, source=source, recycle=recycle, transfer=transfer, **options)
    try:
        assert paged_run(pm, chunk, 2, banded=True) == want
        assert pm.pager is not None
        if transfer != "host" and mode == "fenced":  # every page read straight into MLX buffers
            assert pm.pager.peak_host_bytes == 0 and pm.pager.convert_peak == 0
    finally:
        pm.close()


_LLAMA: list[Path] = []


def llama_dir(factory: pytest.TempPathFactory) -> Path:
    if not _LLAMA:
        _LLAMA.append(save(factory.mktemp("llama-settings"), "llama"))
    return _LLAMA[0]


BIG = {"num_hidden_layers": 8, "hidden_size": 256, "intermediate_size": 4096, "head_dim": 64}


def test_a_model_four_times_the_budget_stays_under_it(tmp_path: Path) -> None:
    """MLX's peak memory above the caller's, plus the pager's host copies, stays under
    the budget at every band."""
    cfg = tiny_config("llama", **BIG)
    save_model_dir(build("llama", seed=1, **BIG), cfg, tmp_path)
    pm = PagedModel(tmp_path, budget=1 << 40)
    pm.budget = pm.weight_bytes // 4
    needed = tight(tmp_path, 16, 7) - min(pm.page_bytes)  # the run's largest need
    assert pm.budget >= needed, "the model's layers are too small beside its KV cache for the test"
    peaks: list[int] = []

    def measure(band: int, chunk: int, made: list[mx.array]) -> None:
        mx.eval(made)  # this band's work is done: its peak is in
        assert pm.pager is not None
        # the sum of the two peaks bounds the peak of the sum
        peaks.append(mx.get_peak_memory() - base + pm.pager.peak_host_bytes)
        mx.reset_peak_memory()
        pm.pager.peak_host_bytes = pm.pager.host_bytes

    cache = pm.make_cache()
    mx.synchronize()
    base = mx.get_active_memory()  # the caller's arrays: the budget covers everything after
    mx.reset_peak_memory()
    pm.on_segment = measure
    try:
        logits = pm.prefill(PROMPT, cache, chunk=16)
        for _ in range(3):
            logits = pm(mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32), cache)
        assert len(peaks) == 3 * 8 + 3 * 8
        assert max(peaks) <= pm.budget, (max(peaks), pm.budget)
        assert pm.pager is not None  # while a page's host copies become arrays, too
        assert pm.pager.convert_peak - base <= pm.budget
        pm.on_segment = None  # the fenced run, nothing drained: its overall peak
        mx.synchronize()
        mx.reset_peak_memory()
        for _ in range(4):
            logits = pm(mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32), cache)
        mx.eval(logits)
        assert pm.pager is not None
        assert mx.get_peak_memory() - base + pm.pager.peak_host_bytes <= pm.budget
        assert pm.stats.peak_resident < pm.weight_bytes // 4
        assert pm.pager.convert_peak > 0 or pm.transfer != "host"  # direct roads convert nothing
    finally:
        pm.close()


def test_a_budget_too_small_is_refused_with_the_smallest_that_works(dirs: dict[str, Path]) -> None:
    with pytest.raises(PagingError, match=r"smallest budget that works is (\d+)") as info:
        PagedModel(dirs["llama"], budget=1000)
    need = int(str(info.value).rsplit(" ", 1)[1])
    with pytest.raises(PagingError, match="too small"):
        PagedModel(dirs["llama"], budget=need - 1)
    pm = PagedModel(dirs["llama"], budget=need)
    try:
        pm(mx.array([[3]], dtype=mx.uint32), pm.make_cache())
        cache = pm.make_cache()
        with pytest.raises(PagingError, match="smallest budget"):  # a longer call needs more
            pm.prefill(PROMPT, cache, chunk=37)
        assert [c.offset for c in cache] == [0] * 4
    finally:
        pm.close()
    for bad in (0, -5, 1.5, True):
        with pytest.raises(PagingError, match="budget"):
            PagedModel(dirs["llama"], budget=bad)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="mode"):
        PagedModel(dirs["llama"], budget=need, mode="sometimes")
    with pytest.raises(ScheduleError, match="evict"):
        PagedModel(dirs["llama"], budget=need, evict="fifo")
    with pytest.raises(ScheduleError, match="depth"):
        PagedModel(dirs["llama"], budget=need, depth=-1)


def _failing_reader(pm: PagedModel, victim: str) -> None:
    base = pm.source._raw

    def reader(info: Any) -> Any:
        if info.name == victim:
            raise OSError("injected read error")
        return base(info)

    pm.source.reader = reader


@settings(max_examples=examples(5))
@given(data=hs.data())
def test_a_read_error_names_the_tensor_and_leaves_the_caller_whole(
    tmp_path_factory: pytest.TempPathFactory, data: hs.DataObject
) -> None:
    path = llama_dir(tmp_path_factory)
    pm = PagedModel(path, budget=1 << 40, evict=data.draw(hs.sampled_from(["spread", "lru", "mru"])))
    try:
        cache = pm.make_cache()
        logits = pm.prefill(PROMPT, cache, chunk=16, banded=False)
        before = (bits(logits), cache_bits(cache))
        victim = data.draw(hs.sampled_from(sorted(pm.source.tensors)))
        pm.close()  # nothing resident: the next call reads every page again
        _failing_reader(pm, victim)
        pager_threads = {t for t in threading.enumerate() if t.name == "segc-pager"}
        tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
        banded = data.draw(hs.booleans())
        with pytest.raises(PagingError) as info:
            if banded:
                pm.prefill(PROMPT[:, :20], cache, chunk=8)
            else:
                pm(tok, cache)
        msg = str(info.value)
        assert repr(victim) in msg and pm.source.tensors[victim].file.name in msg, msg
        assert (bits(logits), cache_bits(cache)) == before  # the caller's state, untouched
        assert pm.pager is None  # the pager ended
        assert not {t for t in threading.enumerate() if t.name == "segc-pager"} - pager_threads
        pm.source.reader = None  # the medium is back: the next call runs, and is right
        want = resident(path, 16, 1)[1]
        assert (bits(pm(tok, cache)), cache_bits(cache)) == want
    finally:
        pm.close()


def test_a_reader_that_hangs_is_a_wait_timeout(dirs: dict[str, Path]) -> None:
    pm = PagedModel(dirs["llama"], budget=1 << 40, timeout=0.5)
    release = threading.Event()
    base = pm.source._raw

    def stuck(info: Any) -> Any:
        if "layers.2." in info.name:
            release.wait(30)
        return base(info)

    pm.source.reader = stuck
    cache = pm.make_cache()
    try:
        with pytest.raises(WaitTimeout) as info:
            pm(mx.array([[1, 2, 3]], dtype=mx.uint32), cache)
        assert info.value.event == "resident" and "band 2" in str(info.value)
        assert [c.offset for c in cache] == [0] * 4
    finally:
        release.set()
        pm.close()


def test_missing_and_truncated_tensors_are_named(tmp_path: Path) -> None:
    path = save(tmp_path / "m", "llama")
    f = path / "model.safetensors"
    data = f.read_bytes()
    pm = PagedModel(path, budget=1 << 40)  # reads headers only
    f.write_bytes(data[:-100])  # then the last tensor is cut short: found mid-run
    cache = pm.make_cache()
    try:
        with pytest.raises(PagingError, match=r"reading tensor 'model\.layers\.3\..*' from .*model\.safetensors"):
            pm.prefill(PROMPT, cache, chunk=16)
        assert [c.offset for c in cache] == [0] * 4
    finally:
        pm.close()
    with pytest.raises(PagingError, match=r"model\.layers\.3\..*model\.safetensors|model\.safetensors.*layers\.3"):
        PagedModel(path, budget=1 << 40)  # and up front, the next time
    other = save(tmp_path / "q", "llama-q4")  # the quantized model's files lack float weights
    for g in other.glob("*.safetensors"):
        g.replace(f)
    with pytest.raises(PagingError, match=r"(?s)loading .*/m: .*model\.layers\.0\.mlp\.down_proj\.scales"):
        PagedModel(path, budget=1 << 40)
    weights = dict(tree_flatten(build("llama", num_hidden_layers=4).parameters()))
    del weights["model.layers.2.mlp.up_proj.weight"]
    mx.save_safetensors(str(f), weights)
    with pytest.raises(PagingError, match=r"(?s)loading .*/m: .*model\.layers\.2\.mlp\.up_proj\.weight"):
        PagedModel(path, budget=1 << 40)
    with pytest.raises(PagingError, match="safetensors"):
        PagedModel(tmp_path, budget=1 << 40)
    (path / "config.json").unlink()
    with pytest.raises(PagingError, match=r"config\.json"):
        PagedModel(path, budget=1 << 40)


def test_the_pager_waits_for_a_slow_dispatch_thread_and_ends_with_a_dead_one(dirs: dict[str, Path]) -> None:
    """The pager's wait for ``reclaim`` outlasts its ``timeout`` while the thread that
    requested the pages lives (a band's first compile may take seconds), and ends with a
    ``WaitTimeout`` naming the pager once that thread is gone: never a hang."""
    from segc.engine.paging.pager import Pager
    from segc.engine.paging.source import DiskSource

    src = DiskSource(dirs["llama"])
    names = sorted(src.tensors)
    pages = [names[: len(names) // 3], names[len(names) // 3 : 2 * len(names) // 3], names[2 * len(names) // 3 :]]
    pager = Pager(src, pages, limit=1 << 40, depth=0, timeout=0.2)

    release = threading.Event()

    def dispatch() -> None:
        pager.request([0, 1, 2])  # ticket 1 waits until ticket 0 is reclaimed: never, here
        release.wait(timeout=30)  # a dispatch thread busy for 5x the pager's timeout

    t = threading.Thread(target=dispatch)
    t.start()
    try:
        time.sleep(1.0)
        assert pager._thread is not None and pager._thread.is_alive() and pager.error is None
        release.set()
        t.join(timeout=10)
        pager._thread.join(timeout=10)  # the requesting thread is gone: the pager ends
        assert not pager._thread.is_alive()
        assert isinstance(pager.error, PagingError) and "reclaim" in str(pager.error), pager.error
    finally:
        pager.close()


def test_a_graph_that_hands_on_a_weight_view_is_not_recycled() -> None:
    """The pager recycles an evicted page's buffers only if no segment's output is a
    parameter or a view of one (``CallPlan.aliased``): such an output could outlive its
    band in the stash, and overwriting the buffer would change it."""
    import mlx.nn as nn

    import segc
    from segc.engine.paging.plan import call_plan

    class Layer(nn.Module):
        def __init__(self, hands_on: bool) -> None:
            super().__init__()
            self.w = mx.ones((4, 4))
            self.hands_on = hands_on

        def __call__(self, x: mx.array) -> Any:
            y = x @ self.w.T
            return (y, self.w.T) if self.hands_on else (y, y.T)

    class Model(nn.Module):
        def __init__(self, hands_on: bool) -> None:
            super().__init__()
            self.layers = [Layer(hands_on)]

        def __call__(self, x: mx.array) -> mx.array:
            y, t = self.layers[0](x)
            return y @ t  # the head: reads what the layer handed on

    x = mx.ones((1, 4))
    for hands_on in (True, False):
        m = Model(hands_on)
        g = segc.jit(m, boundaries="layers.*").lower(x).graph
        assert call_plan(g, 1, 1).aliased is hands_on


def test_the_dispatch_thread_waits_for_a_slow_pager_without_spinning(
    dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a slow medium and a tight budget the dispatch thread waits at the admit
    fence; it helps the pager (waiting for outputs, evicting) only when that frees
    something. Counted by ``_make_room`` calls: a few per band, where a dispatch thread
    that spins while the pager reads makes thousands (it did: 76,000 in 8 tokens)."""
    from segc.engine.paging.pager import Pager

    path = dirs["llama"]
    pm = PagedModel(path, budget=tight(path, 16, 2), timeout=30)
    base = pm.source._raw

    def slow(info: Any) -> Any:
        time.sleep(0.002)  # a slow medium: every tensor takes a while
        return base(info)

    calls = []
    real = Pager._make_room

    def counting(self: Pager, upto: int) -> None:
        calls.append(upto)
        real(self, upto)

    want = resident(path, 16, 2)  # first: on a GPU the resident run is a PagedModel too
    pm.source.reader = slow
    monkeypatch.setattr(Pager, "_make_room", counting)
    try:
        assert paged_run(pm, 16, 2, banded=False) == want
        assert pm.stats.loaded_bytes > pm.weight_bytes  # pages were read again
        assert len(calls) <= 4 * pm.stats.bands, (len(calls), pm.stats.bands)
    finally:
        pm.close()


def test_a_banded_prefill_that_grows_the_caches_is_the_resident_run(
    dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """600 tokens in chunks of 200: the caches grow at the second and third chunks,
    trimmed back to their offsets first (200 and 400 are not multiples of mlx-lm's step
    of 256). The engine grows each band's caches before its call (``grow_ahead``), so
    once a first prompt has traced the graphs, no band call of the next takes the jitted
    call's general path; the logits and caches are eager mlx-lm's all the same."""
    from segc.staging import Jitted

    path = dirs["llama"]
    x = mx.array([[(5 * i + 1) % 128 for i in range(600)]], dtype=mx.uint32)
    if mx.default_device() == mx.cpu:
        model, _ = load_local_model(path)
        ref = make_prompt_cache(model)
        for s in range(0, 600, 200):
            want_logits = model(x[:, s : s + 200], cache=ref)
    else:  # the resident engine (see ``resident``)
        with_all = PagedModel(path, budget=1 << 40, timeout=30)
        ref = with_all.make_cache()
        want_logits = with_all.prefill(x, ref, chunk=200, banded=False)
        with_all.close()
    want = (bits(want_logits), cache_bits(ref))
    pm = PagedModel(path, budget=1 << 40, timeout=30)
    try:
        cache = pm.make_cache()
        assert (bits(pm.prefill(x, cache, chunk=200)), cache_bits(cache)) == want
        binds = []
        real = Jitted._bind
        monkeypatch.setattr(Jitted, "_bind", lambda self, *a, **k: binds.append(1) or real(self, *a, **k))
        cache = pm.make_cache()
        assert (bits(pm.prefill(x, cache, chunk=200)), cache_bits(cache)) == want
        assert binds == []
    finally:
        pm.close()


@pytest.mark.parametrize("banded", [True, False])
def test_with_every_page_held_no_band_waits_for_the_band_before_it(dirs: dict[str, Path], banded: bool) -> None:
    """Every page held (a budget that holds them all, a first call reads them): the
    dispatch thread never waits for the band it dispatched last before dispatching the
    next (that would drain the device between bands): only ``finish`` waits for the last.
    A banded prefill's later chunks of a held page are resident at once, whatever the
    prefetch depth (the depth bounds reads, and they read nothing)."""
    from segc.engine.paging.pager import Pager

    pm = PagedModel(dirs["llama"], budget=1 << 40, timeout=30)
    drains: list[int] = []
    real_wait, real_finish = Pager._wait_for, Pager.finish
    in_finish = threading.local()

    def wait_for(self: Pager, upto: int) -> None:
        newest = self._pending[-1][0] if self._pending else None
        real_wait(self, upto)
        if (
            newest is not None
            and not getattr(in_finish, "on", False)
            and not any(t == newest for t, *_ in self._pending)
        ):
            drains.append(newest)

    def finish(self: Pager) -> None:
        in_finish.on = True
        try:
            real_finish(self)
        finally:
            in_finish.on = False

    try:
        paged_run(pm, 8, 2, banded=banded)  # reads every page
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Pager, "_wait_for", wait_for)
            mp.setattr(Pager, "finish", finish)
            for _ in range(3):
                paged_run(pm, 8, 2, banded=banded)
        assert drains == []
    finally:
        pm.close()


def test_a_banded_prefill_reads_the_next_page_while_every_chunk_of_the_band_runs(dirs: dict[str, Path]) -> None:
    """The prefetch depth counts pages (runs of one page's tickets: a band's chunks), not
    tickets: with ``depth=1`` the next band's page is read as soon as the first chunk of
    the running band is admitted, nothing completed yet (it used to wait until all but
    the band's last chunk were complete, so a read overlapped one chunk of compute); the
    page after it waits until the band before the running one is complete."""
    from segc.engine.paging.pager import Pager
    from segc.engine.paging.source import DiskSource

    pm = PagedModel(dirs["llama"], budget=1 << 40)
    pages = pm.pages
    pm.close()
    assert pages is not None and len(pages) >= 3
    chunks = 3
    pager = Pager(DiskSource(dirs["llama"]), pages, 1 << 40, depth=1, timeout=30)
    try:
        tickets = pager.request([p for p in range(3) for _ in range(chunks)])
        pager.admit(tickets[0], "band 0, chunk 0")
        pager.resident.wait(chunks + 1, timeout=10, where="band 1's page, read ahead")
        time.sleep(0.2)  # time enough to read another page, were it allowed
        assert pager.resident.value == 2 * chunks, "band 1's chunks resident, band 2's page not read"
        for t in tickets[:chunks]:  # band 0 completes: band 2's page may be read
            pager.admit(t, "band 0")
            pager.complete(t, [mx.array(t)])
        pager.finish()
        pager.resident.wait(2 * chunks + 1, timeout=10, where="band 2's page")
    finally:
        pager.close()


def test_the_next_page_is_sent_before_the_last_has_landed_and_pages_land_in_order(dirs: dict[str, Path]) -> None:
    """On the CUDA road the pager does not wait for a page's copies before it starts the
    next page's (it marks them and lands the page once the mark has passed: the copy
    engine is never idle between pages); ``resident`` still moves in ticket order. Here a
    source whose copies land only when the test says so (its marks), on any machine."""
    from segc.engine.paging.pager import Pager
    from segc.engine.paging.source import DiskSource

    class Landing(DiskSource):
        def __init__(self, path: Path) -> None:
            super().__init__(path)
            self.marks: list[int] = []
            self.done: set[int] = set()

        def mark(self) -> Any:
            self.marks.append(len(self.marks))
            return ("mark", self.marks[-1])

        def landed(self, mark: Any) -> bool:
            return mark is None or mark[1] in self.done

    pm = PagedModel(dirs["llama"], budget=1 << 40)
    pages = pm.pages
    pm.close()
    assert pages is not None
    src = Landing(dirs["llama"])
    pager = Pager(src, pages, 1 << 40, depth=1, timeout=30, direct=True)
    try:
        pager.request([0, 1, 2])
        pager._make_room(1)  # the dispatch thread's part: buffers for the first two pages
        deadline = time.monotonic() + 10
        while len(src.marks) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert src.marks == [0, 1], "the second page's copies wait for the first page's"
        assert pager.resident.value == 0
        src.done.add(1)  # the second page's copies are done first: it may not land before the first
        time.sleep(0.1)
        assert pager.resident.value == 0
        src.done.add(0)
        pager.resident.wait(2, timeout=10, where="both pages landed")
        for t, page in ((0, pages[0]), (1, pages[1])):
            arrays = pager.admit(t, f"ticket {t}")
            assert {n: bits(a) for n, a in arrays.items()} == {n: bits(src.read(n)) for n in page}
    finally:
        pager.close()


def test_pages_held_between_do_not_hold_back_the_next_read(dirs: dict[str, Path]) -> None:
    """The prefetch depth counts the runs that read their page: with page 1 held from an
    earlier call, page 2 is read while band 0 runs (``depth=1``: one page read ahead of
    the running one), not once bands 0 and 1 have completed; page 3 waits until band 0
    is complete (two read pages would be ahead of it)."""
    from segc.engine.paging.pager import Pager
    from segc.engine.paging.source import DiskSource

    pm = PagedModel(dirs["llama"], budget=1 << 40)
    pages = pm.pages
    pm.close()
    assert pages is not None and len(pages) >= 4
    pager = Pager(DiskSource(dirs["llama"]), pages, 1 << 40, depth=1, timeout=30)
    try:
        (t,) = pager.request([1])  # an earlier call: page 1 stays held
        pager.admit(t, "earlier")
        pager.complete(t, [mx.array(t)])
        pager.finish()
        first = pager.request([0, 1, 2, 3])[0]
        pager.admit(first, "band 0")  # dispatched, not complete
        pager.resident.wait(first + 3, timeout=10, where="page 2, read ahead past the held page")
        time.sleep(0.2)  # time enough to read page 3, were it allowed
        assert pager.resident.value == first + 3, "page 3 read with page 2 not yet used"
        pager.complete(first, [mx.array(0)])
        pager.finish()
        pager.resident.wait(first + 4, timeout=10, where="page 3, once band 0 is complete")
    finally:
        pager.close()


def test_mru_waits_for_the_band_just_dispatched_rather_than_evict_an_older_page(dirs: dict[str, Path]) -> None:
    """While the admit fence waits for a page (here a slow one), the band dispatched last
    completes, and the room for the page read ahead is made from its page (the most
    recently used) rather than from an older one, which would be read again (here kept
    from an earlier call). Pages 1 and 2 cannot both stay beside 0 and 3."""
    from segc.engine.paging.pager import Pager
    from segc.engine.paging.source import DiskSource

    pm = PagedModel(dirs["llama"], budget=1 << 40)
    pages = pm.pages
    pm.close()
    assert pages is not None and len(pages) == 4
    src = DiskSource(dirs["llama"])
    slow = {(src.tensors[n].file, src.tensors[n].start) for n in pages[0]}
    base = DiskSource(dirs["llama"]).raw

    def reader(info: Any) -> Any:
        if (info.file, info.start) in slow:
            time.sleep(0.05)  # page 0 is slow: the admit fence waits for it
        return base(info)

    src.reader = reader
    sizes = [sum(src.tensors[n].nbytes for n in p) for p in pages]
    assert sizes[3] >= min(sizes[1], sizes[2])
    limit = sizes[0] + sizes[3] + max(sizes[1], sizes[2])
    pager = Pager(src, pages, limit, depth=1, evict="mru", timeout=30)
    try:
        (t,) = pager.request([1])  # an earlier call: page 1 stays held
        pager.admit(t, "earlier")
        pager.complete(t, [mx.array(t)])
        pager.finish()
        for t, p in zip(pager.request([2, 0, 3]), [2, 0, 3]):
            pager.admit(t, f"page {p}")
            pager.complete(t, [mx.array(t)])
        pager.finish()
        assert 1 in pager.held and 2 not in pager.held, sorted(pager.held)
    finally:
        pager.close()


@pytest.mark.timeout(120)
def test_a_cyclic_decode_keeps_pages_spread_over_the_band_order(tmp_path: Path) -> None:
    """``evict="spread"`` (the default): in a cyclic decode (every call bands 0..7, in
    order) at a budget for about half the pages, the pages held across calls are the
    first one and others spread over the cycle (0 and 4 of 8), so the next call starts
    on a resident page and the medium reads a page while each kept band computes, and
    no later call reads them again. ``"mru"``
    keeps one block instead, and drifts (layers 9-14
    of 16 in ``benchmarks/paging_timeline.py``: the medium idled while it computed)."""
    from segc.engine.paging.pager import Pager
    from segc.engine.paging.source import DiskSource

    kw = {"num_hidden_layers": 8, "hidden_size": 128, "intermediate_size": 512}
    path = save_model_dir(build("llama", seed=3, **kw), tiny_config("llama", **kw), tmp_path / "m")
    pm = PagedModel(path, budget=1 << 40)
    pages = pm.pages
    pm.close()
    assert pages is not None and len(pages) == 8
    sizes = [sum(DiskSource(path).tensors[n].nbytes for n in p) for p in pages]
    limit = sizes[0] + sizes[2] + sizes[4] + 2 * max(sizes)  # three pages kept, two in flight
    read: list[int] = []
    pager = Pager(DiskSource(path), pages, limit, depth=1, timeout=30)  # evict="spread", the default
    try:
        for call in range(4):
            before = pager.loaded_bytes
            tickets = pager.request(list(range(8)))
            if call > 0:  # the first band's page is resident at once
                pager.resident.wait(tickets[0] + 1, timeout=10, where="the first page of a cyclic call")
            for t in tickets:
                pager.admit(t, f"ticket {t}")
                pager.complete(t, [mx.array(t)])
            pager.finish()
            read.append(pager.loaded_bytes - before)
            if call > 0:  # after a first call: the first page, and page 4
                assert {0, 4} <= set(pager.held), (call, sorted(pager.held))
        assert pager.peak_bytes <= limit
    finally:
        pager.close()
    # every later call reads at most the pages other than those two (which of the others
    # it keeps can differ from call to call: whether a page has landed when room is made
    # is the reader thread's timing; on a loaded 2-core machine a call read one more)
    assert all(r <= sum(sizes) - sizes[0] - sizes[4] for r in read[1:]), (read, sizes)
    assert all(r < read[0] for r in read[1:]), read  # the held pages are not read again


def test_the_admit_fence_never_waits_for_a_page_that_has_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatch thread helps the pager with the lock released; a page that lands
    meanwhile notifies no one, so the fence checks again before it waits (it used to
    wait out its timeout: 10 s stalls in a decode with ``depth=0`` at a quarter of the
    weights). Checked at every wait of the dispatch thread: the page it admits has not
    landed. An 8-layer llama, as ``benchmarks/paging_timeline.py`` found it."""
    from segc.engine.paging import pager as pager_module

    main = threading.current_thread()
    holder: dict[str, Any] = {}
    bad: list[tuple[int, int]] = []

    class Checking(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            p = holder.get("pm")
            p = p.pager if p is not None else None
            if threading.current_thread() is main and p is not None and p.timeline:
                admits = [k for _, w, k in p.timeline if w == "admit"]
                done = [k for _, w, k in p.timeline if w == "admitted"]
                if admits and (not done or done[-1] < admits[-1]) and p.resident.value > admits[-1]:
                    bad.append((admits[-1], p.resident.value))
            return super().wait(timeout)

    monkeypatch.setattr(pager_module.threading, "Condition", Checking)
    kw = {"num_hidden_layers": 8, "hidden_size": 256, "intermediate_size": 512}
    path = save_model_dir(build("llama", seed=2, **kw), tiny_config("llama", **kw), tmp_path / "m")
    pm = PagedModel(path, budget=1 << 40, depth=0, timeout=30, kv_paging=False)
    holder["pm"] = pm
    pm.timeline = []
    x = mx.array([[(7 * i + 3) % 128 for i in range(64)]], dtype=mx.uint32)
    try:
        for _ in range(3):  # banded prefill, chunks of 16
            cache = pm.make_cache()
            pm.budget = pm.min_budget(x[:, :16], cache, 4) - max(pm.page_bytes) + pm.weight_bytes // 4
            mx.eval(pm.prefill(x, cache, chunk=16))
        assert pm.stats.loaded_bytes > 2 * pm.weight_bytes  # pages were read again and again
        assert bad == []
    finally:
        pm.close()
