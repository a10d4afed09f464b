"""A table of a target's segments: equations, FLOPs, bytes in and out, peak live bytes,
the cost model's estimate, the one-row products segc's CUDA lowering would compute with
their neighbours as one kernel (``segc.lower.product_match``: ``add``, ``glu``, ``gemv``,
``+norm`` with the norm before) and its rotated KV writes (``segc.lower.kvwrite``:
``kv_write``, ``+q`` with the queries' rotation), fences and windows.

Costs are the roofline estimate of the device model named in the table's caption (an
NVIDIA H200 in bf16), not measurements of this machine: ``segc bench`` measures.

Examples::

    segc segments llama:layers=4 --strategy balanced:2
    segc segments graph.segc --format csv
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from .common import add_format, emit
from .target import add_strategy_argument, add_target_arguments, cut, load

COLUMNS = [
    ("segment", "segment>"),
    ("name", "name"),
    ("eqns", "eqns>"),
    ("flops", "FLOPs>"),
    ("bytes_in", "bytes in>"),
    ("bytes_out", "bytes out>"),
    ("peak", "peak live>"),
    ("cost", "cost (h200 est.)>"),
    ("products", "products (CUDA)"),
    ("fences", "fences"),
    ("window", "window"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    add_strategy_argument(p)
    add_format(p)


def machine_text(m: Any) -> str:
    return f"{m.name} roofline ({m.flops_per_s / 1e12:g} TFLOP/s, {m.bytes_per_s / 1e12:g} TB/s)"


def segment_rows(g: Any) -> tuple[list[dict[str, Any]], Any]:
    from ..ir import segment_effects, segments
    from ..ir.printer import effect_text
    from ..lower.fused import cuda_defaults, find_all
    from ..passes.analysis import H200, analyze

    vs = g.vars()
    avals = {n: (v.shape, v.dtype) for n, v in vs.items()}
    consts = {c.var.name: c.value for c in g.consts}
    stats = analyze(g, H200)
    rows = []
    for s, ss, eff in zip(segments(g), stats.segments, segment_effects(g)):
        fences = [effect_text(e) for e in g.eqns[s.start : s.stop] if e.is_pseudo and e.prim != "segc.window"]
        found = find_all(s.eqns(g), s.outputs, consts, avals, g.eqns, **cuda_defaults())
        kinds = Counter(
            m.kind + ("+norm" if m.eps is not None else "") + (f"/q{m.quant[1]}" if m.quant else "")
            for m in found.products
        )
        paired = {id(w) for w, _ in found.pairs}
        kinds.update("kv_write" + ("+q" if w.queries else "") for w in found.writes if id(w) not in paired)
        n_live = len(found.live)  # the write, then MLX's attention over the live keys (lower/live.py)
        kinds.update(
            ["kv_write+attention"] * (len(found.pairs) - n_live)
            + ["kv_write+live_attention"] * n_live
            + ["attention"] * (len(found.attention) - len(found.pairs))
        )
        rows.append(
            {
                "segment": s.index,
                "name": s.name,
                "eqns": ss.n_eqns,
                "flops": ss.flops,
                "bytes_in": sum(vs[v].nbytes for v in s.inputs),
                "bytes_out": sum(vs[v].nbytes for v in s.outputs),
                "peak": ss.peak_live,
                "cost": ss.cost,
                "products": " ".join(f"{k}:{n}" for k, n in sorted(kinds.items())) or None,
                "fences": "; ".join(x for x in fences if x) or None,
                "window": ", ".join(eff.windows) or None,
            }
        )
    return rows, stats


def run(args: argparse.Namespace) -> int:
    from ..passes.analysis import H200

    target = load(args)
    g, plan = cut(target.traced_graph(), args.strategy, legalize=not args.no_legalize)
    rows, stats = segment_rows(g)
    caption = (
        f"{len(rows)} segments; costs: {machine_text(H200)} estimate; whole run peak live "
        f"{_b(stats.peak_live)}, boundary bytes {_b(stats.boundary_bytes)}"
    )
    meta = {"target": target.label, "strategy": plan.strategy, "cost_model": machine_text(H200)}
    emit(rows, COLUMNS, args.format, title=f"{target.label}, strategy {plan.strategy}", caption=caption, meta=meta)
    return 0


def _b(n: int) -> str:
    from ..units import fmt_bytes

    return fmt_bytes(n)
