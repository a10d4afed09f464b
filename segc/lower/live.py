"""A decode step's attention over the live keys, by MLX's own kernel (``SEGC_LIVE_ATTENTION``, on by default).

A dynamic KV cache's graph (``segc/trace/kvcache.py``) attends over the whole buffer with
a mask made from the offset, so that one graph serves every position. Eager mlx-lm
attends over the live keys instead, ``keys[..., :offset + 1, :]``, and from 256 cached
positions MLX's CUDA build runs that with cuDNN's fused kernel, which no kernel of segc's
reproduces (docs/models.md). Here each one-token write paired with its attention
(``fused.py``) becomes the write (segc's kernel: eager's bytes), then MLX's
``scaled_dot_product_attention`` over the buffers sliced to ``offset + 1`` positions, the
call eager makes: eager's bytes on the GPU too, and eager's kernel.

The slice's length is the host's: the offset is an array made from a host integer
(``hostints``), so the length is read there, not from the device. A length cannot live
in a compiled graph (``mx.compile`` would bake it in), so a segment holding such a step
runs as compiled *stretches* between its live steps (:func:`staged`): the graph is still
traced once per buffer capacity, never per position.

Under the executor's ``"auto"`` commit policy such a segment also commits after the
groups of live steps a schedule names (:func:`live_commits`; by default after the first
and the second, then every second): a long segment's first layers start on the device
while the host dispatches the rest.

Taken only where the mask is the causal row of one query at an offset (``causal_row``):
``offset + arange(1) >= arange(capacity)``, nothing else (no window). The write stays in
the compiled stretch before the step: only the slices and the attention run eagerly."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, cast

import mlx.core as mx

from .. import hostints
from ..committer import committer, thread_wanted
from ..errors import UsageError
from ..ir import Eqn
from ..settings import env_choice, env_counts
from . import scratch
from .live_tune import ScheduleTuner, candidates, commit_points

Step = tuple[Callable[..., Any], Eqn, Sequence[str], tuple[str, ...]]
_VIEWS = frozenset({"Broadcast", "Unflatten", "Reshape", "ExpandDims", "Squeeze", "Flatten", "AsType"})


def live_wanted() -> bool:
    """The environment's ``SEGC_LIVE_ATTENTION``: ``1`` (the default: eager's bytes, and
    measured as fast as segc's own attention on an H100, docs/performance.md) or ``0``
    (segc's write-with-attention kernel); read when segments are built
    (``kvwrite.kv_write_kernel``)."""
    return env_choice("SEGC_LIVE_ATTENTION", ("0", "1"), "1") == "1"


def offset_value(off: mx.array) -> int:
    """The host's value of a cache's offset: recorded by its maker (``hostints``), else
    read from the array (a wait for the device, for an offset segc did not make)."""
    n = hostints.known(off)
    return int(cast(int, off.item())) if n is None else n


def attend(q: mx.array, keys: mx.array, values: mx.array, off: mx.array, scale: float) -> mx.array:
    """MLX's attention of the rotated queries ``q`` over the first ``offset + 1`` positions
    of the written buffers, as eager mlx-lm's one-token call makes it (no mask)."""
    n = offset_value(off) + 1
    return mx.fast.scaled_dot_product_attention(q, keys[:, :, :n], values[:, :, :n], scale=scale)


def causal_row(mask: str, context: Sequence[Eqn]) -> bool:
    """Whether ``mask`` is one query's causal row at an offset: ``GreaterEqual`` of an
    offset plus ``arange(1)`` (through views) and ``arange(capacity)``, nothing else."""
    made = {o.name: e for e in context for o in e.outs}

    def through_views(v: str) -> Eqn | None:  # what makes v, past views; None: a graph input
        e = made.get(v)
        while e is not None and e.prim in _VIEWS:
            e = made.get(e.ins[0])
        return e

    top = through_views(mask)
    if top is None or top.prim != "GreaterEqual":
        return False
    row, keys = (through_views(v) for v in top.ins)
    if keys is None or keys.prim != "Arange" or tuple(keys.args[:1]) != (0.0,) or tuple(keys.args[2:3]) != (1.0,):
        return False
    if row is None:  # the offset itself, a graph input
        return True
    if row.prim != "Add":
        return False
    parts = [through_views(v) for v in row.ins]
    ranges = [e for e in parts if e is not None and e.prim == "Arange"]
    return len(ranges) == 1 and tuple(ranges[0].args) == (0.0, 1.0, 1.0) and parts.count(None) == 1


def staged(
    plan: Sequence[Step],
    live: Collection[int],
    consts: Mapping[str, Any],
    in_names: Sequence[str],
    out_names: Sequence[str],
) -> Callable[..., list[mx.array]]:
    """A segment's function whose steps at the indices ``live`` run eagerly (their rules
    read host values at each call) and whose other steps run as stretches between them;
    ``fn.compiled()`` is the same function with each stretch ``mx.compile``d (what the
    executor calls instead of compiling the whole); ``fn.compiled(groups)`` also commits
    (``mx.async_eval``) after the live steps :func:`commit_points` names."""
    parts: list[tuple[bool, list[Step]]] = []
    for i, step in enumerate(plan):
        if i in live:
            parts.append((True, [step]))
        elif parts and not parts[-1][0]:
            parts[-1][1].append(step)
        else:
            parts.append((False, [step]))
    needed: set[str] = set(out_names)
    layout: list[tuple[bool, list[Step], tuple[str, ...], tuple[str, ...]]] = []  # (live, steps, reads, outputs)
    for is_live, steps in reversed(parts):
        made = {v for _, _, _, outs in steps for v in outs}
        reads = {v for _, _, ins, _ in steps for v in ins} - made - set(consts)
        outs = tuple(sorted(made & needed))
        needed = (needed - made) | reads
        layout.append((is_live, steps, tuple(sorted(reads)), outs))
    layout.reverse()
    # the constants a live step reads (a stretch's are its own: steps_fn); none in a decode layer
    held = {v: consts[v] for is_live, steps, _, _ in layout if is_live for v in steps[0][2] if v in consts}

    n_live = sum(1 for is_live, *_ in layout if is_live)

    def build(compile: bool, groups: tuple[int, ...] = ()) -> Callable[..., list[mx.array]]:
        points = commit_points(n_live, groups)
        tried = candidates(n_live, groups) if points and tune_wanted() else []  # SEGC_LIVE_COMMITS=tune
        tuner = None
        if len(tried) > 1:  # keyed by the segment's shape: a retrace for a grown cache keeps the choice
            key = ("staged", n_live, tuple(e.prim for _, e, _, _ in plan), len(in_names), len(out_names))
            tuner = ScheduleTuner(n_live, tried, key=key)
        committing = bool(points)
        c = committer() if committing and thread_wanted() else None  # SEGC_COMMIT_THREAD
        first_point = min(points, default=0)
        fns: list[Callable[..., list[mx.array]] | None] = []
        for is_live, steps, ins, outs in layout:
            fn = None if is_live or not outs else steps_fn(steps, consts, ins, outs)
            fns.append(mx.compile(fn) if compile and fn is not None else fn)

        def stretches(xs: tuple[mx.array, ...]) -> list[mx.array]:
            at, first = points, first_point
            if tuner is not None:  # this call's schedule (SEGC_LIVE_COMMITS=tune)
                at = tuner.next()
                first = min(at, default=0)
            env: dict[str, Any] = dict(held)
            env.update(zip(in_names, xs))
            made: list[mx.array] = []  # since the last commit (SEGC_LIVE_COMMITS)
            seen = 0
            for fn, (is_live, steps, ins, outs) in zip(fns, layout, strict=True):
                if is_live:  # (its rule uses no scratch bank: each stretch has its own)
                    r, e, i, o = steps[0]
                    _apply(env, r([env[v] for v in i], e.args, e), o)
                    if committing:
                        made.extend(env[v] for v in o)
                        seen += 1
                        if seen in at:
                            if c is None:
                                mx.async_eval(made)
                            elif seen == first:  # the inputs may be the caller's stream's (committer.py)
                                mx.async_eval([*made, *xs])
                            else:
                                c.submit(made)
                            made = []
                elif fn is not None:
                    res = fn(*[env[v] for v in ins])
                    env.update(zip(outs, res))
                    if committing:
                        made.extend(res)
            return [env[v] for v in out_names]

        def run(*xs: mx.array) -> list[mx.array]:
            if c is None:
                return stretches(xs)
            with c.building():
                try:
                    out = stretches(xs)
                except BaseException:
                    with contextlib.suppress(BaseException):  # the first exception is the one to report
                        c.finish()
                    raise
                c.finish(where="a segment's commits (SEGC_COMMIT_THREAD)")
            return out

        run.compiled = lambda groups=(): build(True, groups)  # type: ignore[attr-defined]
        run.tuner = tuner  # type: ignore[attr-defined]
        return run

    return build(False)


# after the first and second live steps, then every second: the device starts a layer
# sooner (measured faster than every second on two H100s, ten processes each, and in every
# process of an interleaved comparison on an H200, 2026-12-07; 1 and 4 slower; on two other
# H100s fewer commits were faster, where the host was the slower side: docs/runtime.md)
LIVE_COMMIT_SCHEDULE = (1, 1, 2)


def live_commits() -> tuple[int, ...]:
    """The commit schedule inside a segment run as stretches, under the executor's
    ``"auto"`` commit policy (the other policies name every commit, and make none inside
    a segment): the environment's ``SEGC_LIVE_COMMITS``, group sizes in live steps, the
    last repeated (``2``: after every second; ``1,2``: after the first, then every
    second; ``0``: none; ``tune``: chosen at run time, :func:`tune_wanted`), by default
    ``LIVE_COMMIT_SCHEDULE`` (``1,1,2``). A long segment
    then gets the device started while the host dispatches the rest of it, as a segment per layer
    does, with one compiled call between two attentions where a segment per layer pays
    two; read when segments are built."""
    what = "tune, 0 or whole numbers of live steps separated by commas (group sizes, the last repeated)"
    if tune_wanted():  # the default until the tuner has chosen (live_tune.py), as the cost model sees it
        return LIVE_COMMIT_SCHEDULE
    groups = env_counts("SEGC_LIVE_COMMITS", LIVE_COMMIT_SCHEDULE, 0, what)
    if len(groups) > 1 and 0 in groups:
        raise UsageError(f"SEGC_LIVE_COMMITS must be {what}, not {','.join(map(str, groups))!r}: 0 stands alone")
    return () if groups == (0,) else groups


def tune_wanted() -> bool:
    """Whether ``SEGC_LIVE_COMMITS`` is ``tune``: each segment run as stretches under the
    commit policy ``"auto"`` then tries a few schedules on its own calls and keeps the
    fastest (``live_tune.ScheduleTuner``); read when segments are built."""
    return os.environ.get("SEGC_LIVE_COMMITS", "").strip() == "tune"


def steps_fn(
    steps: Sequence[Step], consts: Mapping[str, Any], in_names: Sequence[str], out_names: Sequence[str]
) -> Callable[..., list[mx.array]]:
    """The replay's steps as one function of ``in_names`` (a segment's, or a stretch's
    between live steps): each rule applied in order, one zeroed scratch bank a call
    (the kernels' counters)."""

    def run(*xs: mx.array) -> list[mx.array]:
        env: dict[str, Any] = dict(consts)
        env.update(zip(in_names, xs))
        with scratch.per_call():
            for r, e, ins, outs in steps:
                _apply(env, r([env[v] for v in ins], e.args, e), outs)
        return [env[v] for v in out_names]

    return run


def _apply(env: dict[str, Any], res: Any, outs: Sequence[str]) -> None:
    if isinstance(res, mx.array):
        env[outs[0]] = res
    else:
        env.update(zip(outs, res))


def compile_segment(fn: Callable[..., list[mx.array]], groups: tuple[int, ...] = ()) -> Callable[..., list[mx.array]]:
    """``mx.compile(fn)``, or for a staged segment (:func:`staged`) its stretches compiled,
    with a commit after the live steps the schedule ``groups`` names
    (:func:`commit_points`; ``()``: none)."""
    parts = getattr(fn, "compiled", None)
    return parts(groups) if parts is not None else mx.compile(fn)
