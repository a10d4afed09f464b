"""The staged results of ``segc.jit``, as in ``jax.jit``: ``.trace`` gives a
:class:`Traced` (the IR of one signature), its ``.lower()`` a :class:`Lowered` (cuts
placed by a strategy) and its ``.compile()`` a :class:`Compiled`: a callable for that
signature, which refuses arguments of another.

Every stage keeps the :class:`~segc.staging.signature.CallSpec` of the function it came
from, so that a :class:`Compiled` can check and flatten a call on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..errors import ScheduleError, SignatureError
from ..ir import WINDOW, Graph, Segment, segment_effects, segments, to_text, verify
from ..lower import describe
from ..lower.fused import lowering_for
from ..passes import run_pass
from ..passes.analysis import header_annotator
from ..passes.fences import Schedule, schedule_for
from ..passes.pipeline import place
from ..runtime import Aborted, Executor
from ..runtime.executor import check_options
from ..runtime.fenced import Fences, Timeline, WindowRun
from ..runtime.interrupts import held
from ..trace import state as st
from ..trace.pytree import TreeDef, unflatten
from ..trace.writes import Writes
from . import rng
from .capture import params_as_consts
from .concat import Concats, is_concat
from .signature import CallSpec, Signature


@dataclass(frozen=True)
class Effects:
    """An engine's persistent additions to every graph of a jitted function: a boundary
    schedule with the events it uses (a ``Schedule``, or a function of each graph giving
    one), windows (a function of each graph giving ``{name: (first id, last id)}``:
    placed in every graph, run only when chosen) and a call timeline."""

    schedule: Schedule | Callable[[Graph], Schedule] | None = None
    fences: Fences | None = None
    windows: Callable[[Graph], Mapping[str, tuple[int, int]]] | None = None
    timeline: Timeline | None = None  # every call appends its waits, dispatches, signals and stash copies


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
        *,
        draws: int = 0,
        concat: bool = False,
        concats: Concats | None = None,
        attention: Any = "auto",
    ):
        self.spec, self.signature, self.graph, self.out_tree = spec, signature, graph, out_tree
        self.commits = commits  # per state object: how its outputs are written back
        self.exact = exact  # indices of the state objects traced in exact mode
        self.strategy = strategy  # the jitted function's default cut placement
        self.draws = draws  # how many times a call splits MLX's global random key (jit/rng.py)
        self.concat = concat  # run the concat_projections pass (segc.passes.concat)
        self.concats = concats  # and where its weights are built (the jitted function's)
        self.attention = attention  # the jitted function's: what its segments are lowered with

    def as_text(self) -> str:
        return self.graph.as_text()

    def lower(self, strategy: Any = None, *, effects: Effects | None = None, attention: Any = None) -> Lowered:
        """Place the cuts by ``strategy`` (default: the jit's; see
        ``segc.passes.pipeline.place``), then the engine's persistent ``effects``: its
        boundary schedule (the ``fences`` pass) and its window (the ``window`` pass).
        With ``concat`` (``segc.jit(..., concat_projections=True)``) sibling products
        become one over concatenated weights first, inside each segment. Cuts keep
        whole each kernel segc's lowering takes with ``attention`` (default: the
        jit's; ``lower.fused.lowering_for``), which ``compile`` then defaults to."""
        attention = self.attention if attention is None else attention
        with lowering_for(attention):
            g = place(self.graph, strategy if strategy is not None else self.strategy)
            if self.concat:
                g = run_pass("concat_projections", g)
            effects = effects or Effects()
            if effects.schedule is not None:
                events = effects.fences.events if effects.fences is not None else None
                g = run_pass("fences", g, schedule=schedule_for(g, effects.schedule, events))
            if effects.windows is not None:
                for name, (first, last) in _windows_for(g, effects.windows).items():
                    g = run_pass("window", g, first=first, last=last, name=name)
        return Lowered(self, g, effects, attention)


def _windows_for(g: Graph, windows: Callable[[Graph], Any]) -> dict[str, tuple[int, int]]:
    """``windows(g)``, checked: a mapping of names to ``(first id, last id)`` int pairs."""
    got = windows(g)
    fn = getattr(windows, "__qualname__", None) or repr(windows)
    what = f"the window function {fn} gave for graph {g.name!r}"
    if not isinstance(got, Mapping):
        raise ScheduleError(f"{what} a {type(got).__name__}, not a mapping of names to (first id, last id)")
    for name, span in got.items():
        ok = isinstance(span, tuple | list) and len(span) == 2
        if not ok or any(isinstance(i, bool) or not isinstance(i, int) for i in span):
            raise ScheduleError(f"{what} window {name!r}: {span!r}, not (first id, last id) as two ints")
    return {name: (first, last) for name, (first, last) in got.items()}


