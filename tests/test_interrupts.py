"""Interrupts never corrupt caches or models (docs/reliability.md).

Whatever ends a call — a ``KeyboardInterrupt`` or an MLX error from inside the dispatch,
the commit, the module wrapping or the eager validation run — the caller's caches end
as eager MLX had them before the call or after it, never in between, and the model is
untouched; decoding then goes on bit-identically to eager.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import pytest
from conftest import bits, examples
from hypothesis import given, settings
from hypothesis import strategies as hst

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from mlx_lm.models.cache import KVCache, RotatingKVCache

import segc
import segc.staging.stages as stages
import segc.trace.state as trace_state
from segc.models.zoo import build
from segc.trace.writes import Writes

ARCHS = ("llama", "qwen3", "gemma3_text")


def observable(caches: list) -> list:
    """What a caller can read of each cache: its type, offset (and ring index) and the
    bytes of its valid positions. Positions past the offset are scratch that the next
    write overwrites (docs/reliability.md)."""
    out = []
    for c in caches:
        if c.keys is None:
            out.append((type(c).__name__, c.offset, None))
            continue
        n = min(c.offset, c.keys.shape[2])
        valid = [bits(c.keys[..., :n, :]), bits(c.values[..., :n, :])]
        out.append((type(c).__name__, c.offset, getattr(c, "_idx", None), valid))
    return out


def make_caches(model: Any, kind: str) -> list:
    if kind == "rotating":  # small, so that a few decode steps wrap around
        return [RotatingKVCache(max_size=12, keep=2) for _ in model.layers]
    return [KVCache() for _ in model.layers]


class Fault:
    """Raises ``exc`` from the ``at``-th call of ``target`` (a module attribute), once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, at: int, exc: BaseException):
        self.real: Callable[..., Any] = getattr(owner, name)
        self.calls, self.at, self.exc, self.fired = 0, at, exc, False

        def hooked(*a: Any, **k: Any) -> Any:
            self.calls += 1
            if self.calls == self.at and not self.fired:
                self.fired = True
                raise self.exc
            return self.real(*a, **k)

        monkeypatch.setattr(owner, name, hooked)


def tok(logits: mx.array) -> mx.array:
    return mx.argmax(logits[:, -1:], axis=-1)


def lockstep(model: Any, step: Any, ce: list, cs: list, t: mx.array, n: int) -> mx.array:
    """``n`` greedy decode steps through eager and segc; every logit and cache equal."""
    for _ in range(n):
        le, ls = model(t, cache=ce), step(t, cache=cs)
        assert bits(le) == bits(ls)
        assert observable(ce) == observable(cs)
        t = tok(le)
    return t


def interrupted_call(model: Any, step: Any, ce: list, cs: list, t: mx.array, exc: type) -> mx.array:
    """Call segc on ``t`` expecting ``exc``; check the caches read as eager's before or
    after the call; bring eager to the same point and return the next token."""
    before = observable(ce)
    with pytest.raises(exc):
        step(t, cache=cs)
    got = observable(cs)
    le = model(t, cache=ce)
    after = observable(ce)
    assert got in (before, after), "the caches were left between two calls"
    if got == before:  # the call never happened: make it now
        assert bits(step(t, cache=cs)) == bits(le)
        assert observable(cs) == after
    return tok(le)


@pytest.fixture(scope="module")
def llama() -> Any:
    return build("llama")


def prefill(model: Any, step: Any, kind: str, n: int = 9) -> tuple[list, list, mx.array]:
    ce, cs = make_caches(model, kind), make_caches(model, kind)
    prompt = mx.array([[(5 * i + 1) % 100 for i in range(n)]])
    le, ls = model(prompt, cache=ce), step(prompt, cache=cs)
    assert bits(le) == bits(ls)
    return ce, cs, tok(le)


