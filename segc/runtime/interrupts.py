"""SIGINT held back where it would leave a caller's state half written.

A call with state objects (KV caches) hands their buffers to the executor, dispatches,
then commits the results into the objects and advances MLX's random key. The dispatch
handles an interrupt itself (``Executor.__call__`` finishes the call or gives the
buffers back: ``aborted.py``), but a ``KeyboardInterrupt`` raised between two bytecodes
of what surrounds it (after the hand-over, after the dispatch, inside the commit) would
leave the objects without their buffers, or half committed. So a call runs
:func:`held`: a SIGINT that arrives there is kept and raised when the block ends, except
inside :func:`allowed`, the regions that handle one (it is raised at once there, and on
entering one if it came before).

The block installs its own SIGINT handler and puts the previous one back when it ends,
so outside a call the process's handler is the caller's. It does so through ``_signal``
(``signal.signal`` converts to and from enums: 6 us for the pair, against 0.6). Only
the main thread receives signals; elsewhere, and when SIGINT has no Python handler
(``SIG_DFL``, ``SIG_IGN``), both are no-ops.
"""

from __future__ import annotations

import _signal
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIGINT = int(signal.SIGINT)
_MAIN = threading.main_thread().ident
_prev: list[Callable[[int, FrameType | None], Any]] = []  # the handler held() replaced
_holding = [False]
_allowed = [False]
_pending: list[FrameType | None] = []


def _handler(signum: int, frame: FrameType | None) -> None:
    if _allowed[0]:
        _prev[0](signum, frame)
    else:
        _pending.append(frame)


def _raise_pending() -> None:
    if _pending:
        frame = _pending[-1]
        _pending.clear()
        _prev[0](_SIGINT, frame)


class _Held:
    """``with held():`` (see the module); a class, not a generator: a decode call enters
    it once, and a generator's context manager costs a few microseconds more."""

    __slots__ = ("on",)

    def __enter__(self) -> None:
        self.on = False
        if _holding[0] or threading.get_ident() != _MAIN:
            return
        prev = _signal.getsignal(_SIGINT)
        if not callable(prev):  # SIG_DFL, SIG_IGN: nothing of Python's to hold
            return
        _prev[:] = [prev]
        _pending.clear()
        _holding[0] = self.on = True
        _signal.signal(_SIGINT, _handler)

    def __exit__(self, *exc: object) -> None:
        if self.on:
            _signal.signal(_SIGINT, _prev[0])
            _holding[0] = False
            _raise_pending()


class _Allowed:
    """``with allowed():`` (see the module)."""

    __slots__ = ("was",)

    def __enter__(self) -> None:
        self.was = _allowed[0]
        if _holding[0] and threading.get_ident() == _MAIN:
            _allowed[0] = True
            try:
                _raise_pending()
            except BaseException:  # raised in __enter__: __exit__ will not run
                _allowed[0] = self.was
                raise

    def __exit__(self, *exc: object) -> None:
        _allowed[0] = self.was


def held() -> _Held:
    """Hold SIGINT back until the block ends (see the module)."""
    return _Held()


def allowed() -> _Allowed:
    """Inside :func:`held`, a region that handles an interrupt itself: one that came
    before is raised on entering it, one that comes during it at once."""
    return _Allowed()
