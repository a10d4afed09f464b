"""One ``PagedModel`` called from several threads (docs/paging.md, "Threads"): the calls
run one at a time, each gives the resident model's bits; a call from inside a running
call (its ``on_segment`` hook) and bad settings or arguments are refused with a segc
error, up front, the caller's caches untouched. Expected values come from eager mlx-lm
with every weight resident."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import make_prompt_cache

from segc.engine import load_local_model
from segc.engine.paging import PagedModel, save_model_dir
from segc.errors import PagingError, ScheduleError, WaitTimeout
from segc.models.zoo import build, tiny_config

SHAPE = {"num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16}
PROMPT = mx.array([[(7 * i + 3) % 128 for i in range(12)]], dtype=mx.uint32)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(build("llama", seed=3, **SHAPE), tiny_config("llama", **SHAPE), tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def want(path: Path) -> Any:
    """Eager mlx-lm, every weight resident: the prompt's logits from a fresh cache."""
    model, _ = load_local_model(path)
    return bits(model(PROMPT, cache=make_prompt_cache(model)))


def offsets(cache: list[Any]) -> list[int]:
    return [int(c.offset) for c in cache]


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason="bit-equal to eager on the CPU (docs/models.md)")
def test_two_threads_calling_one_paged_model_take_turns(path: Path, want: Any) -> None:
    pm = PagedModel(path, budget=1 << 30, timeout=30)
    bands = len(pm.bands)
    log: list[tuple[int, int]] = []  # (thread, band) for each band dispatched
    pm.on_segment = lambda band, chunk, outputs: log.append((threading.get_ident(), band))
    results: list[Any] = []

    def worker() -> None:
        for _ in range(3):
            try:
                results.append(bits(pm(PROMPT, pm.make_cache())))
            except Exception as exc:  # reported below, with its type
                results.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    pm.close()
    assert not any(t.is_alive() for t in threads)
    assert results == [want] * 6, [r for r in results if r != want]
    # each call's bands ran together: no band of one thread between another call's bands
    calls = [log[i : i + bands] for i in range(0, len(log), bands)]
    assert len(calls) == 6
    for call in calls:
        assert len({who for who, _ in call}) == 1 and [b for _, b in call] == list(range(bands)), log


def test_a_call_behind_a_stuck_call_times_out(path: Path, want: Any) -> None:
    """The wait for another thread's call has a timeout: it runs out when the running
    call makes no progress (its ``on_segment`` hook blocks) for ``timeout`` seconds."""
    pm = PagedModel(path, budget=1 << 30, timeout=0.5)
    entered, release = threading.Event(), threading.Event()

    def hook(band: int, chunk: int, outputs: list[mx.array]) -> None:
        if band == 0:
            entered.set()
            release.wait(timeout=30)

    pm.on_segment = hook
    first: list[Any] = []
    a = threading.Thread(target=lambda: first.append(bits(pm(PROMPT, pm.make_cache()))))
    a.start()
    assert entered.wait(timeout=30)
    cache = pm.make_cache()
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match="another thread's call") as exc:
        pm(PROMPT, cache)
    waited = time.monotonic() - start
    release.set()
    a.join(timeout=60)
    pm.on_segment = None
    assert 0.5 <= waited < 20 and exc.value.timeout == 0.5
    assert offsets(cache) == [0] * SHAPE["num_hidden_layers"]
    got = bits(pm(PROMPT, cache))  # usable after, in turn
    pm.close()
    assert not a.is_alive() and len(first) == 1
    if mx.default_device() == mx.cpu:
        assert first == [want] and got == want


def test_a_call_from_its_own_on_segment_hook_is_refused(path: Path, want: Any) -> None:
    pm = PagedModel(path, budget=1 << 30, timeout=30)
    inner: list[BaseException] = []

    def hook(band: int, chunk: int, outputs: list[mx.array]) -> None:
        try:
            pm(PROMPT[:, :1], pm.make_cache())
        except BaseException as exc:
            inner.append(exc)
            raise

    pm.on_segment = hook
    cache = pm.make_cache()
    with pytest.raises(PagingError, match="on_segment"):
        pm(PROMPT, cache)
    assert len(inner) == 1 and isinstance(inner[0], PagingError)
    assert offsets(cache) == [0] * SHAPE["num_hidden_layers"]  # the caller's caches as they were
    pm.on_segment = None
    got = bits(pm(PROMPT, cache))
    pm.close()
    if mx.default_device() == mx.cpu:
        assert got == want


@pytest.mark.parametrize("timeout", [None, -1, math.inf, math.nan, "5", True])
def test_a_bad_timeout_is_refused_by_the_constructor(path: Path, timeout: Any) -> None:
    with pytest.raises(ScheduleError, match="timeout"):
        PagedModel(path, budget=1 << 30, timeout=timeout)


def test_bad_prompts_and_caches_are_refused(path: Path) -> None:
    pm = PagedModel(path, budget=1 << 30, timeout=30)
    cache = pm.make_cache()
    empty = mx.zeros((1, 0), dtype=mx.uint32)
    flat = PROMPT[0]
    for call in (
        lambda: pm.prefill(empty, cache),
        lambda: pm.prefill(flat, cache),
        lambda: pm(empty, cache),
        lambda: pm(flat, cache),
        lambda: pm.prefill(PROMPT, cache, chunk=2.5),
        lambda: pm.generate([], 2),
    ):
        with pytest.raises(ScheduleError, match=r"prompt|chunk"):
            call()
    for bad in (None, cache[:1], "cache"):
        with pytest.raises(PagingError, match=r"paged call: .* for 3 layers"):
            pm(PROMPT, bad)  # type: ignore[arg-type]
    assert offsets(cache) == [0] * SHAPE["num_hidden_layers"]
    assert pm.stats.calls == 0
    pm.close()
