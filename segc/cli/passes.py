"""Run the pass pipeline on an mlx-lm llama (or an IR file): print the IR after any pass,
compare cut-placement strategies, save, diff and re-apply plans.

Examples::

    segc passes --compare                       # the table in docs/passes.md
    segc passes --strategy balanced:4 --print-after all
    segc passes --strategy memory:2MiB --plan-out plan.json
    segc passes --plan-in plan.json --window 40:300 --print-after window
    segc passes --diff a.json b.json
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from ..errors import SegcError


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model (mlx-lm llama, random weights)")
    m.add_argument("--layers", type=int, default=8)
    m.add_argument("--hidden", type=int, default=256)
    m.add_argument("--intermediate", type=int, default=688)
    m.add_argument("--heads", type=int, default=8)
    m.add_argument("--kv-heads", type=int, default=4)
    m.add_argument("--vocab", type=int, default=1024)
    m.add_argument("--tokens", type=int, default=128)
    m.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    m.add_argument("--boundaries", default="layers.*", help="marker globs over submodule paths ('' for none)")
    m.add_argument("--graph", metavar="FILE", help="an IR text file instead of the model")
    p.add_argument(
        "--strategy",
        action="append",
        help="none, markers, every:K, balanced:N, memory:BYTES, min_boundary_bytes[:a,b], or py:module:function "
        "(repeatable; default markers)",
    )
    p.add_argument("--no-legalize", action="store_true", help="keep cuts that split a fused chain")
    p.add_argument("--compare", action="store_true", help="a markdown table of the strategies")
    p.add_argument("--check-bits", action="store_true", help="run each plan; compare with the unsegmented graph")
    p.add_argument(
        "--measure",
        action="store_true",
        help="with --compare: also balanced:N from measured per-marker-segment times (this machine)",
    )
    p.add_argument("--print-after", metavar="PASSES", help="print the IR after these passes (comma list, or all)")
    p.add_argument("--plan-out", metavar="FILE", help="save the plan of the (first) strategy as JSON")
    p.add_argument("--plan-in", metavar="FILE", help="apply a saved plan instead of a strategy")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="diff two saved plans and exit")
    p.add_argument("--schedule", metavar="FILE", help="a fence schedule (JSON) for the fences pass")
    p.add_argument("--window", metavar="FIRST:LAST", help="an execution window over equation ids")


def _model(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import mlx.core as mx

    import segc
    from segc.models import tiny_llama

    model = tiny_llama(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        intermediate_size=args.intermediate,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        dtype=getattr(mx, args.dtype),
    )
    x = mx.array([[(7 * i) % args.vocab for i in range(args.tokens)]], dtype=mx.int32)
    return model, segc.jit(model, boundaries=args.boundaries or None).trace(x), x


def _spec(text: str) -> Any:
    if text.startswith("py:"):
        mod, _, fn = text[3:].rpartition(":")
        return getattr(importlib.import_module(mod), fn)
    return text


def after_each_softmax(g: Any) -> list[tuple[int, str]]:
    """An example user strategy (``--strategy py:segc.cli.passes:after_each_softmax``):
    a cut after every softmax, mid-attention."""
    return [(e.id, f"softmax{k}") for k, e in enumerate(x for x in g.eqns if x.prim == "Softmax")]


def default_specs(g: Any) -> list[Any]:
    from segc.passes.analysis import analyze
    from segc.passes.plan import marker_points

    n = max(len(marker_points(g)), 1)
    per_layer = analyze(g).max_segment_peak
    return [
        "none",
        "markers",
        "every:2",
        f"balanced:{n + 1}",
        f"balanced:{max(n // 2, 1)}",
        f"memory:{per_layer}",
        f"memory:{2 * per_layer}",
        "min_boundary_bytes",
        after_each_softmax,
    ]


def _row(name: str, plan: Any, g: Any, bits: str) -> str:
    from segc.passes.analysis import analyze
    from segc.passes.plan import apply_plan
    from segc.units import fmt_bytes, fmt_seconds

    st = analyze(apply_plan(g, plan))
    return (
        f"| `{name}` | {len(st.segments)} | {fmt_seconds(st.max_segment_cost)} | {fmt_bytes(st.max_segment_peak)} "
        f"| {fmt_bytes(st.peak_live)} | {fmt_bytes(st.boundary_bytes)} | {len(plan.moved)}{bits} |"
    )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except SegcError as exc:
        print(f"segc passes: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import segc
    from segc.passes import Plan, Schedule, make_plan
    from segc.passes.pipeline import Step, run
    from segc.passes.plan import diff

    if args.diff:
        text = diff(Plan.load(args.diff[0]), Plan.load(args.diff[1]))
        print(text or "plans cut alike")
        return 0
    if args.graph:
        with open(args.graph) as f:
            g = segc.parse(f.read())
        model = x = None
    else:
        model, traced, x = _model(args)
        g = traced.graph
    legalize = not args.no_legalize
    specs = [_spec(s) for s in args.strategy] if args.strategy else (default_specs(g) if args.compare else ["markers"])

    if args.compare:
        from segc.passes.analysis import analyze
        from segc.passes.plan import plan_key
        from segc.units import fmt_seconds

        whole = analyze(g)
        print(
            f"graph {g.name}: {sum(1 for e in g.eqns if not e.is_pseudo)} equations, plan key {plan_key(g)}, "
            f"{whole.flops / 1e9:.3g} GFLOP, cost {fmt_seconds(whole.cost)}, critical path "
            f"{len(whole.critical_path)} equations ({fmt_seconds(whole.critical_cost)})"
        )
        print()
        print(
            "| strategy | segments | largest segment cost | peak live (largest segment) | peak live (run) "
            "| boundary bytes | moved cuts |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        if args.measure and model is not None:
            from segc.passes.plan import marker_points
            from segc.passes.strategies import Balanced
            from segc.runtime import measure_segments

            times = measure_segments(g, _inputs(model, g, x), repeats=5)
            specs.append(Balanced(len(marker_points(g)) + 1, measured=times))
        for spec in specs:
            plan = make_plan(g, spec, legalize=legalize)
            name = getattr(spec, "__name__", None) or plan.strategy
            bits = ""
            if args.check_bits and model is not None:
                bits = ", bit-identical" if _same_bits(model, g, plan, x) else ", DIFFERS"
            print(_row(name, plan, g, bits))
        return 0

    plan = Plan.load(args.plan_in) if args.plan_in else make_plan(g, specs[0], legalize=legalize)
    if args.plan_out:
        plan.save(args.plan_out)
        print(f"plan {plan.strategy!r} ({len(plan.cuts)} cuts) -> {args.plan_out}", file=sys.stderr)
    steps = [Step("cut", {"plan": plan})]
    if args.schedule:
        with open(args.schedule) as f:
            steps.append(Step("fences", {"schedule": Schedule.from_json(f.read())}))
    if args.window:
        first, _, last = args.window.partition(":")
        steps.append(Step("window", {"first": int(first), "last": int(last)}))
    wanted = {w.strip() for w in (args.print_after or "").split(",") if w.strip()}

    def dump(name: str, graph: Any) -> None:
        if "all" in wanted or name in wanted:
            print(f"// IR after {name}")
            print(graph.as_text())

    out = run(g, steps, checks=True, dump=dump if wanted else None)
    if not wanted:
        print(out.as_text(), end="")
    for m in plan.moved:
        print(f"// moved cut after #{m.requested} -> {m.placed}: {m.reason}", file=sys.stderr)
    if args.check_bits and model is not None:
        print(f"// bit-identical to the unsegmented graph: {_same_bits(model, g, plan, x)}", file=sys.stderr)
    return 0


def _inputs(model: Any, g: Any, x: Any) -> list[Any]:
    from mlx.utils import tree_flatten

    params = dict(tree_flatten(model.parameters()))
    return [x] + [params[i.path] for i in g.inputs if i.kind == "param"]


def _same_bits(model: Any, g: Any, plan: Any, x: Any) -> bool:
    import mlx.core as mx

    from segc.passes import run_pass
    from segc.passes.plan import apply_plan
    from segc.runtime.executor import Executor

    inputs = _inputs(model, g, x)
    want = Executor(run_pass("strip_cuts", g))(inputs)
    got = Executor(apply_plan(g, plan))(inputs)
    return all(mx.array_equal(a, b).item() for a, b in zip(got, want))
