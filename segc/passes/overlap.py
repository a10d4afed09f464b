"""The overlap of host and device: the executor's two-stage pipeline over costed
segments, and the host's bounded queue (``costmodel``'s docstring: the recurrence)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def queue_lead(
    device: Sequence[float], kernels: Sequence[int], queue_kernels: float
) -> tuple[list[float], list[float]]:
    """Per point ``a`` (0..ops), of the ops' device work (launches left out) and
    kernels (``costmodel.OpCosts``): the work and the kernels of the last
    ``queue_kernels`` kernels before op ``a``, in program order (``costmodel``'s
    docstring, "queue"); zeros when unbounded (0)."""
    n = len(device)
    if queue_kernels <= 0:
        return [0.0] * (n + 1), [0.0] * (n + 1)
    kc, wc = [0.0], [0.0]
    for dv, kn in zip(device, kernels):
        kc.append(kc[-1] + kn)
        wc.append(wc[-1] + dv)
    work, kern = [], []
    b = 0
    for a in range(n + 1):  # b: the first point with at most queue_kernels kernels from it to a
        while kc[a] - kc[b] > queue_kernels:
            b += 1
        work.append(wc[a] - wc[b])
        kern.append(kc[a] - kc[b])
    return work, kern


def pipeline_time(
    host: Sequence[Any],
    device: Sequence[Any],
    pre: Sequence[Any] | None = None,
    commits: Sequence[bool] | None = None,
    commit_s: Any = 0.0,
    maximum: Callable[[Any, Any], Any] = max,
    queue: Sequence[Any] | None = None,
) -> Any:
    """The end of the two-stage pipeline (``costmodel``'s docstring): the device starts segment
    k when it is done with k-1 and the host has done ``pre[k]`` of its ``host[k]``
    (all of it unless given) and committed it, and ends it no sooner than the host
    does. ``commits`` (default: every segment) says which segments are committed
    right after them, each commit costing the host ``commit_s``; the last always is.
    ``queue`` (None: unbounded), per segment, is the device work the host leaves
    queued when throttled (``SegmentTime.queue``): a committed segment's preparation
    starts no earlier than ``queue[k]`` before the device is done with what came
    before it (``costmodel``'s docstring, "queue").
    The figures may be numpy arrays (``maximum=np.maximum``): one pipeline per element,
    as calibration evaluates many machine models at once."""
    h: Any = 0.0
    d: Any = 0.0
    queued: Any = 0.0  # device work dispatched since the last commit
    last = len(host) - 1
    for k, (hk, dk) in enumerate(zip(host, device)):
        if commits is not None and not commits[k] and k < last:
            h = h + hk
            queued = queued + dk
            continue
        start = h if queue is None or k == 0 else maximum(h, d - queue[k])
        release = start + (pre[k] if pre is not None else hk) + commit_s
        h = h + hk + commit_s
        d = maximum(maximum(d, release) + queued + dk, h)
        queued = 0.0
    return d
