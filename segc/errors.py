"""segc's exception classes. Every error a user can cause is one of these."""

from __future__ import annotations


class SegcError(Exception):
    """Base class of every error segc raises on purpose."""


class TraceError(SegcError):
    """The function could not be traced (bad inputs, lazy weights, bad outputs)."""


class UnsupportedPrimitive(SegcError):
    """A primitive has no lowering rule, or MLX cannot export it."""

    def __init__(self, primitive: str, detail: str = "", where: str | None = None):
        self.primitive = primitive
        self.where = where
        msg = f"unsupported primitive {primitive!r}"
        if detail:
            msg += f": {detail}"
        if where:
            msg += f" (produced by {where})"
        super().__init__(msg)


class StateError(TraceError):
    """A state object (a KV cache) segc cannot functionalize, or a misuse of ``state=``."""


class SignatureError(SegcError):
    """A call's arguments do not match what the staged function was traced with."""


class IRError(SegcError):
    """Malformed IR: a verifier failure or unparsable text."""


class ScheduleError(SegcError):
    """An invalid cut plan, fence or window."""


class UsageError(SegcError):
    """A mistake on the ``segc`` command line: a missing file, a malformed value, an
    unknown name (the message lists the valid choices)."""


class MemoryLimitError(SegcError, MemoryError):
    """A segment whose outputs alone exceed MLX's memory limit (``mx.set_memory_limit``):
    refused before anything is dispatched, so the caller's state is untouched. (An
    allocation MLX cannot make ends the process inside MLX 0.32.4's CPU build; segc
    refuses what it can see coming.)"""


class WaitTimeout(SegcError):
    """A wait whose event did not reach its value in time. ``event``, ``value``,
    ``reached`` (the event's value when the wait gave up), ``timeout`` (seconds) and
    ``where`` (what was waiting, e.g. a segment; or None) say which."""

    def __init__(self, event: str, value: int, reached: int, timeout: float, where: str | None = None):
        self.event = event
        self.value = value
        self.reached = reached
        self.timeout = timeout
        self.where = where
        msg = f"event {event!r} did not reach {value} within {timeout:g} s (it is at {reached})"
        if where:
            msg += f"; waiting: {where}"
        super().__init__(msg)

    def __reduce__(self) -> tuple[type[WaitTimeout], tuple[str, int, int, float, str | None]]:
        return (type(self), (self.event, self.value, self.reached, self.timeout, self.where))


class SegcWarning(UserWarning):
    """segc did something other than asked, safely (e.g. ran a call eagerly)."""


class ScheduleWarning(SegcWarning):
    """A schedule or plan that segc changed to make it legal (a cut moved off a fused chain)."""


class PagingError(SegcError):
    """Paging weights in failed, or cannot keep its promise: a tensor that cannot be
    read (the message names the file and the tensor), or a memory budget too small for
    one segment's working set (the message gives the smallest budget that works)."""