@pytest.mark.parametrize("kind", ["kv", "rotating"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupt_inside_a_cached_decode_dispatch(
    llama: Any, monkeypatch: pytest.MonkeyPatch, kind: str, exc: type
) -> None:
    """Defect 1: the cached call donated the caches' buffers; an exception from
    ``mx.async_eval`` used to leave ``keys``/``values`` None with the old offset."""
    step = segc.jit(llama, boundaries="layers.*")
    ce, cs, t = prefill(llama, step, kind)
    t = lockstep(llama, step, ce, cs, t, 6)  # cached decode graph, buffers donated
    Fault(monkeypatch, mx, "async_eval", 2, exc())
    t = interrupted_call(llama, step, ce, cs, t, exc)
    monkeypatch.undo()
    lockstep(llama, step, ce, cs, t, 6)


def test_interrupt_inside_the_commit(llama: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    step = segc.jit(llama, boundaries="layers.*")
    ce, cs, t = prefill(llama, step, "kv")
    t = lockstep(llama, step, ce, cs, t, 3)
    Fault(monkeypatch, trace_state, "commit", 1, KeyboardInterrupt())
    t = interrupted_call(llama, step, ce, cs, t, KeyboardInterrupt)
    monkeypatch.undo()
    lockstep(llama, step, ce, cs, t, 3)


class Sigint:
    """A real SIGINT sent to this process from inside ``owner.name`` (after it ran)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str):
        real = getattr(owner, name)
        self.sent = 0

        def hooked(*a: Any, **k: Any) -> Any:
            out = real(*a, **k)
            if not self.sent:
                self.sent += 1
                signal.raise_signal(signal.SIGINT)  # the handler runs at the next bytecode
            return out

        monkeypatch.setattr(owner, name, hooked)


@pytest.mark.parametrize("where", ["donate", "advance"])
def test_sigint_outside_the_dispatch_waits_for_the_commit(
    llama: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A SIGINT right after the caches handed their buffers over (``Writes.donate``), or
    after the dispatch returned (``rng.advance``), used to leave every cache with
    ``keys`` None; it is now raised after the commit: the caches read as *after*."""
    step = segc.jit(llama, boundaries="layers.*")
    ce, cs, t = prefill(llama, step, "kv")
    t = lockstep(llama, step, ce, cs, t, 3)  # donation on
    owner = {"donate": Writes, "advance": stages.rng}[where]
    sig = Sigint(monkeypatch, owner, where)
    with pytest.raises(KeyboardInterrupt):
        step(t, cache=cs)
    monkeypatch.undo()
    assert sig.sent == 1
    le = llama(t, cache=ce)
    assert observable(cs) == observable(ce)  # after the call, as eager
    lockstep(llama, step, ce, cs, tok(le), 3)


def test_the_callers_sigint_handler_is_back_after_a_call(llama: Any) -> None:
    """segc holds SIGINT only during a stateful call: the caller's handler is in place
    outside it, a handler the caller installs and restores works, and Ctrl-C after the
    call raises as it would without segc."""
    step = segc.jit(llama, boundaries="layers.*")
    cache = make_caches(llama, "kv")
    before = signal.getsignal(signal.SIGINT)
    step(mx.array([[1, 2, 3]]), cache=cache)
    assert signal.getsignal(signal.SIGINT) is before
    hits: list[int] = []
    signal.signal(signal.SIGINT, lambda *a: hits.append(1))
    try:
        step(mx.array([[4]]), cache=cache)
        signal.raise_signal(signal.SIGINT)
        assert hits == [1]
    finally:
        signal.signal(signal.SIGINT, before)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        for _ in range(3):  # the handler runs at the next bytecodes
            pass
    assert hits == [1]


def test_exception_while_modules_are_wrapped_leaves_the_model_whole(llama: Any) -> None:
    """Defect 2: an exception during a trace used to leave wrapper objects in the model."""
    x = mx.array([[1, 2, 3]])
    want = bits(llama(x))
    layers = list(llama.model.layers)

    def boom(*_: Any, **__: Any) -> Any:
        raise KeyboardInterrupt

    step = segc.jit(lambda t: llama(t) + boom(), name="boom")
    with pytest.raises(KeyboardInterrupt):
        step(x)
    wrapped = segc.jit(llama, boundaries="layers.*")
    real = type(llama.model.norm).__call__
    try:
        type(llama.model.norm).__call__ = boom  # raises inside the wrapped model
        with pytest.raises(KeyboardInterrupt):
            wrapped(x)
    finally:
        type(llama.model.norm).__call__ = real
    assert all(a is b for a, b in zip(llama.model.layers, layers)), "a layer is still wrapped"
    assert bits(llama(x)) == want
    assert bits(wrapped(x)) == want


def test_a_trace_never_touches_the_users_module(llama: Any) -> None:
    """Defect 2 at its root: a trace binds placeholders and wraps submodules in a private
    copy of the module tree, so no exit path has anything to undo in the user's model."""
    x = mx.array([[1, 2, 3]])
    layers = list(llama.model.layers)
    weight = llama.model.norm.weight
    seen: list[tuple[bool, bool]] = []
    real = type(llama.model.norm).__call__

    def spy(self: Any, h: mx.array) -> mx.array:
        seen.append((all(a is b for a, b in zip(llama.model.layers, layers)), llama.model.norm.weight is weight))
        return real(self, h)

    try:
        type(llama.model.norm).__call__ = spy
        segc.jit(llama, boundaries="layers.*").trace(x)
    finally:
        type(llama.model.norm).__call__ = real
    assert seen and all(a and b for a, b in seen), seen


def test_interrupt_inside_the_eager_validation_run(llama: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first decode call of a dynamic-cache graph also runs eager on copies of the
    caches; an interrupt there leaves the caller's caches as before."""
    step = segc.jit(llama, boundaries="layers.*")
    ce, cs, t = prefill(llama, step, "kv")
    from segc.staging import validate

    Fault(monkeypatch, validate, "disagreement", 1, KeyboardInterrupt())
    t = interrupted_call(llama, step, ce, cs, t, KeyboardInterrupt)
    monkeypatch.undo()
    lockstep(llama, step, ce, cs, t, 3)


SITES = ("async_eval", "commit", "model", "validation")


@pytest.mark.slow
@settings(max_examples=examples(12), deadline=None, derandomize=True)
@given(
    arch=hst.sampled_from(ARCHS),
    kind=hst.sampled_from(["kv", "rotating"]),
    plan=hst.lists(hst.tuples(hst.sampled_from(SITES), hst.integers(1, 4), hst.booleans()), min_size=1, max_size=3),
)
def test_random_interrupts_over_decode_loops(arch: str, kind: str, plan: list) -> None:
    """Interrupts at random points of decode loops over several architectures and both
    cache kinds: after each, the caches and the model are exactly as eager's and
    decoding continues bit-identically."""
    from segc.staging import validate

    model = build(arch)
    x = mx.array([[3, 1, 4]])
    want = bits(model(x))
    step = segc.jit(model, boundaries="layers.*")
    ce, cs, t = prefill(model, step, kind)
    for site, at, interrupt in plan:
        t = lockstep(model, step, ce, cs, t, 2)
        exc = KeyboardInterrupt() if interrupt else RuntimeError("injected")
        with pytest.MonkeyPatch.context() as mp:
            if site == "async_eval":
                Fault(mp, mx, "async_eval", at, exc)
            elif site == "commit":
                Fault(mp, trace_state, "commit", at, exc)
            elif site == "validation":
                step.clear_cache()  # the next call traces and validates again
                Fault(mp, validate, "disagreement", 1, exc)
            else:  # inside the model, while segc traces it
                step.clear_cache()
                Fault(mp, type(model.model.norm), "__call__", at, exc)
            try:
                before = observable(ce)
                le_ref = None
                step(t, cache=cs)
            except (KeyboardInterrupt, RuntimeError):
                got = observable(cs)
                le_ref = model(t, cache=ce)
                assert got in (before, observable(ce))
                if got == before:
                    mp.undo()
                    assert bits(step(t, cache=cs)) == bits(le_ref)
            else:
                le_ref = model(t, cache=ce)
            assert observable(cs) == observable(ce)
            t = tok(le_ref)
        assert bits(model(x)) == want, "the model changed"
    lockstep(model, step, ce, cs, t, 3)
