"""``cut``: place the cuts of a graph by a strategy, or re-apply a saved plan.

``cut(g, strategy="balanced:4")`` runs the strategy (``strategies.py``), legalises the
plan (``legalize.py``: a cut never splits a fused chain) and applies it (``plan.py``:
every old cut goes, the plan's cuts come in). ``cut(g, plan=p)`` applies a plan made
earlier, after checking it was made for this graph, as it is; except where segc's
lowering takes kernels of its own (on a CUDA device, or with the jit's callable
``attention``: ``lower.fused.kernel_flags``), a cut of it through one of the lowering's
kernels is moved (with a ``ScheduleWarning``): the kernel would otherwise fall to MLX's
kernels in that segment, and an attention to other bits than the unsegmented graph's.
Fences and windows stay put.

Idempotent: cutting a graph again with the same strategy or plan changes nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import ScheduleError, ScheduleWarning
from ..ir import Graph
from ..lower.fused import kernel_flags
from .analysis import ops
from .legalize import inside, legalize_plan
from .plan import Plan, apply_plan, plan_key
from .product_groups import lowering_kernels
from .registry import register
from .strategies import make_plan


@register("cut")
def cut(g: Graph, strategy: Any = "markers", plan: Plan | None = None, legalize: bool = True) -> Graph:
    """Cut ``g`` by ``strategy`` (see ``strategies.resolve``) or by a saved ``plan``."""
    if plan is None:
        plan = make_plan(g, strategy, legalize=legalize)
    elif not isinstance(plan, Plan):
        raise ScheduleError(f"cut: plan must be a segc Plan, got {type(plan).__name__}")
    elif legalize and plan.order is None and (flags := kernel_flags()) is not None:
        plan = _off_kernels(g, plan, flags)
    return apply_plan(g, plan)


def _off_kernels(g: Graph, plan: Plan, flags: Mapping[str, bool]) -> Plan:
    """``plan`` with each cut through a kernel of segc's lowering (``flags``:
    ``fused.find_all``'s) moved off it (the plan's other cuts, legal or not, as they
    are), with a warning naming the moves."""
    os_ = ops(g)
    pos = {e.id: k for k, e in enumerate(os_)}
    if plan.fingerprint != plan_key(g) or any(c.after not in pos for c in plan.cuts):
        return plan  # apply_plan refuses it, saying why
    through = inside(lowering_kernels(g, os_, flags))
    split = tuple(c for c in plan.cuts if pos[c.after] + 1 in through)
    if not split:
        return plan
    moved = legalize_plan(g, replace(plan, cuts=split, moved=()), kernels=flags)
    kept = [c for c in plan.cuts if c not in split]
    at = {c.after for c in kept}
    cuts = sorted([*kept, *(c for c in moved.cuts if c.after not in at)], key=lambda c: pos[c.after])
    warnings.warn(
        f"{g.name}: the saved plan {plan.strategy!r} cuts through kernels of segc's lowering; "
        + "; ".join(
            f"#{m.requested} -> {'dropped' if m.placed is None else f'#{m.placed}'} ({m.reason})" for m in moved.moved
        ),
        ScheduleWarning,
        stacklevel=2,
    )
    return replace(plan, cuts=tuple(cuts), moved=(*plan.moved, *moved.moved))
