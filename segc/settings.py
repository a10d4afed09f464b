"""segc's settings read from the environment (``SEGC_*``), each checked by name: the
lowering's kernels, the runtime's rematerialisation, the traced KV caches' offset;
``env_choice`` for one of a few words, ``env_count`` for a whole number, ``env_counts``
for a list of them."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .errors import UsageError


def env_choice(name: str, choices: Sequence[str], default: str) -> str:
    """The environment's ``name`` (unset or blank: ``default``), one of ``choices``; any
    other value is a ``UsageError`` naming the variable and what it may be."""
    text = os.environ.get(name, default).strip() or default
    if text not in choices:
        raise UsageError(f"{name} must be {' or '.join(choices)}, not {text!r}")
    return text


def env_count(name: str, default: int, least: int, what: str) -> int:
    """The environment's ``name`` as a whole number of at least ``least`` (unset or blank:
    ``default``); anything else is a ``UsageError`` naming the variable and ``what`` it
    counts (``env_counts`` with one number)."""
    got = env_counts(name, (default,), least, what)
    if len(got) != 1:
        raise UsageError(f"{name} must be {what}, not {os.environ[name].strip()!r}")
    return got[0]


def env_counts(name: str, default: tuple[int, ...], least: int, what: str) -> tuple[int, ...]:
    """The environment's ``name`` as whole numbers of at least ``least`` separated by
    commas (unset or blank: ``default``); anything else is a ``UsageError`` naming the
    variable and ``what`` it lists."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and int(p) >= least for p in parts):
        raise UsageError(f"{name} must be {what}, not {text!r}")
    return tuple(int(p) for p in parts)
