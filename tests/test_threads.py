"""Threads (docs/reliability.md): one jitted function may be called from several threads
at once (segc serialises the dispatch, which MLX's compiled calls need), and a trace is
invisible to other users of the module: it works on a private copy of the module tree."""

from __future__ import annotations

import threading
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

import segc
from segc.models.zoo import build


def run_threads(n: int, work: Any) -> list[BaseException]:
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # collected and re-raised by the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a thread hung"
    return errors


def test_one_jitted_from_four_threads() -> None:
    """Defect 7: four threads calling one Jitted aborted the process."""
    model = build("llama")
    step = segc.jit(model, boundaries="layers.*")
    xs = [mx.array([[(k * 7 + i) % 100 for i in range(5 + k % 2)]]) for k in range(4)]
    want = [bits(model(x)) for x in xs]
    got: dict[int, Any] = {}

    def work(k: int) -> None:
        for _ in range(5):
            got[k] = bits(step(xs[k]))

    assert run_threads(4, work) == []
    assert [got[k] for k in range(4)] == want


_ABORTS_ON_CUDA = (
    "eager MLX in a second thread, beside segc's calls, aborts MLX 0.32.4's CUDA build "
    "(MLX is not thread-safe, docs/reliability.md); the CPU build runs it"
)


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason=_ABORTS_ON_CUDA)
def test_eager_calls_during_a_trace_see_the_real_model() -> None:
    """While one thread traces, another calls the same model eagerly and a second
    Jitted on it: neither sees the trace's placeholders or wrappers."""
    model = build("llama")
    x = mx.array([[1, 2, 3, 4]])
    want = bits(model(x))
    stop = threading.Event()
    seen: list[bool] = []

    def eager(_: int) -> None:
        while not stop.is_set():
            seen.append(bits(model(x)) == want)

    def tracer(_: int) -> None:
        try:
            for n in range(6):  # a new signature each time: six traces
                segc.jit(model, boundaries="layers.*")(mx.array([[1] * (n + 2)]))
            other = segc.jit(model)
            seen.append(bits(other(x)) == want)
        finally:
            stop.set()

    t_eager = threading.Thread(target=eager, args=(0,))
    t_eager.start()
    errors = run_threads(1, tracer)
    t_eager.join(timeout=120)
    assert errors == []
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} eager calls saw another model"


def test_a_jitted_call_inside_a_trace_is_inlined() -> None:
    """Re-entrant segc.jit (defect 9): a jitted function called while segc traces
    another one runs inline in that trace, as jax.jit does."""
    inner = segc.jit(lambda a: mx.exp(a) * 2)
    outer = segc.jit(lambda a: inner(a) + 1)
    x = mx.array([0.5, -1.0, 3.0])
    assert bits(outer(x)) == bits(mx.exp(x) * 2 + 1)
    assert inner.cache_info().traces == 0
