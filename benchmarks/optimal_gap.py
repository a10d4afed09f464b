"""How far ``optimal``'s search (``segc.passes.repeat_search``) is from the least
predicted time, where the machine model saves host time on repeated segments: random
machine models on two or three repeated layers (:func:`layers`), every subset of the legal cut points
costed by ``costmodel.predict_time`` on the cut graph (brute force), against the plan
``make_plan(g, "optimal", model=m)`` gives; and against the dynamic program's plan made
without the saving. Prints how many machines' plans are above the least and by how much.

    python benchmarks/optimal_gap.py [--trials 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import random
from dataclasses import replace

from segc.ir import Graph, parse
from segc.passes import make_plan
from segc.passes.costmodel import MachineModel, predict_time
from segc.passes.legalize import legal_points
from segc.passes.plan import apply_plan, plan_at


def layers(n: int) -> Graph:
    """``n`` repeated layers written as IR text, a marker between two: a norm, two
    one-row products of it, their product, an exponential and a residual addition."""
    params, lines, x = ['%a0: f32[1,16] arg="0"'], [], "a0"
    for i in range(n):
        params += [f'%nw{i}: f32[16] param="nw{i}"', f'%wa{i}: f32[16,16] param="wa{i}"']
        params += [f'%wb{i}: f32[16,16] param="wb{i}"']
        lines += [
            f"%n{i}: f32[1,16] = RMSNorm(%{x}, %nw{i}) [1e-05]",
            f"%a{i}x: f32[1,16] = Matmul(%n{i}, %wa{i})",
            f"%b{i}: f32[1,16] = Matmul(%n{i}, %wb{i})",
            f"%m{i}: f32[1,16] = Multiply(%a{i}x, %b{i})",
            f"%e{i}: f32[1,16] = Exp(%m{i})",
            f"%h{i}: f32[1,16] = Add(%{x}, %e{i})",
        ]
        if i < n - 1:
            lines.append(f'segc.cut() ["layers.{i}"]')
        x = f"h{i}"
    body = "\n".join(f"  {t} #{k}" for k, t in enumerate(lines))
    return parse(f"graph f({', '.join(params)}) {{\n{body}\n  return (%{x})\n}}\n")


def machine(rng: random.Random) -> MachineModel:
    """Rates, launch, dispatch and per-kernel host time log-uniform over four decades
    or so; a device time per command buffer or none; the saving per repeated equation
    and per repeated segment (or none)."""
    m = MachineModel(
        "random",
        10 ** rng.uniform(8, 10),
        10 ** rng.uniform(8, 10),
        10 ** rng.uniform(-8, -5),
        10 ** rng.uniform(-7, -3),
        10 ** rng.uniform(-7, -4),
        "random",
        fused_products=True,
        segment_device_s=rng.choice((0.0, 1e-5)),
    )
    return replace(m, repeat_op_s=10 ** rng.uniform(-8, -4), repeat_s=rng.choice((0.0, 10 ** rng.uniform(-7, -4))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    above, dp_above, gaps, dp_gaps = 0, 0, [], []
    for _ in range(args.trials):
        g = layers(rng.choice((2, 3)))
        m = machine(rng)
        pts = legal_points(g, kernels=True)
        subsets = [s for r in range(len(pts) + 1) for s in itertools.combinations(pts, r)]
        least = min(predict_time(apply_plan(g, plan_at(g, "brute", s)), m).total for s in subsets)
        got = predict_time(apply_plan(g, make_plan(g, "optimal", model=m)), m).total
        no_saving = replace(m, repeat_op_s=0.0, repeat_s=0.0)
        dp = predict_time(apply_plan(g, make_plan(g, "optimal", model=no_saving)), m).total
        gaps.append(got / least - 1)
        dp_gaps.append(dp / least - 1)
        above += gaps[-1] > 1e-9
        dp_above += dp_gaps[-1] > 1e-9
    n = args.trials
    print(f"{n} random machines, two or three repeated layers, every subset of the legal points costed")
    print(f"  the search:            above the least on {above} ({above / n:.1%}), by at most {max(gaps):.2%}")
    print(f"  the DP without saving: above the least on {dp_above} ({dp_above / n:.1%}), by at most {max(dp_gaps):.2%}")


if __name__ == "__main__":
    main()
