"""Human-readable byte counts and durations, for IR headers, tables and the CLI."""

from __future__ import annotations

import math


def fmt_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``2.0 MiB``, ... (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def fmt_seconds(t: float) -> str:
    """Three significant digits in s, ms, us or ns."""
    if t == 0:
        return "0 s"
    exp = min(max(math.floor(math.log10(t) / 3), -3), 0)
    unit = {0: "s", -1: "ms", -2: "us", -3: "ns"}[exp]
    return f"{t / 10 ** (3 * exp):.3g} {unit}"
