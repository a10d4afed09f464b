"""Run a segmented graph: one ``mx.compile``d function per segment, dispatched in order.

When a segment's work is committed to the device is the executor's ``commit`` policy,
kept apart from where segments are cut (docs/runtime.md, "Commits"):

* ``"segment"``: ``mx.async_eval`` after every segment, which commits that segment's
  command buffer without waiting for it (the seed's Metal engine does this);
* ``"fences"``: a commit only where something must observe a boundary: after a segment
  that signals, before a segment that waits (so that the work before it runs while the
  host blocks), and at the end (the caller's ``mx.eval``);
* ``"geometric"``: ``"fences"`` plus a commit after segments 1, 2, 4, 8, ... (counted
  from 1): the device starts after the first segment while the commits stay few;
* ``"every:K"``: ``"fences"`` plus a commit after segments K, 2K, 3K, ...: a commit
  per K segments, each a bigger CUDA graph;
* ``"auto"``: ``"segment"`` (a CUDA commit launches the segment's graph at once, run
  while the host dispatches the next: docs/runtime.md, "Commits"), and inside a segment
  run as stretches (CUDA decode) the commits ``live_commits()`` names.

Either way the host never drains between segments. With ``drain=True`` the executor
instead ``mx.eval``s after each segment: the host-draining baseline that segc exists to
beat.

Values live in a flat list of cells; every step's input and output cells are resolved once
here so the per-call loop does no name lookups.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from ..errors import IRError, MemoryLimitError, SignatureError
from ..ir import ELIDE_BYTES, WINDOW, Graph, Segment, SegmentEffects, Var, segment_effects, segments, window_segments
from ..lower import (
    attention_kernel,
    check_supported,
    check_types,
    compile_loses,
    compile_segment,
    dequantized_wanted,
    experts_wanted,
    kv_write_kernel,
    live_commits,
    product_kernel,
    segment_fn,
)
from ..passes.commits import check_commit, commit_period
from ..units import fmt_bytes
from . import remat
from .aborted import Aborted
from .fenced import Fences, Timeline, WindowRun, run_effects
from .interrupts import allowed


@dataclass(frozen=True, slots=True)
class SegmentStep:
    """One segment as the dispatch loop runs it. ``reads``/``writes`` index the
    executor's value list (``env``); ``effects`` are the segment's signals, waits and
    windows from the IR (executed by the runtime's schedule, not by this loop)."""

    segment: Segment
    fn: Callable[..., list[mx.array]]
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    dead: tuple[int, ...]  # cells whose last reader is this step: released after it
    effects: SegmentEffects
    names: tuple[str, ...] = ()  # the values ``reads`` holds, in order: what ``fn`` takes


@dataclass
class DispatchTimes:
    """Host seconds spent in the executor: per call, and per step of each call (the
    compiled segment call and its commit), of which ``built`` the compiled call alone.
    ``inspect(k, outputs)``, if set, sees each step's outputs before their commit (their
    lazy graph, for a benchmark), outside the timed spans."""

    calls: list[float] = field(default_factory=list)
    steps: list[list[float]] = field(default_factory=list)
    built: list[list[float]] = field(default_factory=list)
    inspect: Callable[[int, Sequence[mx.array]], None] | None = None


# MLX's compiled calls are not thread-safe (two threads calling one mx.compile'd function
# abort the process): every dispatch in the process holds this lock. It guards MLX, it
# holds no data.
DISPATCH_LOCK = threading.RLock()


def _getter(cells: tuple[int, ...]) -> Callable[[list], tuple]:
    """``env -> tuple(env[i] for i in cells)`` as one C call."""
    if len(cells) == 1:
        (i,) = cells
        return lambda env: (env[i],)
    if not cells:
        return lambda env: ()
    return operator.itemgetter(*cells)


# segments whose outputs are smaller than this are not checked against the memory limit
# (nothing a limit could refuse is that small)
_MEMORY_LIMIT_FLOOR = 1 << 20

# the policies' names are the cost model's too (segc.passes.commits); the decisions below
# are the runtime's own


def resolve_commit(commit: str) -> str:
    """The commit policy ``commit`` names, with ``"auto"`` resolved (``"segment"``)."""
    check_commit(commit)
    return "segment" if commit == "auto" else commit


def check_options(commit: str, attention: Any) -> None:
    """Raise for a commit policy or attention setting an executor would refuse, without
    building one."""
    resolve_commit(commit)
    attention_kernel(attention)


def _commits_after(g: Graph, segs: Sequence[Segment], policy: str) -> tuple[bool, ...]:
    """Per segment: whether the stock loop commits its outputs right after it."""
    if policy in ("segment", "fences"):
        return tuple(policy == "segment" for _ in segs)
    k = commit_period(policy)
    if k is not None:  # after segments K, 2K, 3K, ... (counted from 1)
        return tuple(i % k == k - 1 for i in range(len(segs)))
    # after segments 1, 2, 4, 8, ...: the device starts after the first segment, and the
    # commits stay few (log2 of the count) while the host dispatches the rest
    return tuple((k + 1) & k == 0 for k in range(len(segs)))


def _touches_empty(g: Graph, s: Segment, vs: dict[str, Var]) -> bool:
    """Whether a value the segment reads or makes has no elements. MLX 0.32.4's CUDA
    build dies with SIGFPE evaluating an ``mx.compile``d function over an empty array
    (docs/lowering.md, "GPU"), so such a segment runs its ops one by one, as eager
    MLX does: the same bits, only without fusion in that segment."""
    names = [*s.inputs, *(o.name for e in s.eqns(g) for o in e.outs)]
    return any(0 in vs[v].shape for v in names)


class Executor:
    """Runs a segmented graph; ``executor(inputs)`` takes the graph's inputs in order
    (arguments, then parameters) and returns its outputs.

    The per-call loop is the host's dispatch path, so everything it needs is resolved
    here: each step's compiled function, a getter for its input cells, its output cells
    and the cells it is the last reader of (released right after it, so a value lives
    no longer than its last segment).
    """

    def __init__(
        self,
        g: Graph,
        *,
        compile: bool = True,
        drain: bool = False,
        check: bool = True,
        commit: str = "auto",
        attention: Any = "auto",
        kv_in_place: bool | None = None,
    ):
        # a constant a printed graph elided (over printer.ELIDE_BYTES) has no value to run
        elided = [c.var.name for c in g.consts if c.value is None]
        if elided:
            raise IRError(
                f"graph {g.name}: constant %{elided[0]} was elided from its text (over "
                f"{ELIDE_BYTES} bytes) and has no value: a parsed graph with elided constants "
                "can be inspected but not run"
            )
        # a graph from elsewhere (parsed text) is type-checked against the rules; the
        # jit's own traced graphs are right by construction and skip it (check=False)
        if check:
            check_types(g)
        else:
            check_supported(g)
        self.graph = g
        self.drain = drain
        self.commit = resolve_commit(commit)
        self.live_groups = live_commits() if commit == "auto" and not drain else ()
        self.segments = segments(g)
        effects = segment_effects(g, self.segments)
        cell: dict[str, int] = {}
        for i in g.inputs:
            cell[i.var.name] = len(cell)
        self.n_inputs = len(cell)
        self.preset: list[tuple[int, mx.array]] = []
        for c in g.consts:
            cell[c.var.name] = len(cell)
            self.preset.append((cell[c.var.name], c.value))
        fns = []
        vs = g.vars()
        fragile = {c.var.name for c in g.consts if compile_loses(c)}
        kernel = attention_kernel(attention)
        products = product_kernel()  # segc.lower.products.FUSED_PRODUCTS, read now
        dequantize = dequantized_wanted()  # segc.lower.dequantized.DEQUANTIZED_PRODUCTS, read now
        dense_experts = experts_wanted()  # segc.lower.experts.DENSE_EXPERTS, read now
        # segc.lower.kvwrite.FUSED_KV_WRITE, read now; a caller's attention kernel is not
        # taken into segc's write-with-attention kernel; kv_in_place: segc.jit's option
        kv_write = kv_write_kernel(own_attention=not callable(attention), in_place=kv_in_place)
        # per segment: the values its function takes, in order: the inputs it reads (less the
        # views of constants it makes itself, remat.py), then the constants compile would lose
        takes: list[tuple[str, ...]] = []
        for s, (ins, again) in zip(self.segments, remat.plan(g, self.segments)):
            used = tuple(dict.fromkeys(v for e in s.eqns(g) for v in e.ins if v in fragile))
            takes.append((*ins, *used))
            opts = {"dequantize": dequantize, "dense_experts": dense_experts}
            fn = segment_fn(g, s, used, kernel, products, kv_write, **opts, inputs=ins, prologue=again)
            if compile and not _touches_empty(g, s, vs):
                fn = compile_segment(fn, self.live_groups)  # a segment with live steps: its stretches (lower/live.py)
            for o in s.outputs:
                cell[o] = len(cell)
            fns.append(fn)
        self.n_cells = len(cell)
        # the bytes each segment's outputs take: a lower bound of what it allocates
        out_bytes = [sum(vs[o].nbytes for o in seg.outputs) for seg in self.segments]
        self._biggest = max(range(len(out_bytes)), key=out_bytes.__getitem__) if out_bytes else -1
        self._biggest_bytes = out_bytes[self._biggest] if out_bytes else 0
        self.first_output = self.n_inputs + len(g.consts)
        self.output_cells = tuple(cell[v] for v in g.outputs)
        # the last step reading each value (graph outputs and constants are never released);
        # graph inputs too: a state buffer (a KV cache) that nothing else holds when its
        # last reader is dispatched can be updated in place by MLX instead of copied
        const_cells = range(self.n_inputs, self.n_inputs + len(g.consts))
        last: dict[int, int] = {}
        for k, names in enumerate(takes):
            for v in names:
                if cell[v] not in const_cells:
                    last[cell[v]] = k
        keep = set(self.output_cells)
        dead: dict[int, list[int]] = {}
        for idx, k in last.items():
            if idx not in keep:
                dead.setdefault(k, []).append(idx)
        self.steps = tuple(
            SegmentStep(
                s,
                fn,
                tuple(cell[v] for v in takes[k]),
                tuple(cell[v] for v in s.outputs),
                tuple(dead.get(k, ())),
                effects[k],
                takes[k],
            )
            for k, (s, fn) in enumerate(zip(self.segments, fns))
        )
        # env = inputs + _tail: constants in their cells, then room for segment outputs
        self._tail: list = [c.value for c in g.consts] + [None] * (self.n_cells - self.n_inputs - len(g.consts))
        # per step: commit its outputs right after it (the draining baseline: always)
        self.commit_after = (True,) * len(self.steps) if drain else _commits_after(g, self.segments, self.commit)
        self._plan = tuple(
            (st.fn, _getter(st.reads), st.writes, st.dead, c) for st, c in zip(self.steps, self.commit_after)
        )
        self._outs = _getter(self.output_cells)
        self._times: DispatchTimes | None = None
        self.cell = cell  # value name -> its cell in env
        # window name -> (indices of the steps it selects, entry values, exit values)
        self.windows: dict[str, tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]] = {}
        self.stash_vars: dict[str, Var] = {}  # the windows' entry values (a stash's arrays are checked against)
        for e in g.eqns:
            if e.prim == WINDOW:
                sel = tuple(window_segments(g, e, self.segments))
                self.windows[e.args[0]] = (sel, tuple(e.args[4]), tuple(e.args[5]))
                self.stash_vars.update((n, vs[n]) for n in e.args[4])

    @contextmanager
    def timed(self) -> Iterator[DispatchTimes]:
        """Within the block, record the host time of every call and of every step's
        dispatch (the compiled segment call and its commit): a timing hook for
        benchmarks that costs the untimed loop one attribute test per call."""
        times = DispatchTimes()
        self._times = times
        try:
            yield times
        finally:
            self._times = None

    def __call__(
        self,
        inputs: Sequence[mx.array],
        *,
        consume: bool = False,
        fences: Fences | None = None,
        window: WindowRun | None = None,
        timeline: Timeline | None = None,
    ) -> list[mx.array]:
        """Dispatch every segment; return the graph's outputs (not waited for).

        ``consume=True`` empties ``inputs`` (a list) once read, so that the executor holds
        the only references to them: an input buffer then dies with its last reader, and
        MLX may update it in place (a KV cache written by slice updates) if the caller
        holds it nowhere else either. The caller then cannot fall back on its inputs, so
        an exception during such a call arrives wrapped in :class:`Aborted`, which says
        what became of them.

        ``fences`` executes the graph's signals and waits; ``window`` runs only that
        window's segments, with its activation stash (``fenced.py``); without either,
        the stock loop below runs, which pays nothing for them.
        """
        if len(inputs) != self.n_inputs:
            raise SignatureError(f"{self.graph.name} takes {self.n_inputs} inputs, got {len(inputs)}")
        if self._biggest_bytes > _MEMORY_LIMIT_FLOOR:
            try:
                self._check_memory()
            except MemoryLimitError as exc:
                if consume:  # every input is still unread: the caller puts them all back
                    raise Aborted(exc, inputs=dict(enumerate(inputs))) from None
                raise
        env = [*inputs, *self._tail]
        if consume:
            del inputs[:]  # type: ignore[attr-defined]
        sync = mx.eval if self.drain else mx.async_eval
        times = self._times
        clock = time.perf_counter
        t_call = clock() if times is not None else 0.0
        steps: list[float] = []
        built: list[float] = []
        hooks = 0.0  # seconds in times.inspect, left out of every span
        k, done, res = 0, -1, None
        if fences is not None or window is not None or timeline is not None:
            with DISPATCH_LOCK:
                return run_effects(self, env, sync, fences, window, timeline, consume)  # type: ignore[return-value]
        with DISPATCH_LOCK:
            try:
                with allowed():  # an interrupt here is handled below (interrupts.py)
                    for k, (fn, take, outs, dead, commit) in enumerate(self._plan):
                        t0 = clock() if times is not None else 0.0
                        res = fn(*take(env))
                        done = k
                        if times is not None:
                            t1 = clock()
                            if times.inspect is not None:
                                times.inspect(k, res)
                            hook = clock() - t1
                            hooks += hook
                        for i in dead:  # before the dispatch, so that MLX may donate those buffers
                            env[i] = None
                        for i, r in zip(outs, res):
                            env[i] = r
                        if commit:
                            sync(res)
                        if times is not None:
                            steps.append(clock() - t0 - hook)
                            built.append(t1 - t0)
            except BaseException as exc:
                if not consume:
                    raise
                raise self._abort(env, k if done < k else k + 1, res if done == k else None, exc) from None
        if times is not None:
            times.calls.append(clock() - t_call - hooks)
            times.steps.append(steps)
            times.built.append(built)
        return list(self._outs(env))

    def _check_memory(self) -> None:
        """Refuse, before dispatching anything, a call whose biggest segment's outputs
        alone exceed MLX's memory limit (``mx.get_memory_limit``: setting the limit to
        read it would leave a window where it is 0, in which an allocation on another
        thread empties MLX's buffer cache)."""
        limit = mx.get_memory_limit()
        if self._biggest_bytes > limit:
            seg = self.segments[self._biggest]
            raise MemoryLimitError(
                f"{self.graph.name}: segment {self._biggest} {seg.name!r} makes {fmt_bytes(self._biggest_bytes)} of "
                f"outputs, more than MLX's memory limit of {fmt_bytes(limit)} (mx.set_memory_limit); "
                "nothing was dispatched"
            )

    def _abort(self, env: list, start: int, res: Any, exc: BaseException) -> Aborted:
        """After ``exc`` interrupted a consuming call at step ``start`` (``res``: the
        outputs of the step before it, if it computed them and they may not be stored):
        dispatch the remaining steps once more, so that the call's results exist (an
        interrupt ends the call, not its state); if that fails too, report what is left
        of the inputs and which outputs exist."""
        if res is not None:
            _, _, outs, dead, _ = self._plan[start - 1]
            for i in dead:
                env[i] = None
            for i, r in zip(outs, res):
                env[i] = r
        try:
            for fn, take, outs, dead, _ in self._plan[start:]:
                out = fn(*take(env))
                for i in dead:
                    env[i] = None
                for i, r in zip(outs, out):
                    env[i] = r
                mx.async_eval(out)
            return Aborted(exc, outputs=list(self._outs(env)))
        except BaseException:  # report the first exception, with what is left
            pass
        alive = {i: env[i] for i in range(self.n_inputs) if env[i] is not None}
        made = {j: env[c] for j, c in enumerate(self.output_cells) if env[c] is not None}
        return Aborted(exc, inputs=alive, partial=made)
