"""Where does a quantized mlx-lm model traced by segc leave eager's bits?

A diagnostic for the device machine (it runs on any MLX build): a tiny 4-bit llama
(the lowering tests' ``tiny("llama", True)``), no cache, 9 tokens. It prints

- each path's largest |difference| from eager: ``mx.compile``, segc uncut with and
  without ``mx.compile`` per segment, per-module cuts, and MLX's own
  ``export_function``/``import_function`` replay;
- the primitives of this device's trace, and any equation whose rule does not rebuild
  the very primitive (``conftest.assert_rules_exact`` per equation);
- module by module (a boundary after every submodule), whether segc's value at the
  module's output equals eager's, and for the first module that differs the equations
  in it, each re-run on eager's inputs against the module run eagerly.

    PYTHONPATH=$PWD python benchmarks/probe_quantized.py [--arch llama mixtral] [--float]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from conftest import retrace, with_cuts
from test_lower_models import tiny

import segc
from segc.ir import CUT, Graph
from segc.lower import REBUILT, replay_fn
from segc.runtime import Executor
from segc.trace import _slots


def diff(a: mx.array, b: mx.array) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    if mx.array_equal(a, b, equal_nan=True).item():
        return "identical"
    d = mx.abs(a.astype(mx.float32) - b.astype(mx.float32))
    return f"max |diff| {mx.max(d).item():.3g}, {int(mx.sum(d > 0).item())} of {d.size} elements differ"


class Recorder:
    """Records a submodule's inputs and output in an eager call."""

    def __init__(self, module: Any, path: str, log: list):
        self.m, self.path, self.log = module, path, log

    def __call__(self, *a: Any, **k: Any) -> Any:
        out = self.m(*a, **k)
        # a copy: model code may update the output in place (gemma3's ``h *= scale``)
        self.log.append((self.path, a, k, mx.array(out) if isinstance(out, mx.array) else out))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.m, name)


def record_eager(model: Any, x: mx.array) -> tuple[mx.array, list]:
    log: list = []
    swapped = []
    for container, key, path, sub in _slots(model):
        if isinstance(container, tuple):
            continue
        swapped.append((container, key, sub))
        rec = Recorder(sub, path, log)
        if isinstance(container, dict):
            dict.__setitem__(container, key, rec)
        else:
            container[key] = rec
    try:
        out = model(x)
        mx.eval(out, [e[3] for e in log if isinstance(e[3], mx.array)])
    finally:
        for container, key, sub in reversed(swapped):
            if isinstance(container, dict):
                dict.__setitem__(container, key, sub)
            else:
                container[key] = sub
    return out, log


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", nargs="+", default=["llama"])
    ap.add_argument("--float", action="store_true", help="the unquantized model")
    a = ap.parse_args()
    print("mlx", mx.__version__, mx.default_device())
    for arch in a.arch:
        print(f"== {arch} ({'float' if a.float else '4-bit'})")
        probe(tiny(arch, not a.float))


def cut_everywhere(g: Graph, inputs: list[mx.array], eager: mx.array) -> None:
    """Every equation its own segment, every value returned: which equation's value
    leaves that of the uncut replay (the rules run one by one, no mx.compile)?"""
    allv = g.replace(outputs=tuple(dict.fromkeys(o.name for e in g.eqns if not e.is_pseudo for o in e.outs)))
    ref = dict(zip(allv.outputs, Executor(allv, compile=False)(inputs)))
    cut = with_cuts(allv, range(1, len(allv.eqns)))
    for compile_ in (True, False):
        got = dict(zip(allv.outputs, Executor(cut, compile=compile_)(inputs)))
        print(f"cut everywhere (compile={compile_}):", diff(got[g.outputs[0]], eager))
        bad = [
            e
            for e in allv.eqns
            if not e.is_pseudo and any(diff(got[o.name], ref[o.name]) != "identical" for o in e.outs)
        ]
        print(f"  equations whose value differs from the uncut replay: {len(bad)}")
        for e in bad[:2]:
            same_in = all(diff(got[v], ref[v]) == "identical" for v in e.ins if v in ref)
            print(
                f"  eqn {e.id} {e.prim}{list(e.args)} ins {[(v, g.vars()[v].dtype, g.vars()[v].shape) for v in e.ins]}"
                f" -> {diff(got[e.outs[0].name], ref[e.outs[0].name])}; inputs identical: {same_in}"
            )


