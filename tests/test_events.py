"""segc.runtime.events: timeline events (docs/runtime.md#events).

Semantics (monotonic value, refusals, timeouts and their messages), release of blocked
waiters across threads, a stress run of ten threads (no lost wake-up, bounded time) and
property tests against a sequential model. No MLX runs here; every wait and join is
bounded, so a broken event fails a test instead of hanging the suite.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
from collections.abc import Callable

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import segc
from segc.errors import ScheduleError, SegcError
from segc.runtime.events import MAX_VALUE, Event, WaitTimeout

JOIN = 10.0  # seconds a thread that should finish gets (a liveness bound, not a timing)


def start(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``fn`` in a daemon thread; its exception, if any, lands in the returned list."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def joined(t: threading.Thread, timeout: float = JOIN) -> bool:
    t.join(timeout)
    return not t.is_alive()


# --------------------------------------------------------------------------- semantics


def test_value_starts_at_initial_and_follows_signals() -> None:
    e = Event(name="kv")
    assert e.value == 0 and e.name == "kv"
    e.signal(3)
    assert e.value == 3
    e.signal(3)  # the same value again: nothing happens
    assert e.value == 3
    e.signal(MAX_VALUE)
    assert e.value == MAX_VALUE
    f = Event(7)
    assert f.value == 7
    f.wait(7, timeout=0)
    f.wait(0, timeout=0)
    assert repr(Event(5, name="pager")) == "Event('pager', value=5)"
    a, b = Event(), Event()
    assert a.name != b.name and a.name.startswith("event")


def test_wait_on_a_reached_value_returns_at_once() -> None:
    e = Event(name="kv")
    e.signal(10)
    t0 = time.monotonic()
    for v in (0, 1, 9, 10):
        e.wait(v, timeout=0)
        e.wait(v, timeout=5.0)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("bad", [-1, MAX_VALUE + 1, 2**70, 1.0, 2.5, "3", None, True, False])
def test_bad_values_are_refused(bad: object) -> None:
    e = Event(2, name="kv")
    for call in (e.signal, lambda v: e.wait(v, timeout=0), lambda v: Event(v)):
        with pytest.raises(ScheduleError, match="event value must"):
            call(bad)
    assert e.value == 2


def test_a_lower_value_is_refused_naming_event_and_values() -> None:
    e = Event(name="kv")
    e.signal(5)
    with pytest.raises(ScheduleError) as info:
        e.signal(4)
    msg = str(info.value)
    assert "'kv'" in msg and "4" in msg and "current value 5" in msg
    assert isinstance(info.value, SegcError)
    assert e.value == 5
    with pytest.raises(ScheduleError, match="current value 5"):
        e.signal(0)


@pytest.mark.parametrize("bad", [None, -0.1, float("nan"), float("inf"), True, "1", 1e300])
def test_bad_timeouts_are_refused(bad: object) -> None:
    e = Event(name="kv")
    with pytest.raises(ScheduleError, match="timeout"):
        e.wait(0, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="timeout"):
        e.wait(1, timeout=bad)  # type: ignore[arg-type]


def test_bad_names_and_wheres_are_refused() -> None:
    with pytest.raises(ScheduleError, match="name"):
        Event(name=3)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="where"):
        Event().wait(1, timeout=0, where=3)  # type: ignore[arg-type]


def test_wait_timeout_is_prompt_and_says_what_was_waited_for() -> None:
    e = Event(name="kv")
    e.signal(2)
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        e.wait(3, timeout=0.05, where="segment 3 'layers.2'")
    elapsed = time.monotonic() - t0
    assert 0.05 <= elapsed < 1.0, elapsed  # it waited its timeout, and not much longer
    exc = info.value
    assert isinstance(exc, SegcError)
    assert (exc.event, exc.value, exc.reached, exc.timeout, exc.where) == ("kv", 3, 2, 0.05, "segment 3 'layers.2'")
    msg = str(exc)
    for part in ("'kv'", "reach 3", "0.05 s", "at 2", "segment 3 'layers.2'"):
        assert part in msg, (part, msg)
    assert "waiting" not in str(WaitTimeout("kv", 3, 2, 0.05))
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is WaitTimeout and str(again) == msg and again.where == exc.where


def test_timeout_zero_checks_without_waiting() -> None:
    e = Event(name="kv")
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match="within 0 s"):
        e.wait(1, timeout=0)
    assert time.monotonic() - t0 < 1.0


def test_segc_reexports_are_these_objects() -> None:
    """Until segc re-exports them, the names here are the runtime's own."""
    assert getattr(segc, "WaitTimeout", WaitTimeout) is WaitTimeout
    assert getattr(segc, "Event", Event) is Event


