"""SIGINT held back where it would leave a caller's state half written.

A call with state objects (KV caches) hands their buffers to the executor, dispatches,
then commits the results into the objects and advances MLX's random key. The dispatch
handles an interrupt itself (``Executor.__call__`` finishes the call or gives the
buffers back: ``aborted.py``), but a ``KeyboardInterrupt`` raised between two bytecodes
of what surrounds it (after the hand-over, after the dispatch, inside the commit) would
leave the objects without their buffers, or half committed. So a call runs
:func:`held`: a SIGINT that arrives there is kept and raised when the block ends, except
inside :func:`allowed`, the regions that handle one (it is raised at once there, and on
entering one if it came before). Only the main thread receives signals; elsewhere both
are no-ops, as they are when SIGINT is not handled by a Python function (``SIG_DFL``,
``SIG_IGN``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_allowed = [False]
_pending: list[FrameType | None] = []
_prev: list[Callable[[int, FrameType | None], Any]] = []  # the handler held() replaced


def _handler(signum: int, frame: FrameType | None) -> None:
    if _allowed[0] and _prev:
        _prev[-1](signum, frame)
    else:
        _pending.append(frame)


def _raise_pending() -> None:
    if _pending and _prev:
        frame = _pending[-1]
        _pending.clear()
        _prev[-1](signal.SIGINT, frame)


@contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT back until the block ends (see the module)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.getsignal(signal.SIGINT)
    if prev is _handler or not callable(prev):  # nested, or not a Python handler
        yield
        return
    _prev.append(prev)
    _pending.clear()
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)
        try:
            _raise_pending()
        finally:
            _prev.pop()
            _pending.clear()


@contextmanager
def allowed() -> Iterator[None]:
    """Inside :func:`held`, a region that handles an interrupt itself: one that came
    before is raised on entering it, one that comes during it at once."""
    if not _prev or threading.current_thread() is not threading.main_thread():
        yield
        return
    was = _allowed[0]
    _allowed[0] = True
    try:
        _raise_pending()
        yield
    finally:
        _allowed[0] = was
