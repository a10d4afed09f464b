"""A ``PagedModel``'s settings checked up front, its statistics, and the lock that runs
its calls one at a time (docs/paging.md, "Settings" and "Threads")."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from ...errors import PagingError, ScheduleError, WaitTimeout
from ...runtime.events import checked_timeout
from .pager import EVICT


@dataclass
class PagingStats:
    calls: int = 0
    bands: int = 0  # band calls dispatched
    loaded_bytes: int = 0  # weight bytes read
    recycled_bytes: int = 0  # of those, read straight into evicted pages' MLX buffers (no copy-in)
    peak_resident: int = 0  # the most weight bytes held at once
    needed: int = 0  # the largest budget a call so far needed (the smallest that runs them all)
    kv_paged_calls: int = 0  # calls that paged the KV caches
    kv_read_bytes: int = 0  # KV bytes read back from the KV store
    kv_written_bytes: int = 0  # KV bytes written out to it


def kv_option(value: Any) -> bool | str:
    if isinstance(value, bool | str) and value in (True, False, "auto"):
        return cast(bool | str, value)
    raise ScheduleError(f"kv_paging must be True, False or 'auto', got {value!r}")


def check_settings(
    *, budget: Any, band: Any, depth: Any, timeout: Any, recycle: Any, mode: Any, source: Any, evict: Any, transfer: Any
) -> float:
    """Refuse a bad setting before anything is read or started; the timeout in seconds."""
    for what, value, allowed in (
        ("recycle", recycle, (True, False)),
        ("mode", mode, ("fenced", "drain")),
        ("source", source, ("disk", "host")),
        ("evict", evict, EVICT),
        ("transfer", transfer, ("auto", "host", "direct", "cuda")),
    ):
        if not any(value is a or (isinstance(a, str) and value == a) for a in allowed):
            raise ScheduleError(f"{what} must be one of {allowed}, got {value!r}")
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ScheduleError(f"prefetch depth must be an int >= 0, got {depth!r}")
    if not isinstance(band, int) or isinstance(band, bool) or band < 1:
        raise ScheduleError(f"band must be an int >= 1, got {band!r}")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise PagingError(f"the budget is a number of bytes (an int >= 1), got {budget!r}")
    return checked_timeout(timeout, "PagedModel: timeout")


class OneCall:
    """Runs a ``PagedModel``'s calls one at a time: a call from another thread waits
    for the running one (its timeout counts from the running call's last band, so a
    long call that keeps making progress is waited for, and a stuck one is not); a call
    from inside a running call on its own thread (its ``on_segment`` hook) is refused."""

    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None  # the thread whose call runs
        self._progress = 0  # bands the running calls have dispatched

    def progress(self) -> None:
        """The running call made progress (a band): a waiting call waits on."""
        with self._cond:
            self._progress += 1

    @contextmanager
    def hold(self, what: str, timeout: float) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                raise PagingError(
                    f"{self.name}: {what} refused: a call of this PagedModel is running on this thread "
                    "(is this its on_segment hook?); a PagedModel runs one call at a time: make the call after it returns"
                )
            seen, deadline = self._progress, time.monotonic() + timeout
            while self._owner is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    if self._progress == seen:
                        raise WaitTimeout(
                            f"{self.name}: bands of the running call",
                            seen + 1,
                            seen,
                            timeout,
                            f"{what} on thread {threading.current_thread().name}, behind another thread's call",
                        )
                    seen, deadline = self._progress, time.monotonic() + timeout
                    continue
                self._cond.wait(left)
            self._owner = me
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._cond.notify_all()
