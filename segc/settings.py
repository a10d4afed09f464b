"""segc's settings read from the environment (``SEGC_*``), each checked by name: the
lowering's kernels, the runtime's rematerialisation, the traced KV caches' offset."""

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
