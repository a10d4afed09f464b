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
- ``"auto"``: ``"segment"``, on a CPU and on a GPU (docs/runtime.md, "Commits", has the
  measurements behind it).

The runtime (``segc.runtime.executor``) takes its policy names from here
and decides its commits itself; ``tests/test_research_commits.py`` checks the two
agree.
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir import Graph, segments

COMMITS = ("auto", "segment", "fences", "geometric")
DEVICES = ("cpu", "gpu")


def commit_flags(g: Graph, policy: str = "segment", device: str = "cpu") -> tuple[bool, ...]:
    """Per segment of ``g`` (``segments(g)`` order): whether the dispatch loop commits
    right after it under ``policy`` on a ``device`` (``"cpu"`` or ``"gpu"``)."""
    if policy not in COMMITS:
        raise ScheduleError(f"commit must be one of {COMMITS}, not {policy!r}")
    if device not in DEVICES:
        raise ScheduleError(f"device must be one of {DEVICES}, not {device!r}")
    segs = segments(g)
    if policy in ("segment", "auto"):
        return (True,) * len(segs)
    if policy == "fences":
        return (False,) * len(segs)
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