# --------------------------------------------------------------------------- threads


def test_a_signal_from_the_main_thread_releases_a_blocked_waiter() -> None:
    e = Event(name="kv")
    t, errors = start(lambda: e.wait(2, timeout=JOIN))
    time.sleep(0.05)
    assert t.is_alive(), "the wait returned before its value was reached"
    e.signal(1)  # not enough
    time.sleep(0.05)
    assert t.is_alive(), "the wait returned at 1, waiting for 2"
    e.signal(2)
    assert joined(t), "the waiter was not released by signal(2)"
    assert errors == []


def test_a_signal_from_another_thread_releases_the_main_thread() -> None:
    e = Event(name="pager")
    timer = threading.Timer(0.05, e.signal, args=(4,))
    timer.start()
    t0 = time.monotonic()
    try:
        e.wait(4, timeout=JOIN)
    finally:
        timer.cancel()
    assert e.value == 4
    assert time.monotonic() - t0 < JOIN / 2


def test_one_signal_releases_every_reached_waiter_and_no_other() -> None:
    e = Event(name="kv")
    waiters = {v: start(lambda v=v: e.wait(v, timeout=JOIN)) for v in (1, 2, 3, 3, 4, 5)}
    time.sleep(0.05)
    e.signal(3)
    for v, (t, errors) in waiters.items():
        if v <= 3:
            assert joined(t) and errors == [], f"the waiter for {v} was not released by signal(3)"
        else:
            assert t.is_alive(), f"the waiter for {v} returned at 3"
    e.signal(5)
    for v, (t, errors) in waiters.items():
        assert joined(t) and errors == [], f"the waiter for {v} was not released by signal(5)"


def test_a_blocked_waiter_times_out_with_the_value_reached() -> None:
    e = Event(name="kv")
    t, errors = start(lambda: e.wait(9, timeout=0.2, where="segment 1 'tail'"))
    e.signal(4)
    assert joined(t)
    assert len(errors) == 1 and isinstance(errors[0], WaitTimeout)
    assert errors[0].reached == 4 and errors[0].where == "segment 1 'tail'"


def test_stress_no_lost_wakeup() -> None:
    """4 producers signal their own event 1..2500; 4 consumers wait for every step of
    one producer's event; a ping-pong pair hands two events back and forth 500 times."""
    steps, rounds = 2500, 500
    events = [Event(name=f"p{k}") for k in range(4)]
    ping, pong = Event(name="ping"), Event(name="pong")
    seen: list[list[int]] = [[] for _ in events]

    def produce(e: Event) -> None:
        for v in range(1, steps + 1):
            e.signal(v)
            if v % 16 == 0:
                time.sleep(1e-4)  # let the consumer catch up, so that its next waits block

    def consume(e: Event, out: list[int]) -> None:
        for v in range(1, steps + 1):
            e.wait(v, timeout=30.0, where=f"consumer of {e.name}")
            out.append(e.value)

    def serve() -> None:
        for k in range(1, rounds + 1):
            ping.signal(k)
            pong.wait(k, timeout=30.0)

    def answer() -> None:
        for k in range(1, rounds + 1):
            ping.wait(k, timeout=30.0)
            pong.signal(k)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings, more blocked waits
    try:
        t0 = time.monotonic()
        threads = [start(lambda k=k: consume(events[k], seen[k])) for k in range(4)]
        threads += [start(lambda e=e: produce(e)) for e in events]
        threads += [start(serve), start(answer)]
        deadline = t0 + 60.0
        for t, _ in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(switch)
    alive = [t.name for t, _ in threads if t.is_alive()]
    assert not alive, f"threads still running after 60 s (a lost wake-up?): {alive}"
    errors = [e for _, errs in threads for e in errs]
    assert errors == [], errors
    assert [e.value for e in events] == [steps] * 4
    assert (ping.value, pong.value) == (rounds, rounds)
    for k, out in enumerate(seen):
        assert len(out) == steps and all(v >= i + 1 for i, v in enumerate(out)), f"consumer {k}"
        assert out == sorted(out), f"consumer {k} saw p{k} go down"


