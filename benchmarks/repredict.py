"""Predict an experiment's measured plans again with this checkout's cost model: the
same measurement (``results.json`` and its ``plans/``), the calibration refitted to its
calibration plans, every plan predicted again; prints each workload's Spearman over
every plan and held out, the ceiling and the verdict. Run it under another checkout's
``PYTHONPATH`` to compare cost models on one measurement. The plans are applied to the
graphs the run saved (``graphs/``: a GPU run's trace, predicted again on this machine),
or to a trace made here (``--retrace``, or a run that saved none).

    python benchmarks/repredict.py out/cpu-decode [--no-queue] [--calibration a,b,c] [--set value_s=5e-6] [--json FILE] [--repeats] [--host-adjust on|off] [--regimes]

``--repeats`` asks whether a term the cost model lacks would order the plans better: a
time per *repeated* segment (one whose equations, by primitive, shape and type, an
earlier segment of the call already had: a plan cut at every layer repeats all but a
few), fitted with an offset to the calibration plans' residuals (measured minus
predicted; the fastest mode's processes where they fell into modes), then every plan's
Spearman with it, over every plan and held out. An analysis, not the cost model.

``--regimes`` asks whether the host's two speeds (docs/experiments.md, "The nineteenth
run") set the plans' order: every call split at the median of the run's probes into the
host's fast and slow halves; each plan measured as its two halves' medians weighted by
the halves' shares of every call (post-stratified, so that no plan's figure turns on how
many of its calls fell in a half); the calibration fitted to those; each plan predicted
as the same weighting of the model at each half's host and device speed (the host
figures scaled by the half's calls' host share over their plan's median, pooled; the
device figures by the one-segment plan's time after the host in the half over the
halves' weighted mean: docs/experiments.md, "Offline: the device's speed in each half").
Prints each plan's halves and the Spearman. An analysis, not the harness's measurement.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from bench_experiment import check, fast_mode

from segc.ir import Graph, parse, segments
from segc.passes.costmodel import CPU, H200, MachineModel, predict_time
from segc.passes.plan import Plan, apply_plan
from segc.research.calibrated import Prepared, calibrate, mark_held_out, predict_row
from segc.research.models import load_model, make_workload
from segc.research.report import Results
from segc.research.sweep import spearman
from segc.research.timing import Timed, record_timings
from segc.staging import jit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--machine", help="a machine model JSON (default: the run's, as this checkout reads it)")
    ap.add_argument("--no-queue", action="store_true", help="an unbounded host queue")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--repeats", action="store_true", help="fit a time per repeated segment (see above)")
    ap.add_argument("--regimes", action="store_true", help="the host's fast and slow halves apart (see above)")
    ap.add_argument("--retrace", action="store_true", help="trace here even where the run saved its graphs")
    ap.add_argument(
        "--host-weight", type=float, help="the measured host times' weight in the fit (fit.py; default: the run's)"
    )
    ap.add_argument(
        "--host-adjust", choices=("on", "off"),
        help="measure again from the run's calls, adjusted to the host's median speed or as measured "
        "(segc.research.timing.adjust); default: the run's measured times as they are"
    )  # fmt: skip
    ap.add_argument(
        "--fit-repeats", action=argparse.BooleanOptionalAction,
        help="fit the host's saving on a repeated segment too (costmodel 'Repeats'; default: as the run did)"
    )  # fmt: skip
    ap.add_argument(
        "--segment-device", action=argparse.BooleanOptionalAction,
        help="fit the device's time per command buffer too (segment_device_s; default: as the run did)"
    )  # fmt: skip
    ap.add_argument("--overheads", default="group", choices=("group", "shared", "device"), help="calibrate.py's")
    ap.add_argument("--calibration", help="calibration plans (comma list of strategies) in place of the run's")
    ap.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a machine figure in place of the run's"
    )
    args = ap.parse_args()
    out = Path(args.out)
    res = json.loads((out / "results.json").read_text())
    if args.machine:
        machine = MachineModel.load(args.machine)
    else:
        # the run's machine model; a figure it lacks (another checkout's) is the built-in
        # model's of its device (H200 for a GPU, else CPU)
        known = {f.name for f in fields(MachineModel)}
        machine = MachineModel(**{k: v for k, v in res["machine"].items() if k in known})
        preset = H200 if machine.device == "gpu" else CPU
        missing = {k: getattr(preset, k) for k in known - set(res["machine"])}
        machine = replace(machine, **missing)
    for item in args.set:  # a figure changed, then calibrated as the run was (value_s: not fitted)
        name, _, value = item.partition("=")
        if name not in {f.name for f in fields(MachineModel)} or not value:
            ap.error(f"--set {item!r}: NAME=VALUE with NAME a machine figure")
        try:
            machine = replace(machine, **{name: type(getattr(machine, name))(float(value))})
        except ValueError:
            ap.error(f"--set {item!r}: {value!r} is not a number")
    if args.no_queue:
        machine = replace(machine, **{f: 0 for f in ("queue_s", "queue_kernels") if hasattr(machine, f)})
    policy = res["experiment"].get("commit_policy", "segment")
    if args.fit_repeats is None:  # the run's own (off before the twenty-eighth session)
        args.fit_repeats = any(f.get("repeats") for f in res.get("fitted", {}).values())
    if args.segment_device is None:  # the run's own (off before the thirty-ninth session)
        args.segment_device = any(f.get("segment_device") for f in res.get("fitted", {}).values())
    if args.host_weight is None:  # the run's own (0 before the twenty-seventh session)
        args.host_weight = float(res["experiment"].get("host_weight", 0.0))
    rows = [dict(r) for r in res["rows"]]
    halves: dict[tuple[str, str], Halves] = {}
    for key in dict.fromkeys((r["model"], r["workload"]) for r in rows):  # every call is in the run's rows
        group = [r for r in rows if (r["model"], r["workload"]) == key and r.get("calls")]
        probed = bool(group) and all(c.get("probe") for r in group for c in r["calls"])
        if args.host_adjust is not None and not group:
            ap.error(f"--host-adjust: {key} has no calls with host probes (a run before them)")
        if args.regimes and not probed:
            ap.error(f"--regimes: {key} has no calls with host probes (a run before them)")
        if args.host_adjust is not None:
            record_timings(group, [[Timed(**c) for c in r["calls"]] for r in group], args.host_adjust == "on")
        if args.regimes:  # after any adjustment, which it replaces for the plans it splits
            halves[key] = split_halves([r for r in group if r.get("plan_file")])
    if args.calibration is not None:  # the held-out plans follow (mark_held_out)
        chosen = set(args.calibration.split(","))
        for r in rows:
            r["calibration"] = r["strategy"] in chosen
    fitted = {}
    cuts: dict[int, Graph] = {}
    for mspec in dict.fromkeys(r["model"] for r in rows):
        model = load_model(mspec)
        preps = []
        for wspec in dict.fromkeys(r["workload"] for r in rows if r["model"] == mspec):
            wl = make_workload(wspec, model)
            saved = next((r["graph_file"] for r in rows if r["workload"] == wspec and r.get("graph_file")), None)
            if saved and not args.retrace:  # the trace as the measuring device made it (a GPU's, say)
                g = parse((out / saved).read_text())
            else:
                a, kw = wl.args()
                g = jit(model, boundaries=res["experiment"].get("boundaries") or None).trace(*a, **kw).graph
            prep = Prepared(wl, [r for r in rows if r["model"] == mspec and r["workload"] == wspec], [], {}, {})
            for r in prep.rows:
                if r.get("plan_file") and "measured_median_s" in r:
                    plan = Plan.load(out / r["plan_file"])
                    prep.cuts[id(r)], prep.plans[id(r)] = apply_plan(g, plan), plan
                    predict_row(r, prep.cuts[id(r)], plan, machine, policy)
            if args.calibration is not None:
                mark_held_out(prep)
            preps.append(prep)
            cuts.update(prep.cuts)
        if any(r.get("calibration") for prep in preps for r in prep.rows):
            fitted[mspec] = calibrate(
                machine,
                policy,
                preps,
                args.overheads,
                host_weight=args.host_weight,
                repeats=args.fit_repeats,
                segment_device=args.segment_device,
            )
        elif args.regimes:
            ap.error("--regimes: the run has no calibration plans to fit (it ran with --calibration '')")
    summary = Results(machine=machine, rows=rows).summary()
    for s in summary:
        noise = s.get("noise") or {}  # None: too few timings to judge
        held = noise.get("heldout") or {}
        print(
            f"{s['model']} {s['workload']}: {s['plans']} plans, Spearman {_f(s['spearman_time'])}, held out "
            f"({s['heldout_plans']}) {_f(s['spearman_heldout'])}; fastest calls {_f(s['spearman_min'])}, held out "
            f"{_f(s['spearman_min_heldout'])}; paired {_f(s['spearman_paired'])}, held out "
            f"{_f(s['spearman_paired_heldout'])} (ceiling {_f(noise.get('ceiling_paired'))}, held out "
            f"{_f(held.get('ceiling_paired'))}); {fast_mode(check(s))}ceiling {_f(noise.get('ceiling'))} "
            f"(held out {_f(held.get('ceiling'))}) -> {s['verdict']}; fastest measured "
            f"{s['fastest_measured']}, predicted {s['fastest_predicted']}; predicted time off by "
            f"{_f(s['time_error_mean'], '{:.1%}')} on average (at most {_f(s['time_error_max'], '{:.1%}')}, "
            f"held out {_f(s['time_error_heldout_mean'], '{:.1%}')}); largest peak-memory error "
            f"{_f(s['max_peak_error'], '{:.1%}')}"
        )
    for (mspec, w), hv in halves.items():
        print(regimes_report(w, hv, fitted[mspec]["machines"][w], cuts, policy))
    if args.repeats:
        for s in summary:
            plans = [r for r in rows if r["workload"] == s["workload"] and r["model"] == s["model"] and id(r) in cuts]
            print(repeat_term(s["workload"], plans, cuts))
    for mspec, f in fitted.items():
        for w, m in f["machines"].items():
            figs = {
                k: f"{m[k] * 1e6:.2f} us"
                for k in (
                    "launch_s",
                    "dispatch_s",
                    "host_op_s",
                    "segment_sq_s",
                    "repeat_s",
                    "repeat_op_s",
                    "segment_device_s",
                )
                if k in m
            }
            print(mspec, w, "fitted", figs, f"scale {f['scales'][w]:.3g}")
    for r in rows:
        if "predicted_s" in r and "measured_median_s" in r:
            host = ""
            if r.get("host_median_s") and r.get("predicted_host_s"):
                host = f"  host predicted {1e3 * r['predicted_host_s']:6.3f} measured {1e3 * r['host_median_s']:6.3f}"
            print(
                f"  {r['strategy']:22s} {r['segments']:3d} seg  predicted {1e3 * r['predicted_s']:6.3f} ms  "
                f"measured {1e3 * r['measured_median_s']:6.3f} ms{host}{'  (held out)' if r.get('held_out') else ''}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "fitted": fitted}, indent=1, default=str))


def repeated(g: Graph) -> int:
    """Segments of ``g`` whose equations (primitive, output shapes and types) an earlier
    segment already had."""
    sigs = [
        tuple((e.prim, tuple((o.shape, o.dtype) for o in e.outs)) for e in s.eqns(g) if not e.is_pseudo)
        for s in segments(g)
    ]
    return len(sigs) - len(set(sigs))


def repeat_term(workload: str, plans: list[dict], cuts: dict[int, Graph]) -> str:
    """The line ``--repeats`` prints for one workload's plans."""
    key = "measured_fast_s" if all(r.get("measured_fast_s") for r in plans) else "measured_median_s"
    reps = {id(r): repeated(cuts[id(r)]) for r in plans}
    cal = [r for r in plans if r.get("calibration")]
    xs = np.array([reps[id(r)] for r in cal], dtype=float)
    ys = np.array([r[key] - r["predicted_s"] for r in cal])
    if len(cal) < 2 or np.ptp(xs) == 0:
        return f"{workload}: no repeat term (the calibration plans repeat no segment, or all alike)"
    beta = min(float(np.polyfit(xs, ys, 1)[0]), 0.0)  # a saving, or nothing
    held = [r for r in plans if r.get("held_out")]

    def rho(rs: list[dict], b: float) -> str:
        return _f(spearman([r["predicted_s"] + b * reps[id(r)] for r in rs], [r[key] for r in rs]))

    return (
        f"{workload}: repeat term {beta * 1e6:+.1f} us per repeated segment (fitted to the calibration plans' "
        f"{key}); Spearman {rho(plans, 0.0)} -> {rho(plans, beta)}, held out ({len(held)}) {rho(held, 0.0)} -> "
        f"{rho(held, beta)}; repeated segments per plan: " + ", ".join(f"{r['strategy']} {reps[id(r)]}" for r in plans)
    )


