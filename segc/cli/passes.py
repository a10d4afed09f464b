"""Run the pass pipeline on a target: print the IR after any pass, compare cut-placement
strategies, save, diff and re-apply plans.

Without a TARGET: an mlx-lm llama with random weights, sized by the model options
(8 layers, hidden 256, bf16, 128 tokens by default: the table in docs/passes.md).

Examples::

    segc passes --compare                                 # strategies side by side
    segc passes llama:layers=2 --strategy balanced:4 --print-after all --changed-only
    segc passes graph.segc --print-after cut,window --diff
    segc passes --strategy memory:2MiB --plan-out plan.json
    segc passes --plan-in plan.json --window 40:300 --print-after window
    segc passes --plan-diff a.json b.json
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any

from ..errors import UsageError
from .common import FORMATS, choice_error, emit, positive_int, progress, window
from .target import Target, add_target_arguments, load, read_schedule, strategy_spec

LLAMA = {"layers": 8, "hidden": 256, "intermediate": 688, "heads": 8, "kv_heads": 4, "vocab": 1024}
STAGES = ("input", "cut", "concat_projections", "fences", "window")  # what --print-after can name, in order


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, optional=True)
    m = p.add_argument_group("the default llama (no TARGET)")
    m.add_argument("--layers", type=positive_int(), help="default 8")
    m.add_argument("--hidden", type=positive_int(), help="default 256")
    m.add_argument("--intermediate", type=positive_int(), help="default 688")
    m.add_argument("--heads", type=positive_int(), help="default 8")
    m.add_argument("--kv-heads", type=positive_int(), help="default 4")
    m.add_argument("--vocab", type=positive_int(), help="default 1024")
    m.add_argument("--graph", metavar="FILE", help="an IR text file (the same as giving it as TARGET)")
    p.add_argument(
        "--strategy",
        action="append",
        help="none, markers, every:K, balanced:N, memory:BYTES, optimal[:BYTES, Fx or markers], "
        "min_boundary_bytes[:a,b], or py:module:function "
        "(repeatable; default markers)",
    )
    p.add_argument("--no-legalize", action="store_true", help="keep cuts that split a fused chain")
    p.add_argument(
        "--concat-projections",
        action="store_true",
        help="run the concat_projections pass after cut (sibling products over concatenated weights)",
    )
    p.add_argument("--compare", action="store_true", help="a table of the strategies")
    p.add_argument(
        "--format", choices=(*FORMATS, "markdown"), help="with --compare: the table's format (default table)"
    )
    p.add_argument("--check-bits", action="store_true", help="run each plan; compare with the unsegmented graph")
    p.add_argument(
        "--measure",
        action="store_true",
        help="with --compare: also balanced:N from measured per-marker-segment times (this machine)",
    )
    p.add_argument("--print-after", metavar="PASSES", help=f"print the IR after these ({', '.join(STAGES)}; or all)")
    p.add_argument("--changed-only", action="store_true", help="with --print-after: skip passes that changed nothing")
    p.add_argument("--diff", action="store_true", help="with --print-after: a unified diff against the previous print")
    p.add_argument("--dump-dir", metavar="DIR", help="write the IR after every pass to DIR, one file per pass")
    p.add_argument("--plan-out", metavar="FILE", help="save the plan of the (first) strategy as JSON")
    p.add_argument("--plan-in", metavar="FILE", help="apply a saved plan instead of a strategy")
    p.add_argument("--plan-diff", nargs=2, metavar=("A", "B"), help="diff two saved plans and exit")
    p.add_argument("--schedule", metavar="FILE", help="a fence schedule (JSON) for the fences pass")
    p.add_argument("--window", type=window, metavar="FIRST:LAST", help="an execution window over equation ids")


def _default_llama(args: argparse.Namespace) -> Target:
    import mlx.core as mx

    from ..models import tiny_llama

    size = {k: getattr(args, k) or v for k, v in LLAMA.items()}
    model = tiny_llama(
        hidden_size=size["hidden"],
        num_hidden_layers=size["layers"],
        intermediate_size=size["intermediate"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        vocab_size=size["vocab"],
        dtype=getattr(mx, args.dtype or "bfloat16"),
    )
    if args.input:
        raise UsageError("--input is for function targets; the default llama takes --tokens")
    tokens = args.tokens or 128
    x = mx.array([[(7 * i) % size["vocab"] for i in range(tokens)]], dtype=mx.int32)
    bnd = "layers.*" if args.boundaries == "auto" else (None if args.boundaries in ("none", "") else args.boundaries)
    label = f"llama (layers={size['layers']}, hidden={size['hidden']}, {tokens} tokens)"
    return Target(label, "arch", label, fn=model, args=[x], boundaries=bnd)


def after_each_softmax(g: Any) -> list[tuple[int, str]]:
    """An example user strategy (``--strategy py:segc.cli.passes:after_each_softmax``):
    a cut after every softmax, mid-attention."""
    return [(e.id, f"softmax{k}") for k, e in enumerate(x for x in g.eqns if x.prim == "Softmax")]


def default_specs(g: Any) -> list[Any]:
    from ..passes.analysis import analyze
    from ..passes.plan import marker_points

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


def run(args: argparse.Namespace) -> int:
    from ..passes import Plan, make_plan
    from ..passes.pipeline import Step
    from ..passes.plan import diff

    if args.plan_diff:
        print(diff(Plan.load(args.plan_diff[0]), Plan.load(args.plan_diff[1])) or "plans cut alike")
        return 0
    wanted = _wanted(args.print_after)
    if (args.changed_only or args.diff) and not wanted:
        raise UsageError("--changed-only and --diff go with --print-after")
    _check_options(args)
    if args.target is not None and args.graph:
        raise UsageError("give either a TARGET or --graph FILE, not both")
    spec = args.target or args.graph
    if spec is None:
        target = _default_llama(args)
    else:
        sized = [f"--{k.replace('_', '-')}" for k in LLAMA if getattr(args, k) is not None]
        if sized:
            raise UsageError(f"{', '.join(sized)} size the default llama; size a target as llama:layers=N,hidden=M")
        target = load(args, spec)
    g = target.traced_graph()
    legalize = not args.no_legalize
    specs = [strategy_spec(s) for s in args.strategy] if args.strategy else None
    if args.compare:
        return _compare(args, target, g, specs or default_specs(g), legalize, chosen=specs is not None)
    schedule = read_schedule(args.schedule) if args.schedule else None
    plan = Plan.load(args.plan_in) if args.plan_in else make_plan(g, (specs or ["markers"])[0], legalize=legalize)
    steps = [Step("cut", {"plan": plan})]
    if args.concat_projections:
        steps.append(Step("concat_projections"))
    if schedule is not None:
        steps.append(Step("fences", {"schedule": schedule}))
    if args.window:
        steps.append(Step("window", {"first": args.window[0], "last": args.window[1]}))
    out = _pipeline(args, g, steps, wanted)
    if args.plan_out:  # once the pipeline ran: a failed run leaves no plan file
        plan.save(args.plan_out)
        print(f"plan {plan.strategy!r} ({len(plan.cuts)} cuts) -> {args.plan_out}", file=sys.stderr)
    if not wanted:
        print(out.as_text(), end="")
    for m in plan.moved:
        print(f"// moved cut after #{m.requested} -> {m.placed}: {m.reason}", file=sys.stderr)
    if args.check_bits:
        print(f"// bit-identical to the unsegmented graph: {_same_bits(g, plan, target)}", file=sys.stderr)
    return 0


# options a --compare table has no use for, and options only it uses
PIPELINE_ONLY = ("plan_out", "plan_in", "schedule", "window", "print_after", "dump_dir", "concat_projections")
COMPARE_ONLY = ("measure", "format")


def _check_options(args: argparse.Namespace) -> None:
    """Refuse options the chosen mode would ignore."""

    def flags(names: tuple[str, ...]) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]

    def verb(given: list[str]) -> str:
        return f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'}"

    if args.compare and flags(PIPELINE_ONLY):
        raise UsageError(f"--compare tabulates strategies; {verb(flags(PIPELINE_ONLY))} without it")
    if not args.compare and flags(COMPARE_ONLY):
        raise UsageError(f"{verb(flags(COMPARE_ONLY))} with --compare")
    if args.plan_in and args.strategy:
        raise UsageError("--plan-in applies a saved plan; --strategy makes one: give one of them")


def _wanted(text: str | None) -> set[str]:
    wanted = {w.strip() for w in (text or "").split(",") if w.strip()}
    valid = {"all", *STAGES}  # the passes this command runs (cut legalises its plan itself)
    for w in sorted(wanted - valid):
        raise choice_error("pass", w, sorted(valid))
    return wanted


def _pipeline(args: argparse.Namespace, g: Any, steps: list[Any], wanted: set[str]) -> Any:
    from ..passes.pipeline import run as run_pipeline

    shown: dict[str, Any] = {"prev": None, "text": None}
    dumps: list[tuple[str, Any]] = []

    def dump(name: str, graph: Any) -> None:
        dumps.append((name, graph))
        text = graph.as_text()
        prev = shown["text"]
        if "all" in wanted or name in wanted:
            if args.changed_only and prev is not None and text == prev:
                print(f"// {name}: no change")
            elif args.diff and prev is not None:
                print(f"// IR after {name} (diff against the previous pass)")
                sys.stdout.writelines(
                    difflib.unified_diff(prev.splitlines(True), text.splitlines(True), "before", f"after {name}")
                )
            else:
                print(f"// IR after {name}")
                print(text)
        shown["text"] = text

    out = run_pipeline(g, steps, checks=True, dump=dump)
    if args.dump_dir:
        from ..passes.pipeline import _dumper

        write = _dumper(args.dump_dir if args.dump_dir.endswith("/") else args.dump_dir + "/")
        assert write is not None
        for i, (name, graph) in enumerate(dumps):
            write(i, name, graph)
        print(f"// {len(dumps)} dumps -> {args.dump_dir}", file=sys.stderr)
    return out


def _compare(args: argparse.Namespace, target: Target, g: Any, specs: list[Any], legalize: bool, chosen: bool) -> int:
    from ..errors import ScheduleError
    from ..passes import make_plan
    from ..passes.analysis import H200, analyze
    from ..passes.plan import apply_plan, plan_key
    from ..units import fmt_seconds
    from .segments import machine_text

    whole = analyze(g)
    model = machine_text(H200)
    summary = (
        f"graph {g.name}: {sum(1 for e in g.eqns if not e.is_pseudo)} equations, plan key {plan_key(g)}, "
        f"{whole.flops / 1e9:.3g} GFLOP, cost {fmt_seconds(whole.cost)}, critical path "
        f"{len(whole.critical_path)} equations ({fmt_seconds(whole.critical_cost)}); costs: {model} estimate"
    )
    if args.measure:
        if target.kind == "ir":
            print("segc passes: --measure times a model's marker segments; an IR file has none", file=sys.stderr)
        else:
            from ..passes.plan import marker_points
            from ..passes.strategies import Balanced
            from ..runtime import measure_segments

            print("segc passes: measuring each marker segment on this machine ...", file=sys.stderr)
            with progress(len(marker_points(g)) + 1, "measuring segments") as bar:
                times = measure_segments(
                    g, target.flat_inputs(), repeats=5, progress=lambda name: bar.advance(what=f"measured {name}")
                )
            specs.append(Balanced(len(marker_points(g)) + 1, measured=times))
    rows = []
    with progress(len(specs), "strategies") as bar:
        for spec in specs:
            try:
                plan = make_plan(g, spec, legalize=legalize)
            except ScheduleError as exc:
                if chosen:
                    raise
                print(f"segc passes: skipped {getattr(spec, '__name__', spec)}: {exc}", file=sys.stderr)
                continue
            st = analyze(apply_plan(g, plan))
            bits = _same_bits(g, plan, target) if args.check_bits else None
            rows.append(
                {
                    "strategy": getattr(spec, "__name__", None) or plan.strategy,
                    "segments": len(st.segments),
                    "largest_segment_cost": st.max_segment_cost,
                    "largest_segment_peak": st.max_segment_peak,
                    "run_peak": st.peak_live,
                    "boundary_bytes": st.boundary_bytes,
                    "moved_cuts": len(plan.moved),
                    "bit_identical": bits,
                }
            )
            bar.advance(what=f"strategy {rows[-1]['strategy']}")
    cols = [
        ("strategy", "strategy"),
        ("segments", "segments>"),
        ("largest_segment_cost", f"largest segment cost ({H200.name} model)>"),
        ("largest_segment_peak", "peak live (largest segment)>"),
        ("run_peak", "peak live (run)>"),
        ("boundary_bytes", "boundary bytes>"),
        ("moved_cuts", "moved cuts>"),
    ]
    if args.check_bits:
        cols.append(("bit_identical", "bit-identical to unsegmented"))
    if args.format == "markdown":
        print(summary + "\n")
        _markdown(rows, cols)
    else:
        emit(rows, cols, args.format or "table", title=summary, meta={"graph": g.name, "cost_model": model})
    return 0 if all(r["bit_identical"] in (None, True) for r in rows) else 1


def _markdown(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> None:
    from .common import cell

    print("| " + " | ".join(h.rstrip(">") for _, h in cols) + " |")
    print("| " + " | ".join("---:" if h.endswith(">") else "---" for _, h in cols) + " |")
    for r in rows:
        vals = [f"`{r['strategy']}`"] + [cell(k, r[k]) for k, _ in cols[1:]]
        print("| " + " | ".join(vals) + " |")


def _same_bits(g: Any, plan: Any, target: Target) -> bool:
    import mlx.core as mx

    from ..dtypes import to_bytes_many
    from ..passes import run_pass
    from ..passes.plan import apply_plan
    from ..runtime.executor import Executor

    inputs = target.flat_inputs()
    want = Executor(run_pass("strip_cuts", g))(list(inputs))
    got = Executor(apply_plan(g, plan))(list(inputs))
    mx.eval(want, got)
    return to_bytes_many(list(got)) == to_bytes_many(list(want))
