"""The experiment's figures: one of four panels per model and workload (predicted
against measured time and peak memory, segments against time, time against the largest
segment's working set with its Pareto front), drawn with matplotlib."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import SegcError
from .sweep import slug


def plot(res: Any, out: Path, formats: Sequence[str]) -> list[Path]:
    """One figure of four panels per (model, workload) of ``res`` (``report.Results``:
    not imported, which imports this module); the paths written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SegcError("plots need matplotlib: pip install 'segc[research]' (or pass no plot formats)") from None
    written = []
    for (m, w), rows in res.groups().items():
        ok = [r for r in rows if "predicted_s" in r and "measured_median_s" in r]
        if not ok:
            continue
        fig, ax = plt.subplots(2, 2, figsize=(11, 8.5))
        fig.suptitle(f"{m}, {w} ({res.env.get('device')}, machine model {res.machine.name})")
        top = max(max(r["predicted_s"], r["measured_median_s"]) for r in ok)
        us, unit = (1.0, "s") if top >= 1 else (1e3, "ms") if top >= 1e-3 else (1e6, "us")
        a = ax[0][0]
        a.scatter([r["predicted_s"] * us for r in ok], [r["measured_median_s"] * us for r in ok])
        for r in ok:
            a.annotate(r["strategy"], (r["predicted_s"] * us, r["measured_median_s"] * us), fontsize=6)
        a.set(xlabel=f"predicted time ({unit})", ylabel=f"measured median ({unit})", title="time")
        a = ax[0][1]
        mib = 1 / 2**20
        a.scatter([r["predicted_peak_bytes"] * mib for r in ok], [r["measured_peak_bytes"] * mib for r in ok])
        lo = min(min(r["predicted_peak_bytes"], r["measured_peak_bytes"]) for r in ok) * mib
        hi = max(max(r["predicted_peak_bytes"], r["measured_peak_bytes"]) for r in ok) * mib
        a.plot([lo, hi], [lo, hi], "k:", linewidth=0.8)
        a.set(xlabel="predicted peak (MiB)", ylabel="mx.get_peak_memory (MiB)", title="peak memory")
        a.ticklabel_format(useOffset=False)
        a = ax[1][0]
        srt = sorted(ok, key=lambda r: r["segments"])
        a.errorbar(
            [r["segments"] for r in srt],
            [r["measured_median_s"] * us for r in srt],
            yerr=[
                [(r["measured_median_s"] - r["measured_p25_s"]) * us for r in srt],
                [(r["measured_p75_s"] - r["measured_median_s"]) * us for r in srt],
            ],
            fmt="o",
            label="measured (median, quartiles)",
        )
        a.plot([r["segments"] for r in srt], [r["predicted_s"] * us for r in srt], "x", label="predicted")
        a.set(xlabel="segments", ylabel=f"time ({unit})", title="segments against time")
        a.legend(fontsize=7)
        a = ax[1][1]
        pts = [(r["measured_median_s"] * us, r["working_set_bytes"] * mib, r["strategy"]) for r in ok]
        a.scatter([p[0] for p in pts], [p[1] for p in pts], c="grey")
        front = pareto([(p[0], p[1]) for p in pts])
        a.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "r-o", label="Pareto front")
        for i in front:
            a.annotate(pts[i][2], pts[i][:2], fontsize=6)
        a.set(xlabel=f"measured time ({unit})", ylabel="largest segment working set (MiB)", title="time against memory")
        a.legend(fontsize=7)
        fig.tight_layout()
        for fmt in formats:
            p = out / f"plot_{slug(m)}_{slug(w)}.{fmt}"
            fig.savefig(p)
            written.append(p)
        plt.close(fig)
    return written


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (smaller is
    better), by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front