# --------------------------------------------------------------------------- properties

# an operation: ("signal", event, value) or ("wait", event, value); values stay small so
# that signals often repeat or go down and waits often find their value reached or not
OPS = st.lists(
    st.tuples(st.sampled_from(["signal", "wait"]), st.integers(0, 2), st.integers(0, 12)),
    max_size=40,
)


@settings(max_examples=examples(50), deadline=None)
@given(initial=st.lists(st.integers(0, 6), min_size=3, max_size=3), ops=OPS)
def test_sequential_model(initial: list[int], ops: list[tuple[str, int, int]]) -> None:
    """Signals and zero-timeout waits on three events do what a dict of ints predicts."""
    events = [Event(v, name=f"e{k}") for k, v in enumerate(initial)]
    model = list(initial)
    for kind, k, v in ops:
        e = events[k]
        if kind == "signal":
            if v < model[k]:
                with pytest.raises(ScheduleError, match=f"current value {model[k]}"):
                    e.signal(v)
            else:
                e.signal(v)
                model[k] = v
        elif v <= model[k]:
            e.wait(v, timeout=0)
        else:
            with pytest.raises(WaitTimeout) as info:
                e.wait(v, timeout=0)
            assert (info.value.event, info.value.value, info.value.reached) == (f"e{k}", v, model[k])
        assert [x.value for x in events] == model


@settings(max_examples=examples(50), deadline=None)
@given(
    targets=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 8)), max_size=6),
    signals=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 8)), max_size=10),
)
def test_blocked_waiters_against_the_model(targets: list[tuple[int, int]], signals: list[tuple[int, int]]) -> None:
    """Waiter threads block on two events while the main thread signals at random: after
    each signal exactly the waiters whose target is reached are released (the others
    stay blocked), and each sees a value at least its target."""
    events = [Event(name="a"), Event(name="b")]
    model = [0, 0]
    got: dict[int, int] = {}

    def waiter(i: int, k: int, v: int) -> None:
        events[k].wait(v, timeout=JOIN)
        got[i] = events[k].value

    threads = [start(lambda i=i, k=k, v=v: waiter(i, k, v)) for i, (k, v) in enumerate(targets)]
    for k, v in signals:
        if v < model[k]:
            with pytest.raises(ScheduleError):
                events[k].signal(v)
            continue
        events[k].signal(v)
        model[k] = v
        for i, ((tk, tv), (t, errors)) in enumerate(zip(targets, threads)):
            if tv <= model[tk]:
                assert joined(t) and errors == [], f"waiter {i} for {events[tk].name} >= {tv} not released"
                assert got[i] >= tv
            else:
                assert t.is_alive(), f"waiter {i} for {events[tk].name} >= {tv} returned at {model[tk]}"
    for k, e in enumerate(events):
        e.signal(max([model[k], *(v for tk, v in targets if tk == k)]))
    for i, (t, errors) in enumerate(threads):
        assert joined(t) and errors == [], f"waiter {i} not released by the final signals"
        assert got[i] >= targets[i][1]
