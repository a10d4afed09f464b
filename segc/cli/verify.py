"""Check a target segmented against eager MLX, bit for bit; on a difference, bisect to
the first segment, then the first equation, whose output diverges.

Three runs of the same inputs: eager MLX (the function or model called as is; for an
IR file, the graph replayed op by op), ``segc.jit`` (function and model targets), and
the segmented graph one compiled segment at a time, which keeps every boundary value
for the bisection. The reference for each intermediate value is the graph replayed op
by op (eager MLX's own ops, uncompiled). Exit status 0 when every output is
bit-identical, 1 when one differs.

Examples::

    segc verify llama:layers=4 --strategy balanced:3
    segc verify mymodel.py:forward --input x=1x128:float32
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from .common import add_format, emit, progress
from .target import add_strategy_argument, add_target_arguments, cut, load


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    add_strategy_argument(p)
    add_format(p, default="table")


def same(a: Any, b: Any) -> bool:
    """Bit-identical: dtype, shape and raw bytes."""
    from ..dtypes import same_bytes

    return same_bytes(a, b)


def describe(a: Any, b: Any) -> str:
    import mlx.core as mx

    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}"
    ne = mx.not_equal(a, b) if a.dtype != mx.bool_ else mx.logical_xor(a, b)
    n = mx.sum(ne).item()  # NaN != NaN: a NaN in both counts too (the bytes decide sameness)
    text = f"{n} of {a.size} elements differ"
    if mx.issubdtype(a.dtype, mx.inexact):
        text += f", max |diff| {mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item():.3g}"
    return text


def _segment_replay(eqns: Any, ins: Any, outs: Any, consts: dict[str, Any]) -> Any:
    """A segment's function, as the executor compiles it (the bisection's seam)."""
    from ..lower import replay_fn

    return replay_fn(eqns, ins, outs, consts)


class Segmented:
    """The graph run one compiled segment at a time, every boundary value kept."""

    def __init__(self, g: Any):
        from ..ir import segments
        from ..lower import compile_loses

        self.g = g
        self.segs = segments(g)
        self.fragile = {c.var.name: c.value for c in g.consts if compile_loses(c)}
        self.consts = {c.var.name: c.value for c in g.consts if c.var.name not in self.fragile}

    def fn(self, eqns: Any, ins: tuple[str, ...], outs: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        import mlx.core as mx

        used = tuple(dict.fromkeys(v for e in eqns for v in e.ins if v in self.fragile))
        return mx.compile(_segment_replay(eqns, (*ins, *used), outs, self.consts)), used

    def run(self, inputs: list[Any]) -> dict[str, Any]:
        import mlx.core as mx

        env = {i.var.name: x for i, x in zip(self.g.inputs, inputs)}
        env.update({c.var.name: c.value for c in self.g.consts})
        for s in self.segs:
            fn, used = self.fn(s.eqns(self.g), s.inputs, s.outputs)
            res = fn(*(env[v] for v in s.inputs), *(self.fragile[c] for c in used))
            mx.eval(res)
            env.update(zip(s.outputs, res))
        return env


def reference(g: Any, inputs: list[Any]) -> dict[str, Any]:
    """Every value of ``g``, replayed op by op with eager MLX's ops."""
    import mlx.core as mx

    from ..lower.replay import replay_fn

    eqns = [e for e in g.eqns if not e.is_pseudo]
    names = [o.name for e in eqns for o in e.outs]
    consts = {c.var.name: c.value for c in g.consts}
    vals = replay_fn(eqns, [i.var.name for i in g.inputs], names, consts)(*inputs)
    mx.eval(vals)
    env = {i.var.name: x for i, x in zip(g.inputs, inputs)}
    env.update(consts)
    env.update(zip(names, vals))
    return env