@dataclass
class Halves:
    """One workload's calls in the host's fast and slow halves (``--regimes``)."""

    threshold: float  # seconds of probe: below it, the fast half
    weights: tuple[float, float]  # each half's share of every call
    factors: tuple[float, float]  # each half's host speed: its calls' host over their plan's median, pooled
    rows: list[dict] = field(default_factory=list)
    per_plan: dict[int, list[tuple[float, float, float]]] = field(default_factory=dict)  # (host, after, call)
    device: tuple[float, float] = (1.0, 1.0)  # each half's device speed: the one-segment plan's time after its host


def split_halves(rows: list[dict]) -> Halves:
    """Split ``rows``' calls at the median probe; set each row's measured time and host
    share to its halves' medians weighted by the halves' shares (post-stratified). Each
    half's device speed is the one-segment plan's (``none``: the device runs all of it
    after the host returns) time after the host in that half, over the halves' weighted
    mean; (1, 1) without that plan."""
    calls = {id(r): [np.array([x for c in r["calls"] for x in c[k]]) for k in ("times", "host", "probe")] for r in rows}
    probes = np.concatenate([v[2] for v in calls.values()])
    thr = float(np.median(probes))
    fast = float(np.mean(probes < thr))
    w = (fast, 1.0 - fast)
    out = Halves(thr, w, (1.0, 1.0), rows)
    ratios: tuple[list, list] = ([], [])
    for r in rows:
        t, h, p = calls[id(r)]
        sel = (p < thr, p >= thr)
        if min(int(s.sum()) for s in sel) == 0:  # a plan with no call in one half: left as measured
            continue
        out.per_plan[id(r)] = [
            (float(np.median(h[s])), float(np.median((t - h)[s])), float(np.median(t[s]))) for s in sel
        ]
        r["measured_median_s"] = sum(wk * hv[2] for wk, hv in zip(w, out.per_plan[id(r)]))
        r["host_median_s"] = sum(wk * hv[0] for wk, hv in zip(w, out.per_plan[id(r)]))
        for k, s in enumerate(sel):
            ratios[k].extend(h[s] / np.median(h))
    if out.per_plan:
        out.factors = (float(np.median(ratios[0])), float(np.median(ratios[1])))
    one = next((hv for r in rows if r.get("strategy") == "none" and (hv := out.per_plan.get(id(r)))), None)
    if one is not None:
        mean = sum(wk * after for wk, (_, after, _) in zip(w, one))
        out.device = (one[0][1] / mean, one[1][1] / mean)
    return out