def probe(model: Any) -> None:
    x = mx.array([[(7 * i + 3) % 100 for i in range(9)]], dtype=mx.int32)

    eager = model(x)
    mx.eval(eager)
    print("eager again         :", diff(model(x), eager))
    print("mx.compile          :", diff(mx.compile(model)(x), eager))
    print("segc unsegmented    :", diff(segc.jit(model)(x), eager))
    print("segc per layer      :", diff(segc.jit(model, boundaries="layers.*")(x), eager))

    step = segc.jit(model)
    traced = step.trace(x)
    g = traced.graph
    params = dict(step._params())
    inputs = [x if i.kind == "arg" else params[i.path] for i in g.inputs]
    print("executor, no compile:", diff(Executor(g, compile=False)(inputs)[0], eager))
    print("executor, compile   :", diff(Executor(g)(inputs)[0], eager))
    print("primitives          :", sorted({e.prim for e in g.eqns if not e.is_pseudo}))
    cut_everywhere(g, inputs, eager)

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.mlxfn")
        mx.export_function(path, lambda t: model(t), x)
        imported = mx.import_function(path)
        print("export/import (MLX) :", diff(imported(x)[0], eager))

    bad = 0
    for e in g.eqns:
        if e.is_pseudo or e.prim in REBUILT:
            continue
        try:
            again = [(r.prim, r.args) for r in retrace(g, e).eqns]
        except Exception as exc:
            print(f"  rule of eqn {e.id} {e.prim}{list(e.args)} failed to retrace: {exc}")
            bad += 1
            continue
        if (e.prim, e.args) not in again and again:
            print(f"  eqn {e.id} {e.prim}{list(e.args)} -> rule built {again}")
            bad += 1
    print("rules not rebuilding their primitive:", bad)

    # module by module: a boundary after every submodule, every module output returned
    _, log = record_eager(model, x)
    gm = segc.jit(model, boundaries="*").trace(x).graph
    vs = gm.vars()
    outs: list[tuple[str, str]] = []
    last: str | None = None
    for e in gm.eqns:
        if e.prim == CUT and last is not None:
            outs.append((e.args[0], last))
        elif not e.is_pseudo and e.outs:
            last = e.outs[0].name
    names = list(dict.fromkeys(v for _, v in outs))
    gm2 = gm.replace(outputs=tuple(names) + tuple(gm.outputs))
    inputs2 = [x if i.kind == "arg" else params[i.path] for i in gm2.inputs]
    for compile_ in (False, True):
        vals = dict(zip(gm2.outputs, Executor(gm2, compile=compile_)(inputs2)))
        first = None
        eager_out = {p: o for p, _, _, o in log if isinstance(o, mx.array)}
        n_same = 0
        for path, v in outs:
            if path not in eager_out:
                continue
            want = eager_out[path]
            if tuple(vs[v].shape) != tuple(want.shape):
                continue
            r = diff(vals[v], want)
            if r == "identical":
                n_same += 1
            elif first is None:
                first = (path, v, r)
        print(f"modules (compile={compile_}): {n_same} identical; first differing: {first}")
        if first is not None and not compile_:
            path = first[0]
            rec = next(item for item in log if item[0] == path)
            mod = next(sub for _, _, p, sub in _slots(model) if p == path)
            print(f"  module {path}: {type(mod).__name__}")
            again = mod(*rec[1], **rec[2])
            print("  module re-run eagerly on its eager inputs vs eager:", diff(again, rec[3]))
            for inp in rec[1]:
                if isinstance(inp, mx.array):
                    hits = [n for n in gm2.outputs if vals[n].shape == inp.shape and diff(vals[n], inp) == "identical"]
                    print(f"  module input {inp.dtype}{inp.shape}: identical to segc values {hits[:3]}")
            # the equations of that module: those between the previous cut and its cut
            idx = next(k for k, e in enumerate(gm.eqns) if e.prim == CUT and e.args[0] == path)
            start = max([k for k, e in enumerate(gm.eqns[:idx]) if e.prim == CUT], default=-1) + 1
            env = {**{i.var.name: v for i, v in zip(gm.inputs, inputs2)}, **{c.var.name: c.value for c in gm.consts}}
            allv = gm.replace(outputs=tuple(o.name for e in gm.eqns if not e.is_pseudo for o in e.outs))
            env.update(zip(allv.outputs, Executor(allv, compile=False)(inputs2)))
            for e in gm.eqns[start:idx]:
                ins = [env[v] for v in e.ins]
                fn = replay_fn([e], list(dict.fromkeys(e.ins)), [o.name for o in e.outs], {})
                got = fn(*[env[v] for v in dict.fromkeys(e.ins)])
                mx.eval(got)
                print(
                    f"  eqn {e.id} {e.prim}{list(e.args)} ins "
                    f"{[(str(t.dtype), t.shape) for t in ins]} -> {e.outs[0].dtype}{e.outs[0].shape}; "
                    f"replayed vs env: {diff(got[0], env[e.outs[0].name])}"
                )
                if e.prim == "QuantizedMatmul":
                    group_size, bits, _mode, transpose = e.args
                    xs = [mx.array(np.array(t)) for t in ins]  # fresh contiguous copies
                    ref = mx.quantized_matmul(*xs, transpose=bool(transpose), group_size=group_size, bits=bits)
                    print(f"    quantized_matmul on fresh copies vs replay: {diff(ref, got[0])}")
                    deq = mx.dequantize(xs[1], xs[2], xs[3], group_size=group_size, bits=bits)
                    print(f"    x @ dequantize(w).T vs replay: {diff(xs[0] @ (deq.T if transpose else deq), got[0])}")


if __name__ == "__main__":
    main()
