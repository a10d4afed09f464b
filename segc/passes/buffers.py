"""Where MLX's CUDA build ends a command buffer, as the cost model sees it: after the
kernel that takes one past ``MachineModel.buffer_kernels`` (``CommandEncoder::needs_commit``),
at every commit the runtime makes after a segment (``commits.commit_flags``) and inside
one (after the live attentions ``lower.live_commits``' schedule names), and at the call's end. The time
model (``costmodel._buffers``) and the memory prediction (``memory.py``) read it."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ScheduleError
from ..ir import Graph, segments
from ..lower.live import commit_points


def op_spans(g: Graph) -> list[tuple[str, int, int]]:
    """Each segment of ``g`` as its name and its ops' span ``[a, b)`` in ``analysis.ops``."""
    spans, k = [], 0
    for s in segments(g):
        n = sum(1 for e in g.eqns[s.start : s.stop] if not e.is_pseudo)
        spans.append((s.name, k, k + n))
        k += n
    return spans


def command_buffers(
    g: Graph, kernels: Sequence[int], most: int, commits: Sequence[bool] | None = None
) -> tuple[list[int], list[int]]:
    """Per op (``analysis.ops`` order; ``kernels``: ``OpCosts.kernels``): its command
    buffer (a count) and the op that ends that buffer. MLX's CUDA build commits a buffer
    after the kernel that takes it past ``most`` kernels (``CommandEncoder::needs_commit``),
    at every commit the runtime makes (``commits``, per segment: ``commit_flags``; default
    all) and at the call's end. The time model (``_buffers``) and the memory prediction
    (``memory.py``) both read it."""
    spans = op_spans(g)
    flags = list(commits) if commits is not None else [True] * len(spans)
    if len(flags) != len(spans):
        raise ScheduleError(f"{g.name}: {len(flags)} commit flags for {len(spans)} segments")
    return span_buffers(kernels, most, spans, flags)


def live_closes(live: Sequence[int], spans: Sequence[tuple[str, int, int]], groups: Sequence[int]) -> frozenset[int]:
    """The ops after which the runtime commits inside a segment: of the live attentions'
    ends ``live`` within each span, those the schedule ``groups`` names, counted from
    the span's start (``lower.live.commit_points``, as ``lower.live.staged`` commits);
    none for ``()``."""
    if not groups or not live:
        return frozenset()
    out: set[int] = set()
    for _, a, b in spans:
        inside = [k for k in live if a <= k < b]
        out.update(inside[p - 1] for p in commit_points(len(inside), groups))
    return frozenset(out)


def span_buffers(
    kernels: Sequence[int],
    most: float,
    spans: Sequence[tuple[str, int, int]],
    flags: Sequence[bool],
    closes: frozenset[int] = frozenset(),
) -> tuple[list[int], list[int]]:
    """``command_buffers`` for segments given as op spans (``op_spans``); ``closes``, ops
    after which a commit inside a segment ends a buffer too (``live_closes``)."""
    closing: list[bool] = []
    for (_, a, b), flag in zip(spans, flags):
        closing += [k in closes for k in range(a, b - 1)] + [flag] if b > a else []
    buf: list[int] = []
    ends: list[int] = []
    nodes = b = 0
    for k, n in enumerate(kernels):
        buf.append(b)
        nodes += n
        if nodes > most or k + 1 == len(kernels) or closing[k]:
            ends += [k] * (len(buf) - len(ends))
            b, nodes = b + 1, 0
    return buf, ends
