"""A segment's commit schedule chosen at run time (``SEGC_LIVE_COMMITS=tune``).

Inside a segment run as stretches (``live.staged``) a commit costs the host time (MLX
builds and launches a CUDA graph) and starts the device sooner. Which weighs more is the
machine's: on an H200 committing after the first and second attentions, then every
second (``1,1,2``), beat every second; on two H100s whose host was the slower side four
or five commits with small end groups (``3,5,5,3``, ``2,4,4,4,2``) beat ``1,1,2`` by
6-13% (docs/runtime.md). So, as cuDNN's benchmark mode picks a convolution's algorithm,
:class:`ScheduleTuner` tries a few schedules on the calls themselves and keeps the one
whose calls came fastest.

What it measures is the period between the starts of two consecutive calls of the
segment: in a decode loop that is the step the caller sees, host and device (a schedule
that leaves the device behind shows in the next start, where the caller waits for a
result). Nothing waits for it: the calls stay asynchronous. A loop that waits for a
step's result only after starting the next (mlx-lm's ``generate_step``) puts the last
call's lag into the next period, so the schedules take the calls in blocks of
:data:`BLOCK`, and a period counts only where both of its calls are its block's: the
first of a block (the last block's lag, or the schedule's first CUDA graphs, which MLX
caches per command buffer's shape) never does. The blocks take turns, round after
round, so that a change of the host's speed (measured up to 1.9x from process to process
on one machine) hits every schedule alike, and the median of a schedule's periods ranks
it. Commits never change what is computed: every schedule gives the same bits.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

WARMUP = 3  # calls before tuning starts: the first compiles every stretch
BLOCK = 3  # consecutive calls of one schedule; a period counts only inside its block
ROUNDS = 6  # rounds of every schedule's block: 12 periods each, settled at the 75th call of four
CLOCK = time.perf_counter  # a tuner's clock unless it is given one
# the schedule each segment's tuner kept, by its key: a decode retraced for a grown KV cache
# (a trace per buffer capacity) builds a new segment of the same shape, which keeps the choice
SETTLED: dict[Any, tuple[int, ...]] = {}


def commit_points(n: int, groups: Sequence[int]) -> frozenset[int]:
    """After which of a segment's ``n`` live steps (counted from 1) the schedule
    ``groups`` commits: a group's size at a time, the last size repeated; none for
    ``()``. (``live`` re-exports it; the cost model's ``passes.buffers`` reads it too.)"""
    out: set[int] = set()
    k = 0
    for i in range(n if groups else 0):
        k += groups[min(i, len(groups) - 1)]
        if k > n:
            break
        out.add(k)
    return frozenset(out)


def tapered(n: int, end: int, middle: int) -> tuple[int, ...]:
    """Group sizes for ``n`` live steps: ``end`` at both ends (the device starts soon, and
    has little left once the host is done), the rest in as few groups of about
    ``middle`` as cover it (fewer commits): 16 steps, ``(2, 4)``: ``2,4,4,4,2``;
    ``(3, 5)``: ``3,5,5,3``. Fewer than ``2 * end + 1`` steps: ``end`` at a time."""
    rest = n - 2 * end
    if rest < 1:
        return (end,)
    k = -(-rest // middle)
    mids = [rest // k + (1 if i < rest % k else 0) for i in range(k)]
    return (end, *mids, end)


def candidates(n: int, default: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The schedules tried for a segment of ``n`` live steps, no two committing after the
    same steps: ``default`` (``live.LIVE_COMMIT_SCHEDULE``) first, every second, and two
    tapered ones (:func:`tapered`)."""
    out: list[tuple[int, ...]] = []
    seen: set[frozenset[int]] = set()
    for groups in (default, (2,), tapered(n, 2, 4), tapered(n, 3, 5)):
        p = commit_points(n, groups)
        if p and p not in seen:
            seen.add(p)
            out.append(groups)
    return out


class ScheduleTuner:
    """Picks one of ``schedules`` (group sizes) for a segment of ``n`` live steps:
    :meth:`next` at the start of each call gives that call's commit points. With a
    ``key``, a choice is kept in :data:`SETTLED`, and a later tuner of the same key starts
    from it instead of tuning again."""

    def __init__(
        self,
        n: int,
        schedules: Sequence[tuple[int, ...]],
        *,
        warmup: int = WARMUP,
        block: int = BLOCK,
        rounds: int = ROUNDS,
        clock: Callable[[], float] | None = None,
        key: Any = None,
    ):
        if not schedules or rounds < 1 or block < 2 or warmup < 0:
            raise ValueError(
                "a tuner needs a schedule, a round, blocks of two calls or more and no negative warmup:"
                f" {schedules}, rounds {rounds}, block {block}, warmup {warmup}"
            )
        self.n = n
        self.schedules = list(schedules)
        self._points = [commit_points(n, s) for s in self.schedules]
        self.warmup, self.block, self.rounds, self.clock = warmup, block, rounds, clock or CLOCK
        self.periods: list[list[float]] = [[] for _ in self.schedules]
        self.key = key
        kept = SETTLED.get(key) if key is not None else None
        self.chosen: int | None = 0 if len(self.schedules) == 1 else None
        if kept in self.schedules:  # a segment of this key has chosen before: no tuning again
            self.chosen = self.schedules.index(kept)
        self._calls = 0
        self._last = 0.0  # the last call's start

    def next(self) -> frozenset[int]:
        """This call's commit points; records the period since the last call's start
        where both calls are one block's (the clock read only while tuning: once a
        schedule is kept, a call costs a lookup)."""
        if self.chosen is None:
            now = self.clock()
            c, b = len(self.schedules), self.block
            k = self._calls - self.warmup  # calls into tuning: this one's
            j = k - 1  # the last call, whose period ends now
            if j >= 0 and j % b:  # not its block's first: both ends the same schedule's
                self.periods[(j // b) % c].append(now - self._last)
            if k < c * b * self.rounds:
                self._calls += 1
                self._last = now
                return self._points[(k // b) % c if k >= 0 else 0]
            # (a schedule without a period, possible only where threads share the segment, never wins)
            self.chosen = min(range(c), key=lambda i: statistics.median(self.periods[i] or [math.inf]))
            if self.key is not None:
                SETTLED[self.key] = self.schedules[self.chosen]
        return self._points[self.chosen]

    def report(self) -> dict[str, Any]:
        """Each schedule's median period (s; None before any), and the chosen one's
        group sizes (None while tuning)."""
        return {
            "live steps": self.n,
            "schedules": [",".join(map(str, s)) for s in self.schedules],
            "medians": [statistics.median(p) if p else None for p in self.periods],
            "chosen": None if self.chosen is None else ",".join(map(str, self.schedules[self.chosen])),
        }