HOST_FIGURES = ("dispatch_s", "host_op_s", "encode_s", "commit_s", "repeat_s", "repeat_op_s")


def regimes_report(workload: str, hv: Halves, fitted: dict, cuts: dict[int, Graph], policy: str) -> str:
    """``--regimes``' lines for one workload: each plan's halves, the model (``fitted``:
    its calibrated machine's figures) at each half's host and device speed, and the
    Spearman of the weighted prediction with the weighted measurement."""
    m = MachineModel(**fitted)  # calibrate's asdict of this checkout's model
    rows = [r for r in hv.rows if id(r) in hv.per_plan and id(r) in cuts]
    lines = [
        f"{workload}: halves at a probe of {hv.threshold * 1e3:.3f} ms, shares {hv.weights[0]:.2f} / "
        f"{hv.weights[1]:.2f}, host speed {hv.factors[0]:.2f} / {hv.factors[1]:.2f} of the median, device "
        f"{hv.device[0]:.2f} / {hv.device[1]:.2f} of the mean"
    ]
    pred = {}
    for r in rows:
        each = [predict_time(cuts[id(r)], _at(m, f, g), policy).total for f, g in zip(hv.factors, hv.device)]
        pred[id(r)] = sum(w * t for w, t in zip(hv.weights, each))
        lines.append(
            f"  {r['strategy']:20s}"
            + "".join(
                f" | {name}: host {1e3 * h:.3f}, after {1e3 * a:.3f}, call {1e3 * c:.3f} ms, predicted {1e3 * p:.3f}"
                for name, (h, a, c), p in zip(("fast", "slow"), hv.per_plan[id(r)], each)
            )
        )
    held = [r for r in rows if r.get("held_out")]
    rho = [_f(spearman([pred[id(r)] for r in rs], [r["measured_median_s"] for r in rs])) for rs in (rows, held)]
    lines.append(f"{workload}: post-stratified, Spearman {rho[0]}, held out ({len(held)}) {rho[1]}")
    return "\n".join(lines)


def _at(m: MachineModel, host: float, device: float) -> MachineModel:
    """``m`` with its host's figures times ``host`` and its device's times ``device``."""
    figs: dict[str, Any] = {"flops_per_s": m.flops_per_s / device, "bytes_per_s": m.bytes_per_s / device}
    figs |= {k: getattr(m, k) * device for k in ("launch_s", "segment_sq_s", "segment_device_s")}
    figs |= {k: getattr(m, k) * host for k in HOST_FIGURES}
    return replace(m, **figs)


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


if __name__ == "__main__":
    main()
