"""The runtime's commit policies as the cost model sees them (docs/runtime.md, "Commits").

A *commit* hands the work dispatched since the last one to the device (``mx.async_eval``
in the executor's dispatch loop; the caller's ``mx.eval`` at the end of a call). Until
its commit a segment's work waits on the host; on MLX's CUDA build each commit builds
and launches a CUDA graph, a fixed host cost (``MachineModel.commit_s``). Which
segments the stock loop commits after:

- ``"segment"``: every one;
- ``"fences"``: none (the call's end commits everything; signals and waits of a
  schedule add commits that are not modelled here);
- ``"geometric"``: the 1st, 2nd, 4th, 8th, ... (counted from 1);
- ``"every:K"`` (K a whole number, 1 or more): the Kth, 2Kth, 3Kth, ... (``"every:1"``
  is ``"segment"``): fewer commits than a segment each, each a bigger graph, while the
  device still starts before the host has dispatched the whole call;
- ``"auto"``: ``"segment"``, on a CPU and on a GPU (docs/runtime.md, "Commits", has the
  measurements behind it); on a GPU also inside a segment, after the live
  attentions ``lower.live_commits`` names (by default the first, the second, then every
  second; the cost model's ``buffers.live_closes``).

The runtime (``segc.runtime.executor``) takes its policy names from here
and decides its commits itself; ``tests/test_research_commits.py`` checks the two
agree.
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir import Graph, segments

COMMITS = ("auto", "segment", "fences", "geometric")  # and "every:K"
DEVICES = ("cpu", "gpu")


def commit_period(policy: str) -> int | None:
    """K of an ``"every:K"`` policy; None for any other name."""
    if isinstance(policy, str) and policy.startswith("every:"):
        k = policy.removeprefix("every:")
        if k.isascii() and k.isdigit() and int(k) >= 1:
            return int(k)
    return None


def check_commit(policy: str) -> str:
    """``policy`` if it names a commit policy, else a ``ScheduleError`` saying what does."""
    if policy in COMMITS or commit_period(policy) is not None:
        return policy
    raise ScheduleError(f"commit must be one of {COMMITS} or 'every:K' (K a whole number >= 1), not {policy!r}")


def commit_flags(g: Graph, policy: str = "segment", device: str = "cpu") -> tuple[bool, ...]:
    """Per segment of ``g`` (``segments(g)`` order): whether the dispatch loop commits
    right after it under ``policy`` on a ``device`` (``"cpu"`` or ``"gpu"``)."""
    check_commit(policy)
    if device not in DEVICES:
        raise ScheduleError(f"device must be one of {DEVICES}, not {device!r}")
    segs = segments(g)
    if policy in ("segment", "auto"):
        return (True,) * len(segs)
    if policy == "fences":
        return (False,) * len(segs)
    k = commit_period(policy)
    if k is not None:
        return tuple((i + 1) % k == 0 for i in range(len(segs)))
    doubling, p = set(), 1
    while p <= len(segs):
        doubling.add(p)
        p *= 2
    return tuple(k + 1 in doubling for k in range(len(segs)))


def commit_count(flags: tuple[bool, ...]) -> int:
    """Commits in one call: the flagged segments but the last, then the caller's
    ``mx.eval``, which commits whatever is left (the last segment's own commit when it
    is flagged)."""
    return sum(flags[:-1]) + 1 if flags else 0
