"""The staged results of ``segc.jit``, as in ``jax.jit``: ``.trace`` gives a
:class:`Traced` (the IR of one signature), its ``.lower()`` a :class:`Lowered` (cuts
placed by a strategy) and its ``.compile()`` a :class:`Compiled`: a callable for that
signature, which refuses arguments of another.

Every stage keeps the :class:`~segc.staging.signature.CallSpec` of the function it came
from, so that a :class:`Compiled` can check and flatten a call on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ..errors import SignatureError
from ..ir import Graph, Segment, segments, to_text, verify
from ..passes.analysis import header_annotator
from ..passes.pipeline import place
from ..runtime import Executor
from ..trace import state as st
from ..trace.pytree import TreeDef, unflatten
from .signature import CallSpec, Signature


class Traced:
    """The traced IR of one signature, before cut placement."""

    def __init__(
        self,
        spec: CallSpec,
        signature: Signature,
        graph: Graph,
        out_tree: TreeDef,
        commits: tuple[st.Commit, ...] = (),
        exact: frozenset[int] = frozenset(),
        strategy: Any = None,
    ):
        self.spec, self.signature, self.graph, self.out_tree = spec, signature, graph, out_tree
        self.commits = commits  # per state object: how its outputs are written back
        self.exact = exact  # indices of the state objects traced in exact mode
        self.strategy = strategy  # the jitted function's default cut placement

    def as_text(self) -> str:
        return self.graph.as_text()

    def lower(self, strategy: Any = None) -> Lowered:
        """Place the cuts by ``strategy`` (default: the jit's; see ``segc.passes.pipeline.place``)."""
        return Lowered(self, place(self.graph, strategy if strategy is not None else self.strategy))


class Lowered:
    """The segmented IR: segments derived from the cuts in the graph."""

    def __init__(self, traced: Traced, graph: Graph):
        self.traced = traced
        self.graph = verify(graph)

    @property
    def segments(self) -> list[Segment]:
        return segments(self.graph)

    def as_text(self) -> str:
        """The IR, each segment's header with the cost model's figures."""
        return to_text(self.graph, annotate=header_annotator(self.graph))

    def __str__(self) -> str:
        return self.as_text()

    def compile(self, *, drain: bool = False) -> Compiled:
        return Compiled(self, drain=drain)


class Compiled:
    """A callable for one signature. Calling it with another signature raises."""

    def __init__(self, lowered: Lowered, *, drain: bool = False, compile: bool = True):
        self.lowered = lowered
        self.graph = lowered.graph
        self.executor = Executor(self.graph, compile=compile, drain=drain)
        t = lowered.traced
        self.spec = t.spec
        self.signature = t.signature
        self.out_tree = t.out_tree
        self.commits = t.commits
        self.exact = t.exact
        self._n_state_out = sum(len(c.outputs) for c in self.commits)
        self._ran = False
        self._param_order = [i.path for i in self.graph.inputs if i.kind == "param"]

    @property
    def segments(self) -> list[Segment]:
        return self.executor.segments

    def as_text(self) -> str:
        return self.lowered.as_text()

    def _bind(self, args: tuple, kwargs: dict) -> tuple[list[mx.array], dict[str, mx.array], list[st.Slot]]:
        args, kwargs, objs = self.spec.extract(args, kwargs)
        slots = [st.make_slot(i, o, exact=i in self.exact) for i, o in enumerate(objs)]
        sig, leaves, params = self.spec.abstract(args, kwargs, slots)
        if sig != self.signature:
            raise SignatureError(
                f"{self.graph.name} was compiled for another signature: {sig.explain_change(self.signature)}"
            )
        if any(st.needs_growth(s, c) for s, c in zip(slots, self.commits)):
            raise SignatureError(f"{self.graph.name}: a state object must grow first; call the jitted function instead")
        return leaves, params, slots

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*self._bind(args, kwargs))

    def flat_inputs(self, *args: Any, **kwargs: Any) -> list[mx.array]:
        """The graph's inputs for a call (arguments, state arrays, then parameters), after
        checking its signature: what :meth:`execute` takes."""
        leaves, params, slots = self._bind(args, kwargs)
        return leaves + [x for s in slots for x in s.inputs] + [params[p] for p in self._param_order]

    def execute(self, inputs: list[mx.array]) -> list[mx.array]:
        """Run the segments on flat graph inputs; the graph's outputs (not waited for),
        state outputs included and written nowhere."""
        return self.executor(list(inputs))

    def run(self, leaves: list[mx.array], params: dict[str, mx.array], slots: Sequence[st.Slot] = ()) -> Any:
        """Run on a call already bound to this signature; commit the state objects."""
        inputs = leaves + [x for s in slots for x in s.inputs] + [params[p] for p in self._param_order]
        # Once this signature has run, hand state buffers that the call rewrites to the
        # executor alone: MLX then updates them in place instead of copying every cache on
        # every decode step (the commit below puts the results back into the objects).
        donate = self._ran and st.donate(list(slots), self.commits)
        outs = self.executor(inputs, consume=donate)
        self._ran = True
        n = len(outs) - self._n_state_out
        k = n
        for s, c in zip(slots, self.commits):
            st.commit(s, c, outs[k : k + len(c.outputs)])
            k += len(c.outputs)
        return unflatten(self.out_tree, outs[:n])
