"""The pass pipeline: a straight list of named passes run top to bottom.

``run(g, steps)`` applies each :class:`Step` (a registered pass and its options). With
checks on it verifies the graph after every pass (``segc.ir.verify``, fences and windows
included) and checks that the pass kept every effect: a pass other than ``fences`` and
``window`` must leave the sequence of fences and windows exactly as it was; those two
may only add to it. Checks are on when ``checks=True`` or when the environment sets
``SEGC_CHECKS=1`` (the test suite sets it). Checks on or off, every step is checked
(a :class:`Step`, a pass name or a ``(name, options)`` pair) and every pass name known
before the first pass runs, and each pass runs through
:func:`~segc.passes.registry.run_pass` (its options checked, a result that is not a
``Graph`` refused, an error inside it naming it).

Dumping: ``dump=`` (or the environment's ``SEGC_DUMP_IR``) is a directory (each pass's
result written there as ``<graph>-<fingerprint>-NN-<pass>.segc``, the fingerprint the
input graph's: one file per graph, signature and pass), a comma-separated list of pass names (or
``all``) printed to stderr, or a callable ``dump(pass_name, graph)``. ``input`` names the
graph before any pass.

``segc.jit`` runs :func:`place` (the ``cut`` pass, by a strategy or a saved plan); an
engine adds ``fences`` (a schedule) and ``window`` after it, in that order::

    cut (strategy or plan) -> fences (schedule) -> window (first, last)
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IRError, ScheduleError
from ..ir import EFFECTS, WINDOW, Graph, to_text, verify
from ..lower import describe
from .registry import EFFECT_PASSES, get, run_pass

Dump = str | Path | Callable[[str, Graph], None] | None


@dataclass(frozen=True)
class Step:
    """A registered pass's name and its options (checked against the pass when it runs)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ScheduleError(f"Step: a pass name (a non-empty string), got {self.name!r}")
        if not isinstance(self.options, Mapping) or not all(isinstance(k, str) for k in self.options):
            raise ScheduleError(f"Step {self.name!r}: options must be a dict of option names, got {self.options!r}")


def as_step(st: Any, where: str = "step") -> Step:
    """A :class:`Step` from a step as ``run`` takes it: a ``Step``, a pass name, or a
    ``(name, options)`` pair; anything else is a :class:`ScheduleError`."""
    if isinstance(st, Step):
        return st
    if isinstance(st, str):
        return Step(st)
    if isinstance(st, tuple) and len(st) == 2:
        return Step(st[0], st[1])
    raise ScheduleError(f"{where}: expected a pass name, a Step or a (name, options) pair, got {st!r}")


def checks_enabled(checks: bool | None = None) -> bool:
    if checks is not None:
        return checks
    return os.environ.get("SEGC_CHECKS", "") not in ("", "0")


def _dumper(dump: Dump) -> Callable[[int, str, Graph], None] | None:
    if dump is None:
        dump = os.environ.get("SEGC_DUMP_IR") or None
    if dump is None:
        return None
    if callable(dump):
        fn = dump
        return lambda i, name, g: fn(name, g)
    text = str(dump)
    path = Path(text)
    if os.sep in text or path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        prefix = [""]

        def to_dir(i: int, name: str, g: Graph) -> None:
            if i == 0:  # one file per graph, signature (the input's fingerprint) and pass
                prefix[0] = f"{re.sub(r'[^A-Za-z0-9_.]+', '_', g.name)}-{g.fingerprint()[:8]}-"
            (path / f"{prefix[0]}{i:02d}-{name}.segc").write_text(to_text(g, describe=describe))

        return to_dir
    wanted = {w.strip() for w in text.split(",") if w.strip()}

    def to_stderr(i: int, name: str, g: Graph) -> None:
        if "all" in wanted or "1" in wanted or name in wanted:
            print(f"// IR after {name}", file=sys.stderr)
            print(to_text(g, describe=describe), file=sys.stderr)

    return to_stderr


def _effects(g: Graph, windows: bool = True) -> list:
    return [e for e in g.eqns if e.prim in EFFECTS and (windows or e.prim != WINDOW)]


def _is_subsequence(small: list, big: list) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def check_effects_kept(name: str, before: Graph, after: Graph) -> None:
    if name in EFFECT_PASSES:
        if not _is_subsequence(_effects(before, False), _effects(after, False)):
            raise IRError(f"pass {name!r} dropped or reordered a fence")
    elif _effects(before) != _effects(after):
        raise IRError(f"pass {name!r} dropped, changed or reordered a fence or window; only fences/window may")


def run(
    g: Graph,
    steps: Sequence[Step | str | tuple[str, dict[str, Any]]],
    *,
    checks: bool | None = None,
    dump: Dump = None,
) -> Graph:
    """Run ``steps`` over ``g``; see the module for checks and dumping."""
    if not isinstance(g, Graph):
        raise IRError(f"run: expected a segc Graph, got {type(g).__name__}")
    if isinstance(steps, str | Step):
        raise ScheduleError(f"run: steps must be a list of steps, got {steps!r}")
    plan = [as_step(st, f"step {i}") for i, st in enumerate(steps, 1)]
    check = checks_enabled(checks)
    out = _dumper(dump)
    if check:
        verify(g)
    if out is not None:
        out(0, "input", g)
    for st in plan:
        get(st.name)  # an unknown pass is refused before any pass runs
    for i, st in enumerate(plan, 1):
        before = g
        g = run_pass(st.name, g, **st.options)
        if check:
            try:
                verify(g)
            except IRError as exc:
                raise IRError(f"after pass {st.name!r}: {exc}") from None
            check_effects_kept(st.name, before, g)
        if out is not None:
            out(i, st.name, g)
    return g


def place(g: Graph, strategy: Any = None, *, checks: bool | None = None, dump: Dump = None) -> Graph:
    """``segc.jit``'s hook: cut ``g`` by ``strategy`` (a spec, a strategy or a saved
    :class:`~segc.passes.plan.Plan`); None leaves ``g`` as traced (unless dumping)."""
    from .plan import Plan

    if strategy is None and dump is None and not os.environ.get("SEGC_DUMP_IR"):
        return g
    steps: list[Step] = []  # no strategy: the traced cuts as they are (dumped as "input")
    if isinstance(strategy, Plan):
        steps.append(Step("cut", {"plan": strategy}))
    elif strategy is not None:
        steps.append(Step("cut", {"strategy": strategy}))
    return run(g, steps, checks=checks, dump=dump)
