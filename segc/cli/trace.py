"""Trace a target and print its IR (cuts at its boundaries, before any strategy).

``--json`` prints the graph as JSON instead: inputs, constants (types only), equations
(id, primitive, inputs, outputs, arguments, segment) and outputs.

Examples::

    segc trace llama:layers=2
    segc trace mymodel.py:forward --input x=1x128:float32 --json
    segc trace graph.segc
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .target import add_target_arguments, load


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("--json", action="store_true", help="the graph as JSON")
    p.add_argument("--costs", action="store_true", help="segment headers with the cost model's figures")


def run(args: argparse.Namespace) -> int:
    g = load(args).traced_graph()
    if args.json:
        print(json.dumps(graph_json(g), indent=1))
    else:
        from ..ir import to_text
        from ..lower import describe
        from ..passes.analysis import header_annotator

        annotate = header_annotator(g) if args.costs else None
        print(to_text(g, annotate=annotate, describe=describe), end="")
    return 0


def graph_json(g: Any) -> dict[str, Any]:
    from ..ir import segment_of, segments
    from ..ir.printer import args_to_json

    seg = segment_of(g)
    var = lambda v: {"name": v.name, "dtype": v.dtype, "shape": list(v.shape)}  # noqa: E731
    return {
        "name": g.name,
        "inputs": [{**var(i.var), "kind": i.kind, "path": i.path} for i in g.inputs],
        "consts": [var(c.var) for c in g.consts],
        "eqns": [
            {
                "id": e.id,
                "prim": e.prim,
                "ins": list(e.ins),
                "outs": [var(o) for o in e.outs],
                "args": json.loads(args_to_json(e.args)) if e.args else [],
                "segment": seg[k],
            }
            for k, e in enumerate(g.eqns)
        ],
        "outputs": list(g.outputs),
        "segments": [
            {"index": s.index, "name": s.name, "inputs": list(s.inputs), "outputs": list(s.outputs)}
            for s in segments(g)
        ],
    }
