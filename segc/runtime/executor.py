"""Run a segmented graph: one ``mx.compile``d function per segment, dispatched in order.

After each segment its outputs are ``mx.async_eval``ed, which commits that segment's
command buffer without waiting for it; the host never drains between segments. With
``drain=True`` the executor instead ``mx.eval``s after each segment: the host-draining
baseline that segc exists to beat.

Values live in a flat slot list; every step's input and output slots are resolved once
here so the per-call loop does no name lookups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx

from ..ir import Graph, Segment, segments
from ..lower import check_supported, segment_fn


@dataclass(frozen=True, slots=True)
class Step:
    segment: Segment
    fn: Callable[..., list[mx.array]]
    in_slots: tuple[int, ...]
    out_slots: tuple[int, ...]


class Executor:
    def __init__(self, g: Graph, *, compile: bool = True, drain: bool = False):
        check_supported(g)
        self.graph = g
        self.drain = drain
        self.segments = segments(g)
        slot: dict[str, int] = {}
        for i in g.inputs:
            slot[i.var.name] = len(slot)
        self.n_inputs = len(slot)
        self.preset: list[tuple[int, mx.array]] = []
        for c in g.consts:
            slot[c.var.name] = len(slot)
            self.preset.append((slot[c.var.name], c.value))
        steps = []
        for s in self.segments:
            fn = segment_fn(g, s)
            if compile:
                fn = mx.compile(fn)
            for o in s.outputs:
                slot[o] = len(slot)
            steps.append(Step(s, fn, tuple(slot[v] for v in s.inputs), tuple(slot[v] for v in s.outputs)))
        self.steps = tuple(steps)
        self.n_slots = len(slot)
        self.out_slots = tuple(slot[v] for v in g.outputs)

    def __call__(self, inputs: Sequence[mx.array]) -> list[mx.array]:
        env: list = [None] * self.n_slots
        env[: self.n_inputs] = inputs
        for k, v in self.preset:
            env[k] = v
        sync = mx.eval if self.drain else mx.async_eval
        for st in self.steps:
            res = st.fn(*[env[i] for i in st.in_slots])
            sync(res)
            for k, r in zip(st.out_slots, res):
                env[k] = r
        return [env[i] for i in self.out_slots]
