"""A signature's state commits, with their kinds' functions looked up once.

A decode step asks every KV cache whether it must grow, donates its buffers and commits
its results at every call, sixteen caches or more: :class:`Writes` does it for one
signature's commits with each kind's ``needs_growth`` and ``donate`` found when the
signature is compiled, not at every object of every call, and commits through
``state.commit``, the one place a state object is written.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from . import state
from .state import KINDS, Commit, Slot


class Writes:
    """What to do with a call's state objects, for one signature's ``commits``."""

    def __init__(self, commits: tuple[Commit, ...]):
        kinds = [KINDS.get(c.kind) for c in commits]
        self._grow = tuple((i, k.needs_growth, c) for i, (k, c) in enumerate(zip(kinds, commits)) if k)
        self._donate = tuple((i, k.donate, c) for i, (k, c) in enumerate(zip(kinds, commits)) if k)
        start, steps = 0, []
        for c in commits:  # each commit's outputs among the state outputs
            steps.append((c, start, start + len(c.outputs)))
            start += len(c.outputs)
        self._commit = tuple(steps)

    def needs_growth(self, slots: Sequence[Slot]) -> bool:
        """Whether any dynamic object must grow (on the host) before this call."""
        n = len(slots)  # (as zip(slots, commits) would: a shorter list of slots stops early)
        return any(i < n and slots[i].kind == c.kind and f(slots[i], c) for i, f, c in self._grow)

    def donate(self, slots: Sequence[Slot]) -> bool:
        """Detach the buffers a call rewrites from their state objects and slots, so that
        the executor holds the only references and MLX can update them in place; the
        call's commit writes the new buffers back. Returns whether anything was detached."""
        any_, n = False, len(slots)
        for i, f, c in self._donate:
            if i < n and slots[i].kind == c.kind and f(slots[i], c):
                any_ = True
        return any_

    def commit(self, slots: Sequence[Slot], outs: list[mx.array]) -> None:
        """Write every state object's results (``outs``: the state outputs, in order). An
        exception in one commit is raised only after every commit has been done (once
        more for the one that raised: commits are idempotent, they write from the slot's
        host values), so that the objects never end between two calls. An object with
        a missing output (a window left its segments out) is left as it was."""
        holes = any(x is None for x in outs)  # once a call, not once an object
        pending: BaseException | None = None
        for s, (c, a, b) in zip(slots, self._commit):
            part = outs[a:b]
            if holes and any(x is None for x in part):
                continue
            try:
                state.commit(s, c, part)
            except BaseException as exc:
                pending = pending or exc
                state.commit(s, c, part)
        if pending is not None:
            raise pending
