"""The pass registry: every pass is registered here by name (``@register("cut")``).

:func:`run_pass` is the one way a pass runs (the pipeline calls it for each step). It
refuses, naming the pass: a graph that is not a :class:`~segc.ir.Graph`, options the
pass does not take (listing those it does), and a result that is not a ``Graph`` (a pass
that forgot its ``return``). A :class:`~segc.errors.SegcError` raised inside a pass
keeps its type and message, with the pass's name in ``pass_name`` and in a note; any
other exception (but a ``MemoryError`` or a warning raised as an error) becomes a
:class:`~segc.errors.ScheduleError` naming the pass, chained to the original.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..errors import IRError, ScheduleError, SegcError
from ..ir import Graph

Pass = Callable[..., Graph]
PASSES: dict[str, Pass] = {}
# passes allowed to add fences and windows
EFFECT_PASSES = frozenset({"fences", "window"})


def register(name: str) -> Callable[[Pass], Pass]:
    if not isinstance(name, str) or not name:
        raise ScheduleError(f"a pass is registered under a non-empty name, got {name!r}")

    def deco(f: Pass) -> Pass:
        if name in PASSES:
            raise ScheduleError(f"pass {name!r} registered twice (first by {_qualname(PASSES[name])})")
        PASSES[name] = f
        f.pass_name = name  # type: ignore[attr-defined]
        return f

    return deco


def _qualname(f: Any) -> str:
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"


def get(name: str) -> Pass:
    try:
        return PASSES[name]
    except (KeyError, TypeError):
        raise ScheduleError(f"no pass named {name!r}; passes: {', '.join(sorted(PASSES))}") from None


def options_of(f: Pass) -> tuple[list[str], bool]:
    """The keyword options a pass takes (after the graph), and whether it takes any."""
    try:
        params = list(inspect.signature(f).parameters.values())[1:]
    except (TypeError, ValueError):  # a callable without a signature: anything goes
        return [], True
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def run_pass(pass_name: str, g: Graph, /, **options: Any) -> Graph:
    """Run the pass registered as ``pass_name`` over ``g`` with ``options``."""
    f = get(pass_name)
    if not isinstance(g, Graph):
        raise IRError(f"pass {pass_name!r}: expected a segc Graph, got {type(g).__name__}")
    names, any_option = options_of(f)
    unknown = [k for k in options if k not in names]
    if unknown and not any_option:
        raise ScheduleError(
            f"pass {pass_name!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options: {', '.join(names) or '(none)'}"
        )
    try:
        inspect.signature(f).bind(g, **options)
    except TypeError as exc:  # a required option missing
        raise ScheduleError(f"pass {pass_name!r}: {exc}; its options: {', '.join(names) or '(none)'}") from None
    except ValueError:
        pass
    try:
        out = f(g, **options)
    except SegcError as exc:
        exc.pass_name = pass_name  # type: ignore[attr-defined]
        if f"in pass {pass_name!r}" not in getattr(exc, "__notes__", ()):
            exc.add_note(f"in pass {pass_name!r}")
        raise
    except (MemoryError, Warning):  # a warning raised as an error stays that warning
        raise
    except Exception as exc:
        raise ScheduleError(f"pass {pass_name!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, Graph):
        raise IRError(
            f"pass {pass_name!r} returned {type(out).__name__}, not a Graph "
            "(a pass returns the new graph, or the one it was given)"
        )
    return out
