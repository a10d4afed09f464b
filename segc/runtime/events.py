"""Timeline events: the fences between segments (docs/runtime.md#events).

An :class:`Event` is a timeline semaphore, as a Metal backend's ``MTLSharedEvent``: a
64-bit value that only grows. ``signal(v)`` sets it; ``wait(v)`` returns once it is at
least ``v``, or raises :class:`WaitTimeout` when its timeout runs out first. Every wait
has a timeout (``timeout=None`` is refused): a schedule that can never be satisfied
fails with a message naming the event, the value and the segment, instead of hanging.

Thread-safe from any thread: each event holds one ``threading.Condition``; a signal
wakes the waiters under it, and each re-checks its target under the same lock, so no
wake-up is lost and nobody polls.
"""

from __future__ import annotations

import itertools
import math
import threading
import time

from ..errors import ScheduleError, WaitTimeout

MAX_VALUE = 2**64 - 1  # an event's value is an unsigned 64-bit integer
DEFAULT_TIMEOUT = 10.0  # seconds a wait gives its event unless told otherwise

_names = itertools.count(1)


def _checked_value(value: object, what: str) -> int:
    """``value`` as an event value (an int in [0, 2**64-1], not a bool), else ScheduleError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{what}: an event value must be an int, got {type(value).__name__} {value!r}")
    if not 0 <= value <= MAX_VALUE:
        raise ScheduleError(f"{what}: an event value must lie in [0, 2**64-1], got {value}")
    return int(value)


def checked_timeout(timeout: object, what: str) -> float:
    """``timeout`` as seconds (a finite int or float >= 0), else ScheduleError."""
    if timeout is None:
        raise ScheduleError(f"{what}: every wait needs a timeout in seconds; timeout=None (forever) is refused")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ScheduleError(f"{what}: a timeout must be a number of seconds, got {type(timeout).__name__}")
    t = float(timeout)
    if not (math.isfinite(t) and 0 <= t <= threading.TIMEOUT_MAX):
        raise ScheduleError(f"{what}: a timeout must be finite seconds >= 0, got {timeout!r}")
    return t


class Event:
    """A monotonic 64-bit timeline value, starting at ``initial`` (0), named ``name``
    in messages (by default ``event<n>``)."""

    __slots__ = ("_cond", "_name", "_value")

    def __init__(self, initial: int = 0, *, name: str | None = None):
        if name is None:
            name = f"event{next(_names)}"
        elif not isinstance(name, str):
            raise ScheduleError(f"an event's name must be a str, got {type(name).__name__}")
        self._name = name
        self._value = _checked_value(initial, f"event {name!r}: initial value")
        self._cond = threading.Condition(threading.Lock())

    @property
    def name(self) -> str:
        return self._name

    @property
    def value(self) -> int:
        """The current value (read under the event's lock)."""
        with self._cond:
            return self._value

    def signal(self, value: int) -> None:
        """Set the value to ``value`` and wake every waiter it satisfies. The same value
        again does nothing; a lower one is refused with ``ScheduleError``."""
        v = _checked_value(value, f"event {self._name!r}: signal")
        with self._cond:
            if v == self._value:
                return
            if v < self._value:
                raise ScheduleError(
                    f"event {self._name!r}: signal {v} is lower than its current value {self._value}; "
                    f"an event's value never decreases"
                )
            self._value = v
            # Every waiter wakes and re-checks its own target under the lock: those now
            # reached return, the others sleep again (one Condition, no lost wake-up).
            self._cond.notify_all()

    def wait(self, value: int, timeout: float = DEFAULT_TIMEOUT, *, where: str | None = None) -> None:
        """Return once the value is at least ``value`` (at once if it already is); raise
        :class:`WaitTimeout` if it is not after ``timeout`` seconds (0: just check).
        ``where`` (e.g. ``"segment 3 'layers.2'"``) goes into the timeout's message."""
        v = _checked_value(value, f"event {self._name!r}: wait")
        t = checked_timeout(timeout, f"event {self._name!r}: wait for {v}")
        if where is not None and not isinstance(where, str):
            raise ScheduleError(f"event {self._name!r}: wait: where must be a str, got {type(where).__name__}")
        with self._cond:
            if self._value >= v:
                return
            deadline = time.monotonic() + t
            while self._value < v:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(self._name, v, self._value, t, where)
                self._cond.wait(left)

    def __repr__(self) -> str:
        return f"Event({self._name!r}, value={self.value})"