def bisect(g: Any, inputs: list[Any], ref: dict[str, Any]) -> list[str]:
    """Lines saying where the segmented run first diverges from ``ref``."""
    from ..ir.printer import to_text
    from ..lower import describe as describe_eqn

    seg = Segmented(g)
    env = {i.var.name: x for i, x in zip(g.inputs, inputs)}
    import mlx.core as mx

    for s in seg.segs:
        fn, used = seg.fn(s.eqns(g), s.inputs, s.outputs)
        res = fn(*(env[v] for v in s.inputs), *(seg.fragile[c] for c in used))
        mx.eval(res)
        bad = [(v, r) for v, r in zip(s.outputs, res) if not same(r, ref[v])]
        env.update(zip(s.outputs, res))
        if not bad:
            continue
        lines = [
            f"first diverging segment: {s.index} {s.name!r} (its inputs agree with eager; outputs "
            + ", ".join(f"%{v}: {describe(r, ref[v])}" for v, r in bad[:3])
            + ")"
        ]
        eqns = s.eqns(g)
        with progress(len(eqns), f"bisecting segment {s.index}") as bar:
            for j, e in enumerate(eqns):
                bar.advance()
                outs = tuple(o.name for o in e.outs)
                f, used = seg.fn(eqns[: j + 1], s.inputs, outs)
                got = f(*(env[v] for v in s.inputs), *(seg.fragile[c] for c in used))
                mx.eval(got)
                diff = [(v, x) for v, x in zip(outs, got) if not same(x, ref[v])]
                if diff:
                    text = to_text(g.replace(eqns=(e,), outputs=()), headers=False, describe=describe_eqn).splitlines()
                    lines.append(f"first diverging equation: #{e.id} {e.prim} in segment {s.index}:")
                    lines += [f"  {t.strip()}" for t in text if re.search(rf" #{e.id}(\s|$)", t)]
                    lines += [f"  %{v}: {describe(x, ref[v])}" for v, x in diff]
                    return lines
        lines.append("every equation of it agrees when run alone: the difference comes from fusion inside the segment")
        return lines
    return ["the segmented run agrees with the op-by-op replay everywhere: eager MLX and the replay differ"]


def run(args: argparse.Namespace) -> int:
    import mlx.core as mx

    from ..dtypes import short
    from ..trace.pytree import flatten

    target = load(args)
    g, plan = cut(target.traced_graph(), args.strategy, legalize=not args.no_legalize)
    inputs = target.flat_inputs()
    want = target.eager()
    rows: list[dict[str, Any]] = []
    runs: dict[str, list[Any]] = {}
    if target.kind != "ir":
        step = target.jitted(strategy=plan)
        outs, _, _ = flatten(step(*target.args), what="output")
        mx.eval(outs)
        runs["segc.jit"] = list(outs)
        info = step.cache_info()
        for why in info.aborted:
            print(f"segc verify: fallback: {why}", file=sys.stderr)
    env = Segmented(g).run(inputs)
    runs["segment by segment"] = [env[v] for v in g.outputs]
    ref = reference(g, inputs)
    runs["op by op (reference)"] = [ref[v] for v in g.outputs]
    ok = True
    for name, outs in runs.items():
        for k, (a, b) in enumerate(zip(outs, want)):
            good = same(a, b)
            ok = ok and good
            rows.append(
                {
                    "run": name,
                    "output": k,
                    "type": f"{short(b.dtype)}[{','.join(map(str, b.shape))}]",
                    "bit_identical": good,
                    "detail": None if good else describe(a, b),
                }
            )
    n = len(plan.cuts) + 1
    where = [] if ok else bisect(g, inputs, ref)
    emit(
        rows,
        [
            ("run", "run"),
            ("output", "output>"),
            ("type", "type"),
            ("bit_identical", "bit-identical"),
            ("detail", "detail"),
        ],
        args.format,
        title=f"{target.label}: {len(g.outputs)} outputs, strategy {plan.strategy} ({n} segments), against eager MLX",
        meta={"target": target.label, "strategy": plan.strategy, "bit_identical": ok, "bisect": where},
    )
    out = sys.stdout if args.format == "table" else sys.stderr
    if ok:
        print(f"verify: bit-identical to eager MLX ({len(want)} outputs, every run)", file=out)
        return 0
    for line in where:
        print(line, file=out)
    return 1
