"""``cut``: place the cuts of a graph by a strategy, or re-apply a saved plan.

``cut(g, strategy="balanced:4")`` runs the strategy (``strategies.py``), legalises the
plan (``legalize.py``: a cut never splits a fused chain) and applies it (``plan.py``:
every old cut goes, the plan's cuts come in). ``cut(g, plan=p)`` applies a plan made
earlier, after checking it was made for this graph. Fences and windows stay put.

Idempotent: cutting a graph again with the same strategy or plan changes nothing.
"""

from __future__ import annotations

from typing import Any

from ..errors import ScheduleError
from ..ir import Graph
from .plan import Plan, apply_plan
from .registry import register
from .strategies import make_plan


@register("cut")
def cut(g: Graph, strategy: Any = "markers", plan: Plan | None = None, legalize: bool = True) -> Graph:
    """Cut ``g`` by ``strategy`` (see ``strategies.resolve``) or by a saved ``plan``."""
    if plan is None:
        plan = make_plan(g, strategy, legalize=legalize)
    elif not isinstance(plan, Plan):
        raise ScheduleError(f"cut: plan must be a segc Plan, got {type(plan).__name__}")
    return apply_plan(g, plan)
