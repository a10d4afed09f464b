"""Measuring a segmented graph on this machine."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from ..ir import Graph
from .executor import Executor


def measure_segments(
    g: Graph, inputs: Sequence[Any], repeats: int = 5, progress: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Median seconds of each segment of ``g`` (its current cuts), run alone with a host
    wait after it: per-segment times for ``balanced(n, measured=...)``. ``progress``
    (if given) is called with each segment's name once it is measured."""
    ex = Executor(g)
    env: dict[str, Any] = {i.var.name: x for i, x in zip(g.inputs, inputs)}
    env.update({c.var.name: c.value for c in g.consts})
    out: dict[str, float] = {}
    for st in ex.steps:
        args = [env[v] for v in st.names]
        times = []
        for _ in range(max(repeats, 1) + 1):
            t0 = time.perf_counter()
            res = st.fn(*args)
            mx.eval(res)
            times.append(time.perf_counter() - t0)
        env.update(zip(st.segment.outputs, res))
        out[st.segment.name] = sorted(times[1:])[len(times[1:]) // 2]
        if progress is not None:
            progress(st.segment.name)
    return out
