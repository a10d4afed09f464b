"""An experiment's results: rows as CSV, everything as JSON (with the environment: MLX
version, device, segc's commit, the machine model), a summary per (model, workload)
(Spearman's rank correlation of predicted and measured time across plans, the largest
error of predicted peak memory, bit-identity), and plots (matplotlib, optional:
``pip install 'segc[research]'``): predicted against measured time and memory,
segments against time, and the Pareto front of time and memory."""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ScheduleError
from ..passes.costmodel import MachineModel
from .noise import fast_mode, measured_in, measured_paired, noise, verdict
from .sweep import slug, spearman

COLUMNS = (
    "model",
    "workload",
    "strategy",
    "plan",
    "segments",
    "commits",
    "moved",
    "calibration",
    "held_out",
    "predicted_s",
    "prior_predicted_s",
    "plan_predicted_s",
    "measured_median_s",
    "measured_p25_s",
    "measured_p75_s",
    "measured_min_s",
    "measured_paired_s",
    "measured_fast_s",
    "process_low_s",
    "process_high_s",
    "host_median_s",
    "predicted_host_s",
    "predicted_device_s",
    "compile_s",
    "predicted_peak_bytes",
    "measured_peak_bytes",
    "predicted_weights_bytes",
    "predicted_inputs_bytes",
    "predicted_activations_bytes",
    "measured_resident_bytes",
    "measured_activations_bytes",
    "working_set_bytes",
    "boundary_bytes",
    "bit_identical",
    "repeats",
    "processes",
    "plan_file",
    "graph_file",
    "error",
)


