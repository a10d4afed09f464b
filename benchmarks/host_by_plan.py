"""Each plan's measured host time (until the call returns), run by run, from experiment
outputs (``results.json`` of ``segc experiment`` / ``bench_experiment.py``), and the
host time one segment more costs between consecutive layer-aligned plans of a
workload (``--chain``, default ``balanced:2,every:4,every:2,min_boundary_bytes,markers``).

    python benchmarks/host_by_plan.py RUN_DIR [RUN_DIR ...] [--chain a,b,c]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

CHAIN = "balanced:2,every:4,every:2,min_boundary_bytes,markers"


def load(run: Path) -> dict[str, dict[str, tuple[float, int]]]:
    """Per workload, per plan: (host median seconds, segments)."""
    res = json.loads((run / "results.json").read_text())
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for row in res["rows"]:
        if row["strategy"] != "eager" and row.get("host_median_s") is not None:
            out.setdefault(row["workload"], {})[row["strategy"]] = (row["host_median_s"], int(row["segments"]))
    return out


def marginal(plans: dict[str, tuple[float, int]], chain: list[str]) -> list[tuple[str, str, float | None]]:
    """Between consecutive plans of ``chain``: µs of host time a segment more (None where
    a plan is missing or the two have as many segments)."""
    out: list[tuple[str, str, float | None]] = []
    for a, b in itertools.pairwise(chain):
        if a not in plans or b not in plans or plans[a][1] == plans[b][1]:
            out.append((a, b, None))
            continue
        (ha, sa), (hb, sb) = plans[a], plans[b]
        out.append((a, b, (hb - ha) / (sb - sa) * 1e6))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--chain", default=CHAIN)
    a = ap.parse_args()
    chain = a.chain.split(",")
    runs = {str(r): load(r) for r in a.runs}
    for wl in sorted({w for r in runs.values() for w in r}):
        print(f"{wl}: host ms a call")
        plans = sorted({p for r in runs.values() for p in r.get(wl, {})})
        for p in plans:
            cells = [f"{r[wl][p][0] * 1e3:7.3f}" if p in r.get(wl, {}) else "      -" for r in runs.values()]
            segs = next(r[wl][p][1] for r in runs.values() if p in r.get(wl, {}))
            print(f"  {p:22s} {segs:3d} seg " + " ".join(cells))
        for name, r in runs.items():
            steps = marginal(r.get(wl, {}), chain)
            text = ", ".join(f"{x}->{y} {'-' if v is None else f'{v:.0f}'}" for x, y, v in steps)
            print(f"  µs a segment more, {name}: {text}")


if __name__ == "__main__":
    main()
