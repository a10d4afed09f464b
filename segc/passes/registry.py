"""The pass registry: every pass is registered here by name (``@register("cut")``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ScheduleError
from ..ir import Graph

Pass = Callable[..., Graph]
PASSES: dict[str, Pass] = {}
# passes allowed to add fences and windows
EFFECT_PASSES = frozenset({"fences", "window"})


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
