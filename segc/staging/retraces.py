"""Why a jitted function traces again, in words for its warnings: exact mode past its
limit (a state object traced once per new offset) and calls that differ only in static
values (Python numbers inside the arguments are part of the cache key)."""

from __future__ import annotations

from ..trace import state as st
from .signature import Signature

STATIC_WARN = 8  # traces for calls differing only in static values before the warning


def exact_limit_reason(traces: int, state_mode: str, aborted: list[str], slots: list[st.Slot]) -> str:
    """Why exact mode traced ``traces`` times, and what would keep one graph: a kind of
    state segc has no dynamic form for (a ``BatchKVCache``) says so; a dynamic cache
    that validation (or a failed dynamic trace) switched to exact mode says that."""
    plain = sorted({type(s.obj).__name__ for s in slots if s.mode == "exact" and s.kind == "exact"})
    if plain and state_mode != "exact" and not any("exact" in a for a in aborted):
        return (
            f"exact mode has traced {traces} times (exact_trace_limit), once per new offset of "
            f"{', '.join(plain)}, which segc serves only in exact mode (no dynamic form)"
        )
    why = next((a for a in reversed(aborted) if "exact" in a), "state_mode='exact'")
    hint = " (validate=False keeps the dynamic KV cache's graph)" if "disagree with eager" in why else ""
    return f"exact mode has traced {traces} times (exact_trace_limit), once per new state offset ({why}), and would trace again{hint}"


def static_only(new: Signature, old: Signature | None) -> bool:
    """Whether ``new`` differs from ``old`` only in static values (the tree holds them)."""
    if old is None or new.tree == old.tree:
        return False
    return (new.leaves, new.params, new.state, new.modes) == (old.leaves, old.params, old.state, old.modes)


def static_warning(name: str, n: int) -> str:
    return (
        f"{name} has traced {n} times for calls that differ only in static values: Python numbers "
        "inside the arguments (a list of token ids, a step count) are part of the cache key, as "
        "static_argnums are; pass an mx.array for a value that changes from call to call"
    )
