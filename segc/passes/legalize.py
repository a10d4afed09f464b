"""Fusion-aware legalisation: a cut never splits a chain that ``mx.compile`` would fuse,
nor a kernel segc's lowering makes of several equations.

``mx.compile`` fuses only elementwise, broadcast and select chains (``is_fusable`` in
``mlx/compile.cpp``). Its ``compile_fuse`` walks the tape backwards from each fusible
array and pulls in a fusible producer when every consumer of that producer is already
in the group (a ``Broadcast`` with outside consumers is copied into the group instead),
up to a depth of 11. :func:`fusion_groups` replays that walk over the whole (uncut)
graph. A cut point inside a group's span is illegal: splitting the chain changes the
kernels, costs a round trip through memory, and on CUDA can change low bits through
FMA contraction. Broadcasts pin nothing unless their input is computed inside the group:
a broadcast is an exact view, so its value may cross a cut unchanged.

Where segc's lowering takes kernels of its own (``lower.fused.kernel_flags``: on a CUDA
default device, or with a jit's callable ``attention`` anywhere; ``Traced.lower`` judges
by the jit's own setting), each kernel it makes of several equations is pinned the same
way (``product_groups.lowering_kernels``: a one-row product with its norm and residual, a
rotated KV write, a decode attention eager runs fused). The lowering finds its kernels
segment by segment, so a cut through one leaves its equations to MLX's kernels: more
launches, and for an attention other bits than eager's fused kernel (measured on the
H200: every plan that cut an attention differed from eager, docs/experiments.md).

:func:`legalize_plan` moves each illegal cut to the nearest legal point (the earlier one
on a tie; a later one for a cut whose segment signals an event, so the signal never
fires early), merges cuts that land on the same point, drops one after which only
views MLX makes without copying would run (a last segment that launches nothing), and
records every move in the plan. The ``legalize`` pass applies that to the cuts already in a graph and moves each
moved cut's signals with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..errors import ScheduleError
from ..ir import CUT, SIGNAL, Eqn, Graph
from ..lower.fused import cuda_defaults, kernel_flags
from ..lower.prim import PRIMS
from .analysis import is_view, liveness, ops
from .plan import Cut, Move, Plan, apply_plan, plan_of
from .product_groups import lowering_kernels
from .registry import register

# which kernels of segc's lowering are pinned (pinned_groups)
Kernels = bool | Mapping[str, bool] | None

# what mx.compile fuses: the primitive table's fusion class (segc/lower/prim.py)
FUSIBLE = frozenset(n for n, p in PRIMS.items() if p.fusible)
MAX_DEPTH = 11  # mlx/compile.cpp: max_compile_depth


def fusion_groups(g: Graph) -> list[tuple[int, ...]]:
    """The op indices (see ``analysis.ops``) of each chain ``mx.compile`` would fuse,
    broadcasts of outside values left out; groups of one are dropped."""
    os_ = ops(g)
    producer: dict[str, int] = {}
    consumers: dict[int, set[int]] = {}
    for k, e in enumerate(os_):
        for v in e.ins:
            p = producer.get(v)
            if p is not None:
                consumers.setdefault(p, set()).add(k)
        for o in e.outs:
            producer[o.name] = k
    outputs = set(g.outputs)
    assigned: set[int] = set()
    groups: list[tuple[int, ...]] = []
    for root in range(len(os_) - 1, -1, -1):
        if root in assigned or os_[root].prim not in FUSIBLE:
            continue
        shape = os_[root].outs[0].shape
        group: set[int] = set()

        def recurse(
            k: int, depth: int, group: set[int] = group, shape: tuple[int, ...] = shape, done: set[int] = assigned
        ) -> None:
            e = os_[k]
            if k in group or depth >= MAX_DEPTH or e.prim not in FUSIBLE or k in done:
                return
            if any(o.name in outputs and o.shape != shape for o in e.outs):
                return
            if depth > 0 and not consumers.get(k, set()) <= group:
                return  # a broadcast would be copied into the group: it pins nothing
            group.add(k)
            for v in e.ins:
                p = producer.get(v)
                if p is not None:
                    recurse(p, depth + 1)

        recurse(root, 0)
        assigned |= group
        # a broadcast of a value from outside the group is an exact view: cutting between
        # it and the group changes no bits and moves no bytes, so it pins nothing
        pins = {k for k in group if os_[k].prim != "Broadcast" or producer.get(os_[k].ins[0]) in group}
        if len(pins) > 1:
            groups.append(tuple(sorted(pins)))
    groups.reverse()
    return groups


def pinned_groups(g: Graph, kernels: Kernels = None) -> list[tuple[tuple[int, ...], str]]:
    """Each group of op positions no cut may split, with what it is: the fusion groups,
    and the kernels of several equations that segc's lowering makes. ``kernels``: None
    (default) those of the lowering here (:func:`~segc.lower.fused.kernel_flags`: on a
    CUDA device, or with the jit's callable attention), True those of the CUDA
    lowering's defaults, False none, or ``find_all``'s flags."""
    out = [(grp, "fused chain") for grp in fusion_groups(g)]
    flags = kernel_flags() if kernels is None else (cuda_defaults() if kernels is True else kernels or None)
    if flags:
        out += [(grp, "kernel of segc's lowering") for grp in lowering_kernels(g, ops(g), flags)]
    return out


def inside(groups: Iterable[Sequence[int]]) -> set[int]:
    """The cut points (``k``: before op ``k``) that would split one of ``groups``."""
    return {k for grp in groups for k in range(grp[0] + 1, grp[-1] + 1)}


def illegal_points(g: Graph, kernels: Kernels = None) -> set[int]:
    """Cut points that would split a pinned group (:func:`pinned_groups`)."""
    return inside(grp for grp, _ in pinned_groups(g, kernels))


def legal_points(g: Graph, kernels: Kernels = None) -> list[int]:
    n = len(ops(g))
    bad = illegal_points(g, kernels)
    return [k for k in range(1, n) if k not in bad]


def legalize_plan(g: Graph, plan: Plan, later: frozenset[int] = frozenset(), kernels: Kernels = None) -> Plan:
    """Move the plan's illegal cuts to the nearest legal point and record the moves.
    A cut after an equation in ``later`` (one whose segment signals an event) moves only
    to a later point, so the signal never fires before that equation has run.
    ``kernels``: see :func:`pinned_groups`."""
    os_ = ops(g)
    if plan.order is not None:  # legality is judged in the plan's order
        pos_of = {e.id: e for e in os_}
        os_ = [pos_of[i] for i in plan.order]
        g = g.replace(eqns=tuple(os_))
    pos = {e.id: k for k, e in enumerate(os_)}
    bad = set()
    span_of: dict[int, tuple[int, int, str]] = {}
    for grp, what in pinned_groups(g, kernels):
        for k in range(grp[0] + 1, grp[-1] + 1):
            bad.add(k)
            span_of.setdefault(k, (os_[grp[0]].id, os_[grp[-1]].id, what))
    legal = [k for k in range(1, len(os_)) if k not in bad]
    cuts: list[Cut] = []
    moved = list(plan.moved)
    placed: set[int] = set()
    for c in plan.cuts:
        k = pos[c.after] + 1
        if k in bad or k >= len(os_):
            if k >= len(os_):
                reason = "a cut after the last equation makes an empty segment"
                target = None
            else:
                a, b, what = span_of[k]
                reason = f"splits the {what} #{a}..#{b}"
                pool = [p for p in legal if p > k] if c.after in later else legal
                target = min(pool, key=lambda p: (abs(p - k), p), default=None)
            if target is None or target in placed:
                moved.append(Move(c.after, None, reason + "; dropped (no other legal point)"))
                continue
            if _launches_nothing_after(g, os_, target):
                moved.append(
                    Move(c.after, None, reason + "; dropped (only views would follow: a segment that launches nothing)")
                )
                continue
            moved.append(Move(c.after, os_[target - 1].id, reason))
            c = Cut(os_[target - 1].id, c.name, c.id)
            k = target
        if k in placed:
            moved.append(Move(c.after, None, "another cut is already at that point; dropped"))
            continue
        placed.add(k)
        cuts.append(c)
    cuts.sort(key=lambda c: pos[c.after])
    return Plan(plan.fingerprint, plan.strategy, tuple(cuts), tuple(moved), plan.order, plan.info)


def _launches_nothing_after(g: Graph, os_: Sequence[Eqn], k: int) -> bool:
    """Whether every equation from point ``k`` to the graph's end is a view MLX makes
    without a copy (``analysis.liveness``): a cut moved there would end the graph with a
    segment that launches nothing and still costs a dispatch (on a GPU with a layer's
    kernel taking the head's product, the output's reshape alone)."""
    if not all(is_view(e) for e in os_[k:]):
        return False
    lv = liveness(g)
    return all(lv.root[o.name] != o.name for e in os_[k:] for o in e.outs)


def signalled(g: Graph) -> dict[int, list[Eqn]]:
    """The ``segc.signal`` equations ending each segment, by the computing equation
    before them (the one its cut follows)."""
    out: dict[int, list[Eqn]] = {}
    last: int | None = None
    for e in g.eqns:
        if e.prim == SIGNAL and last is not None:
            out.setdefault(last, []).append(e)
        elif not e.is_pseudo:
            last = e.id
    return out


def move_blocks(g: Graph, moves: dict[int, int | None]) -> Graph:
    """Move the pseudo-equations right after computing equation ``a`` (its segment's
    signals, the cut, the next segment's waits) to just after equation ``moves[a]``; for
    ``None`` drop the cut alone."""
    block_of: dict[int, int] = {}  # pseudo-equation id -> the equation it follows
    blocks: dict[int, list[Eqn]] = {}
    last: int | None = None
    for e in g.eqns:
        if not e.is_pseudo:
            last = e.id
        elif last in moves:
            assert last is not None
            if moves[last] is not None or e.prim == CUT:
                block_of[e.id] = last
                blocks.setdefault(last, []).append(e)
    into: dict[int, list[Eqn]] = {}
    for a, b in moves.items():
        if b is not None:
            into.setdefault(b, []).extend(blocks.get(a, []))
    eqns: list[Eqn] = []
    for e in g.eqns:
        if e.id in block_of:
            continue
        eqns.append(e)
        if not e.is_pseudo:
            eqns.extend(into.get(e.id, []))
    return g.replace(eqns=tuple(eqns))


@register("legalize")
def legalize(g: Graph) -> Graph:
    """Move every cut that splits a fused chain to the nearest legal point (a later one
    for a cut whose segment signals), with the signals before it and the waits after it."""
    sig = signalled(g)
    plan = legalize_plan(g, plan_of(g), later=frozenset(sig))
    lost = [m for m in plan.moved if m.placed is None and m.requested in sig]
    if lost:
        raise ScheduleError(
            f"legalize: the cut after #{lost[0].requested} signals {sig[lost[0].requested][0].args} and "
            f"{lost[0].reason}"
        )
    if not plan.moved:
        return apply_plan(g, plan)
    return move_blocks(g, {m.requested: m.placed for m in plan.moved})
