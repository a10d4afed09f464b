"""KV paging (docs/paging.md, "KV paging"): the KV caches of the layers outside the
running bands leave MLX's memory for the KV store and come back before their layer.
Decode, chunked and banded prefill with the caches paged give the resident run's
logits and caches bit for bit (segc's resident run, and eager mlx-lm on the CPU), on a
dense llama, a 4-bit llama and mixtral; a cache larger than the budget stays under it
at every band; a failure mid-run leaves the caller's caches as they were."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits, examples
from hypothesis import example, given, settings
from hypothesis import strategies as hs

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache
from test_paging import ARCHS, PROMPT, cache_bits, llama_dir, paged_run, resident, save, tight

from segc.engine import load_local_model
from segc.engine.paging import PagedModel, save_model_dir
from segc.errors import PagingError, ScheduleError
from segc.models.zoo import build, tiny_config

CPU = mx.default_device() == mx.cpu


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {a: save(tmp_path_factory.mktemp(f"kv-{a}"), a, shard_bytes=60_000) for a in ARCHS}


def kv_tight(path: Path, chunk: int, steps: int, **options: Any) -> int:
    """The largest budget the run needs with its caches paged (measured by a first run)."""
    return tight(path, chunk, steps, spare=False, kv_paging=True, **options)


def segc_resident(path: Path, chunk: int, steps: int) -> list[Any]:
    """segc's resident run: every page and every cache in MLX's memory."""
    pm = PagedModel(path, budget=1 << 40, kv_paging=False)
    try:
        return paged_run(pm, chunk, steps, banded=True)
    finally:
        pm.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch", list(ARCHS))
def test_kv_paged_runs_are_the_resident_run(dirs: dict[str, Path], arch: str) -> None:
    path = dirs[arch]
    want = segc_resident(path, 16, 4)
    if CPU:  # and eager mlx-lm's (on a GPU segc's dynamic KV cache is within a bound of it)
        assert resident(path, 16, 4) == want
    pm = PagedModel(path, budget=kv_tight(path, 16, 4), kv_paging=True, timeout=30)
    try:
        assert paged_run(pm, 16, 4, banded=True) == want  # banded prefill, then decode
        assert paged_run(pm, 16, 4, banded=False) == want  # chunked prefill, then decode
        assert pm.stats.kv_paged_calls == pm.stats.calls
        assert pm.stats.kv_written_bytes > pm.stats.kv_read_bytes > 0
        assert pm.stats.loaded_bytes > pm.weight_bytes  # and the weights were paged too
    finally:
        pm.close()


@pytest.mark.timeout(120)
@settings(max_examples=examples(4))
@example(band=1, depth=0, mode="drain", chunk=16, source="disk")
@example(band=2, depth=2, mode="fenced", chunk=8, source="host")
@given(
    band=hs.integers(1, 3),
    depth=hs.integers(0, 2),
    mode=hs.sampled_from(["fenced", "drain"]),
    chunk=hs.sampled_from([8, 16, 37]),
    source=hs.sampled_from(["disk", "host"]),
)
def test_kv_paging_settings_keep_the_bits(
    tmp_path_factory: pytest.TempPathFactory, band: int, depth: int, mode: str, chunk: int, source: str
) -> None:
    path = llama_dir(tmp_path_factory)
    want = segc_resident(path, chunk, 2)
    budget = kv_tight(path, chunk, 2, band=band, depth=depth, mode=mode)
    pm = PagedModel(path, budget=budget, band=band, depth=depth, mode=mode, source=source, kv_paging=True)
    try:
        assert paged_run(pm, chunk, 2, banded=True) == want
    finally:
        pm.close()


# KV heavy: 2 KB of cache per position and layer beside 64-wide activations
WIDE_KV = {"num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 32}
LONG = mx.array([[(5 * i + 1) % 128 for i in range(200)]], dtype=mx.uint32)


def _eager(path: Path, chunk: int, steps: int) -> tuple[Any, list[Any]]:
    model, _ = load_local_model(path)
    cache = make_prompt_cache(model)
    for s in range(0, LONG.shape[1], chunk):
        logits = model(LONG[:, s : s + chunk], cache=cache)
    for _ in range(steps):
        logits = model(mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32), cache=cache)
    return bits(logits), cache_bits(cache)


@pytest.mark.timeout(180)
def test_a_cache_larger_than_the_budget_stays_under_it(tmp_path: Path) -> None:
    """Decode with a KV cache over twice the budget: MLX's peak memory above the
    caller's, plus the pager's host copies, stays under the budget at every band (and
    over the undrained run); the banded prefill before it under its own budget; the
    caches and logits are eager mlx-lm's."""
    save_model_dir(build("llama", seed=3, **WIDE_KV), tiny_config("llama", **WIDE_KV), tmp_path)
    chunk, steps = 32, 4
    # the budgets the two phases need, measured by a first run
    pm = PagedModel(tmp_path, budget=1 << 40, kv_paging=True, depth=0)
    cache = pm.make_cache()
    logits = pm.prefill(LONG, cache, chunk=chunk)
    prefill_budget = pm.stats.needed
    tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
    decode_budget = pm.min_budget(tok, cache)
    kv_bytes = sum(a.nbytes for c in cache for a in (c.keys, c.values))
    pm.close()
    del pm, cache, logits, tok
    assert kv_bytes > 2 * decode_budget, (kv_bytes, decode_budget)

    pm = PagedModel(tmp_path, budget=prefill_budget, kv_paging=True, depth=0)
    peaks: list[tuple[int, int]] = []

    def measure(band: int, chunk: int, made: list[mx.array]) -> None:
        mx.eval(made)  # this band's work is done: its peak is in
        assert pm.pager is not None
        peaks.append((mx.get_peak_memory() - base + pm.pager.peak_host_bytes, pm.budget))
        mx.reset_peak_memory()
        pm.pager.peak_host_bytes = pm.pager.host_bytes

    cache = pm.make_cache()
    mx.synchronize()
    base = mx.get_active_memory()  # the caller's arrays: the budget covers everything after
    mx.reset_peak_memory()
    pm.on_segment = measure
    try:
        logits = pm.prefill(LONG, cache, chunk=chunk)
        # ordinary mlx-lm caches: the class, the attributes and the offsets a resident run leaves
        assert all(type(c) is KVCache and vars(c).keys() == vars(KVCache()).keys() for c in cache)
        assert all(c.offset == LONG.shape[1] and isinstance(c.keys, mx.array) for c in cache)
        # the caches hold the store's arrays: nothing of them in MLX's memory
        assert mx.get_active_memory() - base < kv_bytes / 4
        pm.budget = decode_budget
        assert pm.pager is not None
        pm.pager.convert_peak = 0
        for _ in range(steps // 2):
            logits = pm(mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32), cache)
        assert len(peaks) == 12 * -(-LONG.shape[1] // chunk) + 12 * (steps // 2)
        assert all(p <= b for p, b in peaks), max(p - b for p, b in peaks)
        assert pm.pager.convert_peak - base <= decode_budget  # while host copies become arrays
        pm.on_segment = None  # the fenced run, nothing drained: its overall peak
        mx.synchronize()
        mx.reset_peak_memory()
        for _ in range(steps - steps // 2):
            logits = pm(mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32), cache)
        mx.eval(logits)
        assert mx.get_peak_memory() - base + pm.pager.peak_host_bytes <= decode_budget
        assert pm.stats.kv_paged_calls == pm.stats.calls
    finally:
        pm.close()
    if CPU:
        assert (bits(logits), cache_bits(cache)) == _eager(tmp_path, chunk, steps)


def _fail_on(pm: PagedModel, victim: str) -> None:
    base = pm.source._raw

    def reader(info: Any) -> Any:
        if info.name == victim:
            raise OSError("injected read error")
        return base(info)

    pm.source.reader = reader


@pytest.mark.timeout(120)
@settings(max_examples=examples(4))
@given(data=hs.data())
def test_a_failure_mid_run_leaves_the_callers_kv_caches_whole(
    tmp_path_factory: pytest.TempPathFactory, data: hs.DataObject
) -> None:
    path = llama_dir(tmp_path_factory)
    budget = kv_tight(path, 16, 1)
    pm = PagedModel(path, budget=budget, kv_paging=True, evict=data.draw(hs.sampled_from(["spread", "lru", "mru"])))
    try:
        cache = pm.make_cache()
        logits = pm.prefill(PROMPT, cache, chunk=16)
        held = [(c.keys, c.values) for c in cache]
        before = (bits(logits), cache_bits(cache))
        tok = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
        files = set(pm.kv.directory.glob("layer*"))
        kv_fault = data.draw(hs.booleans())
        if kv_fault:  # the KV store cannot read a layer back
            layer = data.draw(hs.integers(1, 3))

            def broken(info: Any) -> Any:
                if f"layer{layer:04d}-" in info.file.name:
                    raise OSError("injected KV read error")
                return pm.kv._read(info)

            pm.kv.reader = broken
        else:  # or a weight of a later band
            victim = data.draw(hs.sampled_from(sorted(n for n in pm.source.tensors if ".layers.0." not in n)))
            pm.close()  # nothing resident: the next call reads every page again
            _fail_on(pm, victim)
        banded = data.draw(hs.booleans())
        with pytest.raises(PagingError) as info:
            if banded:
                pm.prefill(PROMPT[:, :20], cache, chunk=8)
            else:
                pm(tok, cache)
        msg = str(info.value)
        if kv_fault:
            assert f"layer {layer}'s" in msg and f"layer{layer:04d}-" in msg, msg
        else:
            assert repr(victim) in msg and pm.source.tensors[victim].file.name in msg, msg
        del info
        gc.collect()
        # the caller's caches: the same arrays, the same bytes, the same offsets
        assert all(c.keys is k and c.values is v for c, (k, v) in zip(cache, held))
        assert (bits(logits), cache_bits(cache)) == before
        assert pm.pager is None  # the pager ended
        assert set(pm.kv.directory.glob("layer*")) == files  # the failed call's copies are spares
        pm.source.reader = pm.kv.reader = None
        want = segc_resident(path, 16, 1)[1]
        assert (bits(pm(tok, cache)), cache_bits(cache)) == want
    finally:
        pm.close()


@pytest.mark.timeout(120)
def test_kv_paging_budgets_and_bad_input(dirs: dict[str, Path]) -> None:
    path = dirs["llama"]
    with pytest.raises(PagingError, match=r"with the KV caches paged.*smallest budget that works is (\d+)") as info:
        PagedModel(path, budget=1000, kv_paging=True)
    need = int(str(info.value).rsplit(" ", 1)[1])
    with pytest.raises(PagingError, match="too small"):
        PagedModel(path, budget=need - 1, kv_paging=True)
    pm = PagedModel(path, budget=1 << 40)  # auto: the caches stay resident while they fit
    try:
        cache = pm.make_cache()
        pm.prefill(PROMPT, cache, chunk=16)
        tok = mx.array([[3]], dtype=mx.uint32)
        pm(tok, cache)
        assert pm.stats.kv_paged_calls == 0
        pm.kv_paging = True
        paged = pm.min_budget(tok, cache)
        pm.kv_paging = False
        whole = pm.min_budget(tok, cache)
        assert paged < whole
        pm.kv_paging = "auto"
        assert pm.min_budget(tok, cache) == paged
        pm.budget = paged  # too small for every cache beside the pages: auto pages them
        pm(tok, cache)
        assert pm.stats.kv_paged_calls == 1
        pm.budget = paged - 1
        with pytest.raises(PagingError, match=f"smallest budget that works is {paged}$"):
            pm(tok, cache)
        pm.kv_paging = False
        pm.budget = paged
        with pytest.raises(PagingError, match=f"smallest budget that works is {whole}$"):
            pm(tok, cache)
        assert all(c.offset == PROMPT.shape[1] + 2 for c in cache)
    finally:
        pm.close()
    for bad in ("yes", 1, None):
        with pytest.raises(ScheduleError, match="kv_paging"):
            PagedModel(path, budget=1 << 40, kv_paging=bad)  # type: ignore[arg-type]
    pm = PagedModel(path, budget=1 << 40)
    pm.kv_paging = "sometimes"
    with pytest.raises(ScheduleError, match="kv_paging must be True, False or 'auto', got 'sometimes'"):
        pm(tok, pm.make_cache())
    pm.close()
    pm = PagedModel(path, budget=1 << 40, kv_paging=True)
    try:
        with pytest.raises(PagingError, match="layer 0's cache is a RotatingKVCache"):
            pm(tok, [RotatingKVCache(max_size=64) for _ in range(4)])
    finally:
        pm.close()


@pytest.mark.timeout(60)
def test_the_kv_store_hands_out_lazy_arrays_and_drops_their_files(tmp_path: Path) -> None:
    from segc.engine.paging.kvstore import KVStore

    store = KVStore(tmp_path / "kv")
    keys = mx.arange(2 * 3 * 8 * 4, dtype=mx.float32).reshape(2, 3, 8, 4)
    values = (keys * 0.5).astype(mx.bfloat16)
    mx.eval(keys, values)
    c = KVCache()
    c.__dict__.update(store.write(5, {"keys": keys, "values": values}))
    assert c.keys.dtype == mx.float32 and c.values.dtype == mx.bfloat16 and c.keys.shape == keys.shape
    block = store.home(c)
    assert block is not None and block.layer == 5 and block.nbytes == keys.nbytes + values.nbytes
    host = store.host(block)  # the pager thread's read: numpy, bfloat16 as its bits
    assert host["keys"].tobytes() == bits(keys)[2] and host["values"].tobytes() == bits(values)[2]
    assert (bits(c.keys), bits(c.values)) == (bits(keys), bits(values))  # MLX reads the file
    other = KVCache()
    other.keys, other.values = keys, c.values  # not every buffer the store's: not at home
    assert store.home(other) is None and store.home(KVCache()) is None
    (path,) = store.directory.iterdir()
    del c, other, block
    gc.collect()
    assert not path.exists()  # its last lazy array gone, the file is a spare
    fresh = store.write(4, {"keys": keys * 3})  # overwrites the spare: no new file
    assert [p.name.split("-")[0] for p in store.directory.iterdir()] == ["layer0004"]
    derived = fresh["keys"][..., :4, :]  # reads the file when evaluated
    del fresh
    gc.collect()
    lazy = store.write(1, {"keys": keys * 2})  # the spare is not overwritten: ``derived`` reads it
    assert sorted(p.name.split("-")[0] for p in store.directory.iterdir()) == ["layer0001", "spare"]
    assert bits(derived) == bits((keys * 3)[..., :4, :])
    del derived
    gc.collect()
    again = store.write(3, {"keys": keys})  # now it is
    assert len(list(store.directory.iterdir())) == 2
    assert bits(again["keys"]) == bits(keys) and bits(lazy["keys"]) == bits(keys * 2)
    lazy = store.write(1, {"keys": keys})
    store.close()  # the directory goes; an array MLX opened still reads its file
    assert bits(lazy["keys"]) == bits(keys)

    def broken(info: Any) -> Any:
        raise OSError("injected")

    store = KVStore(tmp_path / "kv2", reader=broken)
    c = KVCache()
    c.__dict__.update(store.write(2, {"keys": keys, "values": values}))
    found = store.home(c)
    assert found is not None
    with pytest.raises(PagingError, match=r"layer 2's keys from .*layer0002-\d+\.safetensors: OSError: injected"):
        store.host(found)
