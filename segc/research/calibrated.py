"""The plans of one model and workload as an experiment holds them (:class:`Prepared`),
their predictions (:func:`predict_row`), which of them are held out from calibration
(:func:`mark_held_out`), and the calibration: the machine model fitted to the
calibration plans' measured times (``fit.py``; by default each workload's overheads
to its own plans), then every plan predicted again with it (:func:`calibrate`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..ir import Graph
from ..passes import Plan
from ..passes.analysis import analyze
from ..passes.commits import commit_flags
from ..passes.costmodel import MachineModel, predict_time
from ..passes.memory import predict_memory
from .fit import FREE, Observation, fit_machine
from .models import Workload

# what overheads="device" fits: the device's throughput, per-kernel launch and size terms
DEVICE_FIGURES = ("scale", "launch_s", "segment_sq_s")


@dataclass
class Prepared:
    """One model and workload, planned, predicted, compiled, checked and measured for
    memory; ``runs`` the rows to time with their functions (the eager row: the model),
    ``cuts`` and ``plans`` each planned row's cut graph and plan (by ``id(row)``)."""

    workload: Workload
    rows: list[dict[str, Any]]
    runs: list[tuple[dict[str, Any], Callable[..., Any]]]
    cuts: dict[int, Graph]
    plans: dict[int, Plan]


def mark_held_out(prep: Prepared) -> None:
    """``held_out``: a planned row that is no calibration plan, nor cuts as one does."""

    def key(p: Plan) -> tuple:
        return tuple(c.after for c in p.cuts), p.order

    seen = {key(prep.plans[id(r)]) for r in prep.rows if r.get("calibration") and id(r) in prep.plans}
    for r in prep.rows:
        if id(r) in prep.plans:
            r["held_out"] = not r.get("calibration") and key(prep.plans[id(r)]) not in seen


def calibrate(
    machine: MachineModel,
    policy: str,
    preps: list[Prepared],
    overheads: str = "group",
    host_weight: float = 0.0,
    repeats: bool = False,
    segment_device: bool = False,
) -> dict[str, Any]:
    """Fit ``machine`` to the calibration rows of every workload, then predict every
    planned row with the fitted model (``prior_predicted_s``: the prediction before).
    ``overheads``: ``"device"``, each workload's device figures alone (``DEVICE_FIGURES``)
    fitted to its own calibration rows, the host's kept as ``machine`` gives them;
    ``"group"``, each workload's overheads fitted to its own calibration
    rows, or ``"shared"``, one set for every workload (``fit.fit_machine``); ``host_weight``
    > 0 fits the rows' measured host times too (``fit.py``; off by default:
    docs/experiments-log.md, "The sixth and seventh runs"); ``repeats`` fits the host's
    saving on a repeated segment too, per equation of it (``repeat_op_s``: ``costmodel``,
    "Repeats"; not with ``"device"``; docs/experiments-log.md, "Offline: the repeat
    saving per equation"); ``segment_device`` fits the device's time per command
    buffer too (``segment_device_s``; docs/experiments-log.md, the twenty-second run)."""
    obs = []
    for prep in preps:
        for r in prep.rows:
            if r.get("calibration") and "measured_median_s" in r and id(r) in prep.cuts:
                segs = predict_time(prep.cuts[id(r)], machine, policy).segments
                host = r.get("host_median_s")
                obs.append(Observation(r["workload"], segs, r["measured_median_s"], r["strategy"], host))
    extra = ("segment_device_s",) if segment_device else ()
    if overheads == "device":  # the host's figures are the machine model's (measured apart): only the device's fitted
        fit = fit_machine(machine, obs, overheads="group", host_weight=host_weight, free=(*DEVICE_FIGURES, *extra))
    else:
        free = (*FREE, "repeat_op_s", *extra) if repeats else (*FREE, *extra)
        fit = fit_machine(machine, obs, overheads=overheads, host_weight=host_weight, free=free)
    for prep in preps:
        m = fit.machines.get(prep.workload.name)
        for r in prep.rows:
            if id(r) in prep.cuts and m is not None:
                r["prior_predicted_s"] = r["predicted_s"]
                predict_row(r, prep.cuts[id(r)], prep.plans[id(r)], m, policy)
    return {
        "machines": {w: asdict(m) for w, m in fit.machines.items()},
        "free": list(fit.free),
        "overheads": overheads,
        "host_weight": host_weight,
        "repeats": repeats,
        "segment_device": segment_device,
        "scales": fit.scales,
        "loss": fit.loss,
        "plans": sorted({o.name for o in obs}),
        "observations": fit.observations,
    }


def predict_row(row: dict[str, Any], cut: Graph, plan: Plan, machine: MachineModel, policy: str) -> None:
    tp = predict_time(cut, machine, policy)
    # measured after warm-up: the jit's call owns its state buffers (from its second call)
    mp = predict_memory(
        cut,
        copied_writes=machine.fused_products,
        buffer_kernels=machine.buffer_kernels,
        commits=commit_flags(cut, policy, machine.device),
        consumed_state=True,
        # MLX's CPU build: the host runs up to its queue of kernels ahead, holding buffers
        lag_kernels=int(machine.queue_kernels) if machine.device == "cpu" else 0,
    )
    st = analyze(cut, machine.roofline())
    row.update(
        {
            "plan": plan.strategy,
            "segments": sum(s.part == 0 for s in tp.segments),  # a GPU's command buffers come as parts
            "commits": tp.commits,
            "moved": len(plan.moved),
            "predicted_s": tp.total,
            "predicted_host_s": tp.host,
            "predicted_device_s": tp.device,
            "predicted_peak_bytes": mp.peak,
            "predicted_weights_bytes": mp.weights,
            "predicted_inputs_bytes": mp.inputs + mp.constants,
            "predicted_activations_bytes": mp.activations,
            "working_set_bytes": st.max_segment_peak,
            "boundary_bytes": st.boundary_bytes,
        }
    )