def environment() -> dict[str, Any]:
    import importlib.metadata

    import mlx.core as mx

    try:
        version: str | None = importlib.metadata.version("segc")
    except importlib.metadata.PackageNotFoundError:
        version = None
    env: dict[str, Any] = {
        "mlx": getattr(mx, "__version__", None),
        "device": str(mx.default_device()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "segc": version,
        "utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # segc's and MLX's settings from the environment (SEGC_KV_IN_PLACE=1, ...): a
        # run's lowering depends on them
        "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("SEGC_", "MLX_"))},
    }
    try:
        info = mx.device_info()
        env["device_name"] = str(info.get("device_name", info.get("architecture", "")))
        env["device_memory"] = int(info.get("memory_size", 0))
    except Exception:  # not every backend reports one
        pass
    try:
        root = Path(__file__).resolve().parents[2]
        env["commit"] = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return env


@dataclass
class Results:
    machine: MachineModel
    experiment: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=environment)
    fitted: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> the calibration's fit

    def groups(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in self.rows:
            out.setdefault((r["model"], r["workload"]), []).append(r)
        return out

    def summary(self) -> list[dict[str, Any]]:
        """Per (model, workload): plans, rank correlation of predicted and measured time
        over every plan and over the held-out ones (a calibrated experiment), the
        measurement's noise (``noise.py``) and what it makes of the correlation, the
        relative error of each plan's predicted time against its measured median (mean
        and largest, over every plan and the held-out ones: how close the model comes,
        which a rank over plans a few percent apart does not say), the largest relative
        error of predicted peak memory, whether every plan and the eager run matched
        eager's bits, the fastest plan measured and predicted."""
        out = []
        for (m, w), rows in self.groups().items():
            plans = [r for r in rows if "predicted_s" in r and "measured_median_s" in r]
            errs = [_peak_error(r) for r in plans if r.get("measured_peak_bytes")]
            _pair(plans)
            out.append(
                {
                    "model": m,
                    "workload": w,
                    "plans": len(plans),
                    "spearman_time": _rho(plans),
                    "spearman_min": _rho(plans, "measured_min_s"),
                    "spearman_paired": _rho(plans, "measured_paired_s"),
                    "spearman_fast": _rho(plans, "measured_fast_s"),
                    **_held_out(plans),
                    **_noise(plans),
                    **_time_error(plans),
                    "max_peak_error": max(errs, default=None),
                    "optimal_gap": optimal_gap(rows),
                    "host_slope": next((r["host_slope"] for r in rows if r.get("host_slope") is not None), None),
                    "bit_identical": all(r.get("bit_identical") for r in rows if "error" not in r),
                    "fastest_measured": min(plans, key=lambda r: r["measured_median_s"])["strategy"] if plans else None,
                    "fastest_predicted": min(plans, key=lambda r: r["predicted_s"])["strategy"] if plans else None,
                    "errors": [f"{r['strategy']}: {r['error']}" for r in rows if "error" in r],
                }
            )
        return out

    def to_json(self) -> str:
        exp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.experiment.items()}
        exp = {k: (str(v) if isinstance(v, Path) else v) for k, v in exp.items()}
        d = {
            "segc_experiment": 1,
            "env": self.env,
            "machine": asdict(self.machine),
            "fitted": self.fitted,
            "experiment": exp,
            "summary": self.summary(),
            "rows": self.rows,
        }
        return json.dumps(d, indent=1, default=str) + "\n"

    def write_csv(self, path: str | Path) -> None:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            for r in self.rows:
                w.writerow(r)

    def write(self, out: str | Path, plots: Sequence[str] = ("png", "svg")) -> list[Path]:
        """``results.csv``, ``results.json`` and, when matplotlib is installed and
        ``plots`` names formats, one figure per (model, workload). The paths written."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.write_csv(out / "results.csv")
        (out / "results.json").write_text(self.to_json())
        paths = [out / "results.csv", out / "results.json", *self.write_fitted(out / "fitted")]
        if plots:
            from .plots import plot

            paths += plot(self, out, plots)
        return paths

    def write_fitted(self, where: Path) -> list[Path]:
        """Each calibrated machine model (per model and workload) as a machine model file,
        ``<model>_<workload>.json``: what ``--machine`` takes, so that another run plans
        ``optimal`` with the calibrated model (its own optimum, measured among the others)."""
        paths = []
        for (mspec, w), m in self.fitted_models().items():
            where.mkdir(parents=True, exist_ok=True)
            paths.append(where / f"{slug(mspec)}_{slug(w)}.json")
            m.save(paths[-1])
        return paths

    def fitted_models(self, label: str = "calibrated") -> dict[tuple[str, str], MachineModel]:
        """Each calibrated machine model by (model, workload), its source ``label: model
        workload``: what ``Experiment.planners`` takes."""
        return {
            (mspec, w): MachineModel(**{**m, "source": f"{label}: {mspec} {w}"})
            for mspec, fit in self.fitted.items()
            for w, m in fit.get("machines", {}).items()
        }

    def table(self) -> str:
        """A markdown table of the rows: a calibration plan marked so, the commits where
        fewer than the segments, the range of the per-process medians in brackets."""
        from ..units import fmt_bytes, fmt_seconds

        head = "| model | workload | strategy | segments | predicted | measured (p25–p75) | predicted peak | measured peak | bits |"
        lines = [head, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in self.rows:
            if "error" in r:
                lines.append(f"| {r['model']} | {r['workload']} | `{r['strategy']}` | | | {r['error'][:60]} | | | |")
                continue
            meas = (
                f"{fmt_seconds(r['measured_median_s'])} ({fmt_seconds(r['measured_p25_s'])}–"
                f"{fmt_seconds(r['measured_p75_s'])})"
                if "measured_median_s" in r
                else ""
            )
            if "process_low_s" in r:
                meas += f" [{fmt_seconds(r['process_low_s'])}–{fmt_seconds(r['process_high_s'])}]"
            pred = fmt_seconds(r["predicted_s"]) if "predicted_s" in r else ""
            pp = fmt_bytes(r["predicted_peak_bytes"]) if "predicted_peak_bytes" in r else ""
            mp = fmt_bytes(r["measured_peak_bytes"]) if "measured_peak_bytes" in r else ""
            bits = "yes" if r.get("bit_identical") else "NO"
            name = f"`{r['strategy']}`" + (" (calibration)" if r.get("calibration") else "")
            segs = str(r.get("segments", ""))
            if r.get("commits", 0) < r.get("segments", 0):
                segs += f" ({r['commits']} commits)"
            lines.append(
                f"| {r['model']} | {r['workload']} | {name} | {segs} | {pred} | {meas} | {pp} | {mp} | {bits} |"
            )
        return "\n".join(lines)


def _peak_error(r: dict[str, Any]) -> float:
    """The predicted peak's relative error against ``mx.get_peak_memory``. Memory the
    process held before the call beyond what the prediction counts resident (another
    workload's KV caches, measured in the same process) is added to the prediction: it
    is measured (``measured_resident_bytes``), not this call's."""
    resident = r["predicted_peak_bytes"] - r.get("predicted_activations_bytes", 0)
    other = max(0, r.get("measured_resident_bytes", resident) - resident)
    return abs(r["predicted_peak_bytes"] + other - r["measured_peak_bytes"]) / r["measured_peak_bytes"]


def _rho(plans: list[dict[str, Any]], measured: str = "measured_median_s") -> float | None:
    """Spearman's correlation of predicted and ``measured`` time; None where a plan lacks
    the measurement. ``measured_min_s``, each plan's fastest call, is the statistic two
    runs on two machines agreed on best (docs/experiments-log.md, "The sixth and seventh runs")."""
    if any(r.get(measured) is None for r in plans):
        return None
    return spearman([r["predicted_s"] for r in plans], [r[measured] for r in plans])


def optimal_gap(rows: list[dict[str, Any]]) -> float | None:
    """The largest ``|its own figure - the cost model's| / the cost model's`` over the
    plans whose strategy predicted them (``optimal``'s dynamic program: exact for the
    model but for segments past a GPU's command-buffer size, ``passes.md``), the cost
    model's before any calibration; None without such a plan. A plan the dynamic program
    costs otherwise than the model is not the model's optimum."""
    gaps = [
        abs(r["plan_predicted_s"] - m) / m
        for r in rows
        if "plan_predicted_s" in r and (m := r.get("prior_predicted_s", r.get("predicted_s")))
    ]
    return max(gaps, default=None)


def _time_error(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and largest ``|predicted - measured| / measured`` of the plans' times
    (measured: each plan's median call), over every plan and over the held-out ones."""

    def errs(rows: list[dict[str, Any]]) -> list[float]:
        return [abs(r["predicted_s"] - r["measured_median_s"]) / r["measured_median_s"] for r in rows]

    every, held = errs(plans), errs([r for r in plans if r.get("held_out")])
    return {
        "time_error_mean": sum(every) / len(every) if every else None,
        "time_error_max": max(every, default=None),
        "time_error_heldout_mean": sum(held) / len(held) if held else None,
    }


def _held_out(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """The rank correlations over the plans no calibration used (none without calibration)."""
    if not any("calibration" in r for r in plans):
        return {
            "heldout_plans": None,
            "spearman_heldout": None,
            "spearman_min_heldout": None,
            "spearman_paired_heldout": None,
            "spearman_fast_heldout": None,
        }
    held = [r for r in plans if r.get("held_out")]
    return {
        "heldout_plans": len(held),
        "spearman_heldout": _rho(held),
        "spearman_min_heldout": _rho(held, "measured_min_s"),
        "spearman_paired_heldout": _rho(held, "measured_paired_s"),
        "spearman_fast_heldout": _rho(held, "measured_fast_s"),
    }


def _noise(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """``noise.noise`` over every plan and over the held-out ones, and the verdict on
    the correlation that matters (held-out where there is a calibration; against the
    paired measurement where every plan was timed in every process)."""
    timed = [r for r in plans if r.get("times_s")]
    if len(timed) < 3:
        return {"noise": None, "verdict": "n/a"}
    stats = noise([r["times_s"] for r in timed], [r["predicted_s"] for r in timed])
    held = [r for r in timed if r.get("held_out")]
    if any("calibration" in r for r in timed):  # calibrated: judged on the held-out plans alone
        if len(held) < 3:
            return {"noise": stats, "verdict": f"too few held-out plans to judge ({len(held)}; at least 3)"}
        h = noise([r["times_s"] for r in held], [r["predicted_s"] for r in held])
        stats["heldout"] = h
        rated, st = held, h
    else:
        rated, st = timed, stats
    # the paired measurement where every plan was timed in every process (noise.py)
    if "ceiling_paired" in st and all("measured_paired_s" in r for r in rated):
        rho, ceiling = _rho(rated, "measured_paired_s"), st["ceiling_paired"]
    else:
        rho, ceiling = _rho(rated), st.get("ceiling")
    return {"noise": stats, "verdict": verdict(rho, ceiling, enough=stats["enough"])}


def _pair(plans: list[dict[str, Any]]) -> None:
    """Each plan's paired measurement (``noise.measured_paired``) as
    ``measured_paired_s``, where every plan was timed in the same processes; where
    those fall into modes, its median over the fastest mode's processes
    (``noise.fast_mode``) as ``measured_fast_s``."""
    timed = [r for r in plans if r.get("times_s")]
    every = timed and len(timed) == len(plans)
    pm = measured_paired([r["times_s"] for r in timed]) if every else None
    for r, v in zip(timed, pm or []):
        r["measured_paired_s"] = v
    fast = fast_mode([r["times_s"] for r in timed]) if every else None
    for r, v in zip(timed, measured_in([r["times_s"] for r in timed], fast) if fast else []):
        r["measured_fast_s"] = v


def read_fitted(
    where: str | Path, models: Sequence[str], workloads: Sequence[str]
) -> dict[tuple[str, str], MachineModel]:
    """The calibrated machine models :meth:`Results.write_fitted` saved in ``where`` (an
    experiment's ``fitted/``), per (model, workload) of this sweep that has one: what
    ``Experiment.planners`` takes, so that ``optimal`` is planned with the model a
    run fitted. A folder with none of them is a ``ScheduleError``, naming the files it
    looked for."""
    d = Path(where)
    names = {(m, w): d / f"{slug(m)}_{slug(w)}.json" for m in models for w in workloads}
    found = {k: MachineModel.load(p) for k, p in names.items() if p.is_file()}
    if not found:
        looked = ", ".join(sorted(p.name for p in names.values()))
        raise ScheduleError(f"{d}: no calibrated machine model for this sweep (looked for {looked})")
    return found
