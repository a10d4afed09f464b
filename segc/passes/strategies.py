"""Cut-placement strategies. Each is a callable ``Graph -> Plan``; all produce the same
:class:`~segc.passes.plan.Plan`, so plans from different strategies can be saved,
diffed, compared (``segc passes --compare``) and re-applied.

- ``none``: no cuts (the stock path);
- ``markers``: the cuts in the traced graph (``segc.boundary``, ``boundaries=`` globs);
- ``every(k)``: every k-th marker (every k equations when there are none);
- ``balanced(n)``: at most n segments minimising the largest segment cost, by dynamic
  programming over the legal cut points (as PipeDream's partitioner); the cost is the
  analytic roofline (``analysis.eqn_cost``) or measured per-segment times
  (``segc.runtime.measure_segments``) spread over each segment's equations;
- ``memory(budget)``: the fewest segments whose peak live bytes each stay under budget
  (exact: a DP over the legal cut points, ``optimal.py``);
- ``optimal[:budget]``: the least time the cost model (``costmodel.py``) predicts,
  under an optional budget (``optimal.py``); ``optimal:markers`` over the markers only;
- ``min_boundary_bytes``: one cut between each pair of consecutive markers, where the
  bytes crossing it are smallest: a minimum s-t cut (networkx) over the equations
  between the markers, which may put one side of the cut first (the plan's ``order``);
- a user callable ``fn(graph) -> ids`` (cut after each equation id; or ``(id, name)``).

:func:`make_plan` resolves a spec and legalises the result (``legalize.py``): the plan
records every cut that had to move.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ScheduleError
from ..ir import Graph, segments
from ..lower.fused import cuda_defaults, pinning
from .analysis import H200, Machine, eqn_cost, liveness, ops, span_peak
from .costmodel import MachineModel
from .legalize import legal_points, legalize_plan
from .mincut import MinBoundaryBytes
from .optimal import Optimal, fewest_segments
from .plan import Cut, Plan, marker_points, plan_at, plan_key, plan_of

Strategy = Callable[[Graph], Plan]


@dataclass(frozen=True)
class NoCuts:
    def __call__(self, g: Graph) -> Plan:
        return Plan(plan_key(g), "none", ())


@dataclass(frozen=True)
class Markers:
    def __call__(self, g: Graph) -> Plan:
        p = plan_of(g, "markers")
        return Plan(p.fingerprint, "markers", p.cuts)


@dataclass(frozen=True)
class Every:
    k: int

    def __call__(self, g: Graph) -> Plan:
        if self.k < 1:
            raise ScheduleError(f"every(k) needs k >= 1, got {self.k}")
        marks = marker_points(g)
        if marks:
            return plan_at(g, f"every({self.k})", [p for i, (p, _, _) in enumerate(marks) if (i + 1) % self.k == 0])
        return plan_at(g, f"every({self.k})", range(self.k, len(ops(g)), self.k))


def _partition(costs: Sequence[float], points: Sequence[int], n: int) -> list[int]:
    """Cut points (a subset of ``points``) splitting ``costs`` into at most ``n`` runs
    with the smallest largest sum. dp[j][i]: best with j runs ending at pts[i]."""
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + c)
    pts = [0, *sorted(p for p in set(points) if 0 < p < len(costs)), len(costs)]
    m = len(pts)
    n = max(1, min(n, m - 1))
    s = [pre[p] for p in pts]
    dp = [s[:]]  # one run: everything up to pts[i]
    arg: list[list[int]] = [[0] * m]
    for _ in range(1, n):
        prev, row, brow = dp[-1], [0.0] * m, [0] * m
        row[0] = 0.0
        for i in range(1, m):
            # max(prev[q], s[i] - s[q]) over q < i: prev rises with q, s[i]-s[q] falls
            lo, hi = 0, i  # the first q with prev[q] >= s[i] - s[q]
            while lo < hi:
                mid = (lo + hi) // 2
                if prev[mid] >= s[i] - s[mid]:
                    hi = mid
                else:
                    lo = mid + 1
            best, bq = float("inf"), 0
            for q in (lo - 1, lo):
                if 0 <= q < i:
                    v = max(prev[q], s[i] - s[q])
                    if v < best:
                        best, bq = v, q
            row[i], brow[i] = best, bq
        dp.append(row)
        arg.append(brow)
    j = min(range(n), key=lambda j: (dp[j][m - 1], j))
    cuts, i = [], m - 1
    while j > 0:
        i = arg[j][i]
        cuts.append(pts[i])
        j -= 1
    return sorted(cuts)


@dataclass(frozen=True)
class Balanced:
    n: int
    measured: Mapping[str, float] | None = None  # segment name -> seconds, on the graph's segments
    machine: Machine = H200

    def costs(self, g: Graph) -> list[float]:
        vs = g.vars()
        os_ = ops(g)
        lv = liveness(g)
        cost = [eqn_cost(e, vs, self.machine, lv) for e in os_]
        if not self.measured:
            return cost
        k = 0
        for s in segments(g):
            n = sum(1 for e in g.eqns[s.start : s.stop] if not e.is_pseudo)
            if s.name not in self.measured:
                raise ScheduleError(f"balanced: no measured time for segment {s.name!r}")
            total = sum(cost[k : k + n]) or float(n)
            for i in range(k, k + n):  # spread the measured time by analytic share
                cost[i] = self.measured[s.name] * ((cost[i] or total / n) / total)
            k += n
        return cost

    def __call__(self, g: Graph) -> Plan:
        if self.n < 1:
            raise ScheduleError(f"balanced(n) needs n >= 1, got {self.n}")
        cost = self.costs(g)
        pts = _partition(cost, legal_points(g), self.n)
        src = "measured" if self.measured else "analytic"
        return plan_at(g, f"balanced({self.n}, {src})", pts, info={"cost": src})


@dataclass(frozen=True)
class Memory:
    """The fewest segments whose working sets stay within ``budget`` bytes (or, with
    ``relative``, that many times :func:`layer_working_set`): exact, by
    ``optimal.fewest_segments``."""

    budget: int = 0
    relative: float | None = None

    def resolve_budget(self, g: Graph) -> int:
        return int(self.relative * layer_working_set(g)) if self.relative is not None else self.budget

    def __call__(self, g: Graph) -> Plan:
        budget = self.resolve_budget(g)
        name = f"memory({self.relative:g}x={budget})" if self.relative is not None else f"memory({budget})"
        return plan_at(g, name, fewest_segments(g, budget), info={"budget": budget})


def layer_working_set(g: Graph) -> int:
    """The largest working set of the segments between marker cuts (one layer with
    ``boundaries="layers.*"``), or the whole graph's when there are no markers: what
    ``memory:1x`` means."""
    os_ = ops(g)
    lv = liveness(g)
    pts = [0, *(p for p, _, _ in marker_points(g)), len(os_)]
    return max((span_peak(g, a, b, lv, os_) for a, b in itertools.pairwise(pts) if b > a), default=0)


@dataclass(frozen=True)
class UserCallable:
    fn: Callable[[Graph], Any]

    def __call__(self, g: Graph) -> Plan:
        res = self.fn(g)
        if isinstance(res, Plan):
            return res
        name_of = getattr(self.fn, "__name__", "user")
        if isinstance(res, str | bytes) or not hasattr(res, "__iter__"):
            raise ScheduleError(
                f"user strategy {name_of!r} returned a {type(res).__name__}; return a Plan or a list of "
                "equation ids (or (id, name) pairs) to cut after"
            )
        ids = {e.id for e in ops(g)}
        cuts = []
        for i, item in enumerate(res):
            ok = isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str)
            eid, name = item if ok else (item, f"cut{i}")
            if not isinstance(eid, int) or isinstance(eid, bool):
                raise ScheduleError(
                    f"user strategy {name_of!r}: item {i} is {item!r}, not an equation id or (id, name)"
                )
            if eid not in ids:
                raise ScheduleError(f"user strategy: #{eid} is not a computing equation of {g.name}")
            cuts.append(Cut(int(eid), str(name)))
        pos = {e.id: k for k, e in enumerate(ops(g))}
        cuts.sort(key=lambda c: pos[c.after])
        return Plan(plan_key(g), getattr(self.fn, "__name__", "user"), tuple(cuts))


# --------------------------------------------------------------------------- specs

_SPEC = re.compile(r"^\s*(\w+)\s*(?:[:(]\s*([^)]*?)\s*\)?)?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


def parse_bytes(text: str) -> int:
    """A byte count: a whole number of bytes (``4096``), or a number with a unit
    (``64MiB``, ``1.5GiB``; binary units)."""
    m = re.fullmatch(r"\s*([0-9.e+]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower().rstrip("b") not in {u.rstrip("b") for u in _UNITS}:
        raise ScheduleError(f"not a byte count: {text!r}")
    unit = m.group(2).lower()
    unit = unit if unit in _UNITS else unit.rstrip("b")
    try:
        x = float(m.group(1))
        n = x * _UNITS[unit]
        if not 0 <= n < 2**63:
            raise OverflowError
    except (ValueError, OverflowError):
        raise ScheduleError(f"not a byte count: {text!r} (a number of bytes below 2**63)") from None
    if _UNITS[unit] == 1 and x != int(x):
        raise ScheduleError(
            f"not a byte count: {text!r} (a whole number of bytes, a unit as in 1.5MiB, "
            "or for a factor of the layer's working set an x: 1.5x)"
        )
    return int(n)


def _factor(name: str, arg: str) -> float:
    """The ``F`` of ``name:Fx``: a finite number above 0."""
    try:
        f = float(arg[:-1])
    except ValueError:
        raise ScheduleError(f"strategy {name!r}: bad argument {arg!r} (a factor is a number and x: 1.5x)") from None
    if not 0 < f < float("inf"):
        raise ScheduleError(f"strategy {name!r}: bad argument {arg!r} (a factor must be above 0)")
    return f


def _bytes(name: str, arg: str) -> int:
    try:
        return parse_bytes(arg)
    except ScheduleError as exc:
        raise ScheduleError(f"strategy {name!r}: {exc}") from None


def _count(name: str, arg: str, what: str) -> int:
    try:
        n = int(arg)
    except ValueError:
        raise ScheduleError(f"strategy {name!r}: bad argument {arg!r} ({name}:{what}, a whole number)") from None
    if n < 1:
        raise ScheduleError(f"{name}({what.lower()}) needs {what.lower()} >= 1, got {n}")
    return n


STRATEGIES = (
    "none, markers, every:K, balanced:N, memory:BYTES, memory:Fx, optimal[:BYTES, Fx or markers], "
    "min_boundary_bytes[:a,b,...]"
)


def resolve(spec: Any, model: MachineModel | None = None) -> Strategy:
    """A strategy from a spec: a strategy object, a :class:`Plan` (used as is), a callable,
    or text: ``none``, ``markers``, ``every:K``, ``balanced:N``, ``memory:BYTES`` (``64MiB``;
    ``memory:1.5x``: 1.5 times :func:`layer_working_set`), ``optimal`` (least predicted
    time; ``optimal:BYTES`` or ``optimal:Fx`` under a working-set budget,
    ``optimal:markers`` cutting only at the markers),
    ``min_boundary_bytes`` (``min_boundary_bytes:a,b`` between markers a and b).
    A text spec is checked here, before any graph: an unknown name, an argument a
    strategy does not take, a missing one or a malformed one is a ``ScheduleError``."""
    if isinstance(spec, Plan):
        return lambda g: spec
    if isinstance(spec, NoCuts | Markers | Every | Balanced | Memory | MinBoundaryBytes | Optimal | UserCallable):
        return spec
    if callable(spec):
        return UserCallable(spec)
    if not isinstance(spec, str):
        raise ScheduleError(f"not a cut strategy: {spec!r}")
    m = _SPEC.match(spec)
    if not m:
        raise ScheduleError(f"cannot read strategy {spec!r}")
    name, arg = m.group(1), (m.group(2) or "").strip()
    given = m.group(2) is not None  # a ':' or '(' was written, even with nothing after it
    arg = arg.split("=", 1)[-1] if "=" in arg else arg
    if name in ("none", "markers") and arg:
        raise ScheduleError(f"strategy {name!r} takes no argument, got {spec.strip()!r}")
    forms = {"every": "every:K", "balanced": "balanced:N", "memory": "memory:BYTES or memory:Fx"}
    if name in forms and not arg and (given or name != "every"):
        raise ScheduleError(f"strategy {spec.strip()!r}: the argument is missing ({forms[name]})")
    if name == "none":
        return NoCuts()
    if name == "markers":
        return Markers()
    if name == "every":
        return Every(_count(name, arg, "K") if given else 1)
    if name == "balanced":
        return Balanced(_count(name, arg, "N"))
    if name == "memory":
        if arg.lower().endswith("x"):
            return Memory(relative=_factor(name, arg))
        return Memory(_bytes(name, arg))
    if name == "optimal":
        if not arg:
            return Optimal(None, model)
        if arg.lower() == "markers":
            return Optimal(None, model, markers=True)
        if arg.lower().endswith("x"):
            return _RelativeOptimal(_factor(name, arg), model)
        return Optimal(_bytes(name, arg), model)
    if name == "min_boundary_bytes":
        between = tuple(a.strip() for a in arg.split(",")) if arg else None
        if between is not None and not all(between):
            raise ScheduleError(f"strategy {spec.strip()!r}: an empty marker name")
        return MinBoundaryBytes(between)
    raise ScheduleError(f"no strategy {name!r}; strategies: {STRATEGIES}")


@dataclass(frozen=True)
class _RelativeOptimal:
    relative: float
    model: MachineModel | None = None

    def __call__(self, g: Graph) -> Plan:
        budget = int(self.relative * layer_working_set(g))
        plan = Optimal(budget, self.model)(g)
        return replace(plan, strategy=f"optimal({self.relative:g}x={budget})")


def make_plan(g: Graph, spec: Any, *, legalize: bool = True, model: MachineModel | None = None) -> Plan:
    """Run a strategy on ``g``; legalise its cuts unless told not to. ``model``: the
    machine the plan is for: ``optimal`` specs predict with it
    (``costmodel.default_model()`` if None), and a model given pins the kernels of its
    lowering (segc's CUDA kernels where ``fused_products``, else none) instead of this
    process's (``lower.fused.pinning``)."""
    pins = nullcontext() if model is None else pinning(cuda_defaults() if model.fused_products else None)
    with pins:
        plan = resolve(spec, model)(g)
        return legalize_plan(g, plan) if legalize else plan
