"""Strategy sweeps: ``balanced:2..18`` (every integer; ``balanced:2..18:4`` every
fourth), ``memory:0.5x..2x`` (steps of 0.25x unless told: ``memory:0.5x..2x:0.5x``),
``memory:1MiB..8MiB`` (doubling), the same for ``optimal:``; any other spec is one
strategy. And the statistics of a sweep: medians with quartiles, Spearman's rank
correlation; a spec as part of a file name (``slug``)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence

from ..errors import ScheduleError
from ..passes.strategies import parse_bytes

_RANGE = re.compile(r"^(\w+):([^:.]+(?:\.\d+)?x?)\.\.([^:]+?)(?::(.+))?$")


def _floats(a: float, b: float, step: float) -> list[float]:
    if step <= 0:
        raise ScheduleError(f"a sweep's step must be positive, got {step}")
    out, k = [], 0
    while a + k * step <= b + 1e-9:
        out.append(round(a + k * step, 6))
        k += 1
    return out


def expand(spec: str) -> list[str]:
    """The strategies of one sweep spec, in order."""
    m = _RANGE.match(spec.strip())
    if not m:
        return [spec.strip()]
    name, lo, hi, step = m.groups()
    try:
        if name == "balanced" or name == "every":
            a, b, s = int(lo), int(hi), int(step or 1)
            if s < 1 or a > b:
                raise ScheduleError(f"sweep {spec!r}: needs LO <= HI and a step >= 1")
            return [f"{name}:{k}" for k in range(a, b + 1, s)]
        if name in ("memory", "optimal") and lo.endswith("x") and hi.endswith("x"):
            vals = _floats(float(lo[:-1]), float(hi[:-1]), float((step or "0.25x").rstrip("x")))
            if not vals:
                raise ScheduleError(f"sweep {spec!r}: needs LO <= HI")
            return [f"{name}:{v:g}x" for v in vals]
        if name in ("memory", "optimal"):
            a2, b2 = parse_bytes(lo), parse_bytes(hi)
            f = float(step or 2)
            if f <= 1 or a2 < 1:
                raise ScheduleError(f"sweep {spec!r}: a byte range doubles (or grows by a factor > 1)")
            out, v = [], float(a2)
            while v <= b2 * (1 + 1e-9):
                out.append(f"{name}:{int(v)}")
                v *= f
            if not out:
                raise ScheduleError(f"sweep {spec!r}: needs LO <= HI")
            return out
    except ValueError:
        raise ScheduleError(f"cannot read sweep {spec!r}") from None
    raise ScheduleError(f"sweep {spec!r}: ranges are for balanced, every, memory and optimal")


def expand_all(specs: Iterable[str]) -> list[str]:
    out: list[str] = []
    for s in specs:
        for x in expand(s):
            if x not in out:
                out.append(x)
    return out


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max."""
    s = sorted(xs)
    if not s:
        return {}
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "p25": q[0], "p75": q[2], "min": s[0], "max": s[-1]}


def ranks(xs: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's of the ranks); None under 3 points or
    when one side is constant."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx_, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx_) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx_) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return float(sxy / (sxx * syy) ** 0.5)


def slug(text: str) -> str:
    """``text`` as part of a file name: runs of other characters than letters, digits and
    dots as one ``-``."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")
