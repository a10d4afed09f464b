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


class SegcWarning(UserWarning):
    """segc did something other than asked, safely (e.g. ran a call eagerly)."""