class Lowered:
    """The segmented IR: segments derived from the cuts in the graph."""

    def __init__(self, traced: Traced, graph: Graph, effects: Effects | None = None, attention: Any = "auto"):
        self.traced = traced
        self.graph = verify(graph)
        self.effects = effects or Effects()
        self.attention = attention  # what the cuts were placed for (Traced.lower)

    @property
    def segments(self) -> list[Segment]:
        return segments(self.graph)

    def as_text(self) -> str:
        """The IR, each segment's header with the cost model's figures."""
        return to_text(self.graph, annotate=header_annotator(self.graph), describe=describe)

    def __str__(self) -> str:
        return self.as_text()

    def compile(
        self,
        *,
        drain: bool = False,
        commit: str = "auto",
        attention: Any = None,
        concats: Concats | None = None,
        capture_params: bool = False,
        kv_in_place: bool | None = None,
    ) -> Compiled:
        concats = concats if concats is not None else self.traced.concats
        attention = self.attention if attention is None else attention
        return Compiled(
            self,
            drain=drain,
            commit=commit,
            attention=attention,
            concats=concats,
            capture_params=capture_params,
            kv_in_place=kv_in_place,
        )


class Compiled:
    """A callable for one signature. Calling it with another signature raises.

    With ``capture_params`` (``segc.jit(..., freeze_params=True)``) the first call's
    parameters become constants of the compiled segments (``capture.py``): the executor
    is built on that graph at the first call (not before: building one costs about 0.4
    ms a segment), and later calls pass no parameters."""

    def __init__(
        self,
        lowered: Lowered,
        *,
        drain: bool = False,
        compile: bool = True,
        commit: str = "auto",
        attention: Any = "auto",
        concats: Concats | None = None,
        capture_params: bool = False,
        kv_in_place: bool | None = None,
    ):
        self.lowered = lowered
        self.graph = lowered.graph
        self._executor_options = {
            "compile": compile,
            "drain": drain,
            "commit": commit,
            "attention": attention,
            "kv_in_place": kv_in_place,
        }
        self._param_order = [i.path for i in self.graph.inputs if i.kind == "param"]
        self._capture = capture_params and bool(self._param_order)
        self._captured = False
        self._executor: Executor | None = None
        if self._capture:  # built at the first call, on the graph with the parameters in it
            check_options(commit, attention)
        else:
            self._executor = Executor(self.graph, check=False, **self._executor_options)
        t = lowered.traced
        self.spec = t.spec
        self.signature = t.signature
        self.out_tree = t.out_tree
        self.commits = t.commits
        self._writes = Writes(t.commits)  # the commits' kinds looked up once
        self.exact = t.exact
        self._n_state_out = sum(len(c.outputs) for c in self.commits)
        self._draws = t.draws
        self._key_in = any(i.path == rng.KEY_PATH for i in self.graph.inputs)
        self._ran = False
        # concatenated weights (segc.passes.concat): built from the members, once
        self._derived = [is_concat(p) for p in self._param_order]
        self._concats = (concats or Concats()) if any(self._derived) else None
        self._memo: tuple[dict[str, mx.array], list[mx.array]] | None = None  # the last call's
        eff = lowered.effects
        fenced = any(e.signals or e.waits for e in segment_effects(self.graph))
        self._fences = eff.fences if fenced else None
        self._timeline = eff.timeline
        # windows that restrict this graph (neither endpoint here: the graph runs in full)
        self._windows = {e.args[0] for e in self.graph.eqns if e.prim == WINDOW and e.args[3] == "range"}
        self.placed = tuple(sorted(e.args[0] for e in self.graph.eqns if e.prim == WINDOW))  # every window

    @property
    def executor(self) -> Executor:
        """What runs the segments (built on the graph with the parameters in it once a
        frozen entry has made its first call)."""
        if self._executor is None:
            self._executor = Executor(self.graph, check=False, **self._executor_options)
        return self._executor

    @property
    def segments(self) -> list[Segment]:
        return segments(self.graph)

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
        if self._writes.needs_growth(slots):
            raise SignatureError(f"{self.graph.name}: a state object must grow first; call the jitted function instead")
        return leaves, params, slots

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*self._bind(args, kwargs))

    def flat_inputs(self, *args: Any, **kwargs: Any) -> list[mx.array]:
        """The graph's inputs for a call (arguments, state arrays, then parameters: none
        once a frozen entry has captured them), after checking its signature: what
        :meth:`execute` takes."""
        return self._inputs(*self._bind(args, kwargs))

    def _inputs(self, leaves: list[mx.array], params: dict[str, mx.array], slots: Sequence[st.Slot]) -> list[mx.array]:
        key = [rng.current_key()] if self._key_in else []
        if self._captured:  # the segments hold the parameters
            return leaves + [x for s in slots for x in s.inputs] + key
        if self._memo is not None and self._memo[0] is params:
            ps = self._memo[1]  # the gatherer returns the same dict while no parameter changed
        else:
            cat = self._concats  # None where no parameter is a concatenation
            ps = [
                cat.get(p, params) if d and cat is not None else params[p]
                for p, d in zip(self._param_order, self._derived)
            ]
            if not self._capture:  # a capturing entry's segments hold them: a memo would only keep arrays alive
                self._memo = (params, ps)
        if self._capture:
            self._capture_params(ps)
            ps = []
        return leaves + [x for s in slots for x in s.inputs] + key + ps

    def release_params(self, names: Iterable[str]) -> None:
        """Parameters ``names`` now hold other arrays of the same values (concatenated
        weights' views): forget the arrays last passed, and a frozen entry that captured
        any of them captures again at its next call."""
        self._memo = None
        if self._captured and not set(names).isdisjoint(self._param_order):
            self._captured, self._capture, self._executor = False, True, None

    def _capture_params(self, ps: list[mx.array]) -> None:
        """Build the executor with ``ps`` as constants of its segments (once)."""
        mx.eval(ps)  # a constant is an evaluated array (concatenated weights may still be lazy)
        self._executor = Executor(params_as_consts(self.graph, ps), check=False, **self._executor_options)
        self._capture, self._captured = False, True

    def execute(self, inputs: list[mx.array]) -> list[mx.array]:
        """Run the segments on flat graph inputs; the graph's outputs (not waited for),
        state outputs included and written nowhere."""
        return self.executor(list(inputs))

    def run(
        self,
        leaves: list[mx.array],
        params: dict[str, mx.array],
        slots: Sequence[st.Slot] = (),
        window: WindowRun | None = None,
    ) -> Any:
        """Run on a call already bound to this signature; commit the state objects.

        Whatever ends the call, the caller's state objects end as they were before it or
        as eager MLX would leave them after it, never in between (docs/reliability.md):
        an exception before the commit leaves them untouched; an exception during a
        dispatch that donated their buffers finishes the dispatch and commits (or, if the
        dispatch fails again, puts back the buffers it took); an exception in a commit
        completes the other commits. The exception is raised after.
        """
        slots = list(slots)
        if window is not None and window.name not in self._windows:
            if window.name not in self.placed:  # a name never placed (a typo) must not run it all
                raise ScheduleError(
                    f"{self.graph.name}: no window {window.name!r} is placed (use_window); placed: {list(self.placed)}"
                )
            window = None
        inputs = self._inputs(leaves, params, slots)
        starts = _input_starts(len(leaves), slots)  # before the donation empties the slots' inputs
        # from the hand-over of the state buffers to the end of the commit, a SIGINT is
        # raised only where the dispatch handles it, or after the commit (interrupts.py)
        with held() if slots or self._draws else nullcontext():
            outs = self._dispatch(inputs, starts, slots, window)
        return unflatten(self.out_tree, outs[: len(outs) - self._n_state_out])

    def _dispatch(
        self, inputs: list[mx.array], starts: list[int], slots: list[st.Slot], window: WindowRun | None
    ) -> list[mx.array]:
        """Donate, dispatch, commit (``run``)."""
        # Once this signature has run, hand state buffers that the call rewrites to the
        # executor alone: MLX then updates them in place instead of copying every cache on
        # every decode step (the commit below puts the results back into the objects).
        # (not under a window: an object whose segments it leaves out keeps its buffers)
        donated = self._ran and window is None and self._writes.donate(slots)
        try:
            outs = self.executor(inputs, consume=donated, fences=self._fences, window=window, timeline=self._timeline)
        except Aborted as ab:
            if ab.outputs is not None:  # finished after the exception: commit, then re-raise
                rng.advance(self._draws)
                self._commit(slots, ab.outputs)
            else:
                self._give_back(slots, starts, ab)
            raise ab.cause.with_traceback(ab.cause.__traceback__) from None
        self._ran = True
        rng.advance(self._draws)  # leave MLX's global key where eager would
        self._commit(slots, outs)
        return outs

    def _commit(self, slots: list[st.Slot], outs: list[mx.array]) -> None:
        """Write every state object's results (``writes.Writes.commit``: an exception in
        one commit is raised only after every commit has been done)."""
        self._writes.commit(slots, outs[len(outs) - self._n_state_out :])

    def needs_growth(self, slots: Sequence[st.Slot]) -> bool:
        """Whether a state object of the call must grow before it (``writes.Writes.needs_growth``)."""
        return self._writes.needs_growth(slots)

    def _give_back(self, slots: list[st.Slot], starts: list[int], ab: Aborted) -> None:
        """After a failed donating dispatch, give each state object back the buffers it
        handed over (``trace.state.give_back``)."""
        k = len(self.graph.outputs) - self._n_state_out
        for s, c, start in zip(slots, self.commits, starts):
            alive = {n: ab.inputs[start + i] for i, n in enumerate(s.names) if start + i in ab.inputs}
            made = {n: ab.partial[k + j] for j, n in enumerate(c.outputs) if k + j in ab.partial}
            st.give_back(s, alive, made)
            k += len(c.outputs)


def _input_starts(n_leaves: int, slots: list[st.Slot]) -> list[int]:
    """The position of each state object's first input among the graph's inputs."""
    out, k = [], n_leaves
    for s in slots:
        out.append(k)
        k += len(s.inputs)
    return out
