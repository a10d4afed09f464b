"""MLX's global random key, functionalised: random ops without ``key=`` draw from it in a
segc call exactly as in eager MLX.

Eager MLX splits the global key once per draw (``KeySequence::next``: the key becomes
``split(key)[0]``, the draw uses ``split(key)[1]``). A trace captures the key as a
constant, which would freeze every call's values. Instead:

- :func:`key_words` reads the key before the trace, :func:`sentinel` sets a fresh random
  key for the trace (so the captured key is told from any other ``u32[2]`` constant by its
  value), and :func:`rewind` with :func:`restore` put the caller's key back after
  (``mx.random.seed`` of its two words sets it exactly), counting the draws the trace
  made: tracing consumes no randomness;
- :func:`key_as_input` turns the captured key into a graph input, so each call starts
  from the key current at that call;
- after each call :func:`advance` makes as many draws of nothing as the function makes,
  which leaves the key where eager leaves it, without waiting for the device.

A function that changes the key any other way (``mx.random.seed`` inside it) is refused.
"""

from __future__ import annotations

import os
from typing import cast

import mlx.core as mx

from ..errors import UnsupportedPrimitive
from ..ir import Graph, Input

KEY_PATH = "mx.random.state[0]"
MAX_DRAWS = 100_000


def current_key() -> mx.array:
    return cast(list, mx.random.state)[0]


def key_words() -> list[int]:
    """The global key's two 32-bit words (evaluates it)."""
    return [int(w) for w in cast(list, current_key().tolist())]


def _seed_of(words: list[int]) -> int:
    return (words[0] << 32) | words[1]  # mx.random.key(seed) = [seed >> 32, seed & 0xffffffff]


def sentinel() -> list[int]:
    """Set the global key to a fresh random one for a trace, and return its words: the
    trace then finds the global key among its constants by a value no other constant
    has (a key the function makes itself, ``mx.random.key(0)`` after ``mx.random.seed(0)``,
    would otherwise equal the global key and be taken for it)."""
    words = [int.from_bytes(os.urandom(4), "little") for _ in range(2)]
    mx.random.seed(_seed_of(words))
    return words


def restore(words: list[int]) -> None:
    """Set the global key to ``words``."""
    mx.random.seed(_seed_of(words))


def rewind(words: list[int], where: str) -> int:
    """Set the global key back to ``words``; return how many draws were made since."""
    now = key_words()
    if now == words:
        return 0
    k = mx.array(words, dtype=mx.uint32)
    for n in range(1, MAX_DRAWS + 1):
        k = mx.random.split(k)[0]
        if k.tolist() == now:
            mx.random.seed(_seed_of(words))
            return n
    mx.random.seed(_seed_of(words))
    raise UnsupportedPrimitive(
        "RandomBits",
        "the function changes MLX's global random key other than by drawing from it (mx.random.seed "
        "inside it?), which segc cannot replay",
        where=where,
    )


def key_as_input(g: Graph, words: list[int]) -> Graph:
    """``g`` with the captured global key (a ``u32[2]`` constant holding ``words``) as a
    graph input of kind ``state``, before the parameters."""
    hits = [c for c in g.consts if c.var.shape == (2,) and c.var.dtype == "u32" and c.value.tolist() == words]
    if not hits:  # drew only empty arrays: nothing reads the key
        return g
    keep = hits[0].var
    rename = {c.var.name: keep.name for c in hits[1:]}
    eqns = tuple(e.replace(ins=tuple(rename.get(v, v) for v in e.ins)) for e in g.eqns)
    consts = tuple(c for c in g.consts if c not in hits)
    k = next((i for i, x in enumerate(g.inputs) if x.kind == "param"), len(g.inputs))
    inputs = (*g.inputs[:k], Input(keep, "state", KEY_PATH), *g.inputs[k:])
    return g.replace(inputs=inputs, consts=consts, eqns=eqns)


def advance(draws: int) -> None:
    """Make ``draws`` draws of nothing: the global key moves as a call's draws move it."""
    for _ in range(draws):
        mx.random.uniform(shape=(0,))


__all__ = ["KEY_PATH", "advance", "current_key", "key_as_input", "key_words", "restore", "rewind", "sentinel"]
