"""segc's compiler passes: pure ``Graph -> Graph`` functions, one per file, by name.

Invariants every pass keeps (the pipeline checks them when checks are on):
- the result verifies (``segc.ir.verify``, fences and windows included);
- fences and windows (``segc.ir.EFFECTS``) are never dropped or reordered: a pass
  that is not a fence or window pass leaves that sequence exactly as it was, and those
  passes only add to it;
- a pass never changes what a graph computes: only cuts, order and effects.

Passes: ``strip_cuts``, ``cut`` (a strategy or a saved plan), ``legalize``, ``fences``,
``window``. Cut-placement strategies (``strategies.py``) produce a :class:`Plan`;
analyses (``analysis.py``) compute costs, liveness and boundary bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ScheduleError
from ..ir import Graph

Pass = Callable[..., Graph]
PASSES: dict[str, Pass] = {}
# passes allowed to add fences and windows
EFFECT_PASSES = {"fences", "window"}


def register(name: str) -> Callable[[Pass], Pass]:
    def deco(f: Pass) -> Pass:
        if name in PASSES:
            raise ValueError(f"pass {name!r} registered twice")
        PASSES[name] = f
        f.pass_name = name  # type: ignore[attr-defined]
        return f

    return deco


def get(name: str) -> Pass:
    try:
        return PASSES[name]
    except KeyError:
        raise ScheduleError(f"no pass named {name!r}; passes: {', '.join(sorted(PASSES))}") from None


def run_pass(pass_name: str, g: Graph, /, **options: Any) -> Graph:
    return get(pass_name)(g, **options)


# importing each pass module registers its pass
from . import cut, fences, legalize, strip, windows  # noqa: E402, F401
from .fences import Schedule as Schedule  # noqa: E402
from .pipeline import Step as Step  # noqa: E402
from .pipeline import run as run  # noqa: E402
from .plan import Plan as Plan  # noqa: E402
from .strategies import make_plan as make_plan  # noqa: E402
from .strategies import resolve as resolve  # noqa: E402

__all__ = [
    "PASSES",
    "Plan",
    "Schedule",
    "Step",
    "get",
    "make_plan",
    "register",
    "resolve",
    "run",
    "run_pass",
]
